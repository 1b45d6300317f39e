// strata.v1.Inference behind its CallGate and RequestLimits: tokens, per-client limits, field limits, the
// request log line and the cancellation that ends a drain. In-process server, tiny pack.

#include <algorithm>
#include <chrono>
#include <fstream>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>

#include "gmock/gmock.h"
#include "grpcpp/client_context.h"
#include "gtest/gtest.h"
#include "services/call_gate.h"
#include "services/inference_service.h"
#include "spdlog/sinks/base_sink.h"
#include "spdlog/spdlog.h"
#include "tests/services/inference_test_util.h"
#include "tests/testing/test_util.h"
#include "tests/testing/wait.h"

namespace strata::services {
namespace {

using ::strata::services::testing::HealthStatus;
using ::strata::services::testing::InferenceTestServer;
using ::strata::services::testing::TinyEngineOptions;
using ::testing::HasSubstr;

constexpr char kToken[] = "access-test-token-0123";

v1::GenerateRequest Greedy(int max_tokens) {
  v1::GenerateRequest r;
  r.mutable_tokens()->add_ids(1);
  r.mutable_tokens()->add_ids(2);
  r.mutable_sampling()->set_temperature(0);
  r.mutable_sampling()->set_ignore_eos(true);
  if (max_tokens > 0) r.mutable_sampling()->set_max_tokens(max_tokens);
  return r;
}

struct Outcome {
  grpc::Status status;
  int tokens = 0;
};

Outcome Generate(v1::Inference::Stub& stub, const v1::GenerateRequest& request, const std::string& token = "",
                 const std::string& request_id = "") {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  if (!token.empty()) context.AddMetadata("authorization", "Bearer " + token);
  if (!request_id.empty()) context.AddMetadata("x-request-id", request_id);
  auto reader = stub.Generate(&context, request);
  Outcome out;
  v1::GenerateResponse message;
  while (reader->Read(&message)) out.tokens += message.tokens_size();
  out.status = reader->Finish();
  return out;
}

TEST(InferenceAccessTest, TokensGuardEveryMethodButHealth) {
  strata::testing::ScratchDir dir;
  std::ofstream(dir.Join("tokens")) << kToken << "\n";
  auto tokens = AuthTokens::Load(dir.Join("tokens"));
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  CallGate gate({.tokens = tokens->get()});
  InferenceTestServer server(TinyEngineOptions(), true, {.gate = &gate});

  const Outcome anonymous = Generate(server.stub(), Greedy(3));
  EXPECT_EQ(anonymous.status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(anonymous.tokens, 0);
  const Outcome wrong = Generate(server.stub(), Greedy(3), "wrong-token-0123456789");
  EXPECT_EQ(wrong.status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  const Outcome allowed = Generate(server.stub(), Greedy(3), kToken);
  EXPECT_TRUE(allowed.status.ok()) << allowed.status.error_message();
  EXPECT_EQ(allowed.tokens, 3);

  grpc::ClientContext info_context;
  v1::ModelInfo info;
  EXPECT_EQ(server.stub().GetModelInfo(&info_context, v1::GetModelInfoRequest(), &info).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  grpc::ClientContext tokenize_context;
  v1::TokenizeRequest tokenize;
  tokenize.set_text("hello");
  v1::TokenizeResponse tokenized;
  EXPECT_EQ(server.stub().Tokenize(&tokenize_context, tokenize, &tokenized).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(HealthStatus(server.channel(), ""), 1);  // probes need no token
  // The accepted call leaves the gate when its handler returns, which may be just after the client saw its
  // last message.
  EXPECT_TRUE(strata::testing::WaitUntil([&] { return gate.in_flight() == 0; }));
}

TEST(InferenceAccessTest, FieldLimitsRefuseBeforeTheEngineAndCapTheDefault) {
  InferenceTestServer server(TinyEngineOptions(), true, {.limits = {.max_tokens = 4}});
  const Outcome over = Generate(server.stub(), Greedy(5));
  EXPECT_EQ(over.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(over.status.error_message(), HasSubstr("sampling.max_tokens: 5 tokens exceed the limit of 4"));
  EXPECT_EQ(server.engine().stats().prompt_tokens, 0u);  // the engine never saw it
  const Outcome unset = Generate(server.stub(), Greedy(0));  // the default 256 is capped at the limit
  EXPECT_TRUE(unset.status.ok()) << unset.status.error_message();
  EXPECT_EQ(unset.tokens, 4);
}

TEST(InferenceAccessTest, PerClientLimitRefusesASecondStream) {
  CallGate gate({.max_calls_per_client = 1});
  InferenceTestServer server(TinyEngineOptions(/*max_seqs=*/2, /*slow=*/true), true, {.gate = &gate});
  grpc::ClientContext long_context;
  auto long_stream = server.stub().Generate(&long_context, Greedy(200));
  v1::GenerateResponse first;
  ASSERT_TRUE(long_stream->Read(&first));  // admitted and running

  const Outcome second = Generate(server.stub(), Greedy(2));
  EXPECT_EQ(second.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(second.status.error_message(), HasSubstr("--max-calls-per-client"));

  long_context.TryCancel();
  v1::GenerateResponse ignored;
  while (long_stream->Read(&ignored)) {
  }
  long_stream->Finish();
  ASSERT_TRUE(strata::testing::WaitUntil([&] { return gate.in_flight() == 0; }));
  EXPECT_TRUE(Generate(server.stub(), Greedy(2)).status.ok());
}

TEST(InferenceAccessTest, CancelGenerationsEndsRunningStreamsWithTheReason) {
  InferenceTestServer server(TinyEngineOptions(/*max_seqs=*/2, /*slow=*/true));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  auto stream = server.stub().Generate(&context, Greedy(250));
  v1::GenerateResponse message;
  ASSERT_TRUE(stream->Read(&message));
  int tokens = message.tokens_size();
  ASSERT_TRUE(strata::testing::WaitUntil([&] { return server.service().active_generations() == 1; }));
  EXPECT_EQ(server.service().CancelGenerations("drain time over"), 1);
  while (stream->Read(&message)) tokens += message.tokens_size();
  const grpc::Status status = stream->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(status.error_message(), HasSubstr("drain time over (after "));
  EXPECT_LT(tokens, 250);
  EXPECT_TRUE(server.WaitUntilIdle());
}

// A sink keeping what it is given; read under the sink's own lock.
class StringSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  std::string Text() {
    std::lock_guard<std::mutex> lock(mutex_);
    return text_;
  }

 protected:
  void sink_it_(const spdlog::details::log_msg& message) override {
    text_.append(message.payload.data(), message.payload.size());
    text_ += '\n';
  }
  void flush_() override {}

 private:
  std::string text_;
};

// Collects what the default logger writes while it lives.
class CapturedLog {
 public:
  CapturedLog() : sink_(std::make_shared<StringSink>()) { spdlog::default_logger()->sinks().push_back(sink_); }
  ~CapturedLog() {
    auto& sinks = spdlog::default_logger()->sinks();
    sinks.erase(std::remove(sinks.begin(), sinks.end(), sink_), sinks.end());
  }
  std::string Text() { return sink_->Text(); }

 private:
  std::shared_ptr<StringSink> sink_;
};

// The log line of the request whose id is `id`, or empty.
std::string LineOf(const std::string& log, const std::string& id) {
  std::istringstream lines(log);
  for (std::string line; std::getline(lines, line);) {
    if (line.find("request id=" + id + " ") != std::string::npos) return line;
  }
  return "";
}

TEST(InferenceAccessTest, EachGenerateLogsOneLineWhenItEnds) {
  InferenceTestServer server(TinyEngineOptions());
  CapturedLog log;
  ASSERT_TRUE(Generate(server.stub(), Greedy(4), "", "test-ok").status.ok());
  ASSERT_TRUE(strata::testing::WaitUntil([&] { return !LineOf(log.Text(), "test-ok").empty(); }));
  const std::string ok = LineOf(log.Text(), "test-ok");
  EXPECT_THAT(ok, HasSubstr(" method=Generate peer="));
  EXPECT_THAT(ok, HasSubstr(" prompt_tokens=2 completion_tokens=4 ttft_s="));
  EXPECT_THAT(ok, HasSubstr(" finish=length status=OK"));
  EXPECT_THAT(ok, Not(HasSubstr("ttft_s=-")));

  v1::GenerateRequest bad = Greedy(4);
  bad.mutable_sampling()->set_temperature(-1);
  EXPECT_EQ(Generate(server.stub(), bad, "", "test-bad").status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  ASSERT_TRUE(strata::testing::WaitUntil([&] { return !LineOf(log.Text(), "test-bad").empty(); }));
  const std::string refused = LineOf(log.Text(), "test-bad");
  EXPECT_THAT(refused, HasSubstr(" completion_tokens=0 ttft_s=- "));
  EXPECT_THAT(refused, HasSubstr(" finish=- status=INVALID_ARGUMENT message=\"temperature"));
  EXPECT_EQ(log.Text().find("request id=test-ok ", log.Text().find("request id=test-ok ") + 1), std::string::npos)
      << "one line per request";
}

}  // namespace
}  // namespace strata::services
