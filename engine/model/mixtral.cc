// Mixtral: llama.cpp's "llama" architecture with expert_count > 0. Llama-style attention (no q/k norm,
// normal RoPE), softmax over the top-k router logits (the same weights as a softmax over all logits
// renormalised over the top k), SwiGLU experts whose width is feed_forward_length.

#include "absl/strings/str_cat.h"
#include "engine/model/model_config.h"
#include "engine/status_macros.h"

namespace strata::model {

absl::Status ConfigureMixtral(const gguf::Metadata& m, ModelConfig* c) {
  ASSIGN_OR_RETURN(c->expert_ff, ReadDimension(m, "llama.feed_forward_length"));
  c->rope_style = RopeStyle::kNormal;
  c->qk_norm = false;
  return absl::OkStatus();
}

}  // namespace strata::model
