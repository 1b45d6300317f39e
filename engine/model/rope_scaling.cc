// RoPE scaling keys (<arch>.rope.scaling.*), as llama.cpp reads them (llama_model::load_hparams,
// llama_context's defaults): no scaling, linear with factor 1 (which is none), or YaRN. Anything else that
// would change the math is refused naming the key.

#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "engine/model/model_config.h"
#include "engine/status_macros.h"

namespace strata::model {
namespace {

// A float key, `fallback` when absent; refused naming the key unless finite and in [lo, hi].
absl::StatusOr<float> ReadFloatIn(const gguf::Metadata& m, const std::string& key, double fallback, double lo,
                                  double hi) {
  ASSIGN_OR_RETURN(const double v, m.GetFloatOr(key, fallback));
  if (!std::isfinite(v) || v < lo || v > hi) {
    return absl::InvalidArgumentError(absl::StrCat(key, " is ", v, ", expected ", lo, " .. ", hi));
  }
  return static_cast<float>(v);
}

}  // namespace

absl::Status ReadRopeScaling(const gguf::Metadata& m, ModelConfig* c, bool log_multiplier_used) {
  const std::string p = c->arch + ".rope.scaling.";
  std::string kind = "none";
  if (m.Has(p + "type")) {
    ASSIGN_OR_RETURN(kind, m.GetString(p + "type"));
  }
  ASSIGN_OR_RETURN(const double factor, m.GetFloatOr(p + "factor", 1.0));
  if (kind == "none" || kind == "linear") {
    if (factor != 1.0 && factor != 0.0) {  // 0: unset in llama.cpp
      return absl::UnimplementedError(absl::StrCat(p, "factor is ", factor, " with ", p, "type ", kind,
                                                   "; Strata does not implement linear RoPE scaling (expected 1)"));
    }
    return absl::OkStatus();
  }
  if (kind != "yarn") {
    return absl::UnimplementedError(absl::StrCat(p, "type is '", kind,
                                                 "'; Strata implements none and yarn RoPE scaling"));
  }
  if (!std::isfinite(factor) || factor <= 1.0 || factor > 1e4) {
    return absl::InvalidArgumentError(absl::StrCat(p, "factor is ", factor, " with ", p,
                                                   "type yarn, expected a value above 1 (up to 10000)"));
  }
  RopeYarn& y = c->yarn;
  y.factor = static_cast<float>(factor);
  ASSIGN_OR_RETURN(y.original_context, ReadDimension(m, p + "original_context_length", c->n_ctx_train));
  ASSIGN_OR_RETURN(y.beta_fast, ReadFloatIn(m, p + "yarn_beta_fast", 32.0, 1e-3, 1e6));
  ASSIGN_OR_RETURN(y.beta_slow, ReadFloatIn(m, p + "yarn_beta_slow", 1.0, 1e-3, 1e6));
  ASSIGN_OR_RETURN(y.attn_factor, ReadFloatIn(m, p + "yarn_attn_factor", 1.0, 1e-3, 1e3));
  // llama.cpp's ext_factor defaults to 1 for yarn (a negative value means unset); other mixes are not
  // implemented. yarn_log_multiplier (DeepSeek's mscale) scales the attention: only where the architecture
  // applies it.
  ASSIGN_OR_RETURN(const double ext, m.GetFloatOr(p + "yarn_ext_factor", -1.0));
  if (ext >= 0.0 && ext != 1.0) {
    return absl::UnimplementedError(absl::StrCat(p, "yarn_ext_factor is ", ext, "; Strata implements 1"));
  }
  ASSIGN_OR_RETURN(const double log_mul, m.GetFloatOr(p + "yarn_log_multiplier", 0.0));
  if (!std::isfinite(log_mul) || log_mul < 0.0 || log_mul > 10.0) {
    return absl::InvalidArgumentError(absl::StrCat(p, "yarn_log_multiplier is ", log_mul, ", expected 0 .. 10"));
  }
  y.log_multiplier = static_cast<float>(log_mul);
  if (!log_multiplier_used && log_mul != 0.0) {
    return absl::UnimplementedError(absl::StrCat(p, "yarn_log_multiplier is ", log_mul,
                                                 "; Strata does not implement it (expected 0)"));
  }
  c->rope_yarn = true;
  return absl::OkStatus();
}

}  // namespace strata::model
