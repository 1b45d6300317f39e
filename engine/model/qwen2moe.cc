// Qwen2-MoE (Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B): GQA attention with q/k/v biases, NEOX RoPE, a softmax
// router whose top-k weights are NOT renormalised, SwiGLU experts, and a shared expert on every token
// whose output is scaled by sigmoid(ffn_gate_inp_shexp . h) (llama.cpp src/models/qwen2moe.cpp).

#include <algorithm>
#include <optional>

#include "engine/model/model_config.h"
#include "engine/status_macros.h"

namespace strata::model {

absl::Status ConfigureQwen2Moe(const gguf::Metadata& m, ModelConfig* c) {
  // llama.cpp's fallbacks: feed_forward_length / expert_used_count for the experts, feed_forward_length
  // for the shared expert.
  std::optional<int64_t> ff;
  if (m.Has("qwen2moe.feed_forward_length")) {
    ASSIGN_OR_RETURN(ff, ReadDimension(m, "qwen2moe.feed_forward_length"));
  }
  std::optional<int64_t> expert_fallback;
  if (ff.has_value()) expert_fallback = std::max<int64_t>(1, *ff / c->n_expert_used);
  ASSIGN_OR_RETURN(c->expert_ff, ReadDimension(m, "qwen2moe.expert_feed_forward_length", expert_fallback));
  ASSIGN_OR_RETURN(c->shared_expert_ff, ReadDimension(m, "qwen2moe.expert_shared_feed_forward_length", ff));
  c->rope_style = RopeStyle::kNeox;
  c->qkv_bias = true;
  c->router_renorm = false;
  c->shared_expert_gate = true;
  return absl::OkStatus();
}

}  // namespace strata::model
