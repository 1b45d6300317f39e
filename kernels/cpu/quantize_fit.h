#ifndef STRATA_KERNELS_CPU_QUANTIZE_FIT_H_
#define STRATA_KERNELS_CPU_QUANTIZE_FIT_H_

// The per-group fits behind QuantizeRole on each CPU path; private to kernels/cpu.
//
// A fit takes `n_groups` groups of Group(s) weights laid one after another and writes, for group g, its
// scale d[g], its offset m[g] (s4; 0 for the other schemes) and its codes codes[g * Group(s) + i] (s8: the
// int8 code's byte), and adds the error of every weight against its decoded value d * code + m to *error.
//
// Every path computes the same d, m and codes bit for bit: a group's search is one sequence of IEEE float
// operations, done in the same order whether the group runs alone (scalar) or in one lane of a SIMD
// register (each lane one group), and the files that hold them are compiled with -ffp-contract=off so that
// no multiply-add is fused. The operations below are the definition; the SIMD paths follow them lane-wise.
//
// s8 (group 32): amax = max |w|; for k = 0..7 the scale d_k = half(amax / 127 * (1 - 0.004 k)); the first
//   with the least squared error wins.
// s4 (group 32): the range [lo, hi] gives (d, m) = half((hi - lo) / 15), half(lo); then for k = 0..3 the
//   range shrunk by 2k% gives codes whose least-squares (d, m) (rounded to half) is a candidate; then, twice,
//   the codes of the best so far give one more candidate the same way (a step of alternating codes and
//   least squares). The least squared error wins, ties to the earlier.
// s2 (group 64): the candidates are d_0 = half(amax / 3), then for k = 1..16 d_k = half(amax / (3 + 0.1875 k))
//   and the least-squares scale of d_k's codes. A scale's codes are the nearest levels: a weight takes an
//   outer code (+-3 d) when MagnitudeKeyS2(x) > MagnitudeKeyS2(-2 d), i.e. |x| > 2d or x = +2d (where
//   CodeS2 puts that tie). Its error comes from sums, not weight by weight: S = sum |x| and A = sum |x| over
//   the outer weights (float, in order), then ScoreS2 in double: N = S + 2A = sum |l x|, D = 64 + 8 outer =
//   sum l^2, err = d * (d * D - 2N) (sum x^2 left out, the same for every candidate), and the least-squares
//   scale of those codes is half(float(N / D)). The least err wins, ties to the earlier (d_0, d_1, its
//   least squares, d_2, ...); scales not above 0 are skipped (and d_k's least squares with them).
// mxfp4 (group 32, scalar on every path): amax = max |w|; the exponents e0 = floor(log2(amax)) + 125 (read from
//   amax's exponent, exactly; ggml's choice: its top level 12 * 2^(e0 - 128) is 1.5 times the power of two at
//   or below amax) and e0 + 1, each
//   weight at the nearest level (CodeMxfp4); the least squared error (float, in order) wins, ties to e0. An
//   all-zero group has exponent 0 and codes 0.
// (s4 tried 12 shrunk ranges before, without the last two steps: 27 passes over a group's weights where it
// now takes 15, for a larger error; bench/RESULTS.md. The SIMD fits take 13, sharing the code sums of a pass
// between the candidates whose codes are the same. s2's candidates are those it always had; each one's
// error was summed weight by weight in float before (about 13 operations a weight a candidate, 4 now), so a
// near-tie may now go the other way: QuantizeRoleTest.S2FitAddsNoMoreErrorThanTheFormerSearch.)
// The squared error that decides s8 and s4 is summed in float, weight by weight in order; the error
// reported in *error is summed in double, weight by weight, for every scheme.

#include <emmintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/quantize.h"
#include "kernels/format/fp16.h"
#include "kernels/format/role_layout.h"
#include "kernels/format/scheme.h"

namespace strata::kernels::internal {

void FitGroupsScalar(Scheme s, const float* w, int64_t n_groups, float* d, float* m, uint8_t* codes,
                     QuantizeError* error);

// The SIMD paths fit the largest multiple of their batch (FitBatchAvx2/Avx512 groups) and return how many groups they
// did (none for mxfp4); the caller fits the rest with FitGroupsScalar. Call only where CpuPathAvailable says.
int64_t FitGroupsAvx2(Scheme s, const float* w, int64_t n_groups, float* d, float* m, uint8_t* codes,
                      QuantizeError* error);
int64_t FitGroupsAvx512(Scheme s, const float* w, int64_t n_groups, float* d, float* m, uint8_t* codes,
                        QuantizeError* error);

// s2's order of weights, by |x| and, among equal magnitudes, the negative ones (and zeros) before the positive
// ones: a weight is outer for scale d when its key exceeds MagnitudeKeyS2(-2d). Fits in 32 bits for every
// finite float.
inline uint32_t MagnitudeKeyS2(float x) {
  uint32_t bits;
  const float a = std::fabs(x);
  std::memcpy(&bits, &a, sizeof bits);
  return (bits << 1) | (x > 0.0f ? 1u : 0u);
}

// One s2 candidate's error less sum x^2 and the least-squares scale of its codes (before rounding to half),
// from its sums (above): the same double operations on every path.
struct S2Score {
  double err;
  float least_squares;
};
inline S2Score ScoreS2(float d, float sum_abs, float outer_abs, int32_t outer, int n) {
  const double sum_lx = static_cast<double>(sum_abs) + 2.0 * static_cast<double>(outer_abs);
  const double sum_ll = static_cast<double>(n) + 8.0 * static_cast<double>(outer);
  const double dd = d;
  return {dd * (dd * sum_ll - 2.0 * sum_lx), static_cast<float>(sum_lx / sum_ll)};
}

// The f16 scheme's quantization with F16C (the same round-to-nearest-even as FloatToHalf, for every float),
// eight weights at a time: writes the halves of src[0..k) to dst and adds their error, for the largest
// multiple k of 8 not above n, and returns k. Call only where CpuPathAvailable(kAvx2).
int64_t RoundToHalfAvx2(const float* src, int64_t n, uint8_t* dst, QuantizeError* error);

// FloatToHalf of src[0..k) into dst with F16C, for the largest multiple k of 8 not above n; returns k. Call
// only where CpuPathAvailable(kAvx2).
int64_t FloatsToHalvesAvx2(const float* src, int64_t n, uint16_t* dst);

// The scalar forms of the SIMD instructions the fits use, with the same results for every input
// (maxps/minps return the second operand when either is NaN; cvttps2dq gives INT32_MIN for NaN and
// out-of-range values).
inline float MaxPs(float a, float b) { return a > b ? a : b; }
inline float MinPs(float a, float b) { return a < b ? a : b; }
inline int32_t CvttPs(float x) { return _mm_cvttss_si32(_mm_set_ss(x)); }
inline float RoundHalf(float v) { return HalfToFloat(FloatToHalf(v)); }

// The least-squares (d, m) of w ~ d * q + m over n weights whose codes have the given sums, before rounding
// to half; (d, m) unchanged when every code is equal (det <= 0).
inline void SolveAffine(int n, int32_t sum_q, int32_t sum_qq, float sum_w, float sum_qw, float* d, float* m) {
  const double sq = sum_q, sqq = sum_qq, sw = sum_w, sqw = sum_qw;
  const double det = n * sqq - sq * sq;
  if (det > 0.0) {
    *d = static_cast<float>((n * sqw - sq * sw) / det);
    *m = static_cast<float>((sqq * sw - sq * sqw) / det);
  }
}

// The s8 candidate scales' factors 1 - 0.004 k, s4's range shrinks 0.02 k and s2's divisors 3 + 0.1875 k, in
// float.
inline float S8Factor(int k) { return 1.0f - 0.004f * static_cast<float>(k); }
inline float S4Shrink(int k) { return 0.02f * static_cast<float>(k); }
inline float S2Divisor(int k) { return 3.0f + 0.1875f * static_cast<float>(k); }
inline constexpr int kS8Candidates = 8;   // k = 0..7
inline constexpr int kS4Candidates = 4;   // k = 0..3, after the full range
inline constexpr int kS4Refinements = 2;  // least squares on the best so far's codes, after the candidates
inline constexpr int kS2Candidates = 16;  // k = 1..16, after amax / 3

}  // namespace strata::kernels::internal

#endif  // STRATA_KERNELS_CPU_QUANTIZE_FIT_H_
