#include "services/request_limits.h"

#include "absl/strings/str_cat.h"
#include "engine/runtime/request.h"
#include "engine/runtime/sampling_params.h"

namespace strata::services {
namespace {

absl::Status OverLimit(const std::string& field, int64_t value, const char* what, int64_t limit,
                       const char* flag) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", value, " ", what, " exceed the limit of ", limit,
                                                 " (strata-server ", flag, ")"));
}

absl::Status CheckLimit(const char* flag, int64_t value, int64_t ceiling) {
  if (value < 1 || value > ceiling) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": ", value, " is not in 1..", ceiling));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckRequestLimits(const RequestLimits& limits) {
  constexpr int64_t kInt32Max = 2147483647;
  if (absl::Status s = CheckLimit("--max-prompt-bytes", limits.max_prompt_bytes, kInt32Max); !s.ok()) return s;
  if (absl::Status s = CheckLimit("--max-prompt-tokens", limits.max_prompt_tokens, kInt32Max); !s.ok()) return s;
  if (absl::Status s = CheckLimit("--max-tokens-limit", limits.max_tokens, kInt32Max); !s.ok()) return s;
  if (absl::Status s = CheckLimit("--max-stop-strings", limits.max_stop_strings, runtime::kMaxStopStrings);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckLimit("--max-stop-bytes", limits.max_stop_bytes, runtime::kMaxStopStringBytes);
      !s.ok()) {
    return s;
  }
  return CheckLimit("--max-top-logprobs", limits.max_top_logprobs, runtime::kMaxTopLogprobs);
}

namespace {

absl::Status CheckSamplingLimits(const v1::SamplingParams& s, const RequestLimits& limits) {
  if (s.has_max_tokens() && s.max_tokens() > limits.max_tokens) {
    return OverLimit("sampling.max_tokens", s.max_tokens(), "tokens", limits.max_tokens, "--max-tokens-limit");
  }
  if (s.stop_size() > limits.max_stop_strings) {
    return OverLimit("sampling.stop", s.stop_size(), "strings", limits.max_stop_strings, "--max-stop-strings");
  }
  for (int i = 0; i < s.stop_size(); ++i) {
    if (static_cast<int64_t>(s.stop(i).size()) > limits.max_stop_bytes) {
      return OverLimit(absl::StrCat("sampling.stop[", i, "]"), static_cast<int64_t>(s.stop(i).size()), "bytes",
                       limits.max_stop_bytes, "--max-stop-bytes");
    }
  }
  if (s.top_logprobs() > limits.max_top_logprobs) {
    return OverLimit("sampling.top_logprobs", s.top_logprobs(), "alternatives", limits.max_top_logprobs,
                     "--max-top-logprobs");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckGenerateRequest(const v1::GenerateRequest& request, const RequestLimits& limits) {
  if (request.has_tokens() && request.tokens().ids_size() > limits.max_prompt_tokens) {
    return OverLimit("tokens", request.tokens().ids_size(), "prompt tokens", limits.max_prompt_tokens,
                     "--max-prompt-tokens");
  }
  if (!request.has_tokens() && static_cast<int64_t>(request.text().size()) > limits.max_prompt_bytes) {
    return OverLimit("text", static_cast<int64_t>(request.text().size()), "prompt bytes", limits.max_prompt_bytes,
                     "--max-prompt-bytes");
  }
  return CheckSamplingLimits(request.sampling(), limits);
}

absl::Status CheckChatRequest(const v1::ChatRequest& request, const RequestLimits& limits) {
  // The conversation becomes the prompt: its text counts against the prompt's limit.
  int64_t bytes = static_cast<int64_t>(request.system_prompt().size());
  for (const v1::ChatMessage& m : request.messages()) bytes += static_cast<int64_t>(m.content().size());
  if (bytes > limits.max_prompt_bytes) {
    return OverLimit("messages", bytes, "prompt bytes", limits.max_prompt_bytes, "--max-prompt-bytes");
  }
  return CheckSamplingLimits(request.sampling(), limits);
}

absl::Status CheckHttpRequest(const runtime::GenerateRequest& request, const RequestLimits& limits) {
  if (static_cast<int64_t>(request.prompt_tokens.size()) > limits.max_prompt_tokens) {
    return OverLimit("prompt", static_cast<int64_t>(request.prompt_tokens.size()), "prompt tokens",
                     limits.max_prompt_tokens, "--max-prompt-tokens");
  }
  if (static_cast<int64_t>(request.prompt.size()) > limits.max_prompt_bytes) {
    return OverLimit("prompt", static_cast<int64_t>(request.prompt.size()), "prompt bytes", limits.max_prompt_bytes,
                     "--max-prompt-bytes");
  }
  const runtime::SamplingParams& s = request.sampling;
  if (s.max_tokens > limits.max_tokens) {
    return OverLimit("max_tokens", s.max_tokens, "tokens", limits.max_tokens, "--max-tokens-limit");
  }
  if (static_cast<int64_t>(s.stop.size()) > limits.max_stop_strings) {
    return OverLimit("stop", static_cast<int64_t>(s.stop.size()), "strings", limits.max_stop_strings,
                     "--max-stop-strings");
  }
  for (size_t i = 0; i < s.stop.size(); ++i) {
    if (static_cast<int64_t>(s.stop[i].size()) > limits.max_stop_bytes) {
      return OverLimit(absl::StrCat("stop[", i, "]"), static_cast<int64_t>(s.stop[i].size()), "bytes",
                       limits.max_stop_bytes, "--max-stop-bytes");
    }
  }
  if (s.top_logprobs > limits.max_top_logprobs) {
    return OverLimit("logprobs", s.top_logprobs, "alternatives", limits.max_top_logprobs, "--max-top-logprobs");
  }
  return absl::OkStatus();
}

absl::Status CheckTokenizeRequest(const v1::TokenizeRequest& request, const RequestLimits& limits) {
  if (static_cast<int64_t>(request.text().size()) > limits.max_prompt_bytes) {
    return OverLimit("text", static_cast<int64_t>(request.text().size()), "bytes", limits.max_prompt_bytes,
                     "--max-prompt-bytes");
  }
  return absl::OkStatus();
}

absl::Status CheckDetokenizeRequest(const v1::DetokenizeRequest& request, const RequestLimits& limits) {
  if (request.tokens_size() > limits.max_prompt_tokens) {
    return OverLimit("tokens", request.tokens_size(), "tokens", limits.max_prompt_tokens, "--max-prompt-tokens");
  }
  return absl::OkStatus();
}

}  // namespace strata::services
