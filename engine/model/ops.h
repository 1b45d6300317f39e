#ifndef STRATA_ENGINE_MODEL_OPS_H_
#define STRATA_ENGINE_MODEL_OPS_H_

// Small f32 building blocks shared by every architecture: norms, RoPE, softmax, top-k. Pure functions.

#include <cstdint>

#include "engine/model/model_config.h"

namespace strata::model {

// out[i] = x[i] / sqrt(mean(x^2) + eps) * weight[i]; out may alias x.
void RmsNorm(const float* x, const float* weight, int64_t n, float eps, float* out);

// Rotates one head of `head_dim` values in place for position `pos`.
void Rope(float* head, int64_t head_dim, int64_t pos, float freq_base, RopeStyle style);

// In-place softmax of x[0..n).
void Softmax(float* x, int64_t n);

// silu(a) * b, elementwise into out.
void SwiGlu(const float* a, const float* b, int64_t n, float* out);

// The k largest of x[0..n) (ties: lower index first), in descending order.
void TopK(const float* x, int64_t n, int64_t k, int32_t* ids);

}  // namespace strata::model

#endif  // STRATA_ENGINE_MODEL_OPS_H_
