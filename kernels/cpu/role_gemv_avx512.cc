// RoleGemv for AVX512 with VNNI. A 16-row tile maps onto the 16 int32 lanes of a zmm register: every
// 64-byte chunk, once unpacked, is the unsigned operand of vpdpbusd against 4 broadcast activation codes,
// so each lane accumulates one row's exact block sum with no horizontal reduction. Signed levels are
// made unsigned by an offset that the activation's block sum cancels (-128*sum for s8, -3*sum for s2, -12*sum for
// mxfp4, whose levels come from a vpshufb table).
// The float step per block is the reference's, lane by lane.
//
// Unpacking: byte shifts are the costly part, so with few tokens the planes of s2 and s4 are only masked
// in place (plane p then carries its code times 4^p or 16^p, exactly) and each plane's block sum is
// shifted back once per token; with more tokens the weights are shifted once for all of them instead.
// Both give the same integers.

// GCC 12 reports the intrinsics' own _mm512_undefined_* operands as maybe-uninitialized once inlined.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <immintrin.h>

#include <cstdint>

#include "kernels/cpu/role_gemv_internal.h"
#include "kernels/format/mxfp4.h"
#include "kernels/format/role_layout.h"

namespace strata::kernels::internal {
namespace {

// acc += vpdpbusd(u8, the 4 activation codes at x4 broadcast to every lane). GCC 12 does not fold the
// broadcast into the instruction ({1to16}), and the separate broadcast costs throughput.
inline __m512i Dot(__m512i acc, __m512i u8, const int8_t* x4) {
  asm("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(u8), "m"(*reinterpret_cast<const int8_t(*)[4]>(x4)));
  return acc;
}

// Weights are prefetched this far ahead of use: on many-core hosts the hardware prefetchers alone leave
// a core short of misses in flight (s2 went from 76 to 94 GB/s on 16 cores of an EPYC host).
constexpr uintptr_t kPrefetchBytes = 4096;

inline void Prefetch(const uint8_t* p) {
  // Integer arithmetic: the address may lie past the role, which a prefetch tolerates.
  _mm_prefetch(reinterpret_cast<const char*>(reinterpret_cast<uintptr_t>(p) + kPrefetchBytes), _MM_HINT_T0);
}

inline __m512 LoadHalves16(const uint8_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// Per-token pointers into the activations of one pass.
template <int T>
struct Tokens {
  const int8_t* q[T];
  const float* scale[T];
  const int32_t* sum[T];
};

// acc[t] = fmaf(float(isum[t]), d * scale, acc[t]) for block b.
template <int T>
inline void BlockStep(const Tokens<T>& x, int64_t b, __m512 d, const __m512i* isum, __m512* acc) {
#pragma GCC unroll 4
  for (int t = 0; t < T; ++t) {
    const __m512 ds = _mm512_mul_ps(d, _mm512_set1_ps(x.scale[t][b]));
    acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[t]), ds, acc[t]);
  }
}

template <int T>
void TileS2(const uint8_t* codes, const uint8_t* scales, int64_t cols, const Tokens<T>& x, __m512* acc) {
  const __m512i m3 = _mm512_set1_epi8(3), m6 = _mm512_set1_epi8(6);
  for (int64_t g = 0; g < cols / 64; ++g) {
    const __m512 d = LoadHalves16(scales + g * 32);
    if (g % 2 == 0) Prefetch(scales + g * 32);
    for (int h = 0; h < 2; ++h) {
      const int64_t b = 2 * g + h;
      const uint8_t* chunk = codes + (4 * g + 2 * h) * 64;
      Prefetch(chunk);
      Prefetch(chunk + 64);
      __m512i isum[T];
      if constexpr (T <= 3) {
        // a[p] = 4^p * sum q_p x; isum = 2 * sum_p (a[p] >> 2p) - 3 * sum x.
        __m512i a[T][4];
#pragma GCC unroll 4
        for (int t = 0; t < T; ++t) a[t][0] = a[t][1] = a[t][2] = a[t][3] = _mm512_setzero_si512();
#pragma GCC unroll 2
        for (int k = 0; k < 2; ++k) {
          const __m512i v = _mm512_loadu_si512(chunk + k * 64);
          const __m512i p0 = _mm512_and_si512(v, m3);
          const __m512i p1 = _mm512_and_si512(v, _mm512_slli_epi16(m3, 2));
          const __m512i p2 = _mm512_and_si512(v, _mm512_slli_epi16(m3, 4));
          const __m512i p3 = _mm512_and_si512(v, _mm512_slli_epi16(m3, 6));
          const int64_t c = b * 32 + k * 16;
#pragma GCC unroll 4
          for (int t = 0; t < T; ++t) {
            a[t][0] = Dot(a[t][0], p0, x.q[t] + c);
            a[t][1] = Dot(a[t][1], p1, x.q[t] + c + 4);
            a[t][2] = Dot(a[t][2], p2, x.q[t] + c + 8);
            a[t][3] = Dot(a[t][3], p3, x.q[t] + c + 12);
          }
        }
#pragma GCC unroll 4
        for (int t = 0; t < T; ++t) {
          const __m512i lo = _mm512_add_epi32(_mm512_slli_epi32(a[t][0], 1), _mm512_srai_epi32(a[t][1], 1));
          const __m512i hi = _mm512_add_epi32(_mm512_srai_epi32(a[t][2], 3), _mm512_srai_epi32(a[t][3], 5));
          isum[t] = _mm512_add_epi32(_mm512_add_epi32(lo, hi), _mm512_set1_epi32(-3 * x.sum[t][b]));
        }
      } else {
        // Planes unpacked to 2q once for all tokens.
#pragma GCC unroll 4
        for (int t = 0; t < T; ++t) isum[t] = _mm512_set1_epi32(-3 * x.sum[t][b]);
#pragma GCC unroll 2
        for (int k = 0; k < 2; ++k) {
          const __m512i v = _mm512_loadu_si512(chunk + k * 64);
          const __m512i p0 = _mm512_and_si512(_mm512_slli_epi16(v, 1), m6);
          const __m512i p1 = _mm512_and_si512(_mm512_srli_epi16(v, 1), m6);
          const __m512i p2 = _mm512_and_si512(_mm512_srli_epi16(v, 3), m6);
          const __m512i p3 = _mm512_and_si512(_mm512_srli_epi16(v, 5), m6);
          const int64_t c = b * 32 + k * 16;
#pragma GCC unroll 4
          for (int t = 0; t < T; ++t) {
            isum[t] = Dot(isum[t], p0, x.q[t] + c);
            isum[t] = Dot(isum[t], p1, x.q[t] + c + 4);
            isum[t] = Dot(isum[t], p2, x.q[t] + c + 8);
            isum[t] = Dot(isum[t], p3, x.q[t] + c + 12);
          }
        }
      }
      BlockStep<T>(x, b, d, isum, acc);
    }
  }
}

template <int T>
void TileS4(const uint8_t* codes, const uint8_t* scales, int64_t cols, const Tokens<T>& x, __m512* acc) {
  const __m512i m15 = _mm512_set1_epi8(15), m240 = _mm512_set1_epi8(static_cast<char>(0xF0));
  for (int64_t b = 0; b < cols / 32; ++b) {
    const __m512 d = LoadHalves16(scales + b * 64);
    const __m512 m = LoadHalves16(scales + b * 64 + 32);
    for (int k = 0; k < 4; ++k) Prefetch(codes + (4 * b + k) * 64);
    Prefetch(scales + b * 64);
    __m512i isum[T];
    if constexpr (T <= 3) {
      // hi = 16 * sum q_hi x.
      __m512i lo[T], hi[T];
#pragma GCC unroll 4
      for (int t = 0; t < T; ++t) lo[t] = hi[t] = _mm512_setzero_si512();
#pragma GCC unroll 4
      for (int k = 0; k < 4; ++k) {
        const __m512i v = _mm512_loadu_si512(codes + (4 * b + k) * 64);
        const __m512i pl = _mm512_and_si512(v, m15), ph = _mm512_and_si512(v, m240);
        const int64_t c = b * 32 + k * 8;
#pragma GCC unroll 4
        for (int t = 0; t < T; ++t) {
          lo[t] = Dot(lo[t], pl, x.q[t] + c);
          hi[t] = Dot(hi[t], ph, x.q[t] + c + 4);
        }
      }
#pragma GCC unroll 4
      for (int t = 0; t < T; ++t) isum[t] = _mm512_add_epi32(lo[t], _mm512_srai_epi32(hi[t], 4));
    } else {
#pragma GCC unroll 4
      for (int t = 0; t < T; ++t) isum[t] = _mm512_setzero_si512();
#pragma GCC unroll 4
      for (int k = 0; k < 4; ++k) {
        const __m512i v = _mm512_loadu_si512(codes + (4 * b + k) * 64);
        const __m512i pl = _mm512_and_si512(v, m15);
        const __m512i ph = _mm512_and_si512(_mm512_srli_epi16(v, 4), m15);
        const int64_t c = b * 32 + k * 8;
#pragma GCC unroll 4
        for (int t = 0; t < T; ++t) {
          isum[t] = Dot(isum[t], pl, x.q[t] + c);
          isum[t] = Dot(isum[t], ph, x.q[t] + c + 4);
        }
      }
    }
    BlockStep<T>(x, b, d, isum, acc);
#pragma GCC unroll 4
    for (int t = 0; t < T; ++t) {
      const float ms = x.scale[t][b] * static_cast<float>(x.sum[t][b]);
      acc[t] = _mm512_fmadd_ps(m, _mm512_set1_ps(ms), acc[t]);
    }
  }
}

template <int T>
void TileS8(const uint8_t* codes, const uint8_t* scales, int64_t cols, const Tokens<T>& x, __m512* acc) {
  const __m512i bias = _mm512_set1_epi8(static_cast<char>(0x80));
  for (int64_t b = 0; b < cols / 32; ++b) {
    const __m512 d = LoadHalves16(scales + b * 32);
    for (int k = 0; k < 8; ++k) Prefetch(codes + (8 * b + k) * 64);
    if (b % 2 == 0) Prefetch(scales + b * 32);
    __m512i isum[T];
#pragma GCC unroll 4
    for (int t = 0; t < T; ++t) isum[t] = _mm512_set1_epi32(-128 * x.sum[t][b]);
#pragma GCC unroll 8
    for (int k = 0; k < 8; ++k) {
      const __m512i v = _mm512_xor_si512(_mm512_loadu_si512(codes + (8 * b + k) * 64), bias);
      const int64_t c = b * 32 + k * 4;
#pragma GCC unroll 4
      for (int t = 0; t < T; ++t) isum[t] = Dot(isum[t], v, x.q[t] + c);
    }
    BlockStep<T>(x, b, d, isum, acc);
  }
}

// Sixteen rows' mxfp4 scales from their exponent bytes, as Mxfp4Scale builds them: (e - 1) << 23 is the float
// 2^(e - 128) for e >= 2; e = 0 and 1 are the subnormals 0x00200000 << e.
inline __m512 LoadMxfp4Scales16(const uint8_t* p) {
  const __m512i e = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  const __m512i normal = _mm512_slli_epi32(_mm512_sub_epi32(e, _mm512_set1_epi32(1)), 23);
  const __m512i subnormal = _mm512_sllv_epi32(_mm512_set1_epi32(0x00200000), e);
  const __mmask16 is_normal = _mm512_cmpgt_epi32_mask(e, _mm512_set1_epi32(1));
  return _mm512_castsi512_ps(_mm512_mask_blend_epi32(is_normal, subnormal, normal));
}

// mxfp4's codes as their levels offset by 12 (0..24, vpshufb from a 16-entry table), vpdpbusd's unsigned
// operand: isum = sum (L + 12) x - 12 sum x. The nibble layout is s4's.
template <int T>
void TileMxfp4(const uint8_t* codes, const uint8_t* scales, int64_t cols, const Tokens<T>& x, __m512* acc) {
  const __m512i m15 = _mm512_set1_epi8(15);
  const __m128i levels = _mm_loadu_si128(reinterpret_cast<const __m128i*>(kMxfp4Levels));
  const __m512i offset_levels = _mm512_broadcast_i32x4(_mm_add_epi8(levels, _mm_set1_epi8(12)));
  for (int64_t b = 0; b < cols / 32; ++b) {
    const __m512 d = LoadMxfp4Scales16(scales + b * 16);
    for (int k = 0; k < 4; ++k) Prefetch(codes + (4 * b + k) * 64);
    if (b % 4 == 0) Prefetch(scales + b * 16);
    __m512i isum[T];
#pragma GCC unroll 4
    for (int t = 0; t < T; ++t) isum[t] = _mm512_set1_epi32(-12 * x.sum[t][b]);
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) {
      const __m512i v = _mm512_loadu_si512(codes + (4 * b + k) * 64);
      const __m512i lo = _mm512_shuffle_epi8(offset_levels, _mm512_and_si512(v, m15));
      const __m512i hi = _mm512_shuffle_epi8(offset_levels, _mm512_and_si512(_mm512_srli_epi16(v, 4), m15));
      const int64_t c = b * 32 + k * 8;
#pragma GCC unroll 4
      for (int t = 0; t < T; ++t) {
        isum[t] = Dot(isum[t], lo, x.q[t] + c);
        isum[t] = Dot(isum[t], hi, x.q[t] + c + 4);
      }
    }
    BlockStep<T>(x, b, d, isum, acc);
  }
}

template <int T>
void TileInteger(Scheme s, const uint8_t* role, int64_t rows, int64_t cols, int64_t tile, __mmask16 mask,
                 const QuantizedActivation* const* xs, float* const* outs) {
  Tokens<T> x;
  for (int t = 0; t < T; ++t) {
    x.q[t] = xs[t]->q.data();
    x.scale[t] = xs[t]->scale.data();
    x.sum[t] = xs[t]->sum.data();
  }
  const uint8_t* codes = layout::TileCodes(s, role, cols, tile);
  const uint8_t* scales = layout::TileScales(s, role, rows, cols, tile);
  __m512 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
  switch (s) {
    case Scheme::kS2:
      TileS2<T>(codes, scales, cols, x, acc);
      break;
    case Scheme::kS4:
      TileS4<T>(codes, scales, cols, x, acc);
      break;
    case Scheme::kMxfp4:
      TileMxfp4<T>(codes, scales, cols, x, acc);
      break;
    default:
      TileS8<T>(codes, scales, cols, x, acc);
      break;
  }
  for (int t = 0; t < T; ++t) _mm512_mask_storeu_ps(outs[t] + tile * kRowTile, mask, acc[t]);
}

template <int T>
void RowF16(const uint8_t* role, int64_t cols, int64_t r, const QuantizedActivation* const* xs,
            float* const* outs) {
  const uint8_t* w = role + 2 * r * cols;
  __m512 acc0[T], acc1[T];
  for (int t = 0; t < T; ++t) acc0[t] = acc1[t] = _mm512_setzero_ps();
  for (int64_t c = 0; c < cols; c += 32) {
    Prefetch(w + 2 * c);
    const __m512 w0 = LoadHalves16(w + 2 * c);
    const __m512 w1 = LoadHalves16(w + 2 * c + 32);
#pragma GCC unroll 4
    for (int t = 0; t < T; ++t) {
      acc0[t] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(xs[t]->f32.data() + c), acc0[t]);
      acc1[t] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(xs[t]->f32.data() + c + 16), acc1[t]);
    }
  }
  for (int t = 0; t < T; ++t) outs[t][r] = _mm512_reduce_add_ps(_mm512_add_ps(acc0[t], acc1[t]));
}

// Calls fn.template operator()<n>(t0) for token groups of at most kMaxTokensPerPass.
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

void RoleGemvAvx512(Scheme scheme, const uint8_t* role, int64_t rows, int64_t cols, int64_t row_begin,
                    int64_t row_end, const QuantizedActivation* const* xs, int n_tokens, float* const* outs) {
  if (scheme == Scheme::kF16) {
    for (int64_t r = row_begin; r < row_end; ++r) {
      ForTokenGroups(n_tokens, [&]<int T>(int t0) { RowF16<T>(role, cols, r, xs + t0, outs + t0); });
    }
    return;
  }
  // Tiles outermost: a tile stays in cache while further token groups reuse it.
  for (int64_t tile = row_begin / kRowTile; tile * kRowTile < row_end; ++tile) {
    const int64_t r0 = tile * kRowTile;
    const int64_t lo = row_begin > r0 ? row_begin - r0 : 0;
    const int64_t hi = row_end < r0 + kRowTile ? row_end - r0 : kRowTile;
    const __mmask16 mask = static_cast<__mmask16>(((1u << hi) - 1) & ~((1u << lo) - 1));
    ForTokenGroups(n_tokens, [&]<int T>(int t0) {
      TileInteger<T>(scheme, role, rows, cols, tile, mask, xs + t0, outs + t0);
    });
  }
}

}  // namespace strata::kernels::internal
