#ifndef STRATA_PACKTOOL_SOURCE_TRANSCODE_H_
#define STRATA_PACKTOOL_SOURCE_TRANSCODE_H_

// Expert roles whose source codes a pack scheme holds as they are, converted code for code instead of
// through the generic fit (which searches a grid of its own and so adds error to weights already on one).
//
//   q4_0, q4_1, q4_K -> s4: every 32 weights along a row are a 4-bit affine code, scale * q + offset (q4_0:
//   d * q - 8 d; q4_1: d * q + m; q4_K: (d * sc) * q - dmin * m). s4 stores the same code with an fp16 scale
//   and offset per 32, so the codes are copied and only the scale and offset are rounded to half: exact for
//   q4_0 and q4_1 (theirs are halves already); q4_K's products need up to 17 significant bits, so each group
//   takes, among the halves next to its scale and offset, the pair with the least squared error over its
//   weights (measured: 4.3e-4 relative RMS error added, where the generic fit added 8.7e-4 to the same
//   weights, and 4.8% to q4_0's; bench/RESULTS.md).
//   mxfp4 -> s8: every 32 weights are an E2M1 value times a power of two, i.e. an integer -12..12 (ggml's
//   doubled table) times 2^(e - 128); s8 stores that integer as its code and the power of two as its half
//   scale: exact (the generic s8 fit adds 0.5%, s4 6.8%). A block whose power of two a half cannot hold
//   (below 2^-24 or above 2^15, with a non-zero value) makes the role go through QuantizeRole.
//   mxfp4 -> mxfp4: the source's bytes rearranged into the pack's layout (every code and exponent byte as it
//   is): exact for every block, at the source's 4.25 bits a weight.
//
// Pure functions, any thread.

#include <cstdint>

#include "absl/status/status.h"
#include "engine/gguf/ggml_types.h"
#include "kernels/cpu/quantize.h"
#include "kernels/format/scheme.h"

namespace strata::packtool {

// Whether roles stored as `type` convert to `scheme` code for code.
bool CanTranscode(gguf::GgmlType type, kernels::Scheme scheme);

// Whether the conversion is exact for every role, so that TranscodeRole needs no decoded values (mxfp4 into
// mxfp4): the pack writer then skips decoding the role.
bool TranscodesWithoutValues(gguf::GgmlType type, kernels::Scheme scheme);

// Converts a rows x cols role (`source`: its rows in `type`, row after row; `values`: the same decoded by
// gguf::Dequantize, the reference for the error; null where TranscodesWithoutValues) into `dst`
// (kernels::RoleBytes bytes), and adds the error of the written role against the values to *error, as
// QuantizeRole does (an exact transcode adds 0 against their sum of squares, formed from the codes when values
// is null). A group whose scale or offset does not fit a half (weights beyond +-65504) makes the whole role go
// through QuantizeRole instead. INVALID_ARGUMENT unless CanTranscode(type, scheme) and the shape passes
// kernels::CheckRoleShape, or values is null where the conversion needs them.
absl::Status TranscodeRole(gguf::GgmlType type, const uint8_t* source, const float* values, int64_t rows,
                           int64_t cols, kernels::Scheme scheme, uint8_t* dst, kernels::QuantizeError* error);

}  // namespace strata::packtool

#endif  // STRATA_PACKTOOL_SOURCE_TRANSCODE_H_
