// QuantizeActivation and its block-range form (contract in scheme.h).

#include <cmath>

#include "kernels/cpu/scheme.h"

namespace strata::kernels {
namespace {

// Round half to even for |v| <= 2^22 under the default rounding mode, without libm: adding 1.5 * 2^23
// leaves no fraction bits (the compiler may not fold the pair without -ffast-math).
inline float RoundHalfEven(float v) { return (v + 12582912.0f) - 12582912.0f; }

}  // namespace

void ResizeActivation(int64_t n, QuantizedActivation* out) {
  out->n = n;
  out->f32.resize(n);
  out->q.resize(n);
  out->scale.resize(n / kActBlock);
  out->sum.resize(n / kActBlock);
}

void QuantizeActivationBlocks(int64_t block_begin, int64_t block_end, QuantizedActivation* out) {
  for (int64_t b = block_begin; b < block_end; ++b) {
    const float* x = out->f32.data() + b * kActBlock;
    int8_t* q = out->q.data() + b * kActBlock;
    float amax = 0.0f;
    for (int i = 0; i < kActBlock; ++i) amax = std::fmax(amax, std::fabs(x[i]));
    const float scale = amax / 127.0f;
    int32_t sum = 0;
    if (scale == 0.0f) {
      for (int i = 0; i < kActBlock; ++i) q[i] = 0;
    } else {
      for (int i = 0; i < kActBlock; ++i) {
        // fmax/fmin first: NaN becomes -127 and the conversion is always in range.
        const float v = std::fmin(std::fmax(x[i] / scale, -127.0f), 127.0f);
        q[i] = static_cast<int8_t>(static_cast<int>(RoundHalfEven(v)));
        sum += q[i];
      }
    }
    out->scale[b] = scale;
    out->sum[b] = sum;
  }
}

void QuantizeActivation(const float* x, int64_t n, QuantizedActivation* out) {
  ResizeActivation(n, out);
  for (int64_t i = 0; i < n; ++i) out->f32[i] = x[i];
  QuantizeActivationBlocks(0, n / kActBlock, out);
}

}  // namespace strata::kernels
