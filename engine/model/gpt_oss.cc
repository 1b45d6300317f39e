// gpt-oss (gpt-oss-20b / 120b; llama.cpp "gpt-oss", LLM_ARCH_OPENAI_MOE, src/models/openai-moe-iswa.cpp):
// GQA attention with q/k/v and output biases, NEOX RoPE (YaRN-scaled in the released models), a learned
// per-head sink logit joining each softmax's denominator (attn_sinks), every even block attending to its
// last attention.sliding_window positions only; the FFN's pre-norm named post_attention_norm; a router with a
// bias (ffn_gate_inp.bias) whose top-k logits are softmaxed among themselves (SOFTMAX_WEIGHT); experts with
// biases and the clamped SwiGLU (swiglu_oai: alpha 1.702, limit 7).

#include "engine/model/model_config.h"
#include "engine/status_macros.h"

namespace strata::model {

absl::Status ConfigureGptOss(const gguf::Metadata& m, ModelConfig* c) {
  ASSIGN_OR_RETURN(c->expert_ff, ReadDimension(m, "gpt-oss.expert_feed_forward_length"));
  ASSIGN_OR_RETURN(c->sliding_window, ReadDimension(m, "gpt-oss.attention.sliding_window"));
  c->swa_pattern = 2;  // the even blocks
  c->rope_style = RopeStyle::kNeox;
  c->qkv_bias = true;
  c->attn_sinks = true;
  c->attn_output_bias = true;
  c->router_gating = RouterGating::kSoftmaxTopK;
  c->router_logit_bias = true;
  c->expert_biases = true;
  c->clamped_swiglu = true;
  c->ffn_norm_name = "post_attention_norm";
  return absl::OkStatus();
}

}  // namespace strata::model
