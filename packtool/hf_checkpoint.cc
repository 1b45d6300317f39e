#include "packtool/hf_checkpoint.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/gguf/gguf_writer.h"
#include "engine/status_macros.h"
#include "nlohmann/json.hpp"
#include "packtool/builtin_vocab.h"
#include "packtool/hf_tokenizer.h"
#include "packtool/safetensors.h"
#include "packtool/synth_arch.h"

namespace strata::packtool {
namespace {

using nlohmann::json;

struct HfArch {
  std::string_view hf_name;        // config.json "architectures"
  std::string_view synth_name;     // synth's architecture, whose tensor list and metadata keys are the GGUF's
  std::string_view moe_block;      // model.layers.N.<moe_block>.gate / .experts.E.<role>
  std::string_view roles[3];       // gate, up, down
  std::string_view expert_ff_key;  // config.json key of the expert width
  std::string_view n_expert_key;
  bool permute_qk;                 // normal (interleaved) RoPE in GGUF
};

const std::vector<HfArch>& HfArchTable() {
  static const std::vector<HfArch> table = {
      {"Qwen3MoeForCausalLM", "qwen3moe", "mlp", {"gate_proj", "up_proj", "down_proj"}, "moe_intermediate_size",
       "num_experts", false},
      {"MixtralForCausalLM", "mixtral", "block_sparse_moe", {"w1", "w3", "w2"}, "intermediate_size",
       "num_local_experts", true},
  };
  return table;
}

absl::StatusOr<json> ReadConfig(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::stringstream text;
  text << in.rdbuf();
  json j = json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return absl::InvalidArgumentError(absl::StrCat(path, ": not a JSON object"));
  return j;
}

absl::StatusOr<const HfArch*> FindHfArch(const json& config, const std::string& path) {
  std::vector<std::string> known;
  for (const HfArch& a : HfArchTable()) known.emplace_back(a.hf_name);
  const std::string expected = absl::StrCat("expected one of: ", absl::StrJoin(known, ", "));
  if (!config.contains("architectures") || !config["architectures"].is_array() || config["architectures"].empty() ||
      !config["architectures"][0].is_string()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": architectures: missing (", expected, ")"));
  }
  const std::string name = config["architectures"][0].get<std::string>();
  for (const HfArch& a : HfArchTable()) {
    if (a.hf_name == name) return &a;
  }
  return absl::UnimplementedError(
      absl::StrCat(path, ": architectures: '", name, "' is not supported (", expected, ")"));
}

absl::StatusOr<int64_t> ReadInt(const json& c, std::string_view key, const std::string& path,
                                std::optional<int64_t> fallback = std::nullopt) {
  const std::string k(key);
  if (!c.contains(k) || c[k].is_null()) {
    if (fallback) return *fallback;
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", k, ": missing (expected a positive integer)"));
  }
  if (!c[k].is_number_unsigned() || c[k].get<uint64_t>() == 0 || c[k].get<uint64_t>() > (uint64_t{1} << 31)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", k, ": expected an integer in 1 .. 2^31"));
  }
  return c[k].get<int64_t>();
}

absl::StatusOr<double> ReadFloat(const json& c, const char* key, const std::string& path, double fallback) {
  if (!c.contains(key) || c[key].is_null()) return fallback;
  if (!c[key].is_number()) return absl::InvalidArgumentError(absl::StrCat(path, ": ", key, ": expected a number"));
  return c[key].get<double>();
}

absl::StatusOr<std::pair<const HfArch*, SynthGeometry>> ReadGeometry(const std::string& dir, json* config_out) {
  const std::string path = dir + "/config.json";
  ASSIGN_OR_RETURN(json c, ReadConfig(path));
  ASSIGN_OR_RETURN(const HfArch* arch, FindHfArch(c, path));
  // What the engine does not implement is refused here, naming the field, rather than converted wrongly.
  if (c.contains("rope_scaling") && !c["rope_scaling"].is_null()) {
    return absl::UnimplementedError(absl::StrCat(path, ": rope_scaling: Strata does not implement RoPE scaling (expected null)"));
  }
  if (arch->synth_name == "qwen3moe") {
    if (c.contains("mlp_only_layers") && c["mlp_only_layers"].is_array() && !c["mlp_only_layers"].empty()) {
      return absl::UnimplementedError(absl::StrCat(path, ": mlp_only_layers: dense layers are not supported (expected [])"));
    }
    if (ReadInt(c, "decoder_sparse_step", path, 1).value_or(0) != 1) {
      return absl::UnimplementedError(absl::StrCat(path, ": decoder_sparse_step: expected 1 (every layer MoE)"));
    }
    if (c.contains("norm_topk_prob") && c["norm_topk_prob"].is_boolean() && !c["norm_topk_prob"].get<bool>()) {
      return absl::UnimplementedError(
          absl::StrCat(path, ": norm_topk_prob: false is not supported (Strata renormalises the top-k weights)"));
    }
  }
  SynthGeometry g;
  g.arch = std::string(arch->synth_name);
  ASSIGN_OR_RETURN(g.n_layer, ReadInt(c, "num_hidden_layers", path));
  ASSIGN_OR_RETURN(g.n_embd, ReadInt(c, "hidden_size", path));
  ASSIGN_OR_RETURN(g.n_head, ReadInt(c, "num_attention_heads", path));
  ASSIGN_OR_RETURN(g.n_head_kv, ReadInt(c, "num_key_value_heads", path, g.n_head));
  ASSIGN_OR_RETURN(g.head_dim, ReadInt(c, "head_dim", path, g.n_embd / g.n_head));
  ASSIGN_OR_RETURN(g.expert_ff, ReadInt(c, arch->expert_ff_key, path));
  ASSIGN_OR_RETURN(g.n_expert, ReadInt(c, arch->n_expert_key, path));
  ASSIGN_OR_RETURN(g.n_expert_used, ReadInt(c, "num_experts_per_tok", path));
  ASSIGN_OR_RETURN(g.n_ctx, ReadInt(c, "max_position_embeddings", path));
  ASSIGN_OR_RETURN(g.n_vocab, ReadInt(c, "vocab_size", path));
  ASSIGN_OR_RETURN(const double theta, ReadFloat(c, "rope_theta", path, 10000.0));
  ASSIGN_OR_RETURN(const double eps, ReadFloat(c, "rms_norm_eps", path, 1e-6));
  g.rope_freq_base = static_cast<float>(theta);
  g.rms_norm_eps = static_cast<float>(eps);
  if (config_out != nullptr) *config_out = std::move(c);
  return std::make_pair(arch, g);
}

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
  if (rest == "attn_norm.weight") return p + "input_layernorm.weight";
  if (rest == "ffn_norm.weight") return p + "post_attention_layernorm.weight";
  if (rest == "attn_q.weight") return p + "self_attn.q_proj.weight";
  if (rest == "attn_k.weight") return p + "self_attn.k_proj.weight";
  if (rest == "attn_v.weight") return p + "self_attn.v_proj.weight";
  if (rest == "attn_output.weight") return p + "self_attn.o_proj.weight";
  if (rest == "attn_q_norm.weight") return p + "self_attn.q_norm.weight";
  if (rest == "attn_k_norm.weight") return p + "self_attn.k_norm.weight";
  if (rest == "ffn_gate_inp.weight") return moe + "gate.weight";
  const int role = rest == "ffn_gate_exps.weight" ? 0 : rest == "ffn_up_exps.weight" ? 1 : 2;
  return absl::StrCat(moe, "experts.", e, ".", std::string(arch.roles[role]), ".weight");
}

// Checks that `t` is a matrix/vector of ggml shape `ne` (its row-major shape reversed).
absl::Status CheckShape(const SafetensorsTensor& t, std::span<const int64_t> ne, const std::string& file) {
  std::vector<int64_t> expected(ne.rbegin(), ne.rend());
  if (t.shape != expected) {
    return absl::InvalidArgumentError(absl::StrCat(file, ": tensor '", t.name, "' has shape [", absl::StrJoin(t.shape, ", "),
                                                   "], expected [", absl::StrJoin(expected, ", "), "] from config.json"));
  }
  return absl::OkStatus();
}

// `src` (of `type`) widened to f32 into `dst`.
absl::Status ToF32(const SafetensorsTensor& src, std::span<uint8_t> dst) {
  const int64_t n = src.n_elements();
  if (src.type == gguf::GgmlType::kF32) {
    std::memcpy(dst.data(), src.data.data(), src.data.size());
    return absl::OkStatus();
  }
  std::vector<float> values(static_cast<size_t>(n));
  RETURN_IF_ERROR(gguf::Dequantize(src.type, src.data.data(), values.data(), n));
  std::memcpy(dst.data(), values.data(), values.size() * sizeof(float));
  return absl::OkStatus();
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
  json config;
  ASSIGN_OR_RETURN(auto arch_geometry, ReadGeometry(options.dir, &config));
  const HfArch& hf = *arch_geometry.first;
  SynthGeometry g = arch_geometry.second;
  ASSIGN_OR_RETURN(const SynthArch* arch, FindSynthArch(g.arch));

  VocabMetadata vocab;
  if (!options.tokenizer_gguf.empty()) {
    ASSIGN_OR_RETURN(vocab, VocabFromGguf(options.tokenizer_gguf));
  } else {
    HfTokenizerOptions t;
    t.dir = options.dir;
    t.n_vocab = g.n_vocab;
    if (config.contains("bos_token_id") && config["bos_token_id"].is_number_unsigned()) {
      t.bos_id = config["bos_token_id"].get<int64_t>();
    }
    if (config.contains("eos_token_id") && config["eos_token_id"].is_number_unsigned()) {
      t.eos_id = config["eos_token_id"].get<int64_t>();
    } else if (config.contains("eos_token_id") && config["eos_token_id"].is_array() &&
               !config["eos_token_id"].empty() && config["eos_token_id"][0].is_number_unsigned()) {
      t.eos_id = config["eos_token_id"][0].get<int64_t>();
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
  auto find = [&](const std::string& name) -> absl::StatusOr<const SafetensorsTensor*> {
    const SafetensorsTensor* t = ckpt->Find(name);
    if (t == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(options.dir, ": tensor '", name, "' is missing from the *.safetensors files"));
    }
    used.insert(name);
    return t;
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
  SetSynthMetadata(*arch, g, &writer);
  writer.SetString("general.name", std::filesystem::path(options.dir).filename().string());
  writer.SetUint32("general.quantization_version", 2);
  for (const auto& [key, value] : vocab.entries) writer.Set(key, value);

  const bool tied = config.contains("tie_word_embeddings") && config["tie_word_embeddings"].is_boolean() &&
                    config["tie_word_embeddings"].get<bool>();
  for (const SynthTensor& st : SynthTensors(*arch, g)) {
    if (st.name == "output.weight" && ckpt->Find("lm_head.weight") == nullptr && tied) continue;  // the engine reuses token_embd
    if (st.kind == SynthTensorKind::kExpert) {
      // One source per expert, stacked along ggml's outermost dimension in expert order.
      std::vector<const SafetensorsTensor*> experts;
      for (int64_t e = 0; e < g.n_expert; ++e) {
        ASSIGN_OR_RETURN(const SafetensorsTensor* t, find(HfName(hf, st.name, e)));
        RETURN_IF_ERROR(CheckShape(*t, std::span<const int64_t>(st.ne).first(2), file_of(*t)));
        if (!experts.empty() && t->type != experts.front()->type) {
          return absl::UnimplementedError(absl::StrCat(file_of(*t), ": tensor '", t->name, "' is ", t->dtype, " but '",
                                                       experts.front()->name, "' is ", experts.front()->dtype,
                                                       "; the experts of a layer must share one dtype"));
        }
        experts.push_back(t);
      }
      RETURN_IF_ERROR(add(st.name, experts.front()->type, st.ne, [experts](std::span<uint8_t> dst) {
        uint64_t at = 0;
        for (const SafetensorsTensor* t : experts) {
          std::memcpy(dst.data() + at, t->data.data(), t->data.size());
          at += t->data.size();
        }
        return absl::OkStatus();
      }));
      continue;
    }
    ASSIGN_OR_RETURN(const SafetensorsTensor* t, find(HfName(hf, st.name, 0)));
    RETURN_IF_ERROR(CheckShape(*t, st.ne, file_of(*t)));
    if (st.kind == SynthTensorKind::kNorm || st.kind == SynthTensorKind::kRouter) {
      // llama.cpp keeps norms and the router in f32.
      RETURN_IF_ERROR(add(st.name, gguf::GgmlType::kF32, st.ne,
                                       [t](std::span<uint8_t> dst) { return ToF32(*t, dst); }));
      continue;
    }
    const bool is_q = absl::EndsWith(st.name, ".attn_q.weight"), is_k = absl::EndsWith(st.name, ".attn_k.weight");
    if (hf.permute_qk && (is_q || is_k)) {
      const int64_t heads = is_q ? g.n_head : g.n_head_kv;
      const uint64_t row_bytes = t->data.size() / static_cast<uint64_t>(heads * g.head_dim);
      const int64_t head_dim = g.head_dim;
      RETURN_IF_ERROR(add(st.name, t->type, st.ne, [t, heads, head_dim, row_bytes](std::span<uint8_t> dst) {
        PermuteRowsForNormalRope(t->data, dst, heads, head_dim, row_bytes);
        return absl::OkStatus();
      }));
      continue;
    }
    RETURN_IF_ERROR(add(st.name, t->type, st.ne, [t](std::span<uint8_t> dst) {
      std::memcpy(dst.data(), t->data.data(), t->data.size());
      return absl::OkStatus();
    }));
  }
  for (const SafetensorsTensor* t : ckpt->tensors()) {
    if (used.contains(t->name) || absl::EndsWith(t->name, "rotary_emb.inv_freq")) continue;
    return absl::UnimplementedError(absl::StrCat(file_of(*t), ": tensor '", t->name, "' has no place in a ",
                                                 std::string(hf.hf_name), " model as Strata reads it"));
  }
  return writer.WriteFile(options.output);
}

}  // namespace strata::packtool
