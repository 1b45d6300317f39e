// The reference model's deepseek2, written from DeepSeek's modeling_deepseek.py (DeepSeek-V2 and V3 on
// Hugging Face: DeepseekV2Attention / DeepseekV3Attention.forward, DeepseekV2YarnRotaryEmbedding, MoEGate)
// and llama.cpp's src/models/deepseek2.cpp for the GGUF names and the RoPE pairing (NORMAL: (2i, 2i + 1),
// which is what modeling_deepseek.py's q_pe/k_pe permutation before rotate_half amounts to):
//   q = q_proj h, or q_b_proj(RmsNorm(q_a_proj h)); per head q = [q_nope, q_pe]
//   [c, k_pe] = kv_a_proj_with_mqa h; kv = kv_b_proj RmsNorm(c); per head kv = [k_nope, v]
//   RoPE(q_pe), RoPE(k_pe) (k_pe shared by all heads); key = [k_nope, k_pe]
//   softmax(q . key * scale) v, scale = head_dim^-1/2 * mscale^2, mscale = 1 + yarn_log_multiplier ln(factor)
// computed the naive way: every head's keys and values decompressed. YaRN frequencies as
// DeepseekV2YarnRotaryEmbedding (beta_fast 32, beta_slow 1, mscale / mscale_all_dim giving unit magnitude).
// Expert groups: V2's group_limited_greedy ranks a group by its best score, V3's noaux_tc by the sum of its two
// best biased scores; experts outside the topk_group best groups are not chosen.

#include "tests/testing/reference_deepseek2.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "engine/status_macros.h"

namespace strata::testing::reference_internal {
namespace {

using Hparams = ReferenceModel::Hparams;

// DeepseekV2YarnRotaryEmbedding's inv_freq (plain RoPE's when there is no YaRN).
std::vector<double> InverseFrequencies(const Hparams& hp) {
  const double dim = static_cast<double>(hp.rope_dim), base = hp.rope_freq_base;
  std::vector<double> extrapolated(hp.rope_dim / 2);
  for (size_t i = 0; i < extrapolated.size(); ++i) extrapolated[i] = 1.0 / std::pow(base, 2.0 * i / dim);
  if (hp.yarn_factor == 0.0) return extrapolated;
  auto correction_dim = [&](double rotations) {
    return dim * std::log(hp.yarn_original_context / (rotations * 2.0 * M_PI)) / (2.0 * std::log(base));
  };
  const double low = std::max(std::floor(correction_dim(32.0)), 0.0);
  double high = std::min(std::ceil(correction_dim(1.0)), dim - 1.0);
  if (low == high) high += 0.001;
  std::vector<double> inv(extrapolated.size());
  for (size_t i = 0; i < inv.size(); ++i) {
    const double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
    const double mask = 1.0 - ramp;  // 1: extrapolated (original), 0: interpolated
    inv[i] = extrapolated[i] / hp.yarn_factor * (1.0 - mask) + extrapolated[i] * mask;
  }
  return inv;
}

// Rotates pairs (2i, 2i + 1) of x by pos * inv[i].
void Rotate(std::span<float> x, int64_t pos, const std::vector<double>& inv) {
  for (size_t i = 0; i < inv.size(); ++i) {
    const double theta = static_cast<double>(pos) * inv[i];
    const double x0 = x[2 * i], x1 = x[2 * i + 1];
    x[2 * i] = static_cast<float>(x0 * std::cos(theta) - x1 * std::sin(theta));
    x[2 * i + 1] = static_cast<float>(x0 * std::sin(theta) + x1 * std::cos(theta));
  }
}

}  // namespace

absl::Status ReadDeepseek2Hparams(const gguf::Metadata& md, const std::string& path, Hparams* hp) {
  const std::string a = "deepseek2.";
  auto error = [&](const std::string& key, const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", a, key, " ", what));
  };
  auto uint_or = [&](const std::string& key, int64_t fallback) -> absl::StatusOr<int64_t> {
    absl::StatusOr<uint64_t> v = md.GetUintOr(a + key, static_cast<uint64_t>(fallback));
    if (!v.ok()) return absl::Status(v.status().code(), absl::StrCat(path, ": ", v.status().message()));
    if (*v > (uint64_t{1} << 30)) return error(key, "is too large");
    return static_cast<int64_t>(*v);
  };
  hp->rope_style = RopeStyle::kNormal;
  ASSIGN_OR_RETURN(hp->kv_lora_rank, uint_or("attention.kv_lora_rank", 0));
  ASSIGN_OR_RETURN(hp->q_lora_rank, uint_or("attention.q_lora_rank", 0));
  ASSIGN_OR_RETURN(hp->v_dim, uint_or("attention.value_length", 0));
  if (md.Has(a + "attention.key_length_mla")) {  // split attn_k_b / attn_v_b: the heads' sizes are here
    ASSIGN_OR_RETURN(hp->head_dim, uint_or("attention.key_length_mla", 0));
    ASSIGN_OR_RETURN(hp->v_dim, uint_or("attention.value_length_mla", 0));
  }
  ASSIGN_OR_RETURN(hp->rope_dim, uint_or("rope.dimension_count", 0));
  if (hp->kv_lora_rank == 0 || hp->v_dim == 0 || hp->rope_dim == 0 || hp->rope_dim % 2 != 0 ||
      hp->rope_dim >= hp->head_dim) {
    return error("attention.*", "latent attention needs kv_lora_rank, value_length and an even rope dimension "
                                "below key_length");
  }
  hp->nope_dim = hp->head_dim - hp->rope_dim;
  ASSIGN_OR_RETURN(const int64_t gating, uint_or("expert_gating_func", 1));
  hp->sigmoid_router = gating == 2;
  hp->group_by_top_two = hp->sigmoid_router;
  auto norm = md.GetBoolOr(a + "expert_weights_norm", false);
  auto scale = md.GetFloatOr(a + "expert_weights_scale", 1.0);
  if (!norm.ok() || !scale.ok()) return error("expert_weights_*", "unreadable");
  hp->renormalize_top_k = *norm;
  hp->routed_scale = *scale == 0.0 ? 1.0 : *scale;
  ASSIGN_OR_RETURN(hp->n_group, uint_or("expert_group_count", 1));
  ASSIGN_OR_RETURN(hp->n_group_used, uint_or("expert_group_used_count", hp->n_group));
  if (hp->n_group == 0 || hp->n_expert % hp->n_group != 0 || hp->n_group_used == 0 || hp->n_group_used > hp->n_group) {
    return error("expert_group_count", "does not divide the experts into usable groups");
  }
  ASSIGN_OR_RETURN(const int64_t expert_ff, uint_or("expert_feed_forward_length", 0));
  ASSIGN_OR_RETURN(const int64_t n_shared, uint_or("expert_shared_count", 0));
  hp->shared_ff = expert_ff * n_shared;
  ASSIGN_OR_RETURN(hp->n_dense_lead, uint_or("leading_dense_block_count", 0));
  if (hp->n_dense_lead >= hp->n_layer) return error("leading_dense_block_count", "leaves no MoE block");
  if (hp->n_dense_lead > 0) {
    ASSIGN_OR_RETURN(hp->dense_ff, uint_or("feed_forward_length", 0));
  }
  if (md.Has(a + "rope.scaling.type")) {
    auto kind = md.GetString(a + "rope.scaling.type");
    if (!kind.ok()) return error("rope.scaling.type", "unreadable");
    if (*kind == "yarn") {
      auto factor = md.GetFloat(a + "rope.scaling.factor");
      auto log_multiplier = md.GetFloatOr(a + "rope.scaling.yarn_log_multiplier", 0.0);
      if (!factor.ok() || !log_multiplier.ok() || *factor < 1.0) return error("rope.scaling.*", "unreadable");
      hp->yarn_factor = *factor;
      hp->yarn_log_multiplier = *log_multiplier;
      // llama.cpp's default (n_ctx_orig_yarn): the training context.
      ASSIGN_OR_RETURN(const int64_t n_ctx, uint_or("context_length", 0));
      ASSIGN_OR_RETURN(hp->yarn_original_context, uint_or("rope.scaling.original_context_length", n_ctx));
      if (hp->yarn_original_context <= 0) return error("rope.scaling.original_context_length", "missing");
    } else if (*kind != "none") {
      return absl::UnimplementedError(absl::StrCat(path, ": ", a, "rope.scaling.type '", *kind, "' is not implemented"));
    }
  }
  return absl::OkStatus();
}

std::vector<std::vector<float>> LatentAttention(const Hparams& hp, const ReferenceModel::Layer& layer,
                                                const std::vector<std::vector<float>>& h) {
  const int64_t n = static_cast<int64_t>(h.size()), heads = hp.n_head, rank = hp.kv_lora_rank;
  const int64_t qk = hp.head_dim, nope = hp.nope_dim, vd = hp.v_dim;
  const std::vector<double> inv = InverseFrequencies(hp);
  // queries[i], keys[i]: heads x qk; values[i]: heads x vd.
  std::vector<std::vector<float>> queries(n), keys(n), values(n);
  for (int64_t i = 0; i < n; ++i) {
    if (hp.q_lora_rank > 0) {
      std::vector<float> q_a = MatVec(layer.q_a, h[i]);
      RmsNorm(q_a, layer.q_a_norm, hp.rms_eps);
      queries[i] = MatVec(layer.q_b, q_a);
    } else {
      queries[i] = MatVec(layer.wq, h[i]);
    }
    std::vector<float> compressed = MatVec(layer.kv_a, h[i]);  // [c, k_pe]
    std::vector<float> latent(compressed.begin(), compressed.begin() + rank);
    std::vector<float> k_pe(compressed.begin() + rank, compressed.end());
    RmsNorm(latent, layer.kv_a_norm, hp.rms_eps);
    const std::vector<float> kv = MatVec(layer.kv_b, latent);  // heads x [k_nope, v]
    Rotate(k_pe, i, inv);
    keys[i].resize(heads * qk);
    values[i].resize(heads * vd);
    for (int64_t head = 0; head < heads; ++head) {
      Rotate(std::span<float>(queries[i]).subspan(head * qk + nope, hp.rope_dim), i, inv);
      const float* kv_head = kv.data() + head * (nope + vd);
      std::copy_n(kv_head, nope, keys[i].begin() + head * qk);
      std::copy(k_pe.begin(), k_pe.end(), keys[i].begin() + head * qk + nope);
      std::copy_n(kv_head + nope, vd, values[i].begin() + head * vd);
    }
  }
  const double mscale = hp.yarn_factor > 0.0 ? 1.0 + hp.yarn_log_multiplier * std::log(hp.yarn_factor) : 1.0;
  const double scale = mscale * mscale / std::sqrt(static_cast<double>(qk));
  std::vector<std::vector<float>> out(n);
  for (int64_t i = 0; i < n; ++i) {
    std::vector<float> attn(heads * vd, 0.0f);
    for (int64_t head = 0; head < heads; ++head) {
      std::vector<double> p(i + 1);
      double max_score = -INFINITY, total = 0;
      for (int64_t j = 0; j <= i; ++j) {
        double dot = 0;
        for (int64_t c = 0; c < qk; ++c) dot += static_cast<double>(queries[i][head * qk + c]) * keys[j][head * qk + c];
        p[j] = dot * scale;
        max_score = std::max(max_score, p[j]);
      }
      for (int64_t j = 0; j <= i; ++j) total += p[j] = std::exp(p[j] - max_score);
      for (int64_t c = 0; c < vd; ++c) {
        double acc = 0;
        for (int64_t j = 0; j <= i; ++j) acc += p[j] / total * values[j][head * vd + c];
        attn[head * vd + c] = static_cast<float>(acc);
      }
    }
    out[i] = MatVec(layer.wo, attn);
  }
  return out;
}

void KeepBestGroups(const Hparams& hp, std::vector<double>* choice) {
  if (hp.n_group <= 1) return;
  const int64_t per_group = hp.n_expert / hp.n_group;
  std::vector<double> group_score(hp.n_group);
  for (int64_t g = 0; g < hp.n_group; ++g) {
    std::vector<double> members(choice->begin() + g * per_group, choice->begin() + (g + 1) * per_group);
    std::sort(members.begin(), members.end(), std::greater<>());
    group_score[g] = hp.group_by_top_two ? members[0] + members[1] : members[0];
  }
  std::vector<bool> kept(hp.n_group, false);
  for (int64_t k = 0; k < hp.n_group_used; ++k) {
    int64_t best = -1;
    for (int64_t g = 0; g < hp.n_group; ++g) {
      if (!kept[g] && (best < 0 || group_score[g] > group_score[best])) best = g;
    }
    kept[best] = true;
  }
  for (int64_t e = 0; e < hp.n_expert; ++e) {
    if (!kept[e / per_group]) (*choice)[e] = -INFINITY;
  }
}

}  // namespace strata::testing::reference_internal
