// The scalar fits: the reference every SIMD fit matches bit for bit (the operations are defined in
// quantize_fit.h). Compiled with -ffp-contract=off.

#include "kernels/cpu/quantize_fit.h"

#include <algorithm>
#include <cmath>

#include "kernels/format/mxfp4.h"

namespace strata::kernels::internal {
namespace {

inline float Inverse(float d) { return d == 0.0f ? 0.0f : 1.0f / d; }

inline int32_t CodeS8(float x, float inv) {
  const float t = MinPs(MaxPs(x * inv, -127.0f), 127.0f);
  return CvttPs(t + std::copysign(0.5f, t));
}
inline int32_t CodeS4(float x, float inv, float m) { return CvttPs(MinPs(MaxPs((x - m) * inv, 0.0f), 15.0f) + 0.5f); }
inline int32_t CodeS2(float x, float inv) { return CvttPs(MinPs(MaxPs(x * inv + 2.0f, 0.0f), 3.0f)); }

// Decoded values, as DequantizeRole computes them.
inline float DecodeS8(float d, int32_t q) { return d * static_cast<float>(q); }
inline float DecodeS4(float d, float m, int32_t q) { return d * static_cast<float>(q) + m; }
inline float DecodeS2(float d, int32_t q) { return d * static_cast<float>(2 * q - 3); }

float SseS8(const float* w, int n, float d) {
  const float inv = Inverse(d);
  float sse = 0.0f;
  for (int i = 0; i < n; ++i) {
    const float e = DecodeS8(d, CodeS8(w[i], inv)) - w[i];
    sse = sse + e * e;
  }
  return sse;
}

float SseS4(const float* w, int n, float d, float m) {
  const float inv = Inverse(d);
  float sse = 0.0f;
  for (int i = 0; i < n; ++i) {
    const float e = DecodeS4(d, m, CodeS4(w[i], inv, m)) - w[i];
    sse = sse + e * e;
  }
  return sse;
}

void AddError(double w, double back, QuantizeError* error) {
  const double e = w - back;
  error->err2 += e * e;
  error->ref2 += w * w;
  error->max_abs = std::max(error->max_abs, std::fabs(e));
}

void FitS8(const float* w, int n, float* d_out, uint8_t* codes, QuantizeError* error) {
  float amax = 0.0f;
  for (int i = 0; i < n; ++i) amax = MaxPs(amax, std::fabs(w[i]));
  float best_d = 0.0f, best_sse = 0.0f;
  for (int k = 0; k < kS8Candidates; ++k) {
    const float d = RoundHalf(amax / 127.0f * S8Factor(k));
    const float sse = SseS8(w, n, d);
    if (k == 0 || sse < best_sse) best_d = d, best_sse = sse;
  }
  const float inv = Inverse(best_d);
  for (int i = 0; i < n; ++i) {
    const int32_t q = CodeS8(w[i], inv);
    codes[i] = static_cast<uint8_t>(static_cast<int8_t>(q));
    AddError(w[i], DecodeS8(best_d, q), error);
  }
  *d_out = best_d;
}

// The least-squares (d, m) of the codes that (d, m) gives the weights, rounded to half; false when it is not a
// usable candidate.
bool RefitS4(const float* w, int n, float sum_w, float* d, float* m) {
  const float inv = Inverse(*d);
  int32_t sum_q = 0, sum_qq = 0;
  float sum_qw = 0.0f;
  for (int i = 0; i < n; ++i) {
    const int32_t q = CodeS4(w[i], inv, *m);
    sum_q += q;
    sum_qq += q * q;
    sum_qw = sum_qw + static_cast<float>(q) * w[i];
  }
  SolveAffine(n, sum_q, sum_qq, sum_w, sum_qw, d, m);
  *d = RoundHalf(*d);
  *m = RoundHalf(*m);
  return *d > 0.0f && std::fabs(*m) < INFINITY;
}

void FitS4(const float* w, int n, float* d_out, float* m_out, uint8_t* codes, QuantizeError* error) {
  float lo = w[0], hi = w[0], sum_w = 0.0f;
  for (int i = 0; i < n; ++i) {
    lo = MinPs(lo, w[i]);
    hi = MaxPs(hi, w[i]);
    sum_w = sum_w + w[i];
  }
  float best_d = RoundHalf((hi - lo) / 15.0f), best_m = RoundHalf(lo);
  float best_sse = SseS4(w, n, best_d, best_m);
  const auto try_refit = [&](float d, float m) {
    if (!RefitS4(w, n, sum_w, &d, &m)) return;
    const float sse = SseS4(w, n, d, m);
    if (sse < best_sse) best_d = d, best_m = m, best_sse = sse;
  };
  for (int k = 0; k < kS4Candidates; ++k) {
    const float cut = (hi - lo) * S4Shrink(k) * 0.5f;
    const float clo = lo + cut, chi = hi - cut;
    try_refit(RoundHalf((chi - clo) / 15.0f), RoundHalf(clo));
  }
  for (int r = 0; r < kS4Refinements; ++r) try_refit(best_d, best_m);
  const float inv = Inverse(best_d);
  for (int i = 0; i < n; ++i) {
    const int32_t q = CodeS4(w[i], inv, best_m);
    codes[i] = static_cast<uint8_t>(q);
    AddError(w[i], DecodeS4(best_d, best_m, q), error);
  }
  *d_out = best_d;
  *m_out = best_m;
}

// ScoreS2 of scale d for a group of s2 weights whose magnitudes sum to sum_abs.
S2Score EvaluateS2(const float* w, int n, float sum_abs, float d) {
  const uint32_t last_inner = MagnitudeKeyS2(-2.0f * d);
  int32_t outer = 0;
  float outer_abs = 0.0f;
  for (int i = 0; i < n; ++i) {
    if (MagnitudeKeyS2(w[i]) > last_inner) ++outer, outer_abs = outer_abs + std::fabs(w[i]);
  }
  return ScoreS2(d, sum_abs, outer_abs, outer, n);
}

void FitS2(const float* w, int n, float* d_out, uint8_t* codes, QuantizeError* error) {
  float amax = 0.0f, sum_abs = 0.0f;
  for (int i = 0; i < n; ++i) {
    amax = MaxPs(amax, std::fabs(w[i]));
    sum_abs = sum_abs + std::fabs(w[i]);
  }
  float best_d = RoundHalf(amax / S2Divisor(0));
  double best_err = EvaluateS2(w, n, sum_abs, best_d).err;
  for (int k = 1; k <= kS2Candidates; ++k) {
    const float d = RoundHalf(amax / S2Divisor(k));
    if (!(d > 0.0f)) continue;
    const S2Score c = EvaluateS2(w, n, sum_abs, d);
    if (c.err < best_err) best_d = d, best_err = c.err;
    const float refined = RoundHalf(c.least_squares);
    if (!(refined > 0.0f)) continue;
    const double refined_err = EvaluateS2(w, n, sum_abs, refined).err;
    if (refined_err < best_err) best_d = refined, best_err = refined_err;
  }
  const float inv = best_d == 0.0f ? 0.0f : 0.5f / best_d;
  for (int i = 0; i < n; ++i) {
    const int32_t q = CodeS2(w[i], inv);
    codes[i] = static_cast<uint8_t>(q);
    AddError(w[i], DecodeS2(best_d, q), error);
  }
  *d_out = best_d;
}

// The nearest mxfp4 level to x at scale d (a power of two, so |x| / d is exact unless it leaves float's
// range): the magnitude's code is the number of midpoints between levels below |x| / d (a tie goes to the
// smaller level), and a negative x with a non-zero magnitude takes codes 9..15.
inline uint8_t CodeMxfp4(float x, float d) {
  static constexpr float kMidpoints[7] = {0.5f, 1.5f, 2.5f, 3.5f, 5.0f, 7.0f, 10.0f};
  const float a = std::fabs(x) / d;
  uint8_t q = 0;
  for (float t : kMidpoints) q += a > t ? 1 : 0;
  return x < 0.0f && q != 0 ? static_cast<uint8_t>(q + 8) : q;
}

void FitMxfp4(const float* w, int n, float* d_out, uint8_t* codes, QuantizeError* error) {
  float amax = 0.0f;
  for (int i = 0; i < n; ++i) amax = MaxPs(amax, std::fabs(w[i]));
  int best_e = 0;
  if (amax > 0.0f) {
    int exponent;  // amax = m 2^exponent with m in [0.5, 1): floor(log2(amax)) = exponent - 1, exactly
    std::frexp(amax, &exponent);
    const int first = std::clamp(exponent - 1 + 125, 0, 254);
    float best_sse = 0.0f;
    for (int e = first; e <= first + 1; ++e) {
      const float d = Mxfp4Scale(static_cast<uint8_t>(e));
      float sse = 0.0f;
      for (int i = 0; i < n; ++i) {
        const float diff = d * static_cast<float>(kMxfp4Levels[CodeMxfp4(w[i], d)]) - w[i];
        sse = sse + diff * diff;
      }
      if (e == first || sse < best_sse) best_e = e, best_sse = sse;
    }
  }
  const float d = Mxfp4Scale(static_cast<uint8_t>(best_e));
  for (int i = 0; i < n; ++i) {
    codes[i] = amax > 0.0f ? CodeMxfp4(w[i], d) : 0;
    AddError(w[i], d * static_cast<float>(kMxfp4Levels[codes[i]]), error);
  }
  *d_out = d;
}

}  // namespace

void FitGroupsScalar(Scheme s, const float* w, int64_t n_groups, float* d, float* m, uint8_t* codes,
                     QuantizeError* error) {
  const int n = static_cast<int>(layout::Group(s));
  for (int64_t g = 0; g < n_groups; ++g) {
    const float* wg = w + g * n;
    uint8_t* cg = codes + g * n;
    m[g] = 0.0f;
    switch (s) {
      case Scheme::kS8:
        FitS8(wg, n, &d[g], cg, error);
        break;
      case Scheme::kS4:
        FitS4(wg, n, &d[g], &m[g], cg, error);
        break;
      case Scheme::kMxfp4:
        FitMxfp4(wg, n, &d[g], cg, error);
        break;
      default:
        FitS2(wg, n, &d[g], cg, error);
        break;
    }
  }
}

}  // namespace strata::kernels::internal
