// Qwen3-MoE: GQA attention with per-head q/k RMSNorm, NeoX RoPE, softmax router with the top-k weights
// renormalised (norm_topk_prob), SwiGLU experts.

#include "absl/strings/str_cat.h"
#include "engine/model/model_config.h"
#include "engine/status_macros.h"

namespace strata::model {

absl::Status ConfigureQwen3Moe(const gguf::Metadata& m, ModelConfig* c) {
  ASSIGN_OR_RETURN(c->expert_ff, ReadDimension(m, "qwen3moe.expert_feed_forward_length"));
  c->rope_style = RopeStyle::kNeox;
  c->qk_norm = true;
  return absl::OkStatus();
}

}  // namespace strata::model
