#include "engine/runtime/sampling_params.h"

#include <cmath>

#include "absl/strings/str_format.h"
#include "engine/tokenizer/utf8.h"

namespace strata::runtime {

std::string_view FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kNone:
      return "none";
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kEos:
      return "eos";
    case FinishReason::kCancelled:
      return "cancelled";
    case FinishReason::kError:
      return "error";
  }
  return "unknown";
}

namespace {

absl::Status Invalid(const absl::FormatSpec<const char*, double>& format, const char* field, double value) {
  return absl::InvalidArgumentError(absl::StrFormat(format, field, value));
}

absl::Status CheckFinite(const char* field, float value) {
  if (!std::isfinite(value)) return Invalid("%s: %g is not a finite number", field, value);
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateSamplingParams(const SamplingParams& p, int n_vocab) {
  if (n_vocab <= 0) {
    return absl::InvalidArgumentError(absl::StrFormat("n_vocab: %d must be positive", n_vocab));
  }
  if (absl::Status s = CheckFinite("temperature", p.temperature); !s.ok()) return s;
  if (p.temperature < 0) return Invalid("%s: %g is negative", "temperature", p.temperature);
  if (p.top_k < 0) return absl::InvalidArgumentError(absl::StrFormat("top_k: %d is negative", p.top_k));
  if (!(p.top_p > 0 && p.top_p <= 1)) return Invalid("%s: %g is not in (0, 1]", "top_p", p.top_p);
  if (!(p.min_p >= 0 && p.min_p <= 1)) return Invalid("%s: %g is not in [0, 1]", "min_p", p.min_p);
  if (absl::Status s = CheckFinite("repetition_penalty", p.repetition_penalty); !s.ok()) return s;
  if (p.repetition_penalty <= 0) {
    return Invalid("%s: %g must be > 0", "repetition_penalty", p.repetition_penalty);
  }
  if (absl::Status s = CheckFinite("presence_penalty", p.presence_penalty); !s.ok()) return s;
  if (absl::Status s = CheckFinite("frequency_penalty", p.frequency_penalty); !s.ok()) return s;
  if (p.penalty_last_n < -1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "penalty_last_n: %d must be -1 (whole context), 0 (off) or a window length", p.penalty_last_n));
  }
  if (p.max_tokens < 1) {
    return absl::InvalidArgumentError(absl::StrFormat("max_tokens: %d must be >= 1", p.max_tokens));
  }
  if (p.stop.size() > static_cast<size_t>(kMaxStopStrings)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("stop: %d strings exceed the limit of %d", p.stop.size(), kMaxStopStrings));
  }
  for (size_t i = 0; i < p.stop.size(); ++i) {
    if (p.stop[i].empty()) return absl::InvalidArgumentError(absl::StrFormat("stop[%d] is empty", i));
    // The stop matcher emits text up to a match; a match inside a character would split it.
    if (!tokenizer::IsValidUtf8(p.stop[i])) {
      return absl::InvalidArgumentError(absl::StrFormat("stop[%d] is not valid UTF-8", i));
    }
    if (p.stop[i].size() > static_cast<size_t>(kMaxStopStringBytes)) {
      return absl::InvalidArgumentError(absl::StrFormat("stop[%d]: %d bytes exceed the limit of %d", i,
                                                        p.stop[i].size(), kMaxStopStringBytes));
    }
  }
  if (p.stop_token_ids.size() > static_cast<size_t>(kMaxStopTokenIds)) {
    return absl::InvalidArgumentError(absl::StrFormat("stop_token_ids: %d ids exceed the limit of %d",
                                                      p.stop_token_ids.size(), kMaxStopTokenIds));
  }
  for (size_t i = 0; i < p.stop_token_ids.size(); ++i) {
    const int32_t id = p.stop_token_ids[i];
    if (id < 0 || id >= n_vocab) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "stop_token_ids[%d]: %d is not a token id (vocabulary has %d)", i, id, n_vocab));
    }
  }
  if (p.top_logprobs < 0) {
    return absl::InvalidArgumentError(absl::StrFormat("top_logprobs: %d is negative", p.top_logprobs));
  }
  if (p.top_logprobs > kMaxTopLogprobs) {
    return absl::InvalidArgumentError(
        absl::StrFormat("top_logprobs: %d exceeds %d", p.top_logprobs, kMaxTopLogprobs));
  }
  if (p.top_logprobs > 0 && !p.logprobs) {
    return absl::InvalidArgumentError(
        absl::StrFormat("top_logprobs: %d requires logprobs to be set", p.top_logprobs));
  }
  return absl::OkStatus();
}

}  // namespace strata::runtime
