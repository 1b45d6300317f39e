// DeepSeek-V2 / V2-Lite / V3 and Kimi-K2 (llama.cpp "deepseek2", src/models/deepseek2.cpp; the models'
// modeling_deepseek.py): multi-head latent attention (q directly or through a LoRA, keys and values from
// one normed latent per token plus a shared RoPE'd key part, NORMAL RoPE over the last rope.dimension_count
// values of each q/k head), YaRN RoPE scaling whose log multiplier raises the attention scale, the first
// leading_dense_block_count blocks with a dense SwiGLU FFN, then a router (softmax for V2, sigmoid with the
// score-correction bias exp_probs_b for V3) that picks top-k experts within the best expert groups, weights
// renormalised if expert_weights_norm times expert_weights_scale, plus an ungated shared expert of
// expert_shared_count experts' width. Multi-token-prediction blocks after the model's (nextn_predict_layers)
// are left out by ReadModelConfig.
//
// Both GGUF forms load: attn_kv_b whole, or split into attn_k_b / attn_v_b (newer converters, which also write
// attention.key_length_mla / value_length_mla).

#include <cmath>

#include "absl/strings/str_cat.h"
#include "engine/model/model_config.h"
#include "engine/status_macros.h"

namespace strata::model {
namespace {

constexpr char kPrefix[] = "deepseek2.";

std::string Key(const char* name) { return absl::StrCat(kPrefix, name); }

absl::Status ConfigureLatentAttention(const gguf::Metadata& m, ModelConfig* c) {
  ASSIGN_OR_RETURN(c->mla.kv_lora_rank, ReadDimension(m, Key("attention.kv_lora_rank")));
  ASSIGN_OR_RETURN(const int64_t key_length, ReadDimension(m, Key("attention.key_length")));
  ASSIGN_OR_RETURN(const int64_t value_length, ReadDimension(m, Key("attention.value_length")));
  ASSIGN_OR_RETURN(c->rope_dim, ReadDimension(m, Key("rope.dimension_count")));
  if (m.Has(Key("attention.key_length_mla")) || m.Has(Key("attention.value_length_mla"))) {
    // Newer GGUFs (attn_k_b / attn_v_b): key_length and value_length describe the cached latent, the _mla
    // keys the heads.
    ASSIGN_OR_RETURN(c->head_dim, ReadDimension(m, Key("attention.key_length_mla")));
    ASSIGN_OR_RETURN(c->mla.v_dim, ReadDimension(m, Key("attention.value_length_mla")));
    if (key_length != c->mla.kv_lora_rank + c->rope_dim || value_length != c->mla.kv_lora_rank) {
      return absl::InvalidArgumentError(absl::StrCat(
          Key("attention.key_length"), " is ", key_length, " and value_length ", value_length, "; with ",
          Key("attention.key_length_mla"), " they are expected to be kv_lora_rank + rope.dimension_count (",
          c->mla.kv_lora_rank + c->rope_dim, ") and kv_lora_rank (", c->mla.kv_lora_rank, ")"));
    }
  } else {
    c->head_dim = key_length;
    c->mla.v_dim = value_length;
  }
  ASSIGN_OR_RETURN(const uint64_t q_lora, m.GetUintOr(Key("attention.q_lora_rank"), 0));  // 0: none (V2-Lite)
  if (q_lora > (uint64_t{1} << 31)) {
    return absl::InvalidArgumentError(
        absl::StrCat(Key("attention.q_lora_rank"), " is ", q_lora, ", expected 0 .. 2^31"));
  }
  c->mla.q_lora_rank = static_cast<int64_t>(q_lora);
  if (c->rope_dim % 2 != 0 || c->rope_dim >= c->head_dim) {
    return absl::InvalidArgumentError(absl::StrCat(Key("rope.dimension_count"), " is ", c->rope_dim,
                                                   ", expected an even number below the key head size (",
                                                   c->head_dim, ")"));
  }
  c->mla.nope_dim = c->head_dim - c->rope_dim;
  c->partial_rope = true;
  c->rope_style = RopeStyle::kNormal;
  return absl::OkStatus();
}

// rope.scaling.*: read as for every architecture (ReadRopeScaling), with DeepSeek's yarn_log_multiplier,
// and YaRN's magnitude moved from the rotation into the attention scale as llama.cpp's deepseek2 graph does
// (its RoPE attn_factor cancels the magnitude; kq_scale carries mscale^2, below).
absl::Status ConfigureYarn(const gguf::Metadata& m, ModelConfig* c) {
  RETURN_IF_ERROR(ReadRopeScaling(m, c, /*log_multiplier_used=*/true));
  if (!c->rope_yarn) return absl::OkStatus();
  if (c->yarn.attn_factor != 1.0f) {
    return absl::UnimplementedError(absl::StrCat(Key("rope.scaling.yarn_attn_factor"), " is ", c->yarn.attn_factor,
                                                 "; Strata implements deepseek2's YaRN with 1"));
  }
  c->yarn.rotation_magnitude = false;
  return absl::OkStatus();
}

absl::Status ConfigureRouter(const gguf::Metadata& m, ModelConfig* c) {
  ASSIGN_OR_RETURN(const uint64_t gating, m.GetUintOr(Key("expert_gating_func"), 0));
  // 0 (absent, older V2 GGUFs): softmax, as llama.cpp reads it; 1 softmax; 2 sigmoid.
  if (gating > 2) {
    return absl::UnimplementedError(absl::StrCat(Key("expert_gating_func"), " is ", gating,
                                                 "; expected 1 (softmax) or 2 (sigmoid)"));
  }
  const bool sigmoid = gating == 2;
  c->router_gating = sigmoid ? RouterGating::kSigmoid : RouterGating::kSoftmax;
  c->router_score_bias = sigmoid;  // V3's exp_probs_b; V2 has none
  // V2 ranks groups by their best score (group_limited_greedy), V3 by the sum of their two best biased scores
  // (noaux_tc): modeling_deepseek.py of each.
  c->group_score = sigmoid ? GroupScore::kTopTwoSum : GroupScore::kMax;
  ASSIGN_OR_RETURN(c->router_renorm, m.GetBoolOr(Key("expert_weights_norm"), false));
  ASSIGN_OR_RETURN(const double scale, m.GetFloatOr(Key("expert_weights_scale"), 1.0));
  if (!std::isfinite(scale) || scale < 0.0 || scale > 1e3) {
    return absl::InvalidArgumentError(absl::StrCat(Key("expert_weights_scale"), " is ", scale, ", expected 0 .. 1000"));
  }
  c->routed_scale = scale == 0.0 ? 1.0f : static_cast<float>(scale);  // 0: unset in llama.cpp
  ASSIGN_OR_RETURN(const uint64_t groups, m.GetUintOr(Key("expert_group_count"), 1));
  ASSIGN_OR_RETURN(const uint64_t used, m.GetUintOr(Key("expert_group_used_count"), groups));
  if (groups == 0 || static_cast<int64_t>(groups) > c->n_expert || c->n_expert % static_cast<int64_t>(groups) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(Key("expert_group_count"), " is ", groups,
                                                   ", expected a divisor of expert_count (", c->n_expert, ")"));
  }
  const int64_t per_group = c->n_expert / static_cast<int64_t>(groups);
  if (used == 0 || used > groups || static_cast<int64_t>(used) * per_group < c->n_expert_used) {
    return absl::InvalidArgumentError(absl::StrCat(Key("expert_group_used_count"), " is ", used, ", expected 1 .. ",
                                                   groups, " groups of ", per_group,
                                                   " experts holding at least expert_used_count (", c->n_expert_used,
                                                   ")"));
  }
  if (groups > 1 && c->group_score == GroupScore::kTopTwoSum && per_group < 2) {
    return absl::InvalidArgumentError(absl::StrCat(Key("expert_group_count"), " is ", groups,
                                                   ": a sigmoid router ranks groups by their two best experts, so ",
                                                   "each group needs at least 2 of the ", c->n_expert));
  }
  c->n_expert_group = static_cast<int64_t>(groups);
  c->n_group_used = static_cast<int64_t>(used);
  return absl::OkStatus();
}

}  // namespace

absl::Status ConfigureDeepseek2(const gguf::Metadata& m, ModelConfig* c) {
  RETURN_IF_ERROR(ConfigureLatentAttention(m, c));
  RETURN_IF_ERROR(ConfigureYarn(m, c));
  RETURN_IF_ERROR(ConfigureRouter(m, c));
  ASSIGN_OR_RETURN(c->expert_ff, ReadDimension(m, Key("expert_feed_forward_length")));
  ASSIGN_OR_RETURN(const uint64_t n_shared, m.GetUintOr(Key("expert_shared_count"), 0));
  if (n_shared > 64) {
    return absl::InvalidArgumentError(absl::StrCat(Key("expert_shared_count"), " is ", n_shared, ", expected 0 .. 64"));
  }
  c->shared_expert_ff = c->expert_ff * static_cast<int64_t>(n_shared);
  ASSIGN_OR_RETURN(const uint64_t n_dense, m.GetUintOr(Key("leading_dense_block_count"), 0));
  RETURN_IF_ERROR(CheckLeadingDenseBlocks(*c, n_dense));
  c->n_dense_lead = static_cast<int64_t>(n_dense);
  if (c->n_dense_lead > 0) {
    ASSIGN_OR_RETURN(c->dense_ff, ReadDimension(m, Key("feed_forward_length")));
  }
  // llama.cpp's kq_scale: mscale^2 / sqrt(key_length), mscale = 1 + yarn_log_multiplier * ln(factor); the
  // RoPE itself keeps unit magnitude (its attn_factor cancels YaRN's).
  const float mscale = c->rope_yarn ? 1.0f + c->yarn.log_multiplier * std::log(c->yarn.factor) : 1.0f;
  c->attention_scale = mscale * mscale / std::sqrt(static_cast<float>(c->head_dim));
  return absl::OkStatus();
}

}  // namespace strata::model
