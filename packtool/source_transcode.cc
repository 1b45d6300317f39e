#include "packtool/source_transcode.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/status_macros.h"
#include "kernels/format/fp16.h"
#include "kernels/format/mxfp4.h"
#include "kernels/format/role_layout.h"

namespace strata::packtool {
namespace {

constexpr int64_t kGroup = 32;  // s4's group, and the run of weights that shares one scale in the sources

// The half next to `h` in magnitude (step -1 or +1 on the bit pattern, same sign); false when there is none
// (below zero, or into the infinities and NaNs).
bool HalfNeighbour(uint16_t h, int step, uint16_t* out) {
  const int magnitude = (h & 0x7fff) + step;
  if (magnitude < 0 || magnitude >= 0x7c00) return false;
  *out = static_cast<uint16_t>((h & 0x8000) | magnitude);
  return true;
}

// Squared error of the group decoded as s4 decodes it (d * float(q) + m) against its source values.
double GroupError(const uint8_t* q, const float* x, float d, float m) {
  double err = 0;
  for (int64_t i = 0; i < kGroup; ++i) {
    const double e = static_cast<double>(d * static_cast<float>(q[i]) + m) - x[i];
    err += e * e;
  }
  return err;
}

// The pair of halves for one group: first the scale and offset rounded to nearest (exact when they are
// halves), then each half next to the scale, with the offset that best fits it and that offset's neighbours;
// the least squared error wins, ties to the earlier. Returns false when no finite pair exists.
bool ChooseHalves(const uint8_t* q, const float* x, float scale, float offset, float* d_out, float* m_out) {
  const uint16_t hd = kernels::FloatToHalf(scale), hm = kernels::FloatToHalf(offset);
  float best_d = kernels::HalfToFloat(hd), best_m = kernels::HalfToFloat(hm);
  if (!std::isfinite(best_d) || !std::isfinite(best_m)) return false;
  double best = GroupError(q, x, best_d, best_m);
  if (best == 0) {
    *d_out = best_d, *m_out = best_m;
    return true;
  }
  for (int ds = -1; ds <= 1; ++ds) {
    uint16_t hd_candidate = hd;
    if (ds != 0 && !HalfNeighbour(hd, ds, &hd_candidate)) continue;
    const float d = kernels::HalfToFloat(hd_candidate);
    // The least-squares offset for this scale: the mean of x - d q.
    double sum_r = 0;
    for (int64_t i = 0; i < kGroup; ++i) sum_r += static_cast<double>(x[i]) - static_cast<double>(d) * q[i];
    const uint16_t hm_fit = kernels::FloatToHalf(static_cast<float>(sum_r / kGroup));
    for (int ms = -1; ms <= 1; ++ms) {
      uint16_t hm_candidate = hm_fit;
      if (ms != 0 && !HalfNeighbour(hm_fit, ms, &hm_candidate)) continue;
      const float m = kernels::HalfToFloat(hm_candidate);
      if (!std::isfinite(m)) continue;
      const double err = GroupError(q, x, d, m);
      if (err < best) best = err, best_d = d, best_m = m;
    }
  }
  *d_out = best_d, *m_out = best_m;
  return true;
}

// MXFP4 into s8: each block's doubled E2M1 values (integers -12..12) are s8 codes and its power of two,
// 2^exponent, the group's scale, exact as a half for exponents -24..15. False (nothing written) when a block
// with a non-zero value has its power of two outside a half's range.
bool TranscodeMxfp4ToS8(const uint8_t* source, const float* values, int64_t rows, int64_t cols, uint8_t* dst,
                        kernels::QuantizeError* error) {
  const uint64_t row_bytes = static_cast<uint64_t>(cols / kGroup) * 17;
  const int64_t groups = cols / kGroup;
  std::vector<int8_t> codes(static_cast<size_t>(cols));
  std::vector<int> exponents(static_cast<size_t>(groups));
  std::vector<float> d(static_cast<size_t>(groups)), m(static_cast<size_t>(groups), 0.0f);
  // Checked for every row first, so that a role is either carried over or fitted whole.
  for (int64_t r = 0; r < rows; ++r) {
    if (!gguf::ReadMxfp4Codes(source + r * row_bytes, cols, codes.data(), exponents.data()).ok()) return false;
    for (int64_t g = 0; g < groups; ++g) {
      const bool zero = std::all_of(codes.begin() + g * kGroup, codes.begin() + (g + 1) * kGroup,
                                    [](int8_t c) { return c == 0; });
      if (!zero && (exponents[g] < -24 || exponents[g] > 15)) return false;
    }
  }
  kernels::QuantizeError local;
  for (int64_t r = 0; r < rows; ++r) {
    (void)gguf::ReadMxfp4Codes(source + r * row_bytes, cols, codes.data(), exponents.data());
    const float* x = values + r * cols;
    for (int64_t g = 0; g < groups; ++g) {
      d[g] = exponents[g] < -24 || exponents[g] > 15 ? 0.0f : std::ldexp(1.0f, exponents[g]);
      for (int64_t i = 0; i < kGroup; ++i) {
        const double w = x[g * kGroup + i];
        const double e = static_cast<double>(d[g] * static_cast<float>(codes[g * kGroup + i])) - w;
        local.err2 += e * e;
        local.ref2 += w * w;
        local.max_abs = std::max(local.max_abs, std::fabs(e));
      }
    }
    kernels::PackRoleGroups(kernels::Scheme::kS8, rows, cols, r * groups, groups, d.data(), m.data(),
                            reinterpret_cast<const uint8_t*>(codes.data()), dst);
  }
  error->Merge(local);
  return true;
}

// MXFP4 into mxfp4: the same numbers in the pack's layout, a byte shuffle. A GGUF block is its exponent byte e,
// then qs[16] with col c < 16 in qs[c]'s low nibble and col c + 16 in its high one; the pack's chunk q (cols
// 8q .. 8q + 7 of a block) holds, in a row's byte j (0..3), col 8q + j low and col 8q + 4 + j high. Every nibble
// and exponent is stored as it is, so nothing is added: the error reported is 0 against sum w^2 of the values.
// (sum w^2 comes from the codes: the decoded values are not needed.)
void TranscodeMxfp4ToMxfp4(const uint8_t* source, int64_t rows, int64_t cols, uint8_t* dst,
                           kernels::QuantizeError* error) {
  namespace layout = kernels::layout;
  constexpr kernels::Scheme kScheme = kernels::Scheme::kMxfp4;
  const int64_t groups = cols / kGroup;
  // sum w^2, in the same pass: a block's d^2 times its sum of L^2 (exact integers, d a power of two).
  kernels::QuantizeError local;
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* block = source + r * groups * 17;
    for (int64_t g = 0; g < groups; ++g, block += 17) {
      const uint8_t* qs = block + 1;
      uint8_t* chunk = dst + layout::CodePosition(kScheme, cols, r, g * kGroup).byte;
      for (int q = 0; q < 4; ++q, chunk += layout::kChunkBytes) {
        // Cols 8q + j and 8q + 4 + j: nibbles of qs[(8q) % 16 + j] and qs[(8q) % 16 + 4 + j], high for q >= 2.
        const uint8_t* lo_src = qs + (8 * q) % 16;
        const int shift = q >= 2 ? 4 : 0;
        for (int j = 0; j < 4; ++j) {
          chunk[j] = static_cast<uint8_t>(((lo_src[j] >> shift) & 0x0F) | (((lo_src[4 + j] >> shift) & 0x0F) << 4));
        }
      }
      dst[layout::ScaleOffset(kScheme, rows, cols, r, g)] = block[0];
      int32_t levels2 = 0;
      for (int j = 0; j < 16; ++j) {
        const int lo = kernels::kMxfp4Levels[qs[j] & 0x0F], hi = kernels::kMxfp4Levels[qs[j] >> 4];
        levels2 += lo * lo + hi * hi;
      }
      const double d = kernels::Mxfp4Scale(block[0]);
      local.ref2 += d * d * levels2;
    }
  }
  error->Merge(local);
}

}  // namespace

bool TranscodesWithoutValues(gguf::GgmlType type, kernels::Scheme scheme) {
  return type == gguf::GgmlType::kMXFP4 && scheme == kernels::Scheme::kMxfp4;
}

bool CanTranscode(gguf::GgmlType type, kernels::Scheme scheme) {
  return (scheme == kernels::Scheme::kS4 && gguf::HasAffine4Codes(type)) ||
         ((scheme == kernels::Scheme::kS8 || scheme == kernels::Scheme::kMxfp4) &&
          type == gguf::GgmlType::kMXFP4);
}

absl::Status TranscodeRole(gguf::GgmlType type, const uint8_t* source, const float* values, int64_t rows,
                           int64_t cols, kernels::Scheme scheme, uint8_t* dst, kernels::QuantizeError* error) {
  if (!CanTranscode(type, scheme)) {
    return absl::InvalidArgumentError(absl::StrCat("cannot carry ", gguf::TypeName(static_cast<uint32_t>(type)),
                                                   " codes into scheme ", std::string(kernels::SchemeName(scheme)),
                                                   " as they are (q4_0, q4_1 and q4_K into s4, mxfp4 into s8 or mxfp4 only)"));
  }
  RETURN_IF_ERROR(kernels::CheckRoleShape(scheme, rows, cols));
  if (TranscodesWithoutValues(type, scheme)) {
    TranscodeMxfp4ToMxfp4(source, rows, cols, dst, error);
    return absl::OkStatus();
  }
  if (values == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("carrying ", gguf::TypeName(static_cast<uint32_t>(type)),
                                                   " codes into scheme ", std::string(kernels::SchemeName(scheme)),
                                                   " needs the decoded values"));
  }
  if (type == gguf::GgmlType::kMXFP4) {
    if (!TranscodeMxfp4ToS8(source, values, rows, cols, dst, error)) {
      kernels::QuantizeRole(scheme, values, rows, cols, dst, error);
    }
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(const uint64_t row_bytes, gguf::RowBytes(type, cols));
  const int64_t groups = cols / kGroup;
  std::vector<uint8_t> codes(static_cast<size_t>(cols));
  std::vector<float> scale(static_cast<size_t>(groups)), offset(static_cast<size_t>(groups));
  std::vector<float> d(static_cast<size_t>(groups)), m(static_cast<size_t>(groups));
  kernels::QuantizeError local;
  for (int64_t r = 0; r < rows; ++r) {
    RETURN_IF_ERROR(gguf::ReadAffine4Codes(type, source + r * row_bytes, cols, codes.data(), scale.data(),
                                           offset.data()));
    const float* x = values + r * cols;
    for (int64_t g = 0; g < groups; ++g) {
      if (!ChooseHalves(codes.data() + g * kGroup, x + g * kGroup, scale[g], offset[g], &d[g], &m[g])) {
        kernels::QuantizeRole(scheme, values, rows, cols, dst, error);
        return absl::OkStatus();
      }
      for (int64_t i = 0; i < kGroup; ++i) {
        const double w = x[g * kGroup + i];
        const double e = static_cast<double>(d[g] * static_cast<float>(codes[g * kGroup + i]) + m[g]) - w;
        local.err2 += e * e;
        local.ref2 += w * w;
        local.max_abs = std::max(local.max_abs, std::fabs(e));
      }
    }
    kernels::PackRoleGroups(scheme, rows, cols, r * groups, groups, d.data(), m.data(), codes.data(), dst);
  }
  error->Merge(local);
  return absl::OkStatus();
}

}  // namespace strata::packtool
