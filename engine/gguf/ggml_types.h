#ifndef STRATA_ENGINE_GGUF_GGML_TYPES_H_
#define STRATA_ENGINE_GGUF_GGML_TYPES_H_

// ggml tensor element types as GGUF stores them: ids, block geometry and dequantization to f32.
// Thread-safe: everything here is a pure function.

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#include "kernels/format/fp16.h"

namespace strata::gguf {

// The numeric ids are ggml's (ggml.h, enum ggml_type) and are what a GGUF file stores.
enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ8_1 = 9,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kQ8_K = 15,
  kBF16 = 30,
  kMXFP4 = 39,  // blocks of 32 E2M1 values with one shared E8M0 exponent (gpt-oss's experts)
};

struct GgmlTypeInfo {
  std::string_view name;  // ggml's name: "f32", "q4_K", ...
  int64_t block_size;     // elements per block
  int64_t type_size;      // bytes per block
  bool can_dequantize;    // Strata can decode it to f32
};

// Information on any type id a GGUF may hold. Ids ggml knows but Strata cannot decode (IQ*, NVFP4, ...)
// yield an UNIMPLEMENTED status naming the type; unknown ids yield INVALID_ARGUMENT naming the id.
absl::StatusOr<GgmlTypeInfo> GetTypeInfo(uint32_t type_id);

// Like GetTypeInfo, but succeeds for every id ggml knows whether or not Strata decodes it
// (`can_dequantize` says which): what a reader needs to size tensors it will never decode.
absl::StatusOr<GgmlTypeInfo> LookupType(uint32_t type_id);

// "f32", "q4_K", ... or "type<N>" for an id ggml does not know.
std::string TypeName(uint32_t type_id);

// Bytes of a tensor of `n_elements` elements per row and `n_rows` rows; fails when a row is not a
// whole number of blocks or the size overflows 64 bits.
absl::StatusOr<uint64_t> TensorBytes(GgmlType type, std::span<const int64_t> ne);

// Bytes of one row of `n` elements (n a multiple of the block size).
absl::StatusOr<uint64_t> RowBytes(GgmlType type, int64_t n);

// Decodes `n` consecutive elements (a multiple of the block size) starting at `src` into `dst`.
// `src` must hold RowBytes(type, n) bytes.
absl::Status Dequantize(GgmlType type, const void* src, float* dst, int64_t n);

// Encodes `n` floats (a multiple of the block size) into `dst` (RowBytes(type, n) bytes).
// Supported for F32, F16, BF16, Q8_0, Q4_0, Q4_1, MXFP4 and Q2_K .. Q6_K (enough to write test models of the
// types users bring); others UNIMPLEMENTED.
absl::Status Quantize(GgmlType type, const float* src, void* dst, int64_t n);

// Whether `type` stores 4-bit affine codes in runs of 32 weights along a row (q4_0, q4_1, q4_K): what a
// scheme of the same kind can hold code for code.
bool HasAffine4Codes(GgmlType type);

// For a type with HasAffine4Codes: the codes of `n` consecutive elements (a multiple of the block size) from
// `src` (RowBytes(type, n) bytes), codes[i] in 0..15, and per 32 elements a scale and an offset such that
// Dequantize gives exactly scale[i / 32] * codes[i] + offset[i / 32] for element i (in float; a zero may
// come out with the other sign). Fails naming
// the type for any other type, and for a partial block.
absl::Status ReadAffine4Codes(GgmlType type, const void* src, int64_t n, uint8_t* codes, float* scale,
                              float* offset);

// MXFP4's codes of `n` consecutive elements (a multiple of 32) from `src` (RowBytes(kMXFP4, n) bytes):
// values[i] the E2M1 value doubled, an integer in -12..12 (ggml's kvalues_mxfp4), and per 32 elements an
// exponent such that Dequantize gives exactly values[i] * 2^exponent[i / 32] (exponent = e - 128, ggml's
// GGML_E8M0_TO_FP32_HALF). Fails for a partial block.
absl::Status ReadMxfp4Codes(const void* src, int64_t n, int8_t* values, int* exponents);

// The half and bfloat16 conversions are kernels/format/fp16.h's, the project's one definition.
using kernels::Bf16ToFloat;
using kernels::FloatToBf16;
using kernels::FloatToHalf;
using kernels::HalfToFloat;

}  // namespace strata::gguf

#endif  // STRATA_ENGINE_GGUF_GGML_TYPES_H_
