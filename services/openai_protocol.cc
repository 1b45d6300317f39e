#include "services/openai_protocol.h"

#include <limits>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/status_macros.h"

namespace strata::services {
namespace {

using nlohmann::json;

absl::string_view TypeName(const json& value) {
  switch (value.type()) {
    case json::value_t::null:
      return "null";
    case json::value_t::boolean:
      return "a boolean";
    case json::value_t::string:
      return "a string";
    case json::value_t::array:
      return "an array";
    case json::value_t::object:
      return "an object";
    case json::value_t::number_float:
      return "a fraction";
    default:
      return "a number";
  }
}

absl::Status WrongType(absl::string_view field, absl::string_view expected, const json& value) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": expected ", expected, ", got ", TypeName(value)));
}

// The field when present and not null.
const json* Field(const json& object, const char* name) {
  auto it = object.find(name);
  if (it == object.end() || it->is_null()) return nullptr;
  return &*it;
}

absl::Status ReadFloat(const json& object, const char* name, float* out) {
  const json* value = Field(object, name);
  if (value == nullptr) return absl::OkStatus();
  if (!value->is_number()) return WrongType(name, "a number", *value);
  *out = value->get<float>();
  return absl::OkStatus();
}

absl::Status ReadInt(const json& object, const char* name, int64_t min, int64_t max, int64_t* out) {
  const json* value = Field(object, name);
  if (value == nullptr) return absl::OkStatus();
  if (!value->is_number_integer()) return WrongType(name, "an integer", *value);
  const bool too_large = value->is_number_unsigned() && value->get<uint64_t>() > static_cast<uint64_t>(max);
  const int64_t v = too_large ? max : value->get<int64_t>();
  if (too_large || v < min || v > max) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": ", value->dump(), " is outside ", min, "..", max));
  }
  *out = v;
  return absl::OkStatus();
}

absl::Status ReadInt32(const json& object, const char* name, int32_t* out) {
  int64_t v = *out;
  RETURN_IF_ERROR(ReadInt(object, name, std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max(), &v));
  *out = static_cast<int32_t>(v);
  return absl::OkStatus();
}

absl::Status ReadBool(const json& object, const char* name, bool* out) {
  const json* value = Field(object, name);
  if (value == nullptr) return absl::OkStatus();
  if (!value->is_boolean()) return WrongType(name, "true or false", *value);
  *out = value->get<bool>();
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int32_t>> ReadTokenIds(const json& array, absl::string_view field) {
  std::vector<int32_t> ids;
  for (size_t i = 0; i < array.size(); ++i) {
    if (!array[i].is_number_integer() || array[i].get<int64_t>() < 0 ||
        array[i].get<int64_t>() > std::numeric_limits<int32_t>::max()) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, "[", i, "]: expected a token id (an integer >= 0), got ", array[i].dump()));
    }
    ids.push_back(array[i].get<int32_t>());
  }
  return ids;
}

// "prompt": a string, an array of one string, an array of token ids or an array of one such array.
absl::Status ReadPrompt(const json& object, runtime::GenerateRequest* request) {
  const json* prompt = Field(object, "prompt");
  if (prompt == nullptr) return absl::InvalidArgumentError("prompt: required (a string or an array of token ids)");
  if (prompt->is_string()) {
    request->prompt = prompt->get<std::string>();
    return absl::OkStatus();
  }
  if (!prompt->is_array()) return WrongType("prompt", "a string or an array of token ids", *prompt);
  if (!prompt->empty() && (*prompt)[0].is_number()) {
    ASSIGN_OR_RETURN(request->prompt_tokens, ReadTokenIds(*prompt, "prompt"));
    if (request->prompt_tokens.empty()) return absl::InvalidArgumentError("prompt: empty");
    return absl::OkStatus();
  }
  if (prompt->size() != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("prompt: ", prompt->size(), " prompts given; this server completes one prompt per request"));
  }
  const json& only = (*prompt)[0];
  if (only.is_string()) {
    request->prompt = only.get<std::string>();
  } else if (only.is_array()) {
    ASSIGN_OR_RETURN(request->prompt_tokens, ReadTokenIds(only, "prompt[0]"));
    if (request->prompt_tokens.empty()) return absl::InvalidArgumentError("prompt[0]: empty");
  } else {
    return WrongType("prompt[0]", "a string or an array of token ids", only);
  }
  return absl::OkStatus();
}

// "messages": [{"role": ..., "content": a string, an array of text parts, or null}, ...].
absl::Status ReadMessages(const json& object, std::vector<ChatMessage>* messages) {
  const json* list = Field(object, "messages");
  if (list == nullptr) return absl::InvalidArgumentError("messages: required (an array of {role, content})");
  if (!list->is_array()) return WrongType("messages", "an array of {role, content}", *list);
  if (list->empty()) return absl::InvalidArgumentError("messages: empty; give at least one message");
  for (size_t i = 0; i < list->size(); ++i) {
    const json& m = (*list)[i];
    const std::string at = absl::StrCat("messages[", i, "]");
    if (!m.is_object()) return WrongType(at, "an object with role and content", m);
    ChatMessage message;
    const json* role = Field(m, "role");
    if (role == nullptr || !role->is_string()) {
      return absl::InvalidArgumentError(absl::StrCat(at, ".role: required, a string such as \"user\""));
    }
    message.role = role->get<std::string>();
    const json* content = Field(m, "content");
    if (content == nullptr) {
      // An assistant turn that only called tools has no content.
    } else if (content->is_string()) {
      message.content = content->get<std::string>();
    } else if (content->is_array()) {
      for (size_t j = 0; j < content->size(); ++j) {
        const json& part = (*content)[j];
        const std::string part_at = absl::StrCat(at, ".content[", j, "]");
        const json* type = part.is_object() ? Field(part, "type") : nullptr;
        if (type == nullptr || *type != "text") {
          return absl::InvalidArgumentError(
              absl::StrCat(part_at, ": only text parts ({\"type\": \"text\", \"text\": ...}) are supported"));
        }
        const json* text = Field(part, "text");
        if (text == nullptr || !text->is_string()) {
          return absl::InvalidArgumentError(absl::StrCat(part_at, ".text: required, a string"));
        }
        message.content += text->get<std::string>();
      }
    } else {
      return WrongType(absl::StrCat(at, ".content"), "a string or an array of text parts", *content);
    }
    messages->push_back(std::move(message));
  }
  return absl::OkStatus();
}

absl::Status ReadStop(const json& object, std::vector<std::string>* stop) {
  const json* value = Field(object, "stop");
  if (value == nullptr) return absl::OkStatus();
  if (value->is_string()) {
    stop->push_back(value->get<std::string>());
    return absl::OkStatus();
  }
  if (!value->is_array()) return WrongType("stop", "a string or an array of strings", *value);
  for (size_t i = 0; i < value->size(); ++i) {
    if (!(*value)[i].is_string()) return WrongType(absl::StrCat("stop[", i, "]"), "a string", (*value)[i]);
    stop->push_back((*value)[i].get<std::string>());
  }
  return absl::OkStatus();
}

absl::Status Unsupported(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", what));
}

// Fields OpenAI has that this server does not do; a request that uses them is refused, not half served.
absl::Status CheckUnsupported(OpenAiEndpoint endpoint, const json& object) {
  int64_t n = 1;
  RETURN_IF_ERROR(ReadInt(object, "n", 1, std::numeric_limits<int32_t>::max(), &n));
  if (n != 1) return Unsupported("n", absl::StrCat(n, " choices asked; this server returns one (n = 1)"));
  int64_t best_of = 1;
  RETURN_IF_ERROR(ReadInt(object, "best_of", 1, std::numeric_limits<int32_t>::max(), &best_of));
  if (best_of != 1) return Unsupported("best_of", "only 1 is supported");
  bool echo = false;
  RETURN_IF_ERROR(ReadBool(object, "echo", &echo));
  if (echo) return Unsupported("echo", "echoing the prompt is not supported");
  if (const json* suffix = Field(object, "suffix"); suffix != nullptr && !(suffix->is_string() && suffix->empty())) {
    return Unsupported("suffix", "insertion (a suffix) is not supported");
  }
  if (const json* bias = Field(object, "logit_bias"); bias != nullptr && !bias->empty()) {
    return Unsupported("logit_bias", "not supported");
  }
  for (const char* name : {"tools", "functions"}) {
    if (const json* tools = Field(object, name); tools != nullptr && !tools->empty()) {
      return Unsupported(name, "tool calling is not supported");
    }
  }
  if (const json* format = Field(object, "response_format"); format != nullptr) {
    const json* type = format->is_object() ? Field(*format, "type") : nullptr;
    if (type == nullptr || *type != "text") {
      return Unsupported("response_format", "only {\"type\": \"text\"} is supported");
    }
  }
  (void)endpoint;
  return absl::OkStatus();
}

absl::Status ReadSampling(OpenAiEndpoint endpoint, const json& object, runtime::SamplingParams* s) {
  RETURN_IF_ERROR(ReadInt32(object, "max_tokens", &s->max_tokens));
  if (endpoint == OpenAiEndpoint::kChatCompletions) {
    RETURN_IF_ERROR(ReadInt32(object, "max_completion_tokens", &s->max_tokens));
  }
  RETURN_IF_ERROR(ReadFloat(object, "temperature", &s->temperature));
  RETURN_IF_ERROR(ReadFloat(object, "top_p", &s->top_p));
  RETURN_IF_ERROR(ReadFloat(object, "presence_penalty", &s->presence_penalty));
  RETURN_IF_ERROR(ReadFloat(object, "frequency_penalty", &s->frequency_penalty));
  // Extensions vLLM and llama-server take too.
  RETURN_IF_ERROR(ReadInt32(object, "top_k", &s->top_k));
  RETURN_IF_ERROR(ReadFloat(object, "min_p", &s->min_p));
  RETURN_IF_ERROR(ReadFloat(object, "repetition_penalty", &s->repetition_penalty));
  RETURN_IF_ERROR(ReadBool(object, "ignore_eos", &s->ignore_eos));
  if (const json* ids = Field(object, "stop_token_ids"); ids != nullptr) {
    if (!ids->is_array()) return WrongType("stop_token_ids", "an array of token ids", *ids);
    ASSIGN_OR_RETURN(s->stop_token_ids, ReadTokenIds(*ids, "stop_token_ids"));
  }
  if (const json* seed = Field(object, "seed"); seed != nullptr) {
    if (!seed->is_number_integer()) return WrongType("seed", "an integer", *seed);
    s->seed = seed->is_number_unsigned() ? seed->get<uint64_t>() : static_cast<uint64_t>(seed->get<int64_t>());
  }
  RETURN_IF_ERROR(ReadStop(object, &s->stop));
  if (endpoint == OpenAiEndpoint::kCompletions) {
    // logprobs: how many alternatives to return with each token's log-probability.
    if (const json* logprobs = Field(object, "logprobs"); logprobs != nullptr) {
      int64_t n = 0;
      RETURN_IF_ERROR(ReadInt(object, "logprobs", 0, std::numeric_limits<int32_t>::max(), &n));
      s->logprobs = true;
      s->top_logprobs = static_cast<int32_t>(n);
    }
  } else {
    RETURN_IF_ERROR(ReadBool(object, "logprobs", &s->logprobs));
    RETURN_IF_ERROR(ReadInt32(object, "top_logprobs", &s->top_logprobs));
  }
  return absl::OkStatus();
}

std::string OpenAiErrorType(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange:
      return "invalid_request_error";
    case absl::StatusCode::kUnauthenticated:
      return "authentication_error";
    case absl::StatusCode::kPermissionDenied:
      return "permission_error";
    case absl::StatusCode::kResourceExhausted:
      return "rate_limit_error";
    case absl::StatusCode::kUnavailable:
      return "unavailable_error";
    case absl::StatusCode::kUnimplemented:
      return "not_implemented_error";
    default:
      return "server_error";
  }
}

int HttpStatus(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange:
      return 400;
    case absl::StatusCode::kUnauthenticated:
      return 401;
    case absl::StatusCode::kPermissionDenied:
      return 403;
    case absl::StatusCode::kNotFound:
      return 404;
    case absl::StatusCode::kResourceExhausted:
      return 429;
    case absl::StatusCode::kCancelled:
      return 499;
    case absl::StatusCode::kUnimplemented:
      return 501;
    case absl::StatusCode::kUnavailable:
      return 503;
    case absl::StatusCode::kDeadlineExceeded:
      return 504;
    default:
      return 500;
  }
}

// The field a message starts with ("stop[2] is empty" -> "stop", "messages[0].role: ..." -> "messages"),
// or "" when it does not start with one.
std::string LeadingField(absl::string_view message) {
  size_t end = 0;
  while (end < message.size() && (absl::ascii_isalnum(message[end]) || message[end] == '_')) ++end;
  if (end == 0 || end == message.size()) return "";
  const char next = message[end];
  if (next != ':' && next != '[' && next != '.') return "";
  return std::string(message.substr(0, end));
}

json TokenBytes(std::string_view piece) {
  json bytes = json::array();
  for (unsigned char c : piece) bytes.push_back(static_cast<int>(c));
  return bytes;
}

}  // namespace

absl::StatusOr<OpenAiRequest> ParseOpenAiRequest(OpenAiEndpoint endpoint, absl::string_view body) {
  json object = json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (object.is_discarded()) {
    return absl::InvalidArgumentError("the request body is not valid JSON");
  }
  if (!object.is_object()) return WrongType("the request body", "a JSON object", object);
  OpenAiRequest request;
  request.endpoint = endpoint;
  if (const json* model = Field(object, "model"); model != nullptr) {
    if (!model->is_string()) return WrongType("model", "a string", *model);
    request.model = model->get<std::string>();
  }
  RETURN_IF_ERROR(CheckUnsupported(endpoint, object));
  if (endpoint == OpenAiEndpoint::kCompletions) {
    RETURN_IF_ERROR(ReadPrompt(object, &request.generate));
  } else {
    RETURN_IF_ERROR(ReadMessages(object, &request.messages));
  }
  RETURN_IF_ERROR(ReadSampling(endpoint, object, &request.generate.sampling));
  RETURN_IF_ERROR(ReadBool(object, "stream", &request.stream));
  if (const json* options = Field(object, "stream_options"); options != nullptr) {
    if (!request.stream) return absl::InvalidArgumentError("stream_options: only allowed when stream is true");
    if (!options->is_object()) return WrongType("stream_options", "an object", *options);
    const json* include = Field(*options, "include_usage");
    if (include != nullptr && !include->is_boolean()) {
      return WrongType("stream_options.include_usage", "true or false", *include);
    }
    request.include_usage = include != nullptr && include->get<bool>();
  }
  return request;
}

OpenAiError OpenAiErrorFromStatus(const absl::Status& status) {
  OpenAiError error;
  error.http_status = HttpStatus(status.code());
  error.message = std::string(status.message());
  if (error.message.empty()) error.message = absl::StatusCodeToString(status.code());
  error.type = OpenAiErrorType(status.code());
  if (status.code() == absl::StatusCode::kInvalidArgument) error.param = LeadingField(status.message());
  error.code = absl::AsciiStrToLower(absl::StatusCodeToString(status.code()));
  return error;
}

json OpenAiErrorJson(const OpenAiError& error) {
  json body = {{"message", error.message},
               {"type", error.type},
               {"param", error.param.empty() ? json(nullptr) : json(error.param)},
               {"code", error.code.empty() ? json(nullptr) : json(error.code)}};
  return json{{"error", std::move(body)}};
}

absl::string_view OpenAiFinishReason(runtime::FinishReason reason) {
  switch (reason) {
    case runtime::FinishReason::kStop:
    case runtime::FinishReason::kEos:
      return "stop";
    case runtime::FinishReason::kLength:
      return "length";
    default:
      return "";
  }
}

json UsageJson(const runtime::Usage& usage) {
  return json{{"prompt_tokens", usage.prompt_tokens},
              {"completion_tokens", usage.completion_tokens},
              {"total_tokens", usage.prompt_tokens + usage.completion_tokens}};
}

json LogprobsJson(OpenAiEndpoint endpoint, const std::vector<runtime::SampleResult>& logprobs,
                  const tokenizer::Tokenizer& tokenizer, int64_t text_offset) {
  if (endpoint == OpenAiEndpoint::kChatCompletions) {
    json content = json::array();
    for (const runtime::SampleResult& sampled : logprobs) {
      const std::string_view piece = tokenizer.TokenPiece(sampled.token);
      json top = json::array();
      for (const runtime::TokenLogprob& alt : sampled.top) {
        const std::string_view alt_piece = tokenizer.TokenPiece(alt.token);
        top.push_back({{"token", alt_piece}, {"logprob", alt.logprob}, {"bytes", TokenBytes(alt_piece)}});
      }
      content.push_back(
          {{"token", piece}, {"logprob", sampled.logprob}, {"bytes", TokenBytes(piece)}, {"top_logprobs", top}});
    }
    return json{{"content", std::move(content)}};
  }
  json tokens = json::array(), token_logprobs = json::array(), top_logprobs = json::array(), offsets = json::array();
  for (const runtime::SampleResult& sampled : logprobs) {
    const std::string_view piece = tokenizer.TokenPiece(sampled.token);
    tokens.push_back(piece);
    token_logprobs.push_back(sampled.logprob);
    json top = json::object();
    for (const runtime::TokenLogprob& alt : sampled.top)
      top[std::string(tokenizer.TokenPiece(alt.token))] = alt.logprob;
    top_logprobs.push_back(std::move(top));
    offsets.push_back(text_offset);
    text_offset += static_cast<int64_t>(piece.size());
  }
  return json{{"tokens", std::move(tokens)},
              {"token_logprobs", std::move(token_logprobs)},
              {"top_logprobs", std::move(top_logprobs)},
              {"text_offset", std::move(offsets)}};
}

namespace {

json Header(OpenAiEndpoint endpoint, const CompletionHeader& header, bool chunk) {
  const char* object = endpoint == OpenAiEndpoint::kCompletions ? "text_completion"
                                                                : (chunk ? "chat.completion.chunk" : "chat.completion");
  return json{{"id", header.id}, {"object", object}, {"created", header.created}, {"model", header.model}};
}

json FinishReasonJson(absl::string_view reason) { return reason.empty() ? json(nullptr) : json(std::string(reason)); }

}  // namespace

json CompletionChunkJson(OpenAiEndpoint endpoint, const CompletionHeader& header, const std::string& text,
                         json logprobs, absl::string_view finish_reason, bool first) {
  json out = Header(endpoint, header, /*chunk=*/true);
  json choice = {{"index", 0}};
  if (endpoint == OpenAiEndpoint::kCompletions) {
    choice["text"] = text;
  } else {
    json delta = json::object();
    if (first) delta["role"] = "assistant";
    if (!text.empty() || first) delta["content"] = text;
    choice["delta"] = std::move(delta);
  }
  choice["logprobs"] = std::move(logprobs);
  choice["finish_reason"] = FinishReasonJson(finish_reason);
  out["choices"] = json::array({std::move(choice)});
  return out;
}

json UsageChunkJson(OpenAiEndpoint endpoint, const CompletionHeader& header, const runtime::Usage& usage) {
  json out = Header(endpoint, header, /*chunk=*/true);
  out["choices"] = json::array();
  out["usage"] = UsageJson(usage);
  return out;
}

json CompletionJson(OpenAiEndpoint endpoint, const CompletionHeader& header, const std::string& text, json logprobs,
                    absl::string_view finish_reason, const runtime::Usage& usage) {
  json out = Header(endpoint, header, /*chunk=*/false);
  json choice = {{"index", 0}};
  if (endpoint == OpenAiEndpoint::kCompletions) {
    choice["text"] = text;
  } else {
    choice["message"] = {{"role", "assistant"}, {"content", text}};
  }
  choice["logprobs"] = std::move(logprobs);
  choice["finish_reason"] = FinishReasonJson(finish_reason);
  out["choices"] = json::array({std::move(choice)});
  out["usage"] = UsageJson(usage);
  return out;
}

std::string DumpJson(const json& value) { return value.dump(-1, ' ', false, json::error_handler_t::replace); }

}  // namespace strata::services
