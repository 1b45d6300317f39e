#include "engine/model/model_config.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/status_macros.h"

namespace strata::model {

const std::vector<Architecture>& ArchitectureTable() {
  static const std::vector<Architecture> table = {
      {"qwen3moe", "Qwen3-MoE", &ConfigureQwen3Moe},
      {"llama", "Mixtral (llama with experts)", &ConfigureMixtral},
  };
  return table;
}

absl::StatusOr<ModelConfig> ReadModelConfig(const gguf::Metadata& m) {
  ModelConfig c;
  ASSIGN_OR_RETURN(c.arch, m.GetString("general.architecture"));
  const Architecture* arch = nullptr;
  std::vector<std::string> known;
  for (const Architecture& a : ArchitectureTable()) {
    if (a.gguf_name == c.arch) arch = &a;
    known.emplace_back(a.gguf_name);
  }
  if (arch == nullptr) {
    return absl::UnimplementedError(absl::StrCat("general.architecture '", c.arch,
                                                 "' is not supported (supported: ", absl::StrJoin(known, ", "), ")"));
  }
  const std::string p = c.arch + ".";
  auto get = [&](const std::string& key, int64_t* out) -> absl::Status {
    ASSIGN_OR_RETURN(const uint64_t v, m.GetUint(p + key));
    if (v == 0 || v > (uint64_t{1} << 31)) {
      return absl::InvalidArgumentError(absl::StrCat(p, key, " is ", v, ", expected 1 .. 2^31"));
    }
    *out = static_cast<int64_t>(v);
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(get("block_count", &c.n_layer));
  RETURN_IF_ERROR(get("embedding_length", &c.n_embd));
  RETURN_IF_ERROR(get("attention.head_count", &c.n_head));
  RETURN_IF_ERROR(get("context_length", &c.n_ctx_train));
  RETURN_IF_ERROR(get("expert_count", &c.n_expert));
  RETURN_IF_ERROR(get("expert_used_count", &c.n_expert_used));
  ASSIGN_OR_RETURN(const uint64_t kv, m.GetUintOr(p + "attention.head_count_kv", c.n_head));
  c.n_head_kv = static_cast<int64_t>(kv);
  ASSIGN_OR_RETURN(const uint64_t head_dim, m.GetUintOr(p + "attention.key_length", c.n_embd / c.n_head));
  c.head_dim = static_cast<int64_t>(head_dim);
  ASSIGN_OR_RETURN(const double base, m.GetFloatOr(p + "rope.freq_base", 10000.0));
  c.rope_freq_base = static_cast<float>(base);
  ASSIGN_OR_RETURN(const double eps, m.GetFloatOr(p + "attention.layer_norm_rms_epsilon", 1e-6));
  c.rms_norm_eps = static_cast<float>(eps);
  ASSIGN_OR_RETURN(const std::vector<std::string> tokens, m.GetStringArray("tokenizer.ggml.tokens"));
  c.n_vocab = static_cast<int64_t>(tokens.size());
  RETURN_IF_ERROR(arch->configure(m, &c));

  if (c.n_head_kv == 0 || c.n_head % c.n_head_kv != 0) {
    return absl::InvalidArgumentError(absl::StrCat(p, "attention.head_count (", c.n_head,
                                                   ") is not a multiple of attention.head_count_kv (", c.n_head_kv, ")"));
  }
  if (c.head_dim == 0 || c.head_dim % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(p, "attention.key_length is ", c.head_dim, ", expected an even number"));
  }
  ASSIGN_OR_RETURN(const uint64_t value_dim, m.GetUintOr(p + "attention.value_length", c.head_dim));
  if (static_cast<int64_t>(value_dim) != c.head_dim) {
    return absl::UnimplementedError(absl::StrCat(p, "attention.value_length ", value_dim, " differs from key_length ",
                                                 c.head_dim, "; Strata needs them equal"));
  }
  // Hyper-parameters the forward pass does not implement are refused, never ignored.
  ASSIGN_OR_RETURN(const double rope_scale, m.GetFloatOr(p + "rope.scaling.factor", 1.0));
  if (rope_scale != 1.0 && rope_scale != 0.0) {
    return absl::UnimplementedError(absl::StrCat(p, "rope.scaling.factor is ", rope_scale,
                                                 "; Strata does not implement RoPE scaling (expected 1)"));
  }
  ASSIGN_OR_RETURN(const uint64_t rope_dim, m.GetUintOr(p + "rope.dimension_count", c.head_dim));
  if (static_cast<int64_t>(rope_dim) != c.head_dim) {
    return absl::UnimplementedError(absl::StrCat(p, "rope.dimension_count ", rope_dim, " differs from the head size ",
                                                 c.head_dim, "; Strata rotates whole heads"));
  }
  if (c.n_expert_used > c.n_expert) {
    return absl::InvalidArgumentError(absl::StrCat(p, "expert_used_count ", c.n_expert_used, " exceeds expert_count ",
                                                   c.n_expert));
  }
  if (c.n_vocab == 0) return absl::InvalidArgumentError("tokenizer.ggml.tokens is empty");
  return c;
}

}  // namespace strata::model
