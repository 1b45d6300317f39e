// QuantizeActivation and its block-range form (contract in scheme.h).

#include <emmintrin.h>

#include <cstring>

#include "kernels/cpu/quantize.h"

namespace strata::kernels {

void ResizeActivation(int64_t n, QuantizedActivation* out) {
  out->n = n;
  out->f32.resize(n);
  out->q.resize(n);
  out->scale.resize(n / kActBlock);
  out->sum.resize(n / kActBlock);
}

// SSE2 (part of x86-64) does the definition in scheme.h exactly: divps is IEEE division, maxps/minps
// with the constant second return it for NaN (so NaN gives -127 and amax skips NaN), and cvtps2dq rounds
// half to even under the default rounding mode.
void QuantizeActivationBlocks(int64_t block_begin, int64_t block_end, QuantizedActivation* out) {
  const __m128 abs_mask = _mm_castsi128_ps(_mm_set1_epi32(0x7FFFFFFF));
  const __m128 lo = _mm_set1_ps(-127.0f), hi = _mm_set1_ps(127.0f);
  for (int64_t b = block_begin; b < block_end; ++b) {
    const float* x = out->f32.data() + b * kActBlock;
    int8_t* q = out->q.data() + b * kActBlock;
    __m128 v[8];
    __m128 amax4 = _mm_setzero_ps();
    for (int i = 0; i < 8; ++i) {
      v[i] = _mm_loadu_ps(x + 4 * i);
      amax4 = _mm_max_ps(_mm_and_ps(v[i], abs_mask), amax4);
    }
    amax4 = _mm_max_ps(amax4, _mm_shuffle_ps(amax4, amax4, _MM_SHUFFLE(1, 0, 3, 2)));
    amax4 = _mm_max_ps(amax4, _mm_shuffle_ps(amax4, amax4, _MM_SHUFFLE(2, 3, 0, 1)));
    const float scale = _mm_cvtss_f32(amax4) / 127.0f;
    out->scale[b] = scale;
    if (scale == 0.0f) {
      std::memset(q, 0, kActBlock);
      out->sum[b] = 0;
      continue;
    }
    const __m128 s4 = _mm_set1_ps(scale);
    __m128i sum4 = _mm_setzero_si128();
    for (int i = 0; i < 8; i += 2) {
      const __m128i q0 = _mm_cvtps_epi32(_mm_min_ps(_mm_max_ps(_mm_div_ps(v[i], s4), lo), hi));
      const __m128i q1 = _mm_cvtps_epi32(_mm_min_ps(_mm_max_ps(_mm_div_ps(v[i + 1], s4), lo), hi));
      sum4 = _mm_add_epi32(sum4, _mm_add_epi32(q0, q1));
      const __m128i q16 = _mm_packs_epi32(q0, q1);
      _mm_storel_epi64(reinterpret_cast<__m128i*>(q + 4 * i), _mm_packs_epi16(q16, q16));
    }
    sum4 = _mm_add_epi32(sum4, _mm_shuffle_epi32(sum4, _MM_SHUFFLE(1, 0, 3, 2)));
    sum4 = _mm_add_epi32(sum4, _mm_shuffle_epi32(sum4, _MM_SHUFFLE(2, 3, 0, 1)));
    out->sum[b] = _mm_cvtsi128_si32(sum4);
  }
}

void QuantizeActivation(const float* x, int64_t n, QuantizedActivation* out) {
  ResizeActivation(n, out);
  for (int64_t i = 0; i < n; ++i) out->f32[i] = x[i];
  QuantizeActivationBlocks(0, n / kActBlock, out);
}

}  // namespace strata::kernels
