#include "packtool/hf_checkpoint.h"

#include <cstring>
#include <filesystem>
#include <memory>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/gguf/gguf_writer.h"
#include "engine/status_macros.h"
#include "nlohmann/json.hpp"
#include "packtool/builtin_vocab.h"
#include "packtool/hf_config.h"
#include "packtool/hf_gpt_oss.h"
#include "packtool/hf_tensors.h"
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

// Adds GGUF expert tensor `st` (blk.N.ffn_<role>_exps.weight): one checkpoint tensor per expert, stacked along
// ggml's outermost dimension in expert order.
absl::Status AddStackedExperts(const SynthTensor& st, const HfModelConfig& config, HfCheckpointTensors& tensors,
                               const HfTensorAdder& add) {
  std::vector<HfTensorSource> experts;
  for (int64_t e = 0; e < config.geometry.n_expert; ++e) {
    ASSIGN_OR_RETURN(HfTensorSource s,
                     tensors.TakeSource(HfName(*config.arch, st.name, e), std::span<const int64_t>(st.ne).first(2)));
    if (!experts.empty() && s.tensor->dtype != experts.front().tensor->dtype) {
      return absl::UnimplementedError(absl::StrCat(tensors.FileOf(*s.tensor), ": tensor '", s.tensor->name, "' is ",
                                                   s.tensor->dtype, " but '", experts.front().tensor->name, "' is ",
                                                   experts.front().tensor->dtype,
                                                   "; the experts of a layer must share one dtype"));
    }
    experts.push_back(s);
  }
  return add(st.name, experts.front().type, st.ne, [experts](std::span<uint8_t> dst) {
    uint64_t at = 0;
    for (const HfTensorSource& s : experts) {
      RETURN_IF_ERROR(s.Fill(dst.subspan(at, s.bytes())));
      at += s.bytes();
    }
    return absl::OkStatus();
  });
}

// Adds blk.N.attn_k_b / attn_v_b for GGUF tensor `st` (blk.N.attn_kv_b.weight) from kv_b_proj `s`, as
// llama.cpp's converter splits it (packtool/hf_config.h).
absl::Status AddSplitKvB(const SynthTensor& st, const SynthGeometry& g, const HfTensorSource& s,
                         const HfTensorAdder& add) {
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
  return add(prefix + "attn_v_b.weight", s.type, {rank, g.v_dim, g.n_head},
             [split](std::span<uint8_t> dst) { return split(dst, false); });
}

// The tokenizer.* keys: from options.tokenizer_gguf when given, else from tokenizer.json with config.json's
// bos/eos ids.
absl::StatusOr<VocabMetadata> ReadVocabulary(const HfToGgufOptions& options, const HfModelConfig& config) {
  if (!options.tokenizer_gguf.empty()) return VocabFromGguf(options.tokenizer_gguf);
  const json& c = config.json;
  HfTokenizerOptions t;
  t.dir = options.dir;
  t.n_vocab = config.geometry.n_vocab;
  if (c.contains("bos_token_id") && c["bos_token_id"].is_number_unsigned()) {
    t.bos_id = c["bos_token_id"].get<int64_t>();
  }
  if (c.contains("eos_token_id") && c["eos_token_id"].is_number_unsigned()) {
    t.eos_id = c["eos_token_id"].get<int64_t>();
  } else if (c.contains("eos_token_id") && c["eos_token_id"].is_array() && !c["eos_token_id"].empty() &&
             c["eos_token_id"][0].is_number_unsigned()) {
    t.eos_id = c["eos_token_id"][0].get<int64_t>();
  }
  return VocabFromHfTokenizer(t);
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

  ASSIGN_OR_RETURN(const VocabMetadata vocab, ReadVocabulary(options, config));
  if (vocab.n_tokens != g.n_vocab) {
    return absl::InvalidArgumentError(absl::StrCat(options.dir, ": the tokenizer has ", vocab.n_tokens,
                                                   " tokens, config.json's vocab_size is ", g.n_vocab));
  }
  // The geometry's rules are synth's; its errors name synth's flags, so say where the numbers came from.
  RETURN_IF_ERROR(
      WithContext(CheckSynthGeometry(g), absl::StrCat(options.dir, "/config.json: the model it describes")));

  ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsCheckpoint> ckpt, SafetensorsCheckpoint::Open(options.dir));
  HfCheckpointTensors tensors(*ckpt, config, options.dir);
  gguf::GgufWriter writer;
  const std::atomic<bool>* cancel = options.cancel;
  const HfTensorAdder add = [&writer, cancel](const std::string& name, gguf::GgmlType type,
                                              const std::vector<int64_t>& ne, gguf::TensorFiller fill) {
    return writer.AddTensor(name, type, ne, [cancel, fill = std::move(fill)](std::span<uint8_t> dst) {
      if (cancel != nullptr && cancel->load()) return absl::CancelledError("convert: cancelled");
      return fill(dst);
    });
  };
  SetHfMetadata(config, &writer);
  writer.SetString("general.name", std::filesystem::path(options.dir).filename().string());
  writer.SetUint32("general.quantization_version", 2);
  for (const auto& [key, value] : vocab.entries) writer.Set(key, value);

  const bool tied = config.tie_word_embeddings;
  for (const SynthTensor& st : SynthTensors(*arch, g)) {
    if (st.name == "output.weight" && ckpt->Find("lm_head.weight") == nullptr && tied) continue;  // the engine reuses token_embd
    if (arch->gpt_oss && absl::StrContains(st.name, "_exps.")) {
      RETURN_IF_ERROR(AddGptOssExpertTensor(st, config, tensors, add));
      continue;
    }
    if (st.kind == SynthTensorKind::kExpert) {
      RETURN_IF_ERROR(AddStackedExperts(st, config, tensors, add));
      continue;
    }
    ASSIGN_OR_RETURN(const HfTensorSource s, tensors.TakeSource(HfName(hf, st.name, 0), st.ne));
    if (st.kind == SynthTensorKind::kNorm || st.kind == SynthTensorKind::kRouter || st.kind == SynthTensorKind::kBias) {
      // llama.cpp keeps norms, biases and the router in f32.
      if (s.scale_inv != nullptr) {
        return absl::UnimplementedError(absl::StrCat(tensors.FileOf(*s.tensor), ": tensor '", s.tensor->name,
                                                     "' is FP8; Strata reads FP8 for weight matrices only"));
      }
      RETURN_IF_ERROR(add(st.name, gguf::GgmlType::kF32, st.ne, [s](std::span<uint8_t> dst) { return s.FillF32(dst); }));
      continue;
    }
    if (absl::EndsWith(st.name, ".attn_kv_b.weight")) {
      RETURN_IF_ERROR(AddSplitKvB(st, g, s, add));
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
  RETURN_IF_ERROR(tensors.CheckAllTaken());
  return writer.WriteFile(options.output);
}

}  // namespace strata::packtool
