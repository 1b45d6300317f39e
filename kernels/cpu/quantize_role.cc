// QuantizeRole and DequantizeRole for every scheme (layout in scheme.h).

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/format/fp16.h"
#include "kernels/format/mxfp4.h"
#include "kernels/format/role_layout.h"
#include "kernels/cpu/quantize.h"
#include "kernels/cpu/quantize_fit.h"
#include "kernels/cpu/role_gemv.h"

namespace strata::kernels {
namespace {

// The four bytes of one row's chunk from its ChunkCols codes: byte j holds codes j, 4 + j, 8 + j, ... from
// the lowest bits up (scheme.h). s4 and s2 take eight codes a 64-bit word, masked to their bits: shifting
// the word right by 32 - bits puts code 4 + j above code j in byte j.
template <Scheme S>
uint32_t ChunkBytes(const uint8_t* q) {
  if constexpr (S == Scheme::kS8) {
    uint32_t bytes;
    std::memcpy(&bytes, q, 4);
    return bytes;
  } else {
    constexpr int kBits = layout::CodeBits(S);
    constexpr uint64_t kMask = (kBits == 4 ? 0x0F : 0x03) * 0x0101010101010101ull;
    uint64_t a;
    std::memcpy(&a, q, 8);
    a &= kMask;
    a |= a >> (32 - kBits);
    if constexpr (S == Scheme::kS2) {
      uint64_t b;
      std::memcpy(&b, q + 8, 8);
      b &= kMask;
      b |= b >> (32 - kBits);
      a |= b << (2 * kBits);
    }
    return static_cast<uint32_t>(a);
  }
}

// Writes the codes of `count` consecutive groups, starting at flat group index `first` (row-major over
// rows x cols / group), into their places in the role, and their scale records (d and m given as halves;
// mxfp4's d as exponent bytes). A group covers whole chunks (Group is a multiple of ChunkCols), so each code
// byte is made from one group's codes and assigned whole.
template <Scheme S>
void PackGroups(int64_t rows, int64_t cols, int64_t first, int64_t count, const uint16_t* d, const uint16_t* m,
                const uint8_t* codes, uint8_t* dst) {
  constexpr int64_t kGroup = layout::Group(S), kChunkCols = layout::ChunkCols(S);
  static_assert(kGroup % kChunkCols == 0);
  const int64_t groups_per_row = cols / kGroup;
  // Group first + k is (r, g), stepped along rather than divided out for each group.
  int64_t r = first / groups_per_row, g = first % groups_per_row;
  for (int64_t k = 0; k < count; ++k) {
    const uint8_t* q = codes + k * kGroup;
    // (r, g * kGroup) starts a chunk: its byte holds code 0 at shift 0; the group's chunks follow.
    uint8_t* chunk = dst + layout::CodePosition(S, cols, r, g * kGroup).byte;
    for (int64_t c = 0; c < kGroup / kChunkCols; ++c, chunk += layout::kChunkBytes, q += kChunkCols) {
      const uint32_t bytes = ChunkBytes<S>(q);
      std::memcpy(chunk, &bytes, 4);
    }
    const int64_t off = layout::ScaleOffset(S, rows, cols, r, g);
    if constexpr (S == Scheme::kMxfp4) {
      dst[off] = static_cast<uint8_t>(d[k]);
    } else {
      StoreHalf(d[k], dst + off);
    }
    if constexpr (S == Scheme::kS4) StoreHalf(m[k], dst + off + layout::kMinOffsetInRecord);
    if (++g == groups_per_row) g = 0, ++r;
  }
}

void PackGroupHalves(Scheme scheme, int64_t rows, int64_t cols, int64_t first_group, int64_t n_groups,
                     const uint16_t* d, const uint16_t* m, const uint8_t* codes, uint8_t* dst) {
  switch (scheme) {
    case Scheme::kS8:
      PackGroups<Scheme::kS8>(rows, cols, first_group, n_groups, d, m, codes, dst);
      break;
    case Scheme::kS4:
      PackGroups<Scheme::kS4>(rows, cols, first_group, n_groups, d, m, codes, dst);
      break;
    case Scheme::kS2:
      PackGroups<Scheme::kS2>(rows, cols, first_group, n_groups, d, m, codes, dst);
      break;
    case Scheme::kMxfp4:
      PackGroups<Scheme::kMxfp4>(rows, cols, first_group, n_groups, d, m, codes, dst);
      break;
    case Scheme::kF16:
      break;  // no codes
  }
}

// A group's scale as PackGroupHalves takes it: the half of d, or mxfp4's exponent byte: that of d where d is
// 2^(e - 128), otherwise of the power of two nearest to |d| in the log (0 for d = 0 or not finite).
uint16_t ScaleWord(Scheme scheme, float d) {
  if (scheme != Scheme::kMxfp4) return FloatToHalf(d);
  if (const int e = Mxfp4ExponentOf(d); e >= 0) return static_cast<uint16_t>(e);
  if (!(std::fabs(d) > 0.0f) || !std::isfinite(d)) return 0;
  return static_cast<uint16_t>(std::clamp(static_cast<int>(std::lround(std::log2(std::fabs(d)))) + 128, 0, 255));
}

// FloatToHalf of src[0..n): with F16C on the SIMD paths (the same halves).
void ToHalves(CpuPath path, const float* src, int64_t n, uint16_t* dst) {
  const int64_t done = path == CpuPath::kScalar ? 0 : internal::FloatsToHalvesAvx2(src, n, dst);
  for (int64_t i = done; i < n; ++i) dst[i] = FloatToHalf(src[i]);
}

void QuantizeInteger(CpuPath path, Scheme s, const float* src, int64_t rows, int64_t cols, uint8_t* dst,
                     QuantizeError* error) {
  const int64_t group = layout::Group(s);
  const int64_t n_groups = rows * cols / group;
  // No clearing first: PackGroups assigns every code byte whole, and every group's scale record.
  constexpr int64_t kChunk = 256;  // groups fitted, then packed, at a time (a multiple of every SIMD batch)
  float d[kChunk], m[kChunk];
  uint16_t d_half[kChunk], m_half[kChunk];
  uint8_t codes[kChunk * 64];
  for (int64_t first = 0; first < n_groups; first += kChunk) {
    const int64_t count = std::min(kChunk, n_groups - first);
    const float* w = src + first * group;
    int64_t done = 0;  // mxfp4's SIMD fits do none: its fit is scalar on every path
    if (path == CpuPath::kAvx512) done = internal::FitGroupsAvx512(s, w, count, d, m, codes, error);
    if (path == CpuPath::kAvx2) done = internal::FitGroupsAvx2(s, w, count, d, m, codes, error);
    internal::FitGroupsScalar(s, w + done * group, count - done, d + done, m + done, codes + done * group, error);
    if (s == Scheme::kMxfp4) {
      for (int64_t k = 0; k < count; ++k) d_half[k] = ScaleWord(s, d[k]);
    } else {
      ToHalves(path, d, count, d_half);
    }
    if (s == Scheme::kS4) ToHalves(path, m, count, m_half);
    PackGroupHalves(s, rows, cols, first, count, d_half, m_half, codes, dst);
  }
}

}  // namespace

void QuantizeRoleOnPath(CpuPath path, Scheme scheme, const float* src, int64_t rows, int64_t cols, uint8_t* dst,
                        QuantizeError* error) {
  QuantizeError local;
  if (error == nullptr) error = &local;
  if (scheme == Scheme::kF16) {
    // AVX-512 CPUs have AVX2 too; F16C gives FloatToHalf's halves, so every path writes the same bytes.
    const int64_t done = path == CpuPath::kScalar ? 0 : internal::RoundToHalfAvx2(src, rows * cols, dst, error);
    for (int64_t i = done; i < rows * cols; ++i) {
      const uint16_t h = FloatToHalf(src[i]);
      StoreHalf(h, dst + 2 * i);
      const double w = src[i], e = w - HalfToFloat(h);
      error->err2 += e * e;
      error->ref2 += w * w;
      error->max_abs = std::max(error->max_abs, std::fabs(e));
    }
    return;
  }
  QuantizeInteger(path, scheme, src, rows, cols, dst, error);
}

void PackRoleGroups(Scheme scheme, int64_t rows, int64_t cols, int64_t first_group, int64_t n_groups, const float* d,
                    const float* m, const uint8_t* codes, uint8_t* dst) {
  constexpr int64_t kChunk = 256;  // groups converted to halves, then packed, at a time
  uint16_t d_half[kChunk], m_half[kChunk] = {};
  const int64_t group = layout::Group(scheme);
  for (int64_t done = 0; done < n_groups; done += kChunk) {
    const int64_t count = std::min(kChunk, n_groups - done);
    for (int64_t k = 0; k < count; ++k) {
      d_half[k] = ScaleWord(scheme, d[done + k]);
      if (scheme == Scheme::kS4) m_half[k] = FloatToHalf(m[done + k]);
    }
    PackGroupHalves(scheme, rows, cols, first_group + done, count, d_half, m_half, codes + done * group, dst);
  }
}

void QuantizeRole(Scheme scheme, const float* src, int64_t rows, int64_t cols, uint8_t* dst, QuantizeError* error) {
  QuantizeRoleOnPath(BestCpuPath(), scheme, src, rows, cols, dst, error);
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
      const float d = scheme == Scheme::kMxfp4 ? Mxfp4Scale(src[off]) : HalfToFloat(LoadHalf(src + off));
      float w;
      switch (scheme) {
        case Scheme::kMxfp4:
          w = d * static_cast<float>(kMxfp4Levels[code]);
          break;
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
