// DotRowReference: the definition every kernel reproduces (see scheme.h).

#include <cmath>

#include "kernels/format/fp16.h"
#include "kernels/format/mxfp4.h"
#include "kernels/format/role_layout.h"
#include "kernels/cpu/quantize.h"

namespace strata::kernels {
namespace {

float DotF16(const uint8_t* role, int64_t cols, int64_t row, const QuantizedActivation& x) {
  const uint8_t* w = role + 2 * row * cols;
  double acc = 0.0;
  for (int64_t c = 0; c < cols; ++c) {
    acc += static_cast<double>(HalfToFloat(LoadHalf(w + 2 * c))) * static_cast<double>(x.f32[c]);
  }
  return static_cast<float>(acc);
}

// The integer level of a code: q, q, 2q-3, L(q) for s8, s4, s2, mxfp4.
inline int32_t Level(Scheme s, unsigned code) {
  switch (s) {
    case Scheme::kS8:
      return static_cast<int8_t>(code);
    case Scheme::kS4:
      return static_cast<int32_t>(code);
    case Scheme::kMxfp4:
      return kMxfp4Levels[code];
    default:
      return 2 * static_cast<int32_t>(code) - 3;
  }
}

float DotInteger(Scheme s, const uint8_t* role, int64_t rows, int64_t cols, int64_t row,
                 const QuantizedActivation& x) {
  const int64_t group = layout::Group(s);
  const unsigned mask = (1u << layout::CodeBits(s)) - 1;
  float acc = 0.0f;
  for (int64_t b = 0; b < cols / kActBlock; ++b) {
    int32_t isum = 0;
    for (int64_t c = b * kActBlock; c < (b + 1) * kActBlock; ++c) {
      const layout::CodePos pos = layout::CodePosition(s, cols, row, c);
      isum += Level(s, (role[pos.byte] >> pos.shift) & mask) * x.q[c];
    }
    const int64_t off = layout::ScaleOffset(s, rows, cols, row, b * kActBlock / group);
    const float d = s == Scheme::kMxfp4 ? Mxfp4Scale(role[off]) : HalfToFloat(LoadHalf(role + off));
    const float ds = d * x.scale[b];
    acc = std::fmaf(static_cast<float>(isum), ds, acc);
    if (s == Scheme::kS4) {
      const float m = HalfToFloat(LoadHalf(role + off + layout::kMinOffsetInRecord));
      const float ms = x.scale[b] * static_cast<float>(x.sum[b]);
      acc = std::fmaf(m, ms, acc);
    }
  }
  return acc;
}

}  // namespace

float DotRowReference(Scheme scheme, const uint8_t* role, int64_t rows, int64_t cols, int64_t row,
                      const QuantizedActivation& x) {
  if (scheme == Scheme::kF16) return DotF16(role, cols, row, x);
  return DotInteger(scheme, role, rows, cols, row, x);
}

}  // namespace strata::kernels
