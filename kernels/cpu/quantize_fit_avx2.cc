// The fits with AVX2 (and F16C for the rounding to half): eight groups per register. Compiled with -mavx2
// -mfma -mf16c -ffp-contract=off; called only where the CPU has them.

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/quantize_fit_simd.h"

namespace strata::kernels::internal {
namespace {

struct Avx2 {
  static constexpr int kLanes = 8;
  using F = __m256;
  using I = __m256i;
  using M = __m256;

  static F Load(const float* p) { return _mm256_load_ps(p); }
  static void Store(float* p, F a) { _mm256_store_ps(p, a); }
  static void StoreUnaligned(float* p, F a) { _mm256_storeu_ps(p, a); }
  static void StoreI(uint32_t* p, I a) { _mm256_store_si256(reinterpret_cast<__m256i*>(p), a); }
  static I LoadI(const uint32_t* p) { return _mm256_load_si256(reinterpret_cast<const __m256i*>(p)); }
  // MagnitudeKeyS2 of every lane with its top bit flipped, so that signed compares order the keys.
  static I BiasedKeyS2(F x) {
    const I magnitude = _mm256_slli_epi32(_mm256_castps_si256(Abs(x)), 1);
    const I positive = _mm256_srli_epi32(_mm256_castps_si256(_mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_GT_OQ)), 31);
    return _mm256_xor_si256(_mm256_or_si256(magnitude, positive), _mm256_set1_epi32(INT32_MIN));
  }
  static M GtI(I a, I b) { return _mm256_castsi256_ps(_mm256_cmpgt_epi32(a, b)); }
  static I CountIf(I count, M m) { return _mm256_sub_epi32(count, _mm256_castps_si256(m)); }  // m lanes are -1
  static F AddIf(F sum, M m, F a) { return _mm256_add_ps(sum, _mm256_and_ps(m, a)); }  // + 0.0 elsewhere
  static F Set(float v) { return _mm256_set1_ps(v); }
  static I SetI(int32_t v) { return _mm256_set1_epi32(v); }
  static F Add(F a, F b) { return _mm256_add_ps(a, b); }
  static F Sub(F a, F b) { return _mm256_sub_ps(a, b); }
  static F Mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F Div(F a, F b) { return _mm256_div_ps(a, b); }
  static F Min(F a, F b) { return _mm256_min_ps(a, b); }
  static F Max(F a, F b) { return _mm256_max_ps(a, b); }
  static F Abs(F a) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), a); }
  static F CopySignHalf(F t) { return _mm256_or_ps(_mm256_set1_ps(0.5f), _mm256_and_ps(t, _mm256_set1_ps(-0.0f))); }
  static I Cvtt(F a) { return _mm256_cvttps_epi32(a); }
  static F Trunc(F a) { return _mm256_round_ps(a, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC); }
  static F ToFloat(I a) { return _mm256_cvtepi32_ps(a); }
  static I AddI(I a, I b) { return _mm256_add_epi32(a, b); }
  static I SubI(I a, I b) { return _mm256_sub_epi32(a, b); }
  static I MulI(I a, I b) { return _mm256_mullo_epi32(a, b); }
  static M Lt(F a, F b) { return _mm256_cmp_ps(a, b, _CMP_LT_OQ); }
  static M Gt(F a, F b) { return _mm256_cmp_ps(a, b, _CMP_GT_OQ); }
  static M Eq(F a, F b) { return _mm256_cmp_ps(a, b, _CMP_EQ_OQ); }
  static M And(M a, M b) { return _mm256_and_ps(a, b); }
  static bool AllTrue(M m) { return _mm256_movemask_ps(m) == 0xFF; }
  static F Select(M m, F a, F b) { return _mm256_blendv_ps(b, a, m); }  // m ? a : b
  static F RoundHalf(F a) { return _mm256_cvtph_ps(_mm256_cvtps_ph(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)); }

  // wt[i][lane] = w[lane * n + i] for the kLanes groups of n weights at w (n a multiple of 8), by 8 x 8
  // blocks.
  static void Transpose(const float* w, int n, float (*wt)[kLanes]) {
    for (int i0 = 0; i0 < n; i0 += 8) {
      __m256 r[8], t[8];
      for (int lane = 0; lane < 8; ++lane) r[lane] = _mm256_loadu_ps(w + lane * n + i0);
      for (int p = 0; p < 4; ++p) {
        t[2 * p] = _mm256_unpacklo_ps(r[2 * p], r[2 * p + 1]);
        t[2 * p + 1] = _mm256_unpackhi_ps(r[2 * p], r[2 * p + 1]);
      }
      for (int p = 0; p < 2; ++p) {
        for (int h = 0; h < 2; ++h) {
          const __m256 a = t[4 * p + h], b = t[4 * p + h + 2];
          r[4 * p + 2 * h] = _mm256_shuffle_ps(a, b, _MM_SHUFFLE(1, 0, 1, 0));
          r[4 * p + 2 * h + 1] = _mm256_shuffle_ps(a, b, _MM_SHUFFLE(3, 2, 3, 2));
        }
      }
      // r[0..3]: lanes 0-3 of weights (i0 + 0, 1, 2, 3) in the low half and (i0 + 4 .. 7) in the high half;
      // r[4..7]: the same for lanes 4-7.
      for (int j = 0; j < 4; ++j) {
        _mm256_store_ps(wt[i0 + j], _mm256_permute2f128_ps(r[j], r[4 + j], 0x20));
        _mm256_store_ps(wt[i0 + 4 + j], _mm256_permute2f128_ps(r[j], r[4 + j], 0x31));
      }
    }
  }

  // Writes the low bytes of q[0..8) (the codes of eight consecutive weights, every lane a group) as eight
  // bytes at dst + lane * stride for each lane.
  static void StoreCodes8(const I* q, uint8_t* dst, int64_t stride) {
    StoreCodes8Words(Word4(q), Word4(q + 4), dst, stride);
  }
  // q[0] | q[1] << 8 | q[2] << 16 | q[3] << 24 of the low bytes, per lane.
  static I Word4(const I* q) {
    const I byte = _mm256_set1_epi32(0xFF);
    const I lo = _mm256_or_si256(_mm256_and_si256(q[0], byte), _mm256_slli_epi32(_mm256_and_si256(q[1], byte), 8));
    const I hi = _mm256_or_si256(_mm256_slli_epi32(_mm256_and_si256(q[2], byte), 16), _mm256_slli_epi32(q[3], 24));
    return _mm256_or_si256(lo, hi);
  }
  // Lane g's eight bytes are (w0[g], w1[g]).
  static void StoreCodes8Words(__m256i w0, __m256i w1, uint8_t* dst, int64_t stride) {
    const __m256i even = _mm256_unpacklo_epi32(w0, w1);  // lanes 0, 1, 4, 5 as 64-bit words
    const __m256i odd = _mm256_unpackhi_epi32(w0, w1);   // lanes 2, 3, 6, 7
    const int64_t words[8] = {_mm256_extract_epi64(even, 0), _mm256_extract_epi64(even, 1),
                              _mm256_extract_epi64(odd, 0),  _mm256_extract_epi64(odd, 1),
                              _mm256_extract_epi64(even, 2), _mm256_extract_epi64(even, 3),
                              _mm256_extract_epi64(odd, 2),  _mm256_extract_epi64(odd, 3)};
    for (int lane = 0; lane < 8; ++lane) std::memcpy(dst + lane * stride, &words[lane], 8);
  }

  // s2's choice among candidate scales on every lane, in double as ScoreS2 (quantize_fit.h) computes:
  // First takes d_0, Offer the others (where d > 0) and returns float(N / D) of the candidate's codes (0
  // where it was skipped), Best the winner.
  class S2Choice {
   public:
    void First(int n, F d, F sum_abs, F outer_abs, I outer) {
      for (int h = 0; h < 2; ++h) {
        best_d_[h] = _mm256_cvtps_pd(Half(d, h));
        best_err_[h] = Score(n, best_d_[h], sum_abs, outer_abs, outer, h, nullptr);
      }
    }
    F Offer(int n, F d, F sum_abs, F outer_abs, I outer) {
      __m128 least_squares[2];
      for (int h = 0; h < 2; ++h) {
        const __m256d dd = _mm256_cvtps_pd(Half(d, h));
        __m256d ls;
        const __m256d err = Score(n, dd, sum_abs, outer_abs, outer, h, &ls);
        const __m256d valid = _mm256_cmp_pd(dd, _mm256_setzero_pd(), _CMP_GT_OQ);
        const __m256d better = _mm256_and_pd(valid, _mm256_cmp_pd(err, best_err_[h], _CMP_LT_OQ));
        best_d_[h] = _mm256_blendv_pd(best_d_[h], dd, better);
        best_err_[h] = _mm256_blendv_pd(best_err_[h], err, better);
        least_squares[h] = _mm256_cvtpd_ps(_mm256_and_pd(valid, ls));
      }
      return _mm256_set_m128(least_squares[1], least_squares[0]);
    }
    F Best() const { return _mm256_set_m128(_mm256_cvtpd_ps(best_d_[1]), _mm256_cvtpd_ps(best_d_[0])); }

   private:
    static __m128 Half(F v, int h) { return h == 0 ? _mm256_castps256_ps128(v) : _mm256_extractf128_ps(v, 1); }
    // ScoreS2's err for lanes 4h..4h+3, and its N / D in *least_squares.
    static __m256d Score(int n, __m256d dd, F sum_abs, F outer_abs, I outer, int h, __m256d* least_squares) {
      const __m256d sum_lx = _mm256_add_pd(_mm256_cvtps_pd(Half(sum_abs, h)),
                                           _mm256_mul_pd(_mm256_set1_pd(2.0), _mm256_cvtps_pd(Half(outer_abs, h))));
      const __m128i outer_h = h == 0 ? _mm256_castsi256_si128(outer) : _mm256_extracti128_si256(outer, 1);
      const __m256d sum_ll = _mm256_add_pd(_mm256_set1_pd(static_cast<double>(n)),
                                           _mm256_mul_pd(_mm256_set1_pd(8.0), _mm256_cvtepi32_pd(outer_h)));
      if (least_squares != nullptr) *least_squares = _mm256_div_pd(sum_lx, sum_ll);
      return _mm256_mul_pd(dd, _mm256_sub_pd(_mm256_mul_pd(dd, sum_ll), _mm256_mul_pd(_mm256_set1_pd(2.0), sum_lx)));
    }
    __m256d best_d_[2], best_err_[2];
  };

  // SolveAffine on every lane: the same double operations, four lanes at a time.
  static void SolveAffine(int n, I sum_q, I sum_qq, F sum_w, F sum_qw, F* d, F* m) {
    const __m256d nd = _mm256_set1_pd(static_cast<double>(n)), zero = _mm256_setzero_pd();
    __m128 d_out[2], m_out[2];
    for (int h = 0; h < 2; ++h) {
      const __m256d sq = _mm256_cvtepi32_pd(h == 0 ? _mm256_castsi256_si128(sum_q) : _mm256_extracti128_si256(sum_q, 1));
      const __m256d sqq =
          _mm256_cvtepi32_pd(h == 0 ? _mm256_castsi256_si128(sum_qq) : _mm256_extracti128_si256(sum_qq, 1));
      const __m256d sw = _mm256_cvtps_pd(h == 0 ? _mm256_castps256_ps128(sum_w) : _mm256_extractf128_ps(sum_w, 1));
      const __m256d sqw = _mm256_cvtps_pd(h == 0 ? _mm256_castps256_ps128(sum_qw) : _mm256_extractf128_ps(sum_qw, 1));
      const __m256d d0 = _mm256_cvtps_pd(h == 0 ? _mm256_castps256_ps128(*d) : _mm256_extractf128_ps(*d, 1));
      const __m256d m0 = _mm256_cvtps_pd(h == 0 ? _mm256_castps256_ps128(*m) : _mm256_extractf128_ps(*m, 1));
      const __m256d det = _mm256_sub_pd(_mm256_mul_pd(nd, sqq), _mm256_mul_pd(sq, sq));
      const __m256d solved_d = _mm256_div_pd(_mm256_sub_pd(_mm256_mul_pd(nd, sqw), _mm256_mul_pd(sq, sw)), det);
      const __m256d solved_m = _mm256_div_pd(_mm256_sub_pd(_mm256_mul_pd(sqq, sw), _mm256_mul_pd(sq, sqw)), det);
      const __m256d use = _mm256_cmp_pd(det, zero, _CMP_GT_OQ);
      d_out[h] = _mm256_cvtpd_ps(_mm256_blendv_pd(d0, solved_d, use));
      m_out[h] = _mm256_cvtpd_ps(_mm256_blendv_pd(m0, solved_m, use));
    }
    *d = _mm256_set_m128(d_out[1], d_out[0]);
    *m = _mm256_set_m128(m_out[1], m_out[0]);
  }

  // The error of decoded values against the weights, in double, per lane.
  struct ErrorSums {
    __m256d err2[2] = {_mm256_setzero_pd(), _mm256_setzero_pd()};
    __m256d ref2[2] = {_mm256_setzero_pd(), _mm256_setzero_pd()};
    __m256d max_abs[2] = {_mm256_setzero_pd(), _mm256_setzero_pd()};
    void Add(F x, F back) {
      const __m256d xs[2] = {_mm256_cvtps_pd(_mm256_castps256_ps128(x)), _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1))};
      const __m256d bs[2] = {_mm256_cvtps_pd(_mm256_castps256_ps128(back)),
                             _mm256_cvtps_pd(_mm256_extractf128_ps(back, 1))};
      for (int h = 0; h < 2; ++h) {
        const __m256d e = _mm256_sub_pd(xs[h], bs[h]);
        err2[h] = _mm256_add_pd(err2[h], _mm256_mul_pd(e, e));
        ref2[h] = _mm256_add_pd(ref2[h], _mm256_mul_pd(xs[h], xs[h]));
        max_abs[h] = _mm256_max_pd(max_abs[h], _mm256_andnot_pd(_mm256_set1_pd(-0.0), e));
      }
    }
    void Flush(QuantizeError* error) const {
      alignas(32) double e[8], r[8], a[8];
      for (int h = 0; h < 2; ++h) {
        _mm256_store_pd(e + 4 * h, err2[h]);
        _mm256_store_pd(r + 4 * h, ref2[h]);
        _mm256_store_pd(a + 4 * h, max_abs[h]);
      }
      for (int i = 0; i < 8; ++i) {
        error->err2 += e[i];
        error->ref2 += r[i];
        error->max_abs = std::max(error->max_abs, a[i]);
      }
    }
  };
};

}  // namespace

int64_t FitGroupsAvx2(Scheme s, const float* w, int64_t n_groups, float* d, float* m, uint8_t* codes,
                      QuantizeError* error) {
  if (s == Scheme::kMxfp4) return 0;  // mxfp4's fit is scalar on every path
  return FitGroupsSimd<Avx2>(s, w, n_groups, d, m, codes, error);
}

int64_t RoundToHalfAvx2(const float* src, int64_t n, uint8_t* dst, QuantizeError* error) {
  Avx2::ErrorSums sums;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_loadu_ps(src + i);
    const __m128i h = _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 2 * i), h);
    sums.Add(x, _mm256_cvtph_ps(h));
  }
  sums.Flush(error);
  return i;
}

int64_t FloatsToHalvesAvx2(const float* src, int64_t n, uint16_t* dst) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), h);
  }
  return i;
}

}  // namespace strata::kernels::internal
