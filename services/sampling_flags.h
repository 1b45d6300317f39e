#ifndef STRATA_SERVICES_SAMPLING_FLAGS_H_
#define STRATA_SERVICES_SAMPLING_FLAGS_H_

// The sampling flags strata-run and strata share (--temperature, --top-k, ...): their checks speak of the
// flag the user typed, not of the engine's field. Pure functions.

#include "absl/status/status.h"
#include "engine/runtime/sampling_params.h"

namespace strata::services {

// runtime::ValidateSamplingParams before any work, its message naming the flag ("--top-p: 2 is not in
// (0, 1]" rather than "top_p: ..."). stop_token_ids are checked against the vocabulary later, by the
// engine; here only their count. OK or INVALID_ARGUMENT.
absl::Status CheckSamplingFlags(const runtime::SamplingParams& params);

// `status` with a leading engine field name (top_p, stop_token_ids[2], ...) replaced by its flag; other
// statuses unchanged.
absl::Status NameSamplingFlag(const absl::Status& status);

}  // namespace strata::services

#endif  // STRATA_SERVICES_SAMPLING_FLAGS_H_
