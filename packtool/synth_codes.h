#ifndef STRATA_PACKTOOL_SYNTH_CODES_H_
#define STRATA_PACKTOOL_SYNTH_CODES_H_

// Random expert roles written directly in a scheme's byte layout (kernels/format/scheme.h), for synthetic
// packs: random weights need no fitting, so there is no f32 matrix and no quantization, and a role costs
// about as much as writing its bytes.
//
// What the decoded weights look like, for a requested standard deviation `stddev`:
//   s8, s4, s2: every code uniform and independent over the scheme's levels (s8: a uniform byte with -128
//     replaced by 0, so codes stay in [-127, 127] and 0 is twice as likely as any other code); each
//     (row, group) scale drawn from 16 values spread over +-23% around a base, the base chosen so that
//     the decoded weights have mean 0 and standard deviation `stddev` (up to rounding the scales to half,
//     at most 5e-4 relative). s4 mins are -7.5 x scale (rounded to half), which centres the 16 levels.
//   mxfp4: every code uniform over its 16 (0 twice, as 0 and -0); the scales two neighbouring powers of two
//     mixed so that the standard deviation is `stddev` within about 5%.
//   f16: halves of stddev x a standard normal value (one of 4096 quantiles, so truncated at about +-3.7).
// Deterministic: the bytes are a pure function of (scheme, shape, stddev, stream, first). They are not
// the bytes the float-then-quantize path writes for the same stream.

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/format/scheme.h"

namespace strata::packtool {

// Writes a random rows x cols role of `scheme` to dst[0 .. kernels::RoleBytes(scheme, rows, cols)).
// `stream` and `first` identify the role: a tensor's value stream (SynthStream) and the index of the role's
// first element in it. The shape must pass kernels::CheckRoleShape. INVALID_ARGUMENT when `stddev` is not
// positive and finite; INTERNAL when it is so small or large that a scale would not be a positive, finite
// half.
absl::Status FillRandomRole(kernels::Scheme scheme, int64_t rows, int64_t cols, float stddev, uint64_t stream,
                            uint64_t first, uint8_t* dst);

// Mean of the squared decoded level (w / scale, s4 counted from its centre) of a uniformly random code as
// FillRandomRole draws it: 5 for s2, 21.25 for s4, 5397.5 for s8, 1 for f16 (whose values are not codes).
double RandomCodeLevelMeanSquare(kernels::Scheme scheme);

}  // namespace strata::packtool

#endif  // STRATA_PACKTOOL_SYNTH_CODES_H_
