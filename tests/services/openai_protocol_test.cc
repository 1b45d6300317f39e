#include "services/openai_protocol.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/test_util.h"

namespace strata::services {
namespace {

using nlohmann::json;
using ::testing::ElementsAre;

absl::StatusOr<OpenAiRequest> Completion(const std::string& body) {
  return ParseOpenAiRequest(OpenAiEndpoint::kCompletions, body);
}
absl::StatusOr<OpenAiRequest> Chat(const std::string& body) {
  return ParseOpenAiRequest(OpenAiEndpoint::kChatCompletions, body);
}

TEST(OpenAiProtocolTest, CompletionFieldsMapOntoTheEnginesRequest) {
  auto r = Completion(R"({"model": "m", "prompt": "Hello", "max_tokens": 7, "temperature": 0.5, "top_p": 0.9,
                          "stop": ["a", "b"], "seed": 42, "logprobs": 3, "presence_penalty": 0.1,
                          "frequency_penalty": 0.2, "top_k": 5, "stream": true,
                          "stream_options": {"include_usage": true}, "user": "ignored"})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->model, "m");
  EXPECT_EQ(r->generate.prompt, "Hello");
  const runtime::SamplingParams& s = r->generate.sampling;
  EXPECT_EQ(s.max_tokens, 7);
  EXPECT_FLOAT_EQ(s.temperature, 0.5f);
  EXPECT_FLOAT_EQ(s.top_p, 0.9f);
  EXPECT_THAT(s.stop, ElementsAre("a", "b"));
  EXPECT_EQ(s.seed, 42u);
  EXPECT_TRUE(s.logprobs);
  EXPECT_EQ(s.top_logprobs, 3);
  EXPECT_FLOAT_EQ(s.presence_penalty, 0.1f);
  EXPECT_FLOAT_EQ(s.frequency_penalty, 0.2f);
  EXPECT_EQ(s.top_k, 5);
  EXPECT_TRUE(r->stream);
  EXPECT_TRUE(r->include_usage);
}

TEST(OpenAiProtocolTest, UnsetFieldsKeepTheEngineDefaults) {
  auto r = Completion(R"({"prompt": "x", "temperature": null, "stop": null})");
  ASSERT_TRUE(r.ok()) << r.status();
  const runtime::SamplingParams defaults;
  EXPECT_EQ(r->generate.sampling.max_tokens, defaults.max_tokens);
  EXPECT_EQ(r->generate.sampling.temperature, defaults.temperature);
  EXPECT_FALSE(r->generate.sampling.logprobs);
  EXPECT_FALSE(r->stream);
  EXPECT_TRUE(r->model.empty());
}

TEST(OpenAiProtocolTest, PromptMayBeTextTokenIdsOrABatchOfOne) {
  auto stop_string = Completion(R"({"prompt": "x", "stop": "\n"})");
  ASSERT_TRUE(stop_string.ok());
  EXPECT_THAT(stop_string->generate.sampling.stop, ElementsAre("\n"));
  auto ids = Completion(R"({"prompt": [1, 2, 3]})");
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_THAT(ids->generate.prompt_tokens, ElementsAre(1, 2, 3));
  auto one_text = Completion(R"({"prompt": ["hi"]})");
  ASSERT_TRUE(one_text.ok());
  EXPECT_EQ(one_text->generate.prompt, "hi");
  auto one_ids = Completion(R"({"prompt": [[4, 5]]})");
  ASSERT_TRUE(one_ids.ok());
  EXPECT_THAT(one_ids->generate.prompt_tokens, ElementsAre(4, 5));
}

TEST(OpenAiProtocolTest, MistakesNameTheField) {
  constexpr auto kInvalid = absl::StatusCode::kInvalidArgument;
  EXPECT_THAT(Completion("{not json").status(), StatusIsWith(kInvalid, "not valid JSON"));
  EXPECT_THAT(Completion("[1]").status(), StatusIsWith(kInvalid, "expected a JSON object"));
  EXPECT_THAT(Completion("{}").status(), StatusIsWith(kInvalid, "prompt: required"));
  EXPECT_THAT(Completion(R"({"prompt": 5})").status(), StatusIsWith(kInvalid, "prompt: expected a string or an array"));
  EXPECT_THAT(Completion(R"({"prompt": ["a", "b"]})").status(), StatusIsWith(kInvalid, "prompt: 2 prompts given"));
  EXPECT_THAT(Completion(R"({"prompt": [1, -2]})").status(), StatusIsWith(kInvalid, "prompt[1]: expected a token id"));
  EXPECT_THAT(Completion(R"({"prompt": "x", "max_tokens": "ten"})").status(),
              StatusIsWith(kInvalid, "max_tokens: expected an integer, got a string"));
  EXPECT_THAT(Completion(R"({"prompt": "x", "max_tokens": 1e30})").status(),
              StatusIsWith(kInvalid, "max_tokens: expected an integer"));
  EXPECT_THAT(Completion(R"({"prompt": "x", "max_tokens": 99999999999})").status(),
              StatusIsWith(kInvalid, "max_tokens: "));
  EXPECT_THAT(Completion(R"({"prompt": "x", "temperature": "hot"})").status(),
              StatusIsWith(kInvalid, "temperature: expected a number"));
  EXPECT_THAT(Completion(R"({"prompt": "x", "stop": [1]})").status(),
              StatusIsWith(kInvalid, "stop[0]: expected a string"));
  EXPECT_THAT(Completion(R"({"prompt": "x", "n": 2})").status(), StatusIsWith(kInvalid, "n: 2 choices asked"));
  EXPECT_THAT(Completion(R"({"prompt": "x", "echo": true})").status(), StatusIsWith(kInvalid, "echo: "));
  EXPECT_THAT(Completion(R"({"prompt": "x", "best_of": 3})").status(), StatusIsWith(kInvalid, "best_of: "));
  EXPECT_THAT(Completion(R"({"prompt": "x", "logit_bias": {"5": 1}})").status(),
              StatusIsWith(kInvalid, "logit_bias: "));
  EXPECT_THAT(Completion(R"({"prompt": "x", "stream_options": {"include_usage": true}})").status(),
              StatusIsWith(kInvalid, "stream_options: only allowed when stream is true"));
  EXPECT_THAT(Completion(R"({"prompt": "x", "model": 3})").status(),
              StatusIsWith(kInvalid, "model: expected a string"));
  EXPECT_THAT(Chat(R"({"messages": []})").status(), StatusIsWith(kInvalid, "messages: empty"));
  EXPECT_THAT(Chat(R"({"messages": [{"content": "hi"}]})").status(),
              StatusIsWith(kInvalid, "messages[0].role: required"));
  EXPECT_THAT(Chat(R"({"messages": [{"role": "user", "content": 3}]})").status(),
              StatusIsWith(kInvalid, "messages[0].content: expected a string or an array of text parts"));
  EXPECT_THAT(Chat(R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})").status(),
              StatusIsWith(kInvalid, "messages[0].content[0]: only text parts"));
  EXPECT_THAT(Chat(R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]})").status(),
              StatusIsWith(kInvalid, "tools: "));
  EXPECT_THAT(Chat(R"({"messages": [{"role": "user", "content": "x"}], "logprobs": 2})").status(),
              StatusIsWith(kInvalid, "logprobs: expected true or false"));
}

TEST(OpenAiProtocolTest, ChatMessagesAndItsOwnFields) {
  auto r = Chat(R"({"messages": [{"role": "system", "content": "Be brief."},
                                 {"role": "user", "content": [{"type": "text", "text": "Hi "},
                                                              {"type": "text", "text": "there"}]},
                                 {"role": "assistant", "content": null}],
                    "max_completion_tokens": 9, "logprobs": true, "top_logprobs": 2})");
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->messages.size(), 3u);
  EXPECT_EQ(r->messages[0].role, "system");
  EXPECT_EQ(r->messages[1].content, "Hi there");
  EXPECT_EQ(r->messages[2].content, "");
  EXPECT_EQ(r->generate.sampling.max_tokens, 9);
  EXPECT_TRUE(r->generate.sampling.logprobs);
  EXPECT_EQ(r->generate.sampling.top_logprobs, 2);
  EXPECT_TRUE(r->generate.prompt.empty());  // the chat renderer makes it
}

TEST(OpenAiProtocolTest, ErrorsTakeOpenAisShapeAndStatus) {
  OpenAiError invalid = OpenAiErrorFromStatus(absl::InvalidArgumentError("max_tokens: 0 must be >= 1"));
  EXPECT_EQ(invalid.http_status, 400);
  EXPECT_EQ(invalid.type, "invalid_request_error");
  EXPECT_EQ(invalid.param, "max_tokens");
  EXPECT_EQ(OpenAiErrorFromStatus(absl::InvalidArgumentError("stop[2] is empty")).param, "stop");
  EXPECT_EQ(OpenAiErrorFromStatus(absl::InvalidArgumentError("the request body is not valid JSON")).param, "");
  EXPECT_EQ(OpenAiErrorFromStatus(absl::ResourceExhaustedError("queue full")).http_status, 429);
  EXPECT_EQ(OpenAiErrorFromStatus(absl::UnavailableError("loading")).http_status, 503);
  EXPECT_EQ(OpenAiErrorFromStatus(absl::UnauthenticatedError("no token")).http_status, 401);
  EXPECT_EQ(OpenAiErrorFromStatus(absl::InternalError("boom")).http_status, 500);

  const json body = OpenAiErrorJson(invalid);
  ASSERT_TRUE(body.contains("error"));
  EXPECT_EQ(body["error"]["message"], "max_tokens: 0 must be >= 1");
  EXPECT_EQ(body["error"]["type"], "invalid_request_error");
  EXPECT_EQ(body["error"]["param"], "max_tokens");
  EXPECT_EQ(body["error"]["code"], "invalid_argument");
  EXPECT_TRUE(OpenAiErrorJson(OpenAiErrorFromStatus(absl::InternalError("x")))["error"]["param"].is_null());
}

TEST(OpenAiProtocolTest, ChunksAndCompletionsHaveOpenAisFields) {
  const CompletionHeader header{"cmpl-1", 1700000000, "tiny"};
  runtime::Usage usage;
  usage.prompt_tokens = 3;
  usage.completion_tokens = 4;

  json chunk = CompletionChunkJson(OpenAiEndpoint::kCompletions, header, "Hel", nullptr, "", false);
  EXPECT_EQ(chunk["object"], "text_completion");
  EXPECT_EQ(chunk["choices"][0]["text"], "Hel");
  EXPECT_TRUE(chunk["choices"][0]["finish_reason"].is_null());

  json chat_first = CompletionChunkJson(OpenAiEndpoint::kChatCompletions, header, "", nullptr, "", true);
  EXPECT_EQ(chat_first["object"], "chat.completion.chunk");
  EXPECT_EQ(chat_first["choices"][0]["delta"]["role"], "assistant");
  json chat_last = CompletionChunkJson(OpenAiEndpoint::kChatCompletions, header, "", nullptr, "length", false);
  EXPECT_TRUE(chat_last["choices"][0]["delta"].empty());
  EXPECT_EQ(chat_last["choices"][0]["finish_reason"], "length");

  json usage_chunk = UsageChunkJson(OpenAiEndpoint::kChatCompletions, header, usage);
  EXPECT_TRUE(usage_chunk["choices"].empty());
  EXPECT_EQ(usage_chunk["usage"]["total_tokens"], 7);

  json whole = CompletionJson(OpenAiEndpoint::kChatCompletions, header, "Hi", nullptr, "stop", usage);
  EXPECT_EQ(whole["object"], "chat.completion");
  EXPECT_EQ(whole["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(whole["choices"][0]["message"]["content"], "Hi");
  EXPECT_EQ(whole["usage"]["prompt_tokens"], 3);

  EXPECT_EQ(OpenAiFinishReason(runtime::FinishReason::kEos), "stop");
  EXPECT_EQ(OpenAiFinishReason(runtime::FinishReason::kStop), "stop");
  EXPECT_EQ(OpenAiFinishReason(runtime::FinishReason::kLength), "length");
}

TEST(OpenAiProtocolTest, DumpReplacesBrokenUtf8) {
  const std::string dumped = DumpJson(json{{"text", std::string("a\xE2\x82")}});
  EXPECT_TRUE(json::accept(dumped)) << dumped;
}

}  // namespace
}  // namespace strata::services
