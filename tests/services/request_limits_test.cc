#include "services/request_limits.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace strata::services {
namespace {

using ::testing::HasSubstr;

RequestLimits Small() {
  return {.max_prompt_bytes = 10, .max_prompt_tokens = 3, .max_tokens = 50, .max_stop_strings = 2,
          .max_stop_bytes = 4, .max_top_logprobs = 5};
}

void ExpectRefused(const absl::Status& status, const std::string& field, const std::string& flag) {
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(status.message(), HasSubstr(field + ": ")) << status;
  EXPECT_THAT(status.message(), HasSubstr(flag)) << status;
}

TEST(RequestLimitsTest, ARequestWithinTheLimitsPasses) {
  v1::GenerateRequest request;
  request.set_text("0123456789");
  request.mutable_sampling()->set_max_tokens(50);
  request.mutable_sampling()->add_stop("abcd");
  request.mutable_sampling()->add_stop("x");
  request.mutable_sampling()->set_logprobs(true);
  request.mutable_sampling()->set_top_logprobs(5);
  EXPECT_TRUE(CheckGenerateRequest(request, Small()).ok());
}

TEST(RequestLimitsTest, EachFieldBeyondItsLimitIsNamed) {
  v1::GenerateRequest text;
  text.set_text("0123456789a");
  ExpectRefused(CheckGenerateRequest(text, Small()), "text", "--max-prompt-bytes");
  EXPECT_THAT(CheckGenerateRequest(text, Small()).message(), HasSubstr("11 prompt bytes exceed the limit of 10"));

  v1::GenerateRequest tokens;
  for (int id : {1, 2, 3, 4}) tokens.mutable_tokens()->add_ids(id);
  ExpectRefused(CheckGenerateRequest(tokens, Small()), "tokens", "--max-prompt-tokens");

  v1::GenerateRequest max_tokens;
  max_tokens.set_text("hi");
  max_tokens.mutable_sampling()->set_max_tokens(51);
  ExpectRefused(CheckGenerateRequest(max_tokens, Small()), "sampling.max_tokens", "--max-tokens-limit");

  v1::GenerateRequest stops;
  stops.set_text("hi");
  for (const char* s : {"a", "b", "c"}) stops.mutable_sampling()->add_stop(s);
  ExpectRefused(CheckGenerateRequest(stops, Small()), "sampling.stop", "--max-stop-strings");

  v1::GenerateRequest long_stop;
  long_stop.set_text("hi");
  long_stop.mutable_sampling()->add_stop("a");
  long_stop.mutable_sampling()->add_stop("abcde");
  ExpectRefused(CheckGenerateRequest(long_stop, Small()), "sampling.stop[1]", "--max-stop-bytes");

  v1::GenerateRequest logprobs;
  logprobs.set_text("hi");
  logprobs.mutable_sampling()->set_logprobs(true);
  logprobs.mutable_sampling()->set_top_logprobs(6);
  ExpectRefused(CheckGenerateRequest(logprobs, Small()), "sampling.top_logprobs", "--max-top-logprobs");

  v1::TokenizeRequest tokenize;
  tokenize.set_text("0123456789a");
  ExpectRefused(CheckTokenizeRequest(tokenize, Small()), "text", "--max-prompt-bytes");
  v1::DetokenizeRequest detokenize;
  for (int id : {1, 2, 3, 4}) detokenize.add_tokens(id);
  ExpectRefused(CheckDetokenizeRequest(detokenize, Small()), "tokens", "--max-prompt-tokens");
}

TEST(RequestLimitsTest, HttpAndChatRequestsMeetTheSameLimitsNamedAsTheirApisNameThem) {
  runtime::GenerateRequest ok;
  ok.prompt = "0123456789";
  ok.sampling.max_tokens = 50;
  ok.sampling.stop = {"abcd", "x"};
  ok.sampling.top_logprobs = 5;
  EXPECT_TRUE(CheckHttpRequest(ok, Small()).ok());
  runtime::GenerateRequest r = ok;
  r.prompt += "a";
  ExpectRefused(CheckHttpRequest(r, Small()), "prompt", "--max-prompt-bytes");
  r = ok;
  r.prompt_tokens = {1, 2, 3, 4};
  ExpectRefused(CheckHttpRequest(r, Small()), "prompt", "--max-prompt-tokens");
  r = ok;
  r.sampling.max_tokens = 51;
  ExpectRefused(CheckHttpRequest(r, Small()), "max_tokens", "--max-tokens-limit");
  r = ok;
  r.sampling.stop = {"a", "b", "c"};
  ExpectRefused(CheckHttpRequest(r, Small()), "stop", "--max-stop-strings");
  r = ok;
  r.sampling.stop = {"abcde"};
  ExpectRefused(CheckHttpRequest(r, Small()), "stop[0]", "--max-stop-bytes");
  r = ok;
  r.sampling.top_logprobs = 6;
  ExpectRefused(CheckHttpRequest(r, Small()), "logprobs", "--max-top-logprobs");

  v1::ChatRequest chat;
  chat.set_system_prompt("01234");
  chat.add_messages()->set_content("56789");
  EXPECT_TRUE(CheckChatRequest(chat, Small()).ok());
  chat.add_messages()->set_content("a");
  ExpectRefused(CheckChatRequest(chat, Small()), "messages", "--max-prompt-bytes");
  chat.mutable_messages()->RemoveLast();
  chat.mutable_sampling()->set_max_tokens(51);
  ExpectRefused(CheckChatRequest(chat, Small()), "sampling.max_tokens", "--max-tokens-limit");
}

TEST(RequestLimitsTest, LimitsOutsideTheirRangeNameTheFlag) {
  EXPECT_TRUE(CheckRequestLimits(RequestLimits()).ok());
  RequestLimits zero = Small();
  zero.max_tokens = 0;
  EXPECT_THAT(CheckRequestLimits(zero).message(), HasSubstr("--max-tokens-limit: 0 is not in 1.."));
  RequestLimits above_engine = Small();
  above_engine.max_top_logprobs = 21;
  EXPECT_THAT(CheckRequestLimits(above_engine).message(), HasSubstr("--max-top-logprobs: 21 is not in 1..20"));
  RequestLimits stops = Small();
  stops.max_stop_strings = 17;
  EXPECT_THAT(CheckRequestLimits(stops).message(), HasSubstr("--max-stop-strings: 17 is not in 1..16"));
}

}  // namespace
}  // namespace strata::services
