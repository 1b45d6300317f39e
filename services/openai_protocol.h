#ifndef STRATA_SERVICES_OPENAI_PROTOCOL_H_
#define STRATA_SERVICES_OPENAI_PROTOCOL_H_

// OpenAI's HTTP API (/v1/completions, /v1/chat/completions, /v1/models) as JSON in and out, mapped onto the
// engine's request types. Parsing checks the JSON's shape and the fields the engine does not know about
// (n, echo, best_of, stream_options, ...) and names the field on a mistake; the values themselves
// (max_tokens, temperature, top_p, stop, ...) are checked by Engine::Submit, the one check the gRPC API
// goes through too. Pure functions, callable from any thread.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/runtime/request.h"
#include "engine/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"

namespace strata::services {

enum class OpenAiEndpoint { kCompletions, kChatCompletions };

struct ChatMessage {
  std::string role;     // "system", "user", "assistant", "tool", ...
  std::string content;  // text parts joined
};

struct OpenAiRequest {
  OpenAiEndpoint endpoint = OpenAiEndpoint::kCompletions;
  std::string model;                  // as given; empty when left out
  runtime::GenerateRequest generate;  // the prompt (completions only) and the sampling fields
  std::vector<ChatMessage> messages;  // chat only
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
};

// Parses a request body. INVALID_ARGUMENT naming the field ("messages[1].content: expected a string or an
// array of text parts") for anything that is not OpenAI's shape or that this server does not do (n > 1,
// echo, best_of > 1, logit_bias, tools).
absl::StatusOr<OpenAiRequest> ParseOpenAiRequest(OpenAiEndpoint endpoint, absl::string_view body);

// An error as OpenAI sends it: {"error": {"message", "type", "param", "code"}} with its HTTP status.
struct OpenAiError {
  int http_status = 500;
  std::string message;
  std::string type;   // "invalid_request_error", "authentication_error", "server_error", ...
  std::string param;  // the request field at fault, "" for none
  std::string code;   // a short machine-readable reason, "" for none
};

// The error for a status from parsing or the engine: INVALID_ARGUMENT 400 (param: the field the message
// starts with), UNAUTHENTICATED 401, PERMISSION_DENIED 403, NOT_FOUND 404, RESOURCE_EXHAUSTED 429,
// UNAVAILABLE 503, UNIMPLEMENTED 501, anything else 500.
OpenAiError OpenAiErrorFromStatus(const absl::Status& status);
nlohmann::json OpenAiErrorJson(const OpenAiError& error);

// "stop" (stop string, stop token or end of generation), "length", or "" for an unfinished sequence.
absl::string_view OpenAiFinishReason(runtime::FinishReason reason);

nlohmann::json UsageJson(const runtime::Usage& usage);

// The log-probabilities of `logprobs` in the endpoint's shape: for completions {"tokens", "token_logprobs",
// "top_logprobs", "text_offset"} (offsets counted from `text_offset`), for chat {"content": [{"token",
// "logprob", "bytes", "top_logprobs"}]}.
nlohmann::json LogprobsJson(OpenAiEndpoint endpoint, const std::vector<runtime::SampleResult>& logprobs,
                            const tokenizer::Tokenizer& tokenizer, int64_t text_offset);

// The fields every completion object and chunk starts with.
struct CompletionHeader {
  std::string id;       // "cmpl-..." or "chatcmpl-..."
  int64_t created = 0;  // Unix seconds
  std::string model;
};

// One streamed chunk with one choice: `text` (a delta), its log-probabilities (null when not asked),
// and the finish reason (null until the last). For chat, `first` adds the assistant role to the delta.
nlohmann::json CompletionChunkJson(OpenAiEndpoint endpoint, const CompletionHeader& header, const std::string& text,
                                   nlohmann::json logprobs, absl::string_view finish_reason, bool first);
// The chunk that carries only the usage, with no choice (stream_options.include_usage).
nlohmann::json UsageChunkJson(OpenAiEndpoint endpoint, const CompletionHeader& header, const runtime::Usage& usage);
// A whole (not streamed) completion.
nlohmann::json CompletionJson(OpenAiEndpoint endpoint, const CompletionHeader& header, const std::string& text,
                              nlohmann::json logprobs, absl::string_view finish_reason, const runtime::Usage& usage);

// JSON text with invalid UTF-8 replaced (a token's piece can be part of a character).
std::string DumpJson(const nlohmann::json& json);

}  // namespace strata::services

#endif  // STRATA_SERVICES_OPENAI_PROTOCOL_H_
