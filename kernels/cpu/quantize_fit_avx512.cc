// The fits with AVX-512 (F, DQ; F16C for the rounding to half): sixteen groups per register. Compiled with
// the AVX-512 flags and -ffp-contract=off; called only where the CPU has them.

#include <immintrin.h>

// GCC 12 warns inside its own AVX-512 headers (the self-initialised _mm512_undefined_* values, GCC bug
// 105593) wherever they are inlined.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/quantize_fit_simd.h"

namespace strata::kernels::internal {
namespace {

struct Avx512 {
  static constexpr int kLanes = 16;
  using F = __m512;
  using I = __m512i;
  using M = __mmask16;

  static F Load(const float* p) { return _mm512_load_ps(p); }
  static void Store(float* p, F a) { _mm512_store_ps(p, a); }
  static void StoreUnaligned(float* p, F a) { _mm512_storeu_ps(p, a); }
  static void StoreI(uint32_t* p, I a) { _mm512_store_si512(p, a); }
  static I LoadI(const uint32_t* p) { return _mm512_load_si512(p); }
  // MagnitudeKeyS2 of every lane with its top bit flipped, so that signed compares order the keys.
  static I BiasedKeyS2(F x) {
    const I magnitude = _mm512_slli_epi32(_mm512_castps_si512(Abs(x)), 1);
    const __mmask16 positive = _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_GT_OQ);
    const I key = _mm512_mask_or_epi32(magnitude, positive, magnitude, _mm512_set1_epi32(1));
    return _mm512_xor_si512(key, _mm512_set1_epi32(INT32_MIN));
  }
  static M GtI(I a, I b) { return _mm512_cmpgt_epi32_mask(a, b); }
  static I CountIf(I count, M m) { return _mm512_mask_add_epi32(count, m, count, _mm512_set1_epi32(1)); }
  // sum + a where m is set, sum elsewhere: the same as adding +0.0 there, since sum is never -0.0.
  static F AddIf(F sum, M m, F a) { return _mm512_mask_add_ps(sum, m, sum, a); }
  static F Set(float v) { return _mm512_set1_ps(v); }
  static I SetI(int32_t v) { return _mm512_set1_epi32(v); }
  static F Add(F a, F b) { return _mm512_add_ps(a, b); }
  static F Sub(F a, F b) { return _mm512_sub_ps(a, b); }
  static F Mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F Div(F a, F b) { return _mm512_div_ps(a, b); }
  static F Min(F a, F b) { return _mm512_min_ps(a, b); }
  static F Max(F a, F b) { return _mm512_max_ps(a, b); }
  static F Abs(F a) { return _mm512_andnot_ps(_mm512_set1_ps(-0.0f), a); }
  static F CopySignHalf(F t) { return _mm512_or_ps(_mm512_set1_ps(0.5f), _mm512_and_ps(t, _mm512_set1_ps(-0.0f))); }
  static I Cvtt(F a) { return _mm512_cvttps_epi32(a); }
  static F Trunc(F a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC); }
  static F ToFloat(I a) { return _mm512_cvtepi32_ps(a); }
  static I AddI(I a, I b) { return _mm512_add_epi32(a, b); }
  static I SubI(I a, I b) { return _mm512_sub_epi32(a, b); }
  static I MulI(I a, I b) { return _mm512_mullo_epi32(a, b); }
  static M Lt(F a, F b) { return _mm512_cmp_ps_mask(a, b, _CMP_LT_OQ); }
  static M Gt(F a, F b) { return _mm512_cmp_ps_mask(a, b, _CMP_GT_OQ); }
  static M Eq(F a, F b) { return _mm512_cmp_ps_mask(a, b, _CMP_EQ_OQ); }
  static M And(M a, M b) { return static_cast<M>(a & b); }
  static bool AllTrue(M m) { return m == 0xFFFF; }
  static F Select(M m, F a, F b) { return _mm512_mask_blend_ps(m, b, a); }  // m ? a : b
  static F RoundHalf(F a) { return _mm512_cvtph_ps(_mm512_cvtps_ph(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)); }

  // wt[i][lane] = w[lane * n + i] for the kLanes groups of n weights at w.
  static void Transpose(const float* w, int n, float (*wt)[kLanes]) {
    for (int lane = 0; lane < kLanes; ++lane) {
      for (int i = 0; i < n; ++i) wt[i][lane] = w[lane * n + i];
    }
  }

  // Writes the low bytes of q[0..8) (the codes of eight consecutive weights, every lane a group) as eight
  // bytes at dst + lane * stride for each lane: AVX2's way, a half of the lanes at a time.
  static void StoreCodes8(const I* q, uint8_t* dst, int64_t stride) {
    const I w0 = Word4(q), w1 = Word4(q + 4);
    for (int h = 0; h < 2; ++h) {
      const __m256i w0h = h == 0 ? _mm512_castsi512_si256(w0) : _mm512_extracti64x4_epi64(w0, 1);
      const __m256i w1h = h == 0 ? _mm512_castsi512_si256(w1) : _mm512_extracti64x4_epi64(w1, 1);
      const __m256i even = _mm256_unpacklo_epi32(w0h, w1h);  // lanes 0, 1, 4, 5 of the half as 64-bit words
      const __m256i odd = _mm256_unpackhi_epi32(w0h, w1h);   // lanes 2, 3, 6, 7
      const int64_t words[8] = {_mm256_extract_epi64(even, 0), _mm256_extract_epi64(even, 1),
                                _mm256_extract_epi64(odd, 0),  _mm256_extract_epi64(odd, 1),
                                _mm256_extract_epi64(even, 2), _mm256_extract_epi64(even, 3),
                                _mm256_extract_epi64(odd, 2),  _mm256_extract_epi64(odd, 3)};
      for (int lane = 0; lane < 8; ++lane) std::memcpy(dst + (8 * h + lane) * stride, &words[lane], 8);
    }
  }
  // q[0] | q[1] << 8 | q[2] << 16 | q[3] << 24 of the low bytes, per lane.
  static I Word4(const I* q) {
    const I byte = _mm512_set1_epi32(0xFF);
    const I lo = _mm512_or_si512(_mm512_and_si512(q[0], byte), _mm512_slli_epi32(_mm512_and_si512(q[1], byte), 8));
    const I hi = _mm512_or_si512(_mm512_slli_epi32(_mm512_and_si512(q[2], byte), 16), _mm512_slli_epi32(q[3], 24));
    return _mm512_or_si512(lo, hi);
  }

  // s2's choice among candidate scales on every lane, in double as ScoreS2 (quantize_fit.h) computes:
  // First takes d_0, Offer the others (where d > 0) and returns float(N / D) of the candidate's codes (0
  // where it was skipped), Best the winner.
  class S2Choice {
   public:
    void First(int n, F d, F sum_abs, F outer_abs, I outer) {
      for (int h = 0; h < 2; ++h) {
        best_d_[h] = _mm512_cvtps_pd(Half(d, h));
        best_err_[h] = Score(n, best_d_[h], sum_abs, outer_abs, outer, h, nullptr);
      }
    }
    F Offer(int n, F d, F sum_abs, F outer_abs, I outer) {
      __m256 least_squares[2];
      for (int h = 0; h < 2; ++h) {
        const __m512d dd = _mm512_cvtps_pd(Half(d, h));
        __m512d ls;
        const __m512d err = Score(n, dd, sum_abs, outer_abs, outer, h, &ls);
        const __mmask8 valid = _mm512_cmp_pd_mask(dd, _mm512_setzero_pd(), _CMP_GT_OQ);
        const __mmask8 better = static_cast<__mmask8>(valid & _mm512_cmp_pd_mask(err, best_err_[h], _CMP_LT_OQ));
        best_d_[h] = _mm512_mask_blend_pd(better, best_d_[h], dd);
        best_err_[h] = _mm512_mask_blend_pd(better, best_err_[h], err);
        least_squares[h] = _mm512_cvtpd_ps(_mm512_maskz_mov_pd(valid, ls));
      }
      return _mm512_insertf32x8(_mm512_castps256_ps512(least_squares[0]), least_squares[1], 1);
    }
    F Best() const {
      return _mm512_insertf32x8(_mm512_castps256_ps512(_mm512_cvtpd_ps(best_d_[0])), _mm512_cvtpd_ps(best_d_[1]), 1);
    }

   private:
    static __m256 Half(F v, int h) { return h == 0 ? _mm512_castps512_ps256(v) : _mm512_extractf32x8_ps(v, 1); }
    // ScoreS2's err for lanes 8h..8h+7, and its N / D in *least_squares.
    static __m512d Score(int n, __m512d dd, F sum_abs, F outer_abs, I outer, int h, __m512d* least_squares) {
      const __m512d sum_lx = _mm512_add_pd(_mm512_cvtps_pd(Half(sum_abs, h)),
                                           _mm512_mul_pd(_mm512_set1_pd(2.0), _mm512_cvtps_pd(Half(outer_abs, h))));
      const __m256i outer_h = h == 0 ? _mm512_castsi512_si256(outer) : _mm512_extracti64x4_epi64(outer, 1);
      const __m512d sum_ll = _mm512_add_pd(_mm512_set1_pd(static_cast<double>(n)),
                                           _mm512_mul_pd(_mm512_set1_pd(8.0), _mm512_cvtepi32_pd(outer_h)));
      if (least_squares != nullptr) *least_squares = _mm512_div_pd(sum_lx, sum_ll);
      return _mm512_mul_pd(dd, _mm512_sub_pd(_mm512_mul_pd(dd, sum_ll), _mm512_mul_pd(_mm512_set1_pd(2.0), sum_lx)));
    }
    __m512d best_d_[2], best_err_[2];
  };

  // SolveAffine on every lane: the same double operations, eight lanes at a time.
  static void SolveAffine(int n, I sum_q, I sum_qq, F sum_w, F sum_qw, F* d, F* m) {
    const __m512d nd = _mm512_set1_pd(static_cast<double>(n)), zero = _mm512_setzero_pd();
    __m256 d_out[2], m_out[2];
    for (int h = 0; h < 2; ++h) {
      const __m512d sq = _mm512_cvtepi32_pd(h == 0 ? _mm512_castsi512_si256(sum_q) : _mm512_extracti64x4_epi64(sum_q, 1));
      const __m512d sqq =
          _mm512_cvtepi32_pd(h == 0 ? _mm512_castsi512_si256(sum_qq) : _mm512_extracti64x4_epi64(sum_qq, 1));
      const __m512d sw = _mm512_cvtps_pd(h == 0 ? _mm512_castps512_ps256(sum_w) : _mm512_extractf32x8_ps(sum_w, 1));
      const __m512d sqw = _mm512_cvtps_pd(h == 0 ? _mm512_castps512_ps256(sum_qw) : _mm512_extractf32x8_ps(sum_qw, 1));
      const __m512d d0 = _mm512_cvtps_pd(h == 0 ? _mm512_castps512_ps256(*d) : _mm512_extractf32x8_ps(*d, 1));
      const __m512d m0 = _mm512_cvtps_pd(h == 0 ? _mm512_castps512_ps256(*m) : _mm512_extractf32x8_ps(*m, 1));
      const __m512d det = _mm512_sub_pd(_mm512_mul_pd(nd, sqq), _mm512_mul_pd(sq, sq));
      const __m512d solved_d = _mm512_div_pd(_mm512_sub_pd(_mm512_mul_pd(nd, sqw), _mm512_mul_pd(sq, sw)), det);
      const __m512d solved_m = _mm512_div_pd(_mm512_sub_pd(_mm512_mul_pd(sqq, sw), _mm512_mul_pd(sq, sqw)), det);
      const __mmask8 use = _mm512_cmp_pd_mask(det, zero, _CMP_GT_OQ);
      d_out[h] = _mm512_cvtpd_ps(_mm512_mask_blend_pd(use, d0, solved_d));
      m_out[h] = _mm512_cvtpd_ps(_mm512_mask_blend_pd(use, m0, solved_m));
    }
    *d = _mm512_insertf32x8(_mm512_castps256_ps512(d_out[0]), d_out[1], 1);
    *m = _mm512_insertf32x8(_mm512_castps256_ps512(m_out[0]), m_out[1], 1);
  }

  struct ErrorSums {
    __m512d err2[2] = {_mm512_setzero_pd(), _mm512_setzero_pd()};
    __m512d ref2[2] = {_mm512_setzero_pd(), _mm512_setzero_pd()};
    __m512d max_abs[2] = {_mm512_setzero_pd(), _mm512_setzero_pd()};
    void Add(F x, F back) {
      const __m512d xs[2] = {_mm512_cvtps_pd(_mm512_castps512_ps256(x)), _mm512_cvtps_pd(_mm512_extractf32x8_ps(x, 1))};
      const __m512d bs[2] = {_mm512_cvtps_pd(_mm512_castps512_ps256(back)),
                             _mm512_cvtps_pd(_mm512_extractf32x8_ps(back, 1))};
      for (int h = 0; h < 2; ++h) {
        const __m512d e = _mm512_sub_pd(xs[h], bs[h]);
        err2[h] = _mm512_add_pd(err2[h], _mm512_mul_pd(e, e));
        ref2[h] = _mm512_add_pd(ref2[h], _mm512_mul_pd(xs[h], xs[h]));
        max_abs[h] = _mm512_max_pd(max_abs[h], _mm512_abs_pd(e));
      }
    }
    void Flush(QuantizeError* error) const {
      alignas(64) double e[16], r[16], a[16];
      for (int h = 0; h < 2; ++h) {
        _mm512_store_pd(e + 8 * h, err2[h]);
        _mm512_store_pd(r + 8 * h, ref2[h]);
        _mm512_store_pd(a + 8 * h, max_abs[h]);
      }
      for (int i = 0; i < 16; ++i) {
        error->err2 += e[i];
        error->ref2 += r[i];
        error->max_abs = std::max(error->max_abs, a[i]);
      }
    }
  };
};

}  // namespace

int64_t FitGroupsAvx512(Scheme s, const float* w, int64_t n_groups, float* d, float* m, uint8_t* codes,
                        QuantizeError* error) {
  if (s == Scheme::kMxfp4) return 0;  // mxfp4's fit is scalar on every path
  return FitGroupsSimd<Avx512>(s, w, n_groups, d, m, codes, error);
}

}  // namespace strata::kernels::internal
