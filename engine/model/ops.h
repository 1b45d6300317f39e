#ifndef STRATA_ENGINE_MODEL_OPS_H_
#define STRATA_ENGINE_MODEL_OPS_H_

// Small f32 building blocks shared by every architecture: norms, RoPE, biases, gates, softmax, top-k. Pure
// functions.

#include <cstdint>
#include <span>
#include <vector>

#include "engine/model/model_config.h"

namespace strata::model {

// out[i] = x[i] / sqrt(mean(x^2) + eps) * weight[i]; out may alias x.
void RmsNorm(const float* x, const float* weight, int64_t n, float eps, float* out);

// freq_base^(-2i / rope_dim) for i in [0, rope_dim / 2): the model's rotation frequencies. rope_dim is the
// head size, or less for partial RoPE (ModelConfig::rope_dim).
std::vector<double> RopeFrequencies(int64_t rope_dim, float freq_base);

// The frequencies of YaRN-scaled RoPE, as ggml computes theta (ggml-cpu rope_yarn with ext_factor 1 and
// ggml_rope_yarn_corr_dims): theta_i = pos * f_i * ((1 - ramp_i) / factor + ramp_i), f_i the unscaled
// frequency, ramp_i = 1 - clamp((i - low) / max(0.001, high - low), 0, 1), low = max(0, floor(d(beta_fast))),
// high = min(rope_dim - 1, ceil(d(beta_slow))), d(b) = rope_dim ln(original_context / (2 pi b)) / (2 ln base).
std::vector<double> YarnFrequencies(int64_t rope_dim, float freq_base, const RopeYarn& yarn);

// The factor YaRN multiplies cos and sin by: attn_factor * (1 + 0.1 ln(factor)) (ggml's mscale).
float YarnMagnitude(const RopeYarn& yarn);

// The rotation of position `pos`: magnitude times cos and sin of pos * frequencies[i], for each of the
// frequencies. The same for every head and layer, so computed once per token.
void RopeAngles(std::span<const double> frequencies, int64_t pos, float* cos, float* sin, float magnitude = 1.0f);

// Rotates the first `rope_dim` values of one head in place by the angles RopeAngles gave (NEOX pairs (i,
// i + rope_dim / 2), as ggml's partial RoPE); the rest of the head is left as it is.
void Rope(float* head, int64_t rope_dim, const float* cos, const float* sin, RopeStyle style);

// x[i] += bias[i] for i < n.
void AddBias(float* x, const float* bias, int64_t n);

// sum a[i] * b[i], accumulated in double.
float Dot(const float* a, const float* b, int64_t n);

// 1 / (1 + exp(-x)).
float Sigmoid(float x);

// out[i] = silu(gate[i]) * up[i] (silu(g) = g * sigmoid(g)); out may alias gate or up.
void SwiGlu(const float* gate, const float* up, int64_t n, float* out);

// In-place softmax of x[0..n).
void Softmax(float* x, int64_t n);

// The k largest of x[0..n) (ties: lower index first), in descending order.
void TopK(const float* x, int64_t n, int64_t k, int32_t* ids);

// Splits scores[0..n) into n_group equal consecutive groups, ranks them by `how` (ties: lower group first)
// and sets every score outside the n_group_used best groups to -infinity, so that TopK then picks within
// them. n is a multiple of n_group; kTopTwoSum needs at least 2 scores per group.
void MaskAllButBestGroups(float* scores, int64_t n, int64_t n_group, int64_t n_group_used, GroupScore how);

}  // namespace strata::model

#endif  // STRATA_ENGINE_MODEL_OPS_H_
