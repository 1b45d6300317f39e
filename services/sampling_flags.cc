#include "services/sampling_flags.h"

#include <limits>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace strata::services {
namespace {

struct FieldFlag {
  absl::string_view field;  // as ValidateSamplingParams names it
  absl::string_view flag;   // as the user types it
};

// Longer names first where one is a prefix of another (stop_token_ids before stop, top_logprobs before top_*).
constexpr FieldFlag kFieldFlags[] = {
    {"temperature", "--temperature"},
    {"top_logprobs", "--logprobs"},
    {"top_k", "--top-k"},
    {"top_p", "--top-p"},
    {"min_p", "--min-p"},
    {"repetition_penalty", "--repeat-penalty"},
    {"presence_penalty", "--presence-penalty"},
    {"frequency_penalty", "--frequency-penalty"},
    {"penalty_last_n", "--penalty-last-n"},
    {"max_tokens", "--max-tokens"},
    {"stop_token_ids", "--stop-token-ids"},
    {"stop", "--stop"},
};

}  // namespace

absl::Status NameSamplingFlag(const absl::Status& status) {
  const absl::string_view message = status.message();
  for (const FieldFlag& f : kFieldFlags) {
    if (!absl::StartsWith(message, f.field)) continue;
    const absl::string_view rest = message.substr(f.field.size());
    // "top_p: ...", "stop[0] is empty", "stop_token_ids[1]: ..."
    if (rest.empty() || (rest[0] != ':' && rest[0] != '[')) continue;
    return absl::Status(status.code(), absl::StrCat(f.flag, rest));
  }
  return status;
}

absl::Status CheckSamplingFlags(const runtime::SamplingParams& params) {
  return NameSamplingFlag(runtime::ValidateSamplingParams(params, std::numeric_limits<int>::max()));
}

}  // namespace strata::services
