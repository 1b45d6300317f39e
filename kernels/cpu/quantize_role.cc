// QuantizeRole and DequantizeRole for every scheme (layout in scheme.h).

#include <emmintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/format/fp16.h"
#include "kernels/format/role_layout.h"
#include "kernels/cpu/quantize.h"

namespace strata::kernels {
namespace {

inline float RoundHalf(float v) { return HalfToFloat(FloatToHalf(v)); }

// A group's fitted scale d (and offset m, affine schemes only) and the squared error of its codes.
struct GroupFit {
  float d = 0.0f;
  float m = 0.0f;
  double sse = 0.0;
};

// Codes are assigned by multiplying with a reciprocal and rounding by truncation; the result only has to
// be deterministic, and weights that are exactly representable still get their own codes.

// Writes four int32 lanes, each already in T's range, to q[0..3].
template <typename T>
inline void StoreCodes(__m128i codes, T* q) {
  alignas(16) int32_t v[4];
  _mm_store_si128(reinterpret_cast<__m128i*>(v), codes);
  for (int j = 0; j < 4; ++j) q[j] = static_cast<T>(v[j]);
}

// The four lanes summed in double, in a fixed order.
inline double SumLanes(__m128 x) {
  alignas(16) float p[4];
  _mm_store_ps(p, x);
  return (double(p[0]) + p[1]) + (double(p[2]) + p[3]);
}

// Assigns codes -127..127 for w = d*q (rounding half away from zero) and returns the squared error.
// SSE2, n a multiple of 4.
double AssignS8(const float* w, int n, float d, int8_t* q) {
  const __m128 inv = _mm_set1_ps(d == 0.0f ? 0.0f : 1.0f / d), d4 = _mm_set1_ps(d);
  const __m128 lo = _mm_set1_ps(-127.0f), hi = _mm_set1_ps(127.0f), half = _mm_set1_ps(0.5f);
  const __m128 sign_mask = _mm_set1_ps(-0.0f);
  __m128 sse = _mm_setzero_ps();
  for (int i = 0; i < n; i += 4) {
    const __m128 x = _mm_loadu_ps(w + i);
    const __m128 t = _mm_min_ps(_mm_max_ps(_mm_mul_ps(x, inv), lo), hi);
    const __m128i qi = _mm_cvttps_epi32(_mm_add_ps(t, _mm_or_ps(half, _mm_and_ps(t, sign_mask))));
    const __m128 e = _mm_sub_ps(_mm_mul_ps(d4, _mm_cvtepi32_ps(qi)), x);
    sse = _mm_add_ps(sse, _mm_mul_ps(e, e));
    StoreCodes(qi, q + i);
  }
  return SumLanes(sse);
}

// s8: symmetric int8, a few candidate scales at and below amax / 127.
GroupFit FitS8(const float* w, int n, uint8_t* q_out) {
  float amax = 0.0f;
  for (int i = 0; i < n; ++i) amax = std::max(amax, std::fabs(w[i]));
  GroupFit best;
  best.sse = -1.0;
  int8_t q[64];
  for (int k = 0; k < 8; ++k) {
    const float d = RoundHalf(amax / 127.0f * (1.0f - 0.004f * static_cast<float>(k)));
    const double sse = AssignS8(w, n, d, q);
    if (best.sse < 0.0 || sse < best.sse) {
      best = {d, 0.0f, sse};
      std::memcpy(q_out, q, n);
    }
  }
  return best;
}

// Assigns codes 0..15 for w = d*q + m and returns the squared error.
// Four weights at a time with SSE2 (part of x86-64); n is a multiple of 4.
double AssignS4(const float* w, int n, float d, float m, uint8_t* q) {
  const __m128 inv = _mm_set1_ps(d == 0.0f ? 0.0f : 1.0f / d), d4 = _mm_set1_ps(d), m4 = _mm_set1_ps(m);
  const __m128 lo = _mm_setzero_ps(), hi = _mm_set1_ps(15.0f), half = _mm_set1_ps(0.5f);
  __m128 sse = _mm_setzero_ps();
  for (int i = 0; i < n; i += 4) {
    const __m128 x = _mm_loadu_ps(w + i);
    const __m128 t = _mm_min_ps(_mm_max_ps(_mm_mul_ps(_mm_sub_ps(x, m4), inv), lo), hi);
    const __m128i qi = _mm_cvttps_epi32(_mm_add_ps(t, half));
    const __m128 e = _mm_sub_ps(_mm_add_ps(_mm_mul_ps(d4, _mm_cvtepi32_ps(qi)), m4), x);
    sse = _mm_add_ps(sse, _mm_mul_ps(e, e));
    StoreCodes(qi, q + i);
  }
  return SumLanes(sse);
}

// s4: affine; candidates from shrunken min/max ranges, each refined by a least-squares fit of d and m to
// its codes, all with d and m rounded to half.
GroupFit FitS4(const float* w, int n, uint8_t* q_out) {
  float lo = w[0], hi = w[0];
  for (int i = 1; i < n; ++i) {
    lo = std::min(lo, w[i]);
    hi = std::max(hi, w[i]);
  }
  GroupFit best;
  uint8_t q[64];
  {
    const float d = RoundHalf((hi - lo) / 15.0f), m = RoundHalf(lo);
    best = {d, m, AssignS4(w, n, d, m, q_out)};
  }
  for (int k = 0; k < 12; ++k) {
    const float shrink = 0.02f * static_cast<float>(k);
    const float clo = lo + (hi - lo) * shrink * 0.5f, chi = hi - (hi - lo) * shrink * 0.5f;
    float d = RoundHalf((chi - clo) / 15.0f), m = RoundHalf(clo);
    AssignS4(w, n, d, m, q);
    // Least squares of w ~ d*q + m for these codes.
    int isq = 0, isqq = 0;
    float fsw = 0.0f, fsqw = 0.0f;
    for (int i = 0; i < n; ++i) {
      isq += q[i];
      isqq += q[i] * q[i];
      fsw += w[i];
      fsqw += static_cast<float>(q[i]) * w[i];
    }
    const double sq = isq, sqq = isqq, sw = fsw, sqw = fsqw;
    const double det = n * sqq - sq * sq;
    if (det > 0.0) {
      d = RoundHalf(static_cast<float>((n * sqw - sq * sw) / det));
      m = RoundHalf(static_cast<float>((sqq * sw - sq * sqw) / det));
    }
    if (!(d > 0.0f) || !std::isfinite(m)) continue;
    const double sse = AssignS4(w, n, d, m, q);
    if (sse < best.sse) {
      best = {d, m, sse};
      std::memcpy(q_out, q, n);
    }
  }
  return best;
}

// Assigns codes 0..3 for w = d*(2q-3) and returns the squared error.
// Thresholds at -2d, 0, 2d; the clamp keeps the truncation a floor. SSE2, n a multiple of 4.
double AssignS2(const float* w, int n, float d, uint8_t* q) {
  const __m128 inv = _mm_set1_ps(d == 0.0f ? 0.0f : 0.5f / d), d4 = _mm_set1_ps(d);
  const __m128 lo = _mm_setzero_ps(), hi = _mm_set1_ps(3.0f), two = _mm_set1_ps(2.0f);
  const __m128i three = _mm_set1_epi32(3);
  __m128 sse = _mm_setzero_ps();
  for (int i = 0; i < n; i += 4) {
    const __m128 x = _mm_loadu_ps(w + i);
    const __m128i qi = _mm_cvttps_epi32(_mm_min_ps(_mm_max_ps(_mm_add_ps(_mm_mul_ps(x, inv), two), lo), hi));
    const __m128i level = _mm_sub_epi32(_mm_add_epi32(qi, qi), three);
    const __m128 e = _mm_sub_ps(_mm_mul_ps(d4, _mm_cvtepi32_ps(level)), x);
    sse = _mm_add_ps(sse, _mm_mul_ps(e, e));
    StoreCodes(qi, q + i);
  }
  return SumLanes(sse);
}

// s2: symmetric levels +-d, +-3d; candidate scales from amax/3 down to amax/6, each refined by the
// least-squares scale for its codes.
GroupFit FitS2(const float* w, int n, uint8_t* q_out) {
  float amax = 0.0f;
  for (int i = 0; i < n; ++i) amax = std::max(amax, std::fabs(w[i]));
  GroupFit best;
  {
    const float d = RoundHalf(amax / 3.0f);
    best = {d, 0.0f, AssignS2(w, n, d, q_out)};
  }
  if (amax == 0.0f) return best;
  uint8_t q[64];
  for (int k = 1; k <= 16; ++k) {
    float d = RoundHalf(amax / (3.0f + 0.1875f * static_cast<float>(k)));
    if (!(d > 0.0f)) continue;
    double sse = AssignS2(w, n, d, q);
    if (sse < best.sse) {
      best = {d, 0.0f, sse};
      std::memcpy(q_out, q, n);
    }
    float sl = 0.0f;
    int sll = 0;
    for (int i = 0; i < n; ++i) {
      const int l = 2 * q[i] - 3;
      sl += static_cast<float>(l) * w[i];
      sll += l * l;
    }
    d = RoundHalf(sl / static_cast<float>(sll));
    if (!(d > 0.0f)) continue;
    sse = AssignS2(w, n, d, q);
    if (sse < best.sse) {
      best = {d, 0.0f, sse};
      std::memcpy(q_out, q, n);
    }
  }
  return best;
}

void QuantizeInteger(Scheme s, const float* src, int64_t rows, int64_t cols, uint8_t* dst) {
  const int64_t group = layout::Group(s);
  const int bits = layout::CodeBits(s);
  std::memset(dst, 0, layout::CodesBytes(s, rows, cols));
  uint8_t q[64];
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t g = 0; g < cols / group; ++g) {
      const float* w = src + r * cols + g * group;
      GroupFit fit;
      switch (s) {
        case Scheme::kS8:
          fit = FitS8(w, static_cast<int>(group), q);
          break;
        case Scheme::kS4:
          fit = FitS4(w, static_cast<int>(group), q);
          break;
        default:
          fit = FitS2(w, static_cast<int>(group), q);
          break;
      }
      for (int64_t i = 0; i < group; ++i) {
        const layout::CodePos pos = layout::CodePosition(s, cols, r, g * group + i);
        dst[pos.byte] |= static_cast<uint8_t>((q[i] & ((1u << bits) - 1)) << pos.shift);
      }
      const int64_t off = layout::ScaleOffset(s, rows, cols, r, g);
      StoreHalf(FloatToHalf(fit.d), dst + off);
      if (s == Scheme::kS4) StoreHalf(FloatToHalf(fit.m), dst + off + layout::kMinOffsetInRecord);
    }
  }
}

}  // namespace

void QuantizeRole(Scheme scheme, const float* src, int64_t rows, int64_t cols, uint8_t* dst) {
  if (scheme == Scheme::kF16) {
    for (int64_t i = 0; i < rows * cols; ++i) StoreHalf(FloatToHalf(src[i]), dst + 2 * i);
    return;
  }
  QuantizeInteger(scheme, src, rows, cols, dst);
}

void DequantizeRole(Scheme scheme, const uint8_t* src, int64_t rows, int64_t cols, float* dst) {
  if (scheme == Scheme::kF16) {
    for (int64_t i = 0; i < rows * cols; ++i) dst[i] = HalfToFloat(LoadHalf(src + 2 * i));
    return;
  }
  const int64_t group = layout::Group(scheme);
  const int bits = layout::CodeBits(scheme);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const layout::CodePos pos = layout::CodePosition(scheme, cols, r, c);
      const unsigned code = (src[pos.byte] >> pos.shift) & ((1u << bits) - 1);
      const int64_t off = layout::ScaleOffset(scheme, rows, cols, r, c / group);
      const float d = HalfToFloat(LoadHalf(src + off));
      float w;
      switch (scheme) {
        case Scheme::kS8:
          w = d * static_cast<float>(static_cast<int8_t>(code));
          break;
        case Scheme::kS4:
          w = d * static_cast<float>(code) + HalfToFloat(LoadHalf(src + off + layout::kMinOffsetInRecord));
          break;
        default:
          w = d * static_cast<float>(2 * static_cast<int>(code) - 3);
          break;
      }
      dst[r * cols + c] = w;
    }
  }
}

}  // namespace strata::kernels
