// QuantizeRole and DequantizeRole for every scheme (layout in scheme.h).

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/cpu/fp16.h"
#include "kernels/cpu/role_layout.h"
#include "kernels/cpu/scheme.h"

namespace strata::kernels {
namespace {

inline float RoundHalf(float v) { return HalfToFloat(FloatToHalf(v)); }

// Sum of squared errors of a symmetric or affine code assignment; `level(q)` is the integer level.
struct GroupFit {
  float d = 0.0f;
  float m = 0.0f;
  double sse = 0.0;
};

// Codes are assigned by multiplying with a reciprocal and rounding by truncation; the result only has to
// be deterministic, and weights that are exactly representable still get their own codes.

// s8: symmetric int8, a few candidate scales at and below amax / 127.
GroupFit FitS8(const float* w, int n, uint8_t* q_out) {
  float amax = 0.0f;
  for (int i = 0; i < n; ++i) amax = std::max(amax, std::fabs(w[i]));
  GroupFit best;
  best.sse = -1.0;
  int8_t q[64], best_q[64] = {};
  for (int k = 0; k < 8; ++k) {
    const float d = RoundHalf(amax / 127.0f * (1.0f - 0.004f * static_cast<float>(k)));
    const float inv = d == 0.0f ? 0.0f : 1.0f / d;
    float sse = 0.0f;
    for (int i = 0; i < n; ++i) {
      const float t = std::clamp(w[i] * inv, -127.0f, 127.0f);
      q[i] = static_cast<int8_t>(t + (t >= 0.0f ? 0.5f : -0.5f));
      const float e = d * q[i] - w[i];
      sse += e * e;
    }
    if (best.sse < 0.0 || sse < best.sse) {
      best = {d, 0.0f, sse};
      std::memcpy(best_q, q, n);
    }
  }
  std::memcpy(q_out, best_q, n);
  return best;
}

// Assigns codes 0..15 for w = d*q + m and returns the squared error.
double AssignS4(const float* w, int n, float d, float m, uint8_t* q) {
  const float inv = d == 0.0f ? 0.0f : 1.0f / d;
  float sse = 0.0f;
  for (int i = 0; i < n; ++i) {
    q[i] = static_cast<uint8_t>(std::clamp((w[i] - m) * inv, 0.0f, 15.0f) + 0.5f);
    const float e = d * q[i] + m - w[i];
    sse += e * e;
  }
  return sse;
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
    double sq = 0, sqq = 0, sw = 0, sqw = 0;
    for (int i = 0; i < n; ++i) {
      sq += q[i];
      sqq += static_cast<double>(q[i]) * q[i];
      sw += w[i];
      sqw += static_cast<double>(q[i]) * w[i];
    }
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
double AssignS2(const float* w, int n, float d, uint8_t* q) {
  // Thresholds at -2d, 0, 2d; the clamp keeps the truncation a floor.
  const float inv = d == 0.0f ? 0.0f : 0.5f / d;
  float sse = 0.0f;
  for (int i = 0; i < n; ++i) {
    q[i] = static_cast<uint8_t>(std::clamp(w[i] * inv + 2.0f, 0.0f, 3.0f));
    const float e = d * static_cast<float>(2 * q[i] - 3) - w[i];
    sse += e * e;
  }
  return sse;
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
    double sl = 0, sll = 0;
    for (int i = 0; i < n; ++i) {
      const int l = 2 * q[i] - 3;
      sl += static_cast<double>(l) * w[i];
      sll += l * l;
    }
    d = RoundHalf(static_cast<float>(sl / sll));
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
