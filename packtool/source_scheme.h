#ifndef STRATA_PACKTOOL_SOURCE_SCHEME_H_
#define STRATA_PACKTOOL_SOURCE_SCHEME_H_

// The expert scheme convert uses when none is asked for (--scheme auto): the one that adds the least error
// to what the source's experts decode to, at the least size. Pure functions, any thread.
//
//   q4_1       -> s4   an affine 4-bit code with fp16 scale and min per 32 weights: s4 holds it exactly
//                      (measured: zero added error)
//   q8_0, q5_0, q5_1, q5_K, q6_K -> s8   5 to 8 bits do not fit 4; s8 holds q8_0 exactly (measured: zero)
//   q4_0       -> s8   s4 could hold its code (q - 8) exactly, but s4's fit does not find that grid when a
//                      block's codes do not reach both ends (measured: 4.8% added), so s8
//   q4_K, q3_K, q2_K -> s4   affine or symmetric codes of 4 bits or fewer in sub-blocks of 16 or 32; not
//                      measured here (engine/gguf has no K encoders to synthesize them): read the error
//                      convert reports, and pass --scheme s8 where it is too large
//   f32, f16, bf16 -> s4   what convert did before (f16 keeps them exactly, at 3.2x the size)
// A model whose expert tensors have several types (Q4_K_M files keep some in q6_K) gets the scheme the most
// precise of them needs.

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
