#ifndef STRATA_KERNELS_CPU_SCHEME_H_
#define STRATA_KERNELS_CPU_SCHEME_H_

// Expert weight schemes of a Strata pack and their scalar references.
//
// A role is a rows x cols matrix of one expert (rows = output features, cols = input features), stored in
// one of four schemes with weights grouped along cols. The functions here are the reference every SIMD
// and CUDA kernel is tested against; they are pure and thread-safe.

#include <cstdint>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace strata::kernels {

enum class Scheme : uint8_t { kF16, kS8, kS4, kS2 };

absl::StatusOr<Scheme> ParseScheme(std::string_view name);  // "f16", "s8", "s4", "s2"
std::string_view SchemeName(Scheme scheme);

// Weights per scale group along cols (1 for f16, which has no groups).
int SchemeGroup(Scheme scheme);
// Storage cost, for reports.
double SchemeBitsPerWeight(Scheme scheme);

// OK when cols is a positive multiple of the scheme's group and rows is positive; otherwise
// INVALID_ARGUMENT naming rows/cols and the group.
absl::Status CheckRoleShape(Scheme scheme, int64_t rows, int64_t cols);

// Bytes of a rows x cols role in this scheme (shape must pass CheckRoleShape).
uint64_t RoleBytes(Scheme scheme, int64_t rows, int64_t cols);

// Quantizes a row-major rows x cols f32 matrix into `dst` (RoleBytes bytes).
void QuantizeRole(Scheme scheme, const float* src, int64_t rows, int64_t cols, uint8_t* dst);

// Decodes a role back to row-major f32.
void DequantizeRole(Scheme scheme, const uint8_t* src, int64_t rows, int64_t cols, float* dst);

// An activation vector quantized once per layer for the integer schemes: int8 codes with one fp32 scale
// per 32 elements (x ~= q * scale), plus the per-32 sums of the codes that affine schemes need. `f32` keeps
// the unquantized values, which the f16 scheme uses so that it is exact.
struct QuantizedActivation {
  int64_t n = 0;                 // multiple of 32
  std::vector<float> f32;        // n
  std::vector<int8_t> q;         // n
  std::vector<float> scale;      // n / 32
  std::vector<int32_t> sum;      // n / 32: sum of q over each block
};

// Quantizes x[0..n) (n a multiple of 32): scale = max|x| / 127, q = round-to-nearest(x / scale).
void QuantizeActivation(const float* x, int64_t n, QuantizedActivation* out);

// Reference dot product of row `row` of a role with an activation of length cols.
float DotRowReference(Scheme scheme, const uint8_t* role, int64_t rows, int64_t cols, int64_t row,
                      const QuantizedActivation& x);

}  // namespace strata::kernels

#endif  // STRATA_KERNELS_CPU_SCHEME_H_
