#ifndef STRATA_SERVICES_REQUEST_LIMITS_H_
#define STRATA_SERVICES_REQUEST_LIMITS_H_

// Bounds on what one strata.v1.Inference request may ask for, checked by the service before the engine
// sees the request. Each refusal is INVALID_ARGUMENT naming the request field, its value, the limit and
// the server flag that sets it. The engine's own limits (a prompt must fit the context; at most
// runtime::kMaxStopStrings stop strings of kMaxStopStringBytes, kMaxTopLogprobs alternatives) stay the
// ceiling: a flag may lower them, never raise them. Message size is gRPC's (ServerConfig::max_message_bytes,
// RESOURCE_EXHAUSTED). Pure functions.

#include <cstdint>

#include "absl/status/status.h"
#include "engine/runtime/request.h"
#include "strata/v1/inference.pb.h"

namespace strata::services {

struct RequestLimits {
  int64_t max_prompt_bytes = 1 << 20;  // --max-prompt-bytes: a text prompt, a Tokenize text
  int64_t max_prompt_tokens = 32768;   // --max-prompt-tokens: a token-id prompt, a Detokenize list
  int32_t max_tokens = 4096;           // --max-tokens-limit: the largest sampling.max_tokens
  int32_t max_stop_strings = 16;       // --max-stop-strings: sampling.stop entries
  int32_t max_stop_bytes = 512;        // --max-stop-bytes: bytes of one stop string
  int32_t max_top_logprobs = 20;       // --max-top-logprobs: sampling.top_logprobs
};

// INVALID_ARGUMENT naming the flag when a limit is below 1 or above the engine's ceiling.
absl::Status CheckRequestLimits(const RequestLimits& limits);

absl::Status CheckGenerateRequest(const v1::GenerateRequest& request, const RequestLimits& limits);
// The messages' and system prompt's text against max_prompt_bytes, and the sampling as for Generate.
absl::Status CheckChatRequest(const v1::ChatRequest& request, const RequestLimits& limits);
// The same limits for a request of the OpenAI-compatible HTTP API (after parsing and chat rendering), the
// fields named as that API names them (prompt, max_tokens, stop, logprobs).
absl::Status CheckHttpRequest(const runtime::GenerateRequest& request, const RequestLimits& limits);
absl::Status CheckTokenizeRequest(const v1::TokenizeRequest& request, const RequestLimits& limits);
absl::Status CheckDetokenizeRequest(const v1::DetokenizeRequest& request, const RequestLimits& limits);

}  // namespace strata::services

#endif  // STRATA_SERVICES_REQUEST_LIMITS_H_
