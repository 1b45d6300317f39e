#ifndef STRATA_KERNELS_FORMAT_SCHEME_H_
#define STRATA_KERNELS_FORMAT_SCHEME_H_

// Expert weight schemes of a Strata pack: the one definition of their byte layouts, shared by the CPU
// kernels (kernels/cpu), the CUDA kernels (kernels/cuda), packs (engine/pack) and the converter.
//
// A role is a rows x cols matrix of one expert (rows = output features, cols = input features), stored in
// one of four schemes with weights grouped along cols. The scalar references that define the arithmetic
// (quantize, dequantize, dot) are in kernels/cpu/quantize.h; every SIMD and CUDA kernel is tested against
// them. Everything here is pure and thread-safe.
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
//   s8, s4, s2, mxfp4 (b = 8, 4, 2, 4 bits a code; P = 8 / b codes a byte; G = group: 32, 32, 64, 32):
//     [codes plane: rows*cols*b/8 bytes][scale plane]
//     The rows are cut into tiles of 16 (tile t = rows 16t .. 16t+15). A tile's codes are 16*cols*b/8
//     contiguous bytes at t*16*cols*b/8, a run of 64-byte chunks; chunk k covers the tile's 16 rows and the
//     4P cols 4Pk .. 4Pk+4P-1. In a chunk, byte 4i+j (i = row in tile, j = 0..3) holds in bits
//     [b*p, b*p+b) the code of row 16t+i, col 4Pk + 4p + j, for p = 0..P-1. (So byte 4i+j is one lane
//     of an int32 SIMD register per row, and p is a shift: an unpacked plane is 16 rows x 4 cols, the
//     operand of one vpdpbusd.)
//     The scale plane starts at rows*cols*b/8: for tile t and group g (in col order) a record of the 16
//     rows' halves at record index t*(cols/G) + g. s8 and s2 records are 16 scales (32 bytes); s4 records
//     are 16 scales then 16 mins (64 bytes); mxfp4 records are the 16 rows' E8M0 exponent bytes (16 bytes).
//     Rows are addressable by tile: threads split a role at multiples of 16 rows.
//
//   s8: code q is int8 (two's complement) in [-127, 127]; w = d * q. 8.5 bits/weight.
//   s4: code q is 0..15; w = d * q + m. 5 bits/weight.
//   s2: code q is 0..3; w = d * (2q - 3), levels -3d, -d, d, 3d. 2.25 bits/weight; a 640 x 2560 role is
//       409,600 + 51,200 = 460,800 bytes.
//   mxfp4: OCP MX FP4 as GGUF's MXFP4 blocks hold it (gpt-oss ships its experts so): code q is an E2M1 value,
//       level L(q) = its double, {0, 1, 2, 3, 4, 6, 8, 12} for q = 0..7 and minus those for q = 8..15 (the
//       table kernels/format/mxfp4.h and ggml share); w = d * L(q) with d = 2^(e - 128) from the exponent
//       byte e (exact in float for every e). 4.25 bits/weight: a source's blocks are carried code for code.
//
// Dot products. For f16, w.x in f32 with the unquantized activation (the reference accumulates in double).
// For the integer schemes, against a QuantizedActivation x, the reference is defined as (bit for bit, and
// every SIMD kernel reproduces it exactly):
//
//   float acc = 0
//   for each 32-block b of cols, in order (group g = 32b / G; an s2 group spans two blocks):
//     int32 isum = sum over the block's cols c of wq(c) * x.q[c]     (wq = q, q, 2q-3, L(q) for s8, s4, s2,
//                                                                      mxfp4)
//     acc = fmaf(float(isum), d[g] * x.scale[b], acc)
//     s4 only: acc = fmaf(m[g], x.scale[b] * float(x.sum[b]), acc)
//
// with d and m the halves (mxfp4: the power of two) widened exactly to float, and each product rounded to
// float before the fmaf.
//
// Measured quantization error: relative RMS error sqrt(sum (w - w')^2 / sum w^2) on seeded N(0, 1)
// weights of 256 x 1024 is 0.00021 (f16), 0.0053 (s8), 0.073 (s4), 0.336 (s2), about 0.11 (mxfp4);
// SchemeErrorBound gives the tested bounds, with some margin.

#include <cstdint>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

// Marks the small layout helpers that CUDA kernels call too.
#if defined(__CUDACC__)
#define STRATA_HOST_DEVICE __host__ __device__
#else
#define STRATA_HOST_DEVICE
#endif

namespace strata::kernels {

enum class Scheme : uint8_t { kF16, kS8, kS4, kS2, kMxfp4 };

// Rows of a role come in tiles of this many (see the layout above).
inline constexpr int64_t kRowTile = 16;
// Activations are quantized in blocks of this many elements.
inline constexpr int64_t kActBlock = 32;
// Largest rows or cols of a role.
inline constexpr int64_t kMaxRoleDim = int64_t{1} << 20;

absl::StatusOr<Scheme> ParseScheme(std::string_view name);  // "f16", "s8", "s4", "s2", "mxfp4"
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

}  // namespace strata::kernels

#endif  // STRATA_KERNELS_FORMAT_SCHEME_H_
