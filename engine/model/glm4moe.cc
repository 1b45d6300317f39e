// GLM-4.5 / 4.6 (llama.cpp "glm4moe", src/models/glm4-moe.cpp): GQA attention with q/k/v biases and NEOX
// RoPE over the first rope.dimension_count values of each head (half of it in GLM-4.5), the FFN's pre-norm
// named post_attention_norm, the first leading_dense_block_count blocks with a dense SwiGLU FFN, the others
// with a sigmoid router whose choice adds the score-correction bias exp_probs_b (weights without it,
// renormalised if expert_weights_norm, times expert_weights_scale) and an ungated shared expert of
// expert_shared_count experts' width. A multi-token-prediction block after the model's
// (nextn_predict_layers, in GLM-4.5's GGUFs) is left out by ReadModelConfig. GLM-4.5 (not Air) normalizes
// each head of q and k (RMSNorm, after the biases, before RoPE), which its GGUFs say by carrying the tensors.

#include <cmath>

#include "absl/strings/str_cat.h"
#include "engine/model/model_config.h"
#include "engine/status_macros.h"

namespace strata::model {

absl::Status ConfigureGlm4Moe(const gguf::Metadata& m, ModelConfig* c) {
  ASSIGN_OR_RETURN(c->expert_ff, ReadDimension(m, "glm4moe.expert_feed_forward_length"));
  ASSIGN_OR_RETURN(const uint64_t n_shared, m.GetUint("glm4moe.expert_shared_count"));
  if (n_shared > 64) {
    return absl::InvalidArgumentError(absl::StrCat("glm4moe.expert_shared_count is ", n_shared, ", expected 0 .. 64"));
  }
  c->shared_expert_ff = c->expert_ff * static_cast<int64_t>(n_shared);
  ASSIGN_OR_RETURN(const uint64_t n_dense, m.GetUintOr("glm4moe.leading_dense_block_count", 0));
  RETURN_IF_ERROR(CheckLeadingDenseBlocks(*c, n_dense));
  c->n_dense_lead = static_cast<int64_t>(n_dense);
  if (c->n_dense_lead > 0) {
    ASSIGN_OR_RETURN(c->dense_ff, ReadDimension(m, "glm4moe.feed_forward_length"));
  }
  if (m.Has("glm4moe.rope.dimension_sections")) {
    return absl::UnimplementedError("glm4moe.rope.dimension_sections is set; Strata does not implement M-RoPE");
  }
  ASSIGN_OR_RETURN(c->router_renorm, m.GetBoolOr("glm4moe.expert_weights_norm", false));
  ASSIGN_OR_RETURN(const double scale, m.GetFloatOr("glm4moe.expert_weights_scale", 1.0));
  if (!std::isfinite(scale) || scale < 0.0 || scale > 1e3) {
    return absl::InvalidArgumentError(absl::StrCat("glm4moe.expert_weights_scale is ", scale, ", expected 0 .. 1000"));
  }
  c->routed_scale = scale == 0.0 ? 1.0f : static_cast<float>(scale);  // 0: unset in llama.cpp
  c->rope_style = RopeStyle::kNeox;
  c->partial_rope = true;
  c->qkv_bias = true;
  c->router_gating = RouterGating::kSigmoid;
  c->router_score_bias = true;
  c->ffn_norm_name = "post_attention_norm";
  return absl::OkStatus();
}

absl::Status ConfigureGlm4MoeTensors(const gguf::GgufFile& file, ModelConfig* c) {
  // GLM-4.5 has a per-head q/k RMSNorm (use_qk_norm), Air has not; llama.cpp takes it where the tensors are.
  const gguf::TensorInfo* q_norm = file.FindTensor("blk.0.attn_q_norm.weight");
  if (q_norm == nullptr) return absl::OkStatus();
  if (q_norm->n_elements() != c->head_dim) {
    return absl::InvalidArgumentError(absl::StrCat(file.path(), ": tensor 'blk.0.attn_q_norm.weight' has ",
                                                   q_norm->n_elements(), " values; a per-head q norm has key_length ",
                                                   c->head_dim));
  }
  c->qk_norm = true;
  return absl::OkStatus();
}

}  // namespace strata::model
