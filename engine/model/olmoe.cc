// OLMoE: attention with an RMSNorm over the whole q projection and the whole k projection (not per head)
// before NEOX RoPE, a softmax router whose top-k weights are NOT renormalised, SwiGLU experts whose width
// is feed_forward_length (llama.cpp src/models/olmoe.cpp).

#include "engine/model/model_config.h"
#include "engine/status_macros.h"

namespace strata::model {

absl::Status ConfigureOlmoe(const gguf::Metadata& m, ModelConfig* c) {
  ASSIGN_OR_RETURN(c->expert_ff, ReadDimension(m, "olmoe.feed_forward_length"));
  c->rope_style = RopeStyle::kNeox;
  c->qk_norm_whole = true;
  c->router_renorm = false;
  return absl::OkStatus();
}

}  // namespace strata::model
