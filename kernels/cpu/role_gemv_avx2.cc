// RoleGemv for AVX2 (with FMA and F16C). A 16-row tile is computed as two halves of 8 rows, each the
// 32-byte half of every chunk, mapped onto the 8 int32 lanes of a ymm register. Without VNNI, a chunk
// plane is multiplied with vpmaddubsw (u8 x s8 -> s16 pairs) and widened with vpmaddwd; the s16 partial
// sums stay below 2^15 for the value ranges of each scheme, so the block sums are exact. s8 weights are
// made unsigned with the sign trick (|w| times sign(w)*x), since 255 * 127 pairs would saturate; mxfp4's
// codes become their levels plus 12 (unsigned) by a byte shuffle, corrected by the activation's code sum.

#include <immintrin.h>

#include <cstring>

#include "kernels/cpu/role_gemv_internal.h"
#include "kernels/format/mxfp4.h"
#include "kernels/format/role_layout.h"

namespace strata::kernels::internal {
namespace {

inline __m256i Broadcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof v);
  return _mm256_set1_epi32(v);
}

inline __m256i Load32(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

inline __m256 LoadHalves8(const uint8_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

inline float HorizontalSum(__m256 v) {
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  const __m128 s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 0x55));
  return _mm_cvtss_f32(s1);
}

template <int T>
struct Tokens {
  const int8_t* q[T];
  const float* scale[T];
  const int32_t* sum[T];
};

// acc[t] = fmaf(float(isum[t]), d * scale, acc[t]) for block b.
template <int T>
inline void BlockStep(const Tokens<T>& x, int64_t b, __m256 d, const __m256i* isum, __m256* acc) {
#pragma GCC unroll 4
  for (int t = 0; t < T; ++t) {
    const __m256 ds = _mm256_mul_ps(d, _mm256_set1_ps(x.scale[t][b]));
    acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t]), ds, acc[t]);
  }
}

// `codes` and `scales` point at the tile's half: byte 32*half of the codes, byte 16*half of the scales.
template <int T>
void HalfS2(const uint8_t* codes, const uint8_t* scales, int64_t cols, const Tokens<T>& x, __m256* acc) {
  const __m256i m6 = _mm256_set1_epi8(6);
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t g = 0; g < cols / 64; ++g) {
    const __m256 d = LoadHalves8(scales + g * 32);
    for (int h = 0; h < 2; ++h) {
      const int64_t b = 2 * g + h;
      __m256i s16[T];
#pragma GCC unroll 4
      for (int t = 0; t < T; ++t) s16[t] = _mm256_setzero_si256();
#pragma GCC unroll 2
      for (int k = 0; k < 2; ++k) {
        const __m256i v = Load32(codes + (4 * g + 2 * h + k) * 64);
        const __m256i p0 = _mm256_and_si256(_mm256_slli_epi16(v, 1), m6);
        const __m256i p1 = _mm256_and_si256(_mm256_srli_epi16(v, 1), m6);
        const __m256i p2 = _mm256_and_si256(_mm256_srli_epi16(v, 3), m6);
        const __m256i p3 = _mm256_and_si256(_mm256_srli_epi16(v, 5), m6);
        const int64_t c = b * 32 + k * 16;
#pragma GCC unroll 4
        for (int t = 0; t < T; ++t) {
          // At most 8 pairs of 6 * 128 per s16 lane: no overflow.
          const __m256i a = _mm256_add_epi16(_mm256_maddubs_epi16(p0, Broadcast4(x.q[t] + c)),
                                             _mm256_maddubs_epi16(p1, Broadcast4(x.q[t] + c + 4)));
          const __m256i e = _mm256_add_epi16(_mm256_maddubs_epi16(p2, Broadcast4(x.q[t] + c + 8)),
                                             _mm256_maddubs_epi16(p3, Broadcast4(x.q[t] + c + 12)));
          s16[t] = _mm256_add_epi16(s16[t], _mm256_add_epi16(a, e));
        }
      }
      __m256i isum[T];
#pragma GCC unroll 4
      for (int t = 0; t < T; ++t) {
        isum[t] = _mm256_add_epi32(_mm256_madd_epi16(s16[t], ones), _mm256_set1_epi32(-3 * x.sum[t][b]));
      }
      BlockStep<T>(x, b, d, isum, acc);
    }
  }
}

template <int T>
void HalfS4(const uint8_t* codes, const uint8_t* scales, int64_t cols, const Tokens<T>& x, __m256* acc) {
  const __m256i m15 = _mm256_set1_epi8(15);
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t b = 0; b < cols / 32; ++b) {
    const __m256 d = LoadHalves8(scales + b * 64);
    const __m256 m = LoadHalves8(scales + b * 64 + 32);
    __m256i s16[T];
#pragma GCC unroll 4
    for (int t = 0; t < T; ++t) s16[t] = _mm256_setzero_si256();
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) {
      const __m256i v = Load32(codes + (4 * b + k) * 64);
      const __m256i lo = _mm256_and_si256(v, m15);
      const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m15);
      const int64_t c = b * 32 + k * 8;
#pragma GCC unroll 4
      for (int t = 0; t < T; ++t) {
        // At most 8 pairs of 15 * 128 per s16 lane: no overflow.
        s16[t] = _mm256_add_epi16(s16[t], _mm256_add_epi16(_mm256_maddubs_epi16(lo, Broadcast4(x.q[t] + c)),
                                                           _mm256_maddubs_epi16(hi, Broadcast4(x.q[t] + c + 4))));
      }
    }
    __m256i isum[T];
#pragma GCC unroll 4
    for (int t = 0; t < T; ++t) isum[t] = _mm256_madd_epi16(s16[t], ones);
    BlockStep<T>(x, b, d, isum, acc);
#pragma GCC unroll 4
    for (int t = 0; t < T; ++t) {
      const float ms = x.scale[t][b] * static_cast<float>(x.sum[t][b]);
      acc[t] = _mm256_fmadd_ps(m, _mm256_set1_ps(ms), acc[t]);
    }
  }
}

template <int T>
void HalfS8(const uint8_t* codes, const uint8_t* scales, int64_t cols, const Tokens<T>& x, __m256* acc) {
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t b = 0; b < cols / 32; ++b) {
    const __m256 d = LoadHalves8(scales + b * 32);
    __m256i isum[T];
#pragma GCC unroll 4
    for (int t = 0; t < T; ++t) isum[t] = _mm256_setzero_si256();
#pragma GCC unroll 8
    for (int k = 0; k < 8; ++k) {
      const __m256i w = Load32(codes + (8 * b + k) * 64);
      const __m256i aw = _mm256_sign_epi8(w, w);
      const int64_t c = b * 32 + k * 4;
#pragma GCC unroll 4
      for (int t = 0; t < T; ++t) {
        const __m256i sx = _mm256_sign_epi8(Broadcast4(x.q[t] + c), w);
        isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(_mm256_maddubs_epi16(aw, sx), ones));
      }
    }
    BlockStep<T>(x, b, d, isum, acc);
  }
}

// Eight rows' mxfp4 scales from their exponent bytes, as Mxfp4Scale builds them: (e - 1) << 23 is the float
// 2^(e - 128) for e >= 2; e = 0 and 1 are the subnormals 0x00200000 << e.
inline __m256 LoadMxfp4Scales8(const uint8_t* p) {
  const __m256i e = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  const __m256i normal = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
  const __m256i subnormal = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), e);
  const __m256i is_normal = _mm256_cmpgt_epi32(e, _mm256_set1_epi32(1));
  return _mm256_castsi256_ps(_mm256_blendv_epi8(subnormal, normal, is_normal));
}

// mxfp4's levels offset by 12 are unsigned (0..24), vpmaddubsw's weight operand: isum = sum (L + 12) x - 12 sum x,
// with sum x the activation block's code sum.
template <int T>
void HalfMxfp4(const uint8_t* codes, const uint8_t* scales, int64_t cols, const Tokens<T>& x, __m256* acc) {
  const __m256i m15 = _mm256_set1_epi8(15);
  const __m256i ones = _mm256_set1_epi16(1);
  const __m128i levels = _mm_loadu_si128(reinterpret_cast<const __m128i*>(kMxfp4Levels));
  const __m256i offset_levels = _mm256_broadcastsi128_si256(_mm_add_epi8(levels, _mm_set1_epi8(12)));
  for (int64_t b = 0; b < cols / 32; ++b) {
    const __m256 d = LoadMxfp4Scales8(scales + b * 16);
    __m256i isum[T];
#pragma GCC unroll 4
    for (int t = 0; t < T; ++t) isum[t] = _mm256_setzero_si256();
#pragma GCC unroll 2
    for (int pair = 0; pair < 2; ++pair) {
      __m256i s16[T];
#pragma GCC unroll 4
      for (int t = 0; t < T; ++t) s16[t] = _mm256_setzero_si256();
#pragma GCC unroll 2
      for (int k = 2 * pair; k < 2 * pair + 2; ++k) {
        const __m256i v = Load32(codes + (4 * b + k) * 64);
        const __m256i lo = _mm256_shuffle_epi8(offset_levels, _mm256_and_si256(v, m15));
        const __m256i hi = _mm256_shuffle_epi8(offset_levels, _mm256_and_si256(_mm256_srli_epi16(v, 4), m15));
        const int64_t c = b * 32 + k * 8;
#pragma GCC unroll 4
        for (int t = 0; t < T; ++t) {
          // Two chunks: at most 8 pairs of 24 * 127 per s16 lane, no overflow.
          s16[t] = _mm256_add_epi16(s16[t], _mm256_add_epi16(_mm256_maddubs_epi16(lo, Broadcast4(x.q[t] + c)),
                                                             _mm256_maddubs_epi16(hi, Broadcast4(x.q[t] + c + 4))));
        }
      }
#pragma GCC unroll 4
      for (int t = 0; t < T; ++t) isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(s16[t], ones));
    }
#pragma GCC unroll 4
    for (int t = 0; t < T; ++t) isum[t] = _mm256_sub_epi32(isum[t], _mm256_set1_epi32(12 * x.sum[t][b]));
    BlockStep<T>(x, b, d, isum, acc);
  }
}

template <int T>
void TileInteger(Scheme s, const uint8_t* role, int64_t rows, int64_t cols, int64_t tile, int64_t row_begin,
                 int64_t row_end, const QuantizedActivation* const* xs, float* const* outs) {
  Tokens<T> x;
  for (int t = 0; t < T; ++t) {
    x.q[t] = xs[t]->q.data();
    x.scale[t] = xs[t]->scale.data();
    x.sum[t] = xs[t]->sum.data();
  }
  const uint8_t* codes = layout::TileCodes(s, role, cols, tile);
  const uint8_t* scales = layout::TileScales(s, role, rows, cols, tile);
  for (int half = 0; half < 2; ++half) {
    const int64_t r0 = tile * kRowTile + 8 * half;
    if (r0 + 8 <= row_begin || r0 >= row_end) continue;
    __m256 acc[T];
    for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_ps();
    switch (s) {
      case Scheme::kS2:
        HalfS2<T>(codes + 32 * half, scales + 16 * half, cols, x, acc);
        break;
      case Scheme::kS4:
        HalfS4<T>(codes + 32 * half, scales + 16 * half, cols, x, acc);
        break;
      case Scheme::kMxfp4:
        HalfMxfp4<T>(codes + 32 * half, scales + 8 * half, cols, x, acc);  // one exponent byte a row
        break;
      default:
        HalfS8<T>(codes + 32 * half, scales + 16 * half, cols, x, acc);
        break;
    }
    if (r0 >= row_begin && r0 + 8 <= row_end) {
      for (int t = 0; t < T; ++t) _mm256_storeu_ps(outs[t] + r0, acc[t]);
    } else {
      for (int t = 0; t < T; ++t) {
        alignas(32) float v[8];
        _mm256_store_ps(v, acc[t]);
        for (int i = 0; i < 8; ++i) {
          if (r0 + i >= row_begin && r0 + i < row_end) outs[t][r0 + i] = v[i];
        }
      }
    }
  }
}

template <int T>
void RowF16(const uint8_t* role, int64_t cols, int64_t r, const QuantizedActivation* const* xs,
            float* const* outs) {
  const uint8_t* w = role + 2 * r * cols;
  __m256 acc0[T], acc1[T];
  for (int t = 0; t < T; ++t) acc0[t] = acc1[t] = _mm256_setzero_ps();
  for (int64_t c = 0; c < cols; c += 16) {
    const __m256 w0 = LoadHalves8(w + 2 * c);
    const __m256 w1 = LoadHalves8(w + 2 * c + 16);
#pragma GCC unroll 4
    for (int t = 0; t < T; ++t) {
      acc0[t] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xs[t]->f32.data() + c), acc0[t]);
      acc1[t] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xs[t]->f32.data() + c + 8), acc1[t]);
    }
  }
  for (int t = 0; t < T; ++t) outs[t][r] = HorizontalSum(_mm256_add_ps(acc0[t], acc1[t]));
}

template <typename Fn>
inline void ForTokenGroups(int n_tokens, Fn&& fn) {
  for (int t0 = 0; t0 < n_tokens; t0 += kMaxTokensPerPass) {
    switch (n_tokens - t0) {
      case 1:
        fn.template operator()<1>(t0);
        break;
      case 2:
        fn.template operator()<2>(t0);
        break;
      case 3:
        fn.template operator()<3>(t0);
        break;
      default:
        fn.template operator()<4>(t0);
        break;
    }
  }
}

}  // namespace

void RoleGemvAvx2(Scheme scheme, const uint8_t* role, int64_t rows, int64_t cols, int64_t row_begin,
                  int64_t row_end, const QuantizedActivation* const* xs, int n_tokens, float* const* outs) {
  if (scheme == Scheme::kF16) {
    for (int64_t r = row_begin; r < row_end; ++r) {
      ForTokenGroups(n_tokens, [&]<int T>(int t0) { RowF16<T>(role, cols, r, xs + t0, outs + t0); });
    }
    return;
  }
  for (int64_t tile = row_begin / kRowTile; tile * kRowTile < row_end; ++tile) {
    ForTokenGroups(n_tokens, [&]<int T>(int t0) {
      TileInteger<T>(scheme, role, rows, cols, tile, row_begin, row_end, xs + t0, outs + t0);
    });
  }
}

}  // namespace strata::kernels::internal
