#include "engine/model/model_config.h"

#include <algorithm>
#include <cmath>

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

absl::StatusOr<const Architecture*> FindArchitecture(std::string_view gguf_arch) {
  std::vector<std::string> known;
  for (const Architecture& a : ArchitectureTable()) {
    if (a.gguf_name == gguf_arch) return &a;
    known.emplace_back(a.gguf_name);
  }
  return absl::UnimplementedError(absl::StrCat("general.architecture '", std::string(gguf_arch),
                                               "' is not supported (supported: ", absl::StrJoin(known, ", "), ")"));
}

absl::StatusOr<int64_t> ReadDimension(const gguf::Metadata& m, const std::string& key,
                                      std::optional<int64_t> fallback) {
  uint64_t v = 0;
  if (fallback.has_value()) {
    ASSIGN_OR_RETURN(v, m.GetUintOr(key, static_cast<uint64_t>(*fallback)));
  } else {
    ASSIGN_OR_RETURN(v, m.GetUint(key));
  }
  if (v == 0 || v > (uint64_t{1} << 31)) return absl::InvalidArgumentError(absl::StrCat(key, " is ", v, ", expected 1 .. 2^31"));
  return static_cast<int64_t>(v);
}

absl::StatusOr<ModelConfig> ReadModelConfig(const gguf::Metadata& m) {
  ModelConfig c;
  ASSIGN_OR_RETURN(c.arch, m.GetString("general.architecture"));
  ASSIGN_OR_RETURN(const Architecture* arch, FindArchitecture(c.arch));
  const std::string p = c.arch + ".";
  ASSIGN_OR_RETURN(c.n_layer, ReadDimension(m, p + "block_count"));
  ASSIGN_OR_RETURN(c.n_embd, ReadDimension(m, p + "embedding_length"));
  ASSIGN_OR_RETURN(c.n_head, ReadDimension(m, p + "attention.head_count"));
  ASSIGN_OR_RETURN(c.n_ctx_train, ReadDimension(m, p + "context_length"));
  ASSIGN_OR_RETURN(c.n_expert, ReadDimension(m, p + "expert_count"));
  ASSIGN_OR_RETURN(c.n_expert_used, ReadDimension(m, p + "expert_used_count"));
  ASSIGN_OR_RETURN(c.n_head_kv, ReadDimension(m, p + "attention.head_count_kv", c.n_head));
  ASSIGN_OR_RETURN(c.head_dim, ReadDimension(m, p + "attention.key_length", std::max<int64_t>(1, c.n_embd / c.n_head)));
  ASSIGN_OR_RETURN(const double base, m.GetFloatOr(p + "rope.freq_base", 10000.0));
  if (!std::isfinite(base) || base <= 1.0 || base > 1e12) {
    return absl::InvalidArgumentError(absl::StrCat(p, "rope.freq_base is ", base, ", expected a finite value above 1"));
  }
  c.rope_freq_base = static_cast<float>(base);
  ASSIGN_OR_RETURN(const double eps, m.GetFloatOr(p + "attention.layer_norm_rms_epsilon", 1e-6));
  if (!std::isfinite(eps) || eps <= 0.0 || eps >= 1.0) {
    return absl::InvalidArgumentError(
        absl::StrCat(p, "attention.layer_norm_rms_epsilon is ", eps, ", expected a finite value in (0, 1)"));
  }
  c.rms_norm_eps = static_cast<float>(eps);
  ASSIGN_OR_RETURN(const std::vector<std::string> tokens, m.GetStringArray("tokenizer.ggml.tokens"));
  c.n_vocab = static_cast<int64_t>(tokens.size());
  RETURN_IF_ERROR(arch->configure(m, &c));

  if (c.n_head % c.n_head_kv != 0) {  // both >= 1 (ReadDimension)
    return absl::InvalidArgumentError(absl::StrCat(p, "attention.head_count (", c.n_head,
                                                   ") is not a multiple of attention.head_count_kv (", c.n_head_kv, ")"));
  }
  if (c.head_dim % 2 != 0) {
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
