#ifndef STRATA_KERNELS_CPU_SCHEME_H_
#define STRATA_KERNELS_CPU_SCHEME_H_

// Expert weight schemes of a Strata pack and their scalar references.
//
// A role is a rows x cols matrix of one expert (rows = output features, cols = input features), stored in
// one of four schemes with weights grouped along cols. The functions here are the reference every SIMD
// and CUDA kernel is tested against; they are pure and thread-safe.
//
// Shapes: rows is a positive multiple of kRowTile (16) and cols a positive multiple of 32 and of the
// scheme's group, both at most kMaxRoleDim. (Every role of a SwiGLU expert has as rows a dimension that
// is another role's cols, so real experts always qualify.)
//
// Byte layout of a role (pack format v1). All multi-byte values are little-endian; "half" is IEEE
// binary16.
//
//   f16: rows x cols halves, row-major (row r at byte 2*r*cols).
//
//   s8, s4, s2 (b = 8, 4, 2 bits a code; P = 8 / b codes a byte; G = group: 32, 32, 64):
//     [codes plane: rows*cols*b/8 bytes][scale plane]
//     The rows are cut into tiles of 16 (tile t = rows 16t .. 16t+15). A tile's codes are 16*cols*b/8
//     contiguous bytes at t*16*cols*b/8, a run of 64-byte chunks; chunk k covers the tile's 16 rows and the
//     4P cols 4Pk .. 4Pk+4P-1. In a chunk, byte 4i+j (i = row in tile, j = 0..3) holds in bits
//     [b*p, b*p+b) the code of row 16t+i, col 4Pk + 4p + j, for p = 0..P-1. (So byte 4i+j is one lane
//     of an int32 SIMD register per row, and p is a shift: an unpacked plane is 16 rows x 4 cols, the
//     operand of one vpdpbusd.)
//     The scale plane starts at rows*cols*b/8: for tile t and group g (in col order) a record of the 16
//     rows' halves at record index t*(cols/G) + g. s8 and s2 records are 16 scales (32 bytes); s4 records
//     are 16 scales then 16 mins (64 bytes).
//     Rows are addressable by tile: threads split a role at multiples of 16 rows.
//
//   s8: code q is int8 (two's complement) in [-127, 127]; w = d * q. 8.5 bits/weight.
//   s4: code q is 0..15; w = d * q + m. 5 bits/weight.
//   s2: code q is 0..3; w = d * (2q - 3), levels -3d, -d, d, 3d. 2.25 bits/weight; a 640 x 2560 role is
//       409,600 + 51,200 = 460,800 bytes.
//
// Dot products. For f16, w.x in f32 with the unquantized activation (the reference accumulates in double).
// For the integer schemes, against a QuantizedActivation x, the reference is defined as (bit for bit, and
// every SIMD kernel reproduces it exactly):
//
//   float acc = 0
//   for each 32-block b of cols, in order (group g = 32b / G; an s2 group spans two blocks):
//     int32 isum = sum over the block's cols c of wq(c) * x.q[c]     (wq = q, q, 2q-3 for s8, s4, s2)
//     acc = fmaf(float(isum), d[g] * x.scale[b], acc)
//     s4 only: acc = fmaf(m[g], x.scale[b] * float(x.sum[b]), acc)
//
// with d and m the halves widened exactly to float, and each product rounded to float before the fmaf.
//
// Measured quantization error: relative RMS error sqrt(sum (w - w')^2 / sum w^2) on seeded N(0, 1)
// weights of 256 x 1024 is 0.00021 (f16), 0.0053 (s8), 0.073 (s4), 0.336 (s2); SchemeErrorBound gives the
// tested bounds, with some margin.

#include <cstdint>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace strata::kernels {

enum class Scheme : uint8_t { kF16, kS8, kS4, kS2 };

// Rows of a role come in tiles of this many (see the layout above).
inline constexpr int64_t kRowTile = 16;
// Activations are quantized in blocks of this many elements.
inline constexpr int64_t kActBlock = 32;
// Largest rows or cols of a role.
inline constexpr int64_t kMaxRoleDim = int64_t{1} << 20;

absl::StatusOr<Scheme> ParseScheme(std::string_view name);  // "f16", "s8", "s4", "s2"
std::string_view SchemeName(Scheme scheme);

// Weights per scale group along cols (1 for f16, which has no groups).
int SchemeGroup(Scheme scheme);
// Storage cost, for reports.
double SchemeBitsPerWeight(Scheme scheme);
// Upper bound on the relative RMS quantization error of Gaussian weights (see above).
double SchemeErrorBound(Scheme scheme);

// OK when the shape is valid for the scheme (see the top of this file); otherwise INVALID_ARGUMENT naming
// rows/cols and what they must be.
absl::Status CheckRoleShape(Scheme scheme, int64_t rows, int64_t cols);

// Bytes of a rows x cols role in this scheme (shape must pass CheckRoleShape).
uint64_t RoleBytes(Scheme scheme, int64_t rows, int64_t cols);

// Quantizes a row-major rows x cols f32 matrix into `dst` (RoleBytes bytes). Scales are chosen per group
// to minimise squared error (a small search over candidate scales, refined by least squares for s4 and
// s2). Thread-safe and single-threaded: some 50 ns a weight for s4 and s2, so converters split a model's
// roles across threads. Weights must be finite.
void QuantizeRole(Scheme scheme, const float* src, int64_t rows, int64_t cols, uint8_t* dst);

// Decodes a role back to row-major f32.
void DequantizeRole(Scheme scheme, const uint8_t* src, int64_t rows, int64_t cols, float* dst);

// An activation vector quantized once per layer for the integer schemes: int8 codes with one fp32 scale
// per 32 elements (x ~= q * scale), plus the per-32 sums of the codes that affine schemes need. `f32` keeps
// the unquantized values, which the f16 scheme uses so that it is exact. The kernels rely on q being in
// [-127, 127] and sum matching q.
struct QuantizedActivation {
  int64_t n = 0;                 // multiple of 32
  std::vector<float> f32;        // n
  std::vector<int8_t> q;         // n
  std::vector<float> scale;      // n / 32
  std::vector<int32_t> sum;      // n / 32: sum of q over each block
};

// Quantizes x[0..n) (n a multiple of 32) into `out`, resizing its vectors. Per 32-block:
// scale = amax / 127.0f (amax = largest |x|); if scale is 0, every q is 0; otherwise
// q = round-half-even(x / scale) (IEEE f32 division), clamped to [-127, 127] (NaN gives -127).
// A GPU implementation must use the same operations to produce the same codes.
void QuantizeActivation(const float* x, int64_t n, QuantizedActivation* out);

// Sizes `out` for n elements (n a multiple of 32) without computing anything.
void ResizeActivation(int64_t n, QuantizedActivation* out);

// Whether the scheme's kernels read an activation's int8 codes (q, scale, sum); f16 reads only f32, so
// quantizing for it is wasted work.
inline bool ReadsQuantizedActivation(Scheme scheme) { return scheme != Scheme::kF16; }

// Quantizes blocks [block_begin, block_end) of out->f32 in place into out->q/scale/sum, exactly as
// QuantizeActivation would; `out` must already be sized. Distinct block ranges may be quantized by
// different threads at once.
void QuantizeActivationBlocks(int64_t block_begin, int64_t block_end, QuantizedActivation* out);

// Reference dot product of row `row` of a role with an activation of length cols.
float DotRowReference(Scheme scheme, const uint8_t* role, int64_t rows, int64_t cols, int64_t row,
                      const QuantizedActivation& x);

}  // namespace strata::kernels

#endif  // STRATA_KERNELS_CPU_SCHEME_H_
