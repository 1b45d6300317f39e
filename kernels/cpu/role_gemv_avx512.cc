// RoleGemv for AVX512 with VNNI. A 16-row tile maps onto the 16 int32 lanes of a zmm register: every
// 64-byte chunk, once unpacked, is the unsigned operand of vpdpbusd against 4 broadcast activation codes,
// so each lane accumulates one row's exact block sum with no horizontal reduction. Signed levels are
// made unsigned by an offset that the accumulator starts out cancelling (-128*sum for s8, -3*sum for s2,
// whose unpacked operand is 2q). The float step per block is the reference's, lane by lane.

// GCC 12 reports the intrinsics' own _mm512_undefined_* operands as maybe-uninitialized once inlined.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <immintrin.h>

#include <cstring>

#include "kernels/cpu/role_gemv_internal.h"
#include "kernels/cpu/role_layout.h"

namespace strata::kernels::internal {
namespace {

inline __m512i Broadcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof v);
  return _mm512_set1_epi32(v);
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
  const __m512i m6 = _mm512_set1_epi8(6);
  for (int64_t g = 0; g < cols / 64; ++g) {
    const __m512 d = LoadHalves16(scales + g * 32);
    for (int h = 0; h < 2; ++h) {
      const int64_t b = 2 * g + h;
      __m512i isum[T];
#pragma GCC unroll 4
      for (int t = 0; t < T; ++t) isum[t] = _mm512_set1_epi32(-3 * x.sum[t][b]);
#pragma GCC unroll 2
      for (int k = 0; k < 2; ++k) {
        const __m512i v = _mm512_loadu_si512(codes + (4 * g + 2 * h + k) * 64);
        const __m512i p0 = _mm512_and_si512(_mm512_slli_epi16(v, 1), m6);
        const __m512i p1 = _mm512_and_si512(_mm512_srli_epi16(v, 1), m6);
        const __m512i p2 = _mm512_and_si512(_mm512_srli_epi16(v, 3), m6);
        const __m512i p3 = _mm512_and_si512(_mm512_srli_epi16(v, 5), m6);
        const int64_t c = b * 32 + k * 16;
#pragma GCC unroll 4
        for (int t = 0; t < T; ++t) {
          isum[t] = _mm512_dpbusd_epi32(isum[t], p0, Broadcast4(x.q[t] + c));
          isum[t] = _mm512_dpbusd_epi32(isum[t], p1, Broadcast4(x.q[t] + c + 4));
          isum[t] = _mm512_dpbusd_epi32(isum[t], p2, Broadcast4(x.q[t] + c + 8));
          isum[t] = _mm512_dpbusd_epi32(isum[t], p3, Broadcast4(x.q[t] + c + 12));
        }
      }
      BlockStep<T>(x, b, d, isum, acc);
    }
  }
}

template <int T>
void TileS4(const uint8_t* codes, const uint8_t* scales, int64_t cols, const Tokens<T>& x, __m512* acc) {
  const __m512i m15 = _mm512_set1_epi8(15);
  for (int64_t b = 0; b < cols / 32; ++b) {
    const __m512 d = LoadHalves16(scales + b * 64);
    const __m512 m = LoadHalves16(scales + b * 64 + 32);
    __m512i isum[T];
#pragma GCC unroll 4
    for (int t = 0; t < T; ++t) isum[t] = _mm512_setzero_si512();
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) {
      const __m512i v = _mm512_loadu_si512(codes + (4 * b + k) * 64);
      const __m512i lo = _mm512_and_si512(v, m15);
      const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m15);
      const int64_t c = b * 32 + k * 8;
#pragma GCC unroll 4
      for (int t = 0; t < T; ++t) {
        isum[t] = _mm512_dpbusd_epi32(isum[t], lo, Broadcast4(x.q[t] + c));
        isum[t] = _mm512_dpbusd_epi32(isum[t], hi, Broadcast4(x.q[t] + c + 4));
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
    __m512i isum[T];
#pragma GCC unroll 4
    for (int t = 0; t < T; ++t) isum[t] = _mm512_set1_epi32(-128 * x.sum[t][b]);
#pragma GCC unroll 8
    for (int k = 0; k < 8; ++k) {
      const __m512i v = _mm512_xor_si512(_mm512_loadu_si512(codes + (8 * b + k) * 64), bias);
      const int64_t c = b * 32 + k * 4;
#pragma GCC unroll 4
      for (int t = 0; t < T; ++t) isum[t] = _mm512_dpbusd_epi32(isum[t], v, Broadcast4(x.q[t] + c));
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
