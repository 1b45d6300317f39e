#ifndef STRATA_PACKTOOL_SOURCE_SCHEME_H_
#define STRATA_PACKTOOL_SOURCE_SCHEME_H_

// The expert scheme convert uses when none is asked for (--scheme auto): the one that adds the least error
// to what the source's experts decode to, at the least size. Pure functions, any thread.
//
// Measured (bench/RESULTS.md, strata-source-error-bench: relative RMS error convert adds against the decoded
// source, over every expert role; Strata's own K encoders):
//   q4_0, q4_1 -> s4   4-bit affine codes per 32 weights, carried over code for code
//                      (source_transcode.h): 0 added (q4_0 through the generic fit: 4.8%)
//   q4_K       -> s4   the same, with the scale and min products rounded to half: 4.3e-4 added
//   q8_0       -> s8   held exactly (0 added)
//   mxfp4      -> mxfp4  its codes and exponent bytes carried over byte for byte (source_transcode.h): 0 added
//                      at 4.25 bits a weight, on the CPU and CUDA engines; --scheme s8 holds it exactly too
//                      at 8.5 bits (s4 adds 6.8%, the generic s8 fit 0.5%).
//   q6_K, q5_K -> s8   0.48%, 0.49% added (s4: 7.0%, 6.3%, more than a 4-bit grid can carry)
//   q3_K, q2_K -> s8   0.41%, 0.44% added; s4 adds 6.3% and 5.0% (its grid of 32 cannot hold two 16-weight
//                      sub-blocks' scales) for half the size: pass --scheme s4 to choose that
//   q5_0, q5_1 -> s8   5 bits do not fit 4 (not measured: Strata has no q5_0/q5_1 encoder)
//   f32, f16, bf16 -> s4   what convert did before (7.0% added; s8 0.5%, f16 nothing, at 1.7x and 3.2x the size)
// A model whose expert tensors have several types (Q4_K_M files keep some in q6_K) gets the scheme the most
// precise of them needs, so a Q4_K_M file converts to s8.

#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "engine/gguf/ggml_types.h"
#include "kernels/format/scheme.h"

namespace strata::packtool {

// The scheme for experts stored as `type`; UNIMPLEMENTED naming the type for one Strata cannot decode.
absl::StatusOr<kernels::Scheme> DefaultSchemeFor(gguf::GgmlType type);

// The scheme for the experts of the GGUF at `input` (a file or any shard of a split model, or a Hugging Face
// checkpoint directory: its experts' dtype): errors name
// the file, or the tensor whose type cannot be decoded; INVALID_ARGUMENT when it has no expert tensors.
absl::StatusOr<kernels::Scheme> DefaultSchemeForModel(const std::string& input);

// "auto" (nullopt) or a scheme name; INVALID_ARGUMENT naming `field` and the choices otherwise.
absl::StatusOr<std::optional<kernels::Scheme>> ParseSchemeChoice(std::string_view name, std::string_view field);

}  // namespace strata::packtool

#endif  // STRATA_PACKTOOL_SOURCE_SCHEME_H_
