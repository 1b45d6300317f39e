#include "packtool/hf_checkpoint.h"

#include <cstring>
#include <filesystem>
#include <memory>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/gguf/gguf_writer.h"
#include "engine/status_macros.h"
#include "nlohmann/json.hpp"
#include "packtool/builtin_vocab.h"
#include "packtool/hf_config.h"
#include "packtool/hf_fp8.h"
#include "packtool/hf_gpt_oss.h"
#include "packtool/hf_tokenizer.h"
#include "packtool/safetensors.h"
#include "packtool/synth_arch.h"

namespace strata::packtool {
namespace {

using nlohmann::json;

// The Hugging Face name of a GGUF tensor of synth's list (experts: of expert `e`).
std::string HfName(const HfArch& arch, const std::string& gguf_name, int64_t e) {
  if (gguf_name == "token_embd.weight") return "model.embed_tokens.weight";
  if (gguf_name == "output_norm.weight") return "model.norm.weight";
  if (gguf_name == "output.weight") return "lm_head.weight";
  // blk.N.<rest>
  const size_t dot = gguf_name.find('.', 4);
  const std::string layer = gguf_name.substr(4, dot - 4);
  const std::string rest = gguf_name.substr(dot + 1);
  const std::string p = absl::StrCat("model.layers.", layer, ".");
  const std::string moe = absl::StrCat(p, std::string(arch.moe_block), ".");
  static const absl::flat_hash_map<std::string, std::string> kLayerNames = {
      {"attn_norm.weight", "input_layernorm.weight"},
      {"ffn_norm.weight", "post_attention_layernorm.weight"},
      {"attn_q.weight", "self_attn.q_proj.weight"},
      {"attn_k.weight", "self_attn.k_proj.weight"},
      {"attn_v.weight", "self_attn.v_proj.weight"},
      {"attn_output.weight", "self_attn.o_proj.weight"},
      {"attn_q_norm.weight", "self_attn.q_norm.weight"},
      {"attn_k_norm.weight", "self_attn.k_norm.weight"},
      // DeepSeek's latent attention and dense leading blocks.
      {"attn_q_a.weight", "self_attn.q_a_proj.weight"},
      {"attn_q_a_norm.weight", "self_attn.q_a_layernorm.weight"},
      {"attn_q_b.weight", "self_attn.q_b_proj.weight"},
      {"attn_kv_a_mqa.weight", "self_attn.kv_a_proj_with_mqa.weight"},
      {"attn_kv_a_norm.weight", "self_attn.kv_a_layernorm.weight"},
      {"attn_kv_b.weight", "self_attn.kv_b_proj.weight"},
      {"ffn_gate.weight", "mlp.gate_proj.weight"},
      {"ffn_up.weight", "mlp.up_proj.weight"},
      {"ffn_down.weight", "mlp.down_proj.weight"},
      // gpt-oss's biases, sinks and FFN pre-norm.
      {"attn_q.bias", "self_attn.q_proj.bias"},
      {"attn_k.bias", "self_attn.k_proj.bias"},
      {"attn_v.bias", "self_attn.v_proj.bias"},
      {"attn_output.bias", "self_attn.o_proj.bias"},
      {"attn_sinks.weight", "self_attn.sinks"},
      {"post_attention_norm.weight", "post_attention_layernorm.weight"},
  };
  if (auto it = kLayerNames.find(rest); it != kLayerNames.end()) return p + it->second;
  if (rest == "ffn_gate_inp.weight") return absl::StrCat(moe, std::string(arch.router), ".weight");
  if (rest == "ffn_gate_inp.bias") return absl::StrCat(moe, std::string(arch.router), ".bias");
  if (rest == "exp_probs_b.bias") return moe + "gate.e_score_correction_bias";
  const int role = absl::StartsWith(rest, "ffn_gate_") ? 0 : absl::StartsWith(rest, "ffn_up_") ? 1 : 2;
  if (rest == "ffn_gate_inp_shexp.weight") return moe + "shared_expert_gate.weight";
  if (absl::EndsWith(rest, "_shexp.weight")) {
    return absl::StrCat(moe, std::string(arch.shared_expert), ".", std::string(arch.roles[role]), ".weight");
  }
  return absl::StrCat(moe, "experts.", e, ".", std::string(arch.roles[role]), ".weight");
}

// Checks that `t` is a matrix/vector of ggml shape `ne` (its row-major shape reversed).
// A vector may be a [1, n] matrix (Qwen2-MoE's shared_expert_gate, a linear layer of one output).
absl::Status CheckShape(const SafetensorsTensor& t, std::span<const int64_t> ne, const std::string& file) {
  std::vector<int64_t> expected(ne.rbegin(), ne.rend());
  const bool row_vector = ne.size() == 1 && t.shape == std::vector<int64_t>{1, ne[0]};
  if (t.shape != expected && !row_vector) {
    return absl::InvalidArgumentError(absl::StrCat(file, ": tensor '", t.name, "' has shape [", absl::StrJoin(t.shape, ", "),
                                                   "], expected [", absl::StrJoin(expected, ", "), "] from config.json"));
  }
  return absl::OkStatus();
}

// A checkpoint tensor as the GGUF gets it: F16/BF16/F32 as they are, FP8 block-scaled dequantized to BF16.
struct Source {
  const SafetensorsTensor* tensor = nullptr;
  const SafetensorsTensor* scale_inv = nullptr;  // FP8 only
  gguf::GgmlType type = gguf::GgmlType::kF32;     // what it is written as

  uint64_t element_bytes() const { return type == gguf::GgmlType::kF32 ? 4 : 2; }  // F32, F16 or BF16
  uint64_t bytes() const { return static_cast<uint64_t>(tensor->n_elements()) * element_bytes(); }
  absl::Status Fill(std::span<uint8_t> dst) const {
    if (scale_inv == nullptr) {
      std::memcpy(dst.data(), tensor->data.data(), tensor->data.size());
      return absl::OkStatus();
    }
    return DequantizeFp8Blocks(tensor->data, scale_inv->data, tensor->shape[0], tensor->shape[1], tensor->name, dst);
  }
};

// `src` widened to f32 into `dst`.
absl::Status ToF32(const Source& src, std::span<uint8_t> dst) {
  const SafetensorsTensor& t = *src.tensor;
  if (src.type == gguf::GgmlType::kF32) {
    std::memcpy(dst.data(), t.data.data(), t.data.size());
    return absl::OkStatus();
  }
  std::vector<float> values(static_cast<size_t>(t.n_elements()));
  RETURN_IF_ERROR(gguf::Dequantize(src.type, t.data.data(), values.data(), t.n_elements()));
  std::memcpy(dst.data(), values.data(), values.size() * sizeof(float));
  return absl::OkStatus();
}

// DeepSeek's kv_b_proj ([n_head * (nope + v), rank], Hugging Face order) split as llama.cpp's converter does:
// attn_k_b holds each head's first `nope` rows transposed (ggml ne [nope, rank, n_head]), attn_v_b its last
// `v` rows as they are (ne [rank, v, n_head]). `element` bytes per value; `k_b` and `v_b` are filled.
void SplitKvB(std::span<const uint8_t> kv_b, int64_t n_head, int64_t nope, int64_t v, int64_t rank, uint64_t element,
              std::span<uint8_t> k_b, std::span<uint8_t> v_b) {
  const int64_t per_head = nope + v;
  for (int64_t h = 0; h < n_head; ++h) {
    for (int64_t d = 0; d < nope; ++d) {
      for (int64_t r = 0; r < rank; ++r) {
        std::memcpy(k_b.data() + ((h * rank + r) * nope + d) * element,
                    kv_b.data() + ((h * per_head + d) * rank + r) * element, element);
      }
    }
    std::memcpy(v_b.data() + h * v * rank * element, kv_b.data() + (h * per_head + nope) * rank * element,
                v * rank * element);
  }
}

// True for a tensor of the multi-token-prediction layers (DeepSeek-V3, GLM-4.5), numbered after the model's `n_layer`, which
// llama.cpp's converter leaves out (the engine does not run them).
bool IsMtpLayer(const std::string& name, int64_t n_layer, int64_t n_mtp) {
  for (int64_t l = n_layer; l < n_layer + n_mtp; ++l) {
    if (absl::StartsWith(name, absl::StrCat("model.layers.", l, "."))) return true;
  }
  return false;
}

}  // namespace

bool IsHfCheckpointDir(const std::string& path) {
  std::error_code ec;
  return std::filesystem::is_directory(path, ec) && std::filesystem::is_regular_file(path + "/config.json", ec);
}

namespace {

// Row (h, i, j) of the q/k projections moves between Hugging Face's order (h * head_dim + i + j * half) and
// GGUF's (h * head_dim + 2i + j), towards GGUF's or back.
void ReorderRowsForNormalRope(std::span<const uint8_t> src, std::span<uint8_t> dst, int64_t n_head, int64_t head_dim,
                              uint64_t row_bytes, bool to_gguf) {
  const int64_t half = head_dim / 2;
  for (int64_t h = 0; h < n_head; ++h) {
    for (int64_t i = 0; i < half; ++i) {
      for (int64_t j = 0; j < 2; ++j) {
        const uint64_t gguf_row = static_cast<uint64_t>(h * head_dim + 2 * i + j);
        const uint64_t hf_row = static_cast<uint64_t>(h * head_dim + i + j * half);
        const uint64_t to = to_gguf ? gguf_row : hf_row, from = to_gguf ? hf_row : gguf_row;
        std::memcpy(dst.data() + to * row_bytes, src.data() + from * row_bytes, row_bytes);
      }
    }
  }
}

}  // namespace

void PermuteRowsForNormalRope(std::span<const uint8_t> src, std::span<uint8_t> dst, int64_t n_head, int64_t head_dim,
                              uint64_t row_bytes) {
  ReorderRowsForNormalRope(src, dst, n_head, head_dim, row_bytes, /*to_gguf=*/true);
}

void UnpermuteRowsForNormalRope(std::span<const uint8_t> src, std::span<uint8_t> dst, int64_t n_head,
                                int64_t head_dim, uint64_t row_bytes) {
  ReorderRowsForNormalRope(src, dst, n_head, head_dim, row_bytes, /*to_gguf=*/false);
}

absl::Status HfCheckpointToGguf(const HfToGgufOptions& options) {
  ASSIGN_OR_RETURN(const HfModelConfig config, ReadHfConfig(options.dir));
  const HfArch& hf = *config.arch;
  const SynthGeometry& g = config.geometry;
  ASSIGN_OR_RETURN(const SynthArch* arch, FindSynthArch(g.arch));

  const json& c = config.json;
  VocabMetadata vocab;
  if (!options.tokenizer_gguf.empty()) {
    ASSIGN_OR_RETURN(vocab, VocabFromGguf(options.tokenizer_gguf));
  } else {
    HfTokenizerOptions t;
    t.dir = options.dir;
    t.n_vocab = g.n_vocab;
    if (c.contains("bos_token_id") && c["bos_token_id"].is_number_unsigned()) {
      t.bos_id = c["bos_token_id"].get<int64_t>();
    }
    if (c.contains("eos_token_id") && c["eos_token_id"].is_number_unsigned()) {
      t.eos_id = c["eos_token_id"].get<int64_t>();
    } else if (c.contains("eos_token_id") && c["eos_token_id"].is_array() && !c["eos_token_id"].empty() &&
               c["eos_token_id"][0].is_number_unsigned()) {
      t.eos_id = c["eos_token_id"][0].get<int64_t>();
    }
    ASSIGN_OR_RETURN(vocab, VocabFromHfTokenizer(t));
  }
  if (vocab.n_tokens != g.n_vocab) {
    return absl::InvalidArgumentError(absl::StrCat(options.dir, ": the tokenizer has ", vocab.n_tokens,
                                                   " tokens, config.json's vocab_size is ", g.n_vocab));
  }
  RETURN_IF_ERROR(CheckSynthGeometry(g));

  ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsCheckpoint> ckpt, SafetensorsCheckpoint::Open(options.dir));
  absl::flat_hash_set<std::string> used;
  auto file_of = [&](const SafetensorsTensor& t) { return ckpt->files()[static_cast<size_t>(t.shard)]->path(); };
  // HF tensor `name`, of ggml shape `ne`, marked used.
  auto lookup = [&](const std::string& name, std::span<const int64_t> ne) -> absl::StatusOr<const SafetensorsTensor*> {
    const SafetensorsTensor* t = ckpt->Find(name);
    if (t == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(options.dir, ": tensor '", name, "' is missing from the *.safetensors files"));
    }
    used.insert(name);
    RETURN_IF_ERROR(CheckShape(*t, ne, file_of(*t)));
    return t;
  };
  // The source of HF tensor `name`, of ggml shape `ne`: its dtype read, FP8's scale_inv found and checked.
  auto find = [&](const std::string& name, std::span<const int64_t> ne) -> absl::StatusOr<Source> {
    ASSIGN_OR_RETURN(const SafetensorsTensor* t, lookup(name, ne));
    if (t->type.has_value()) return Source{t, nullptr, *t->type};
    const std::string where = absl::StrCat(file_of(*t), ": tensor '", name, "' is ", t->dtype);
    if (t->dtype != "F8_E4M3") return absl::UnimplementedError(absl::StrCat(where, ", which Strata does not read here"));
    if (!config.fp8_blocks) {
      return absl::UnimplementedError(absl::StrCat(where, " but config.json has no quantization_config ",
                                                   "(expected quant_method fp8 with weight_block_size [128, 128])"));
    }
    if (t->shape.size() != 2) {
      return absl::UnimplementedError(absl::StrCat(where, " of ", t->shape.size(), " dimensions; Strata reads FP8 ",
                                                   "block-scaled matrices only"));
    }
    const std::string scale_name = name + "_scale_inv";
    const SafetensorsTensor* s = ckpt->Find(scale_name);
    if (s == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(where, " but its block scales '", scale_name, "' are missing"));
    }
    used.insert(scale_name);
    const std::vector<int64_t> blocks = {(t->shape[0] + kFp8BlockSize - 1) / kFp8BlockSize,
                                         (t->shape[1] + kFp8BlockSize - 1) / kFp8BlockSize};
    if (s->dtype != "F32" || s->shape != blocks) {
      return absl::InvalidArgumentError(absl::StrCat(
          file_of(*s), ": tensor '", scale_name, "' is ", s->dtype, " [", absl::StrJoin(s->shape, ", "),
          "], expected F32 [", absl::StrJoin(blocks, ", "), "]: one scale per 128 x 128 block of '", name, "'"));
    }
    return Source{t, s, gguf::GgmlType::kBF16};
  };

  gguf::GgufWriter writer;
  const std::atomic<bool>* cancel = options.cancel;
  // Each tensor's filler, checking for cancellation first.
  auto add = [&writer, cancel](const std::string& name, gguf::GgmlType type, const std::vector<int64_t>& ne,
                               gguf::TensorFiller fill) {
    return writer.AddTensor(name, type, ne, [cancel, fill = std::move(fill)](std::span<uint8_t> dst) {
      if (cancel != nullptr && cancel->load()) return absl::CancelledError("convert: cancelled");
      return fill(dst);
    });
  };
  SetHfMetadata(config, &writer);
  writer.SetString("general.name", std::filesystem::path(options.dir).filename().string());
  writer.SetUint32("general.quantization_version", 2);
  for (const auto& [key, value] : vocab.entries) writer.Set(key, value);

  // gpt-oss's blk.N.ffn_{gate,up,down}_exps.{weight,bias} from the layer's fused tensors (packtool/hf_gpt_oss.h).
  auto add_gpt_oss_experts = [&](const SynthTensor& st) -> absl::Status {
    const bool down = absl::StrContains(st.name, ".ffn_down_"), up = absl::StrContains(st.name, ".ffn_up_");
    const std::string fused = absl::StrCat("model.layers.", st.layer, ".mlp.experts.", down ? "down_proj" : "gate_up_proj");
    const int64_t E = g.n_expert, k = down ? g.expert_ff : g.n_embd;
    const int64_t step = down ? 1 : 2, first = up ? 1 : 0, src_rows = step * (down ? g.n_embd : g.expert_ff);
    auto require = [&](const SafetensorsTensor* t, bool u8) -> absl::Status {
      if (u8 ? t->dtype == "U8" : t->type.has_value()) return absl::OkStatus();
      return absl::UnimplementedError(absl::StrCat(file_of(*t), ": tensor '", t->name, "' is ", t->dtype, ", expected ",
                                                   u8 ? "U8 (MXFP4)" : "F16, BF16 or F32"));
    };
    if (absl::EndsWith(st.name, ".bias")) {
      ASSIGN_OR_RETURN(const SafetensorsTensor* t, lookup(fused + "_bias", std::vector<int64_t>{src_rows, E}));
      RETURN_IF_ERROR(require(t, false));
      const Source s{t, nullptr, *t->type};
      return add(st.name, gguf::GgmlType::kF32, st.ne, [s, E, src_rows, step, first](std::span<uint8_t> dst) {
        std::vector<uint8_t> selected(static_cast<size_t>(E * (src_rows / step)) * s.element_bytes());
        SelectExpertRows(s.tensor->data, E, src_rows, s.element_bytes(), step, first, selected);
        return gguf::Dequantize(s.type, selected.data(), reinterpret_cast<float*>(dst.data()),
                                static_cast<int64_t>(selected.size() / s.element_bytes()));
      });
    }
    if (config.mxfp4_experts) {
      if (k % 32 != 0) {
        return absl::InvalidArgumentError(absl::StrCat(fused, ": MXFP4 rows of ", k, " values, expected a multiple of 32"));
      }
      const int64_t n_blocks = k / 32;
      ASSIGN_OR_RETURN(const SafetensorsTensor* blocks,
                       lookup(fused + "_blocks", std::vector<int64_t>{16, n_blocks, src_rows, E}));
      ASSIGN_OR_RETURN(const SafetensorsTensor* scales,
                       lookup(fused + "_scales", std::vector<int64_t>{n_blocks, src_rows, E}));
      RETURN_IF_ERROR(require(blocks, true));
      RETURN_IF_ERROR(require(scales, true));
      return add(st.name, gguf::GgmlType::kMXFP4, st.ne,
                 [blocks, scales, E, src_rows, n_blocks, step, first](std::span<uint8_t> dst) {
                   RepackMxfp4Rows(blocks->data, scales->data, E, src_rows, n_blocks, step, first, dst);
                   return absl::OkStatus();
                 });
    }
    ASSIGN_OR_RETURN(const SafetensorsTensor* t, lookup(fused, std::vector<int64_t>{src_rows, k, E}));
    RETURN_IF_ERROR(require(t, false));
    const Source s{t, nullptr, *t->type};
    return add(st.name, s.type, st.ne, [s, E, k, src_rows, step, first](std::span<uint8_t> dst) {
      TransposeExpertRows(s.tensor->data, E, k, src_rows, s.element_bytes(), step, first, dst);
      return absl::OkStatus();
    });
  };

  const bool tied = c.contains("tie_word_embeddings") && c["tie_word_embeddings"].is_boolean() &&
                    c["tie_word_embeddings"].get<bool>();
  for (const SynthTensor& st : SynthTensors(*arch, g)) {
    if (st.name == "output.weight" && ckpt->Find("lm_head.weight") == nullptr && tied) continue;  // the engine reuses token_embd
    if (arch->gpt_oss && absl::StrContains(st.name, "_exps.")) {
      RETURN_IF_ERROR(add_gpt_oss_experts(st));
      continue;
    }
    if (st.kind == SynthTensorKind::kExpert) {
      // One source per expert, stacked along ggml's outermost dimension in expert order.
      std::vector<Source> experts;
      for (int64_t e = 0; e < g.n_expert; ++e) {
        ASSIGN_OR_RETURN(Source s, find(HfName(hf, st.name, e), std::span<const int64_t>(st.ne).first(2)));
        if (!experts.empty() && s.tensor->dtype != experts.front().tensor->dtype) {
          return absl::UnimplementedError(absl::StrCat(file_of(*s.tensor), ": tensor '", s.tensor->name, "' is ",
                                                       s.tensor->dtype, " but '", experts.front().tensor->name, "' is ",
                                                       experts.front().tensor->dtype,
                                                       "; the experts of a layer must share one dtype"));
        }
        experts.push_back(s);
      }
      RETURN_IF_ERROR(add(st.name, experts.front().type, st.ne, [experts](std::span<uint8_t> dst) {
        uint64_t at = 0;
        for (const Source& s : experts) {
          RETURN_IF_ERROR(s.Fill(dst.subspan(at, s.bytes())));
          at += s.bytes();
        }
        return absl::OkStatus();
      }));
      continue;
    }
    ASSIGN_OR_RETURN(const Source s, find(HfName(hf, st.name, 0), st.ne));
    if (st.kind == SynthTensorKind::kNorm || st.kind == SynthTensorKind::kRouter || st.kind == SynthTensorKind::kBias) {
      // llama.cpp keeps norms, biases and the router in f32.
      if (s.scale_inv != nullptr) {
        return absl::UnimplementedError(absl::StrCat(file_of(*s.tensor), ": tensor '", s.tensor->name,
                                                     "' is FP8; Strata reads FP8 for weight matrices only"));
      }
      RETURN_IF_ERROR(add(st.name, gguf::GgmlType::kF32, st.ne, [s](std::span<uint8_t> dst) { return ToF32(s, dst); }));
      continue;
    }
    if (absl::EndsWith(st.name, ".attn_kv_b.weight")) {
      // Latent attention: split into attn_k_b / attn_v_b as llama.cpp's converter writes it (packtool/hf_config.h).
      const std::string prefix = st.name.substr(0, st.name.size() - std::string("attn_kv_b.weight").size());
      const int64_t nope = g.head_dim - g.rope_dim, rank = g.kv_lora_rank;
      const uint64_t element = s.element_bytes();
      // Each half decodes the whole matrix (small: 33 MB in DeepSeek-V3) rather than share state between fillers.
      auto split = [s, n_head = g.n_head, nope, v = g.v_dim, rank, element](std::span<uint8_t> dst, bool key) {
        std::vector<uint8_t> whole(s.bytes());
        RETURN_IF_ERROR(s.Fill(whole));
        std::vector<uint8_t> other(static_cast<size_t>(n_head * (key ? v : nope) * rank) * element);
        SplitKvB(whole, n_head, nope, v, rank, element, key ? dst : std::span<uint8_t>(other),
                 key ? std::span<uint8_t>(other) : dst);
        return absl::OkStatus();
      };
      RETURN_IF_ERROR(add(prefix + "attn_k_b.weight", s.type, {nope, rank, g.n_head},
                          [split](std::span<uint8_t> dst) { return split(dst, true); }));
      RETURN_IF_ERROR(add(prefix + "attn_v_b.weight", s.type, {rank, g.v_dim, g.n_head},
                          [split](std::span<uint8_t> dst) { return split(dst, false); }));
      continue;
    }
    const bool is_q = absl::EndsWith(st.name, ".attn_q.weight"), is_k = absl::EndsWith(st.name, ".attn_k.weight");
    if (hf.permute_qk && (is_q || is_k)) {
      const int64_t heads = is_q ? g.n_head : g.n_head_kv;
      const uint64_t row_bytes = s.bytes() / static_cast<uint64_t>(heads * g.head_dim);
      const int64_t head_dim = g.head_dim;
      RETURN_IF_ERROR(add(st.name, s.type, st.ne, [s, heads, head_dim, row_bytes](std::span<uint8_t> dst) {
        std::vector<uint8_t> hf_order(s.bytes());
        RETURN_IF_ERROR(s.Fill(hf_order));
        PermuteRowsForNormalRope(hf_order, dst, heads, head_dim, row_bytes);
        return absl::OkStatus();
      }));
      continue;
    }
    RETURN_IF_ERROR(add(st.name, s.type, st.ne, [s](std::span<uint8_t> dst) { return s.Fill(dst); }));
  }
  for (const SafetensorsTensor* t : ckpt->tensors()) {
    if (used.contains(t->name) || absl::EndsWith(t->name, "rotary_emb.inv_freq") || IsMtpLayer(t->name, g.n_layer, config.n_mtp_layers)) continue;
    return absl::UnimplementedError(absl::StrCat(file_of(*t), ": tensor '", t->name, "' has no place in a ",
                                                 std::string(hf.hf_name), " model as Strata reads it"));
  }
  return writer.WriteFile(options.output);
}

}  // namespace strata::packtool
