// AVX2 + FMA + F16C dense products; called through DenseGemv when the CPU has them and cols % 8 == 0.

#include <immintrin.h>

#include <cstring>

#include "kernels/cpu/dense_gemv.h"

namespace strata::kernels {
namespace {

inline float HorizontalSum(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
  return _mm_cvtss_f32(lo);
}

// Eight weights of a row starting at column c, widened to f32.
template <DenseType kType>
inline __m256 LoadWeights(const uint8_t* row, int64_t c) {
  if constexpr (kType == DenseType::kF32) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(row) + c);
  } else if constexpr (kType == DenseType::kF16) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * c)));
  } else if constexpr (kType == DenseType::kBF16) {
    const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * c)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
  } else {
    const uint8_t* block = row + 34 * (c / 32);
    uint16_t h;
    std::memcpy(&h, block, 2);
    const __m256 d = _mm256_cvtph_ps(_mm_set1_epi16(static_cast<short>(h)));
    int64_t q8;
    std::memcpy(&q8, block + 2 + (c % 32), 8);
    const __m256 q = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_cvtsi64_si128(q8)));
    return _mm256_mul_ps(d, q);
  }
}

// Four independent accumulators per token hide the FMA latency. Every token gets the same arithmetic
// whatever the tile size, so a token's result does not depend on which other tokens share its batch.
template <DenseType kType, int kTokens>
void RowTile(const uint8_t* row, int64_t cols, const float* x, int64_t x_stride, float* y, int64_t y_stride,
             int64_t r) {
  constexpr int kUnroll = 4;
  __m256 acc[kTokens][kUnroll];
  for (int t = 0; t < kTokens; ++t) {
    for (int u = 0; u < kUnroll; ++u) acc[t][u] = _mm256_setzero_ps();
  }
  int64_t c = 0;
  for (; c + 8 * kUnroll <= cols; c += 8 * kUnroll) {
    for (int u = 0; u < kUnroll; ++u) {
      const __m256 w = LoadWeights<kType>(row, c + 8 * u);
      for (int t = 0; t < kTokens; ++t) {
        acc[t][u] = _mm256_fmadd_ps(w, _mm256_loadu_ps(x + t * x_stride + c + 8 * u), acc[t][u]);
      }
    }
  }
  for (; c < cols; c += 8) {
    const __m256 w = LoadWeights<kType>(row, c);
    for (int t = 0; t < kTokens; ++t) acc[t][0] = _mm256_fmadd_ps(w, _mm256_loadu_ps(x + t * x_stride + c), acc[t][0]);
  }
  for (int t = 0; t < kTokens; ++t) {
    __m256 sum = acc[t][0];
    for (int u = 1; u < kUnroll; ++u) sum = _mm256_add_ps(sum, acc[t][u]);
    y[t * y_stride + r] = HorizontalSum(sum);
  }
}

template <DenseType kType>
void Run(const uint8_t* w, int64_t cols, int64_t row_begin, int64_t row_end, const float* x, int64_t x_stride,
         int n_tokens, float* y, int64_t y_stride) {
  const uint64_t row_bytes = DenseRowBytes(kType, cols);
  for (int64_t r = row_begin; r < row_end; ++r) {
    const uint8_t* row = w + static_cast<uint64_t>(r) * row_bytes;
    int t = 0;
    for (; t + 2 <= n_tokens; t += 2) RowTile<kType, 2>(row, cols, x + t * x_stride, x_stride, y + t * y_stride, y_stride, r);
    if (t < n_tokens) RowTile<kType, 1>(row, cols, x + t * x_stride, x_stride, y + t * y_stride, y_stride, r);
  }
}

}  // namespace

void DenseGemvAvx2(DenseType type, const uint8_t* w, int64_t cols, int64_t row_begin, int64_t row_end,
                   const float* x, int64_t x_stride, int n_tokens, float* y, int64_t y_stride) {
  switch (type) {
    case DenseType::kF32:
      return Run<DenseType::kF32>(w, cols, row_begin, row_end, x, x_stride, n_tokens, y, y_stride);
    case DenseType::kF16:
      return Run<DenseType::kF16>(w, cols, row_begin, row_end, x, x_stride, n_tokens, y, y_stride);
    case DenseType::kBF16:
      return Run<DenseType::kBF16>(w, cols, row_begin, row_end, x, x_stride, n_tokens, y, y_stride);
    case DenseType::kQ8_0:
      return Run<DenseType::kQ8_0>(w, cols, row_begin, row_end, x, x_stride, n_tokens, y, y_stride);
  }
}

}  // namespace strata::kernels
