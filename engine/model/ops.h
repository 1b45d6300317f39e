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

// freq_base^(-2i / head_dim) for i in [0, head_dim / 2): the model's rotation frequencies.
std::vector<double> RopeFrequencies(int64_t head_dim, float freq_base);

// The rotation of position `pos`: cos and sin of pos * frequencies[i], for each of the frequencies. The
// same for every head and layer, so computed once per token.
void RopeAngles(std::span<const double> frequencies, int64_t pos, float* cos, float* sin);

// Rotates one head of `head_dim` values in place by the angles RopeAngles gave.
void Rope(float* head, int64_t head_dim, const float* cos, const float* sin, RopeStyle style);

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

}  // namespace strata::model

#endif  // STRATA_ENGINE_MODEL_OPS_H_
