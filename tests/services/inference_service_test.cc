#include "services/inference_service.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "grpcpp/client_context.h"
#include "gtest/gtest.h"
#include "services/inference_protos.h"
#include "tests/services/inference_test_util.h"

namespace strata::services {
namespace {

using ::strata::services::testing::HealthStatus;
using ::strata::services::testing::InferenceTestServer;
using ::strata::services::testing::TinyEngineOptions;
using ::testing::HasSubstr;

constexpr int kServing = 1;
constexpr int kNotServing = 2;

// Every message of a Generate call, what they add up to, and the status.
struct Streamed {
  std::vector<v1::GenerateResponse> messages;
  std::vector<int32_t> tokens;
  std::string text;
  grpc::Status status;
};

Streamed RunGenerate(v1::Inference::Stub& stub, const v1::GenerateRequest& request,
                     std::chrono::milliseconds deadline = std::chrono::seconds(60)) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + deadline);
  Streamed out;
  auto reader = stub.Generate(&context, request);
  v1::GenerateResponse message;
  while (reader->Read(&message)) {
    out.tokens.insert(out.tokens.end(), message.tokens().begin(), message.tokens().end());
    out.text += message.text();
    out.messages.push_back(message);
  }
  out.status = reader->Finish();
  return out;
}

v1::GenerateRequest Greedy(int max_tokens) {
  v1::GenerateRequest r;
  r.mutable_sampling()->set_temperature(0);
  r.mutable_sampling()->set_max_tokens(max_tokens);
  r.mutable_sampling()->set_ignore_eos(true);
  return r;
}

v1::GenerateRequest GreedyText(const std::string& text, int max_tokens) {
  v1::GenerateRequest r = Greedy(max_tokens);
  r.set_text(text);
  return r;
}

v1::GenerateRequest GreedyTokens(const std::vector<int32_t>& prompt, int max_tokens) {
  v1::GenerateRequest r = Greedy(max_tokens);
  r.mutable_tokens()->mutable_ids()->Add(prompt.begin(), prompt.end());
  return r;
}

TEST(InferenceServiceTest, StreamedGenerationEqualsTheEnginesDirectOutput) {
  InferenceTestServer server(TinyEngineOptions());
  const v1::GenerateRequest request = GreedyText("The quick brown fox jumps", 24);
  const Streamed streamed = RunGenerate(server.stub(), request);
  ASSERT_TRUE(streamed.status.ok()) << streamed.status.error_message();
  auto direct = server.engine().Generate(GenerateRequestFromProto(request));
  ASSERT_TRUE(direct.ok()) << direct.status();
  EXPECT_EQ(streamed.tokens, direct->result.tokens);
  EXPECT_EQ(streamed.text, direct->text);
  EXPECT_EQ(streamed.tokens.size(), 24u);

  // Only the last message ends the stream, with the usage.
  ASSERT_FALSE(streamed.messages.empty());
  for (size_t i = 0; i + 1 < streamed.messages.size(); ++i) {
    EXPECT_EQ(streamed.messages[i].finish_reason(), v1::FINISH_REASON_UNSPECIFIED) << "message " << i;
    EXPECT_FALSE(streamed.messages[i].has_usage());
  }
  const v1::GenerateResponse& last = streamed.messages.back();
  EXPECT_EQ(last.finish_reason(), v1::FINISH_REASON_LENGTH);
  EXPECT_EQ(last.usage().completion_tokens(), 24);
  EXPECT_EQ(last.usage().prompt_tokens(), direct->result.usage.prompt_tokens);
  EXPECT_GT(last.usage().time_to_first_token(), 0);
  EXPECT_GT(last.usage().decode_tokens_per_second(), 0);
  EXPECT_GT(last.usage().expert_bytes(), 0u);
}

TEST(InferenceServiceTest, LogprobsComeWithEveryToken) {
  InferenceTestServer server(TinyEngineOptions());
  v1::GenerateRequest request = GreedyTokens({10, 20, 30}, 6);
  request.mutable_sampling()->set_logprobs(true);
  request.mutable_sampling()->set_top_logprobs(3);
  const Streamed streamed = RunGenerate(server.stub(), request);
  ASSERT_TRUE(streamed.status.ok()) << streamed.status.error_message();
  std::vector<v1::TokenLogprob> logprobs;
  for (const auto& m : streamed.messages) {
    EXPECT_EQ(m.logprobs_size(), m.tokens_size());
    logprobs.insert(logprobs.end(), m.logprobs().begin(), m.logprobs().end());
  }
  ASSERT_EQ(logprobs.size(), streamed.tokens.size());
  for (size_t i = 0; i < logprobs.size(); ++i) {
    EXPECT_EQ(logprobs[i].token(), streamed.tokens[i]);
    EXPECT_LE(logprobs[i].logprob(), 0);
    ASSERT_EQ(logprobs[i].top_size(), 3);
    // Greedy: the chosen token is the most likely one, first among the alternatives.
    EXPECT_EQ(logprobs[i].top(0).token(), streamed.tokens[i]);
    EXPECT_FLOAT_EQ(logprobs[i].top(0).logprob(), logprobs[i].logprob());
    EXPECT_GE(logprobs[i].top(0).logprob(), logprobs[i].top(1).logprob());
    EXPECT_GE(logprobs[i].top(1).logprob(), logprobs[i].top(2).logprob());
  }
}

TEST(InferenceServiceTest, CancellingMidStreamFreesTheSequence) {
  InferenceTestServer server(TinyEngineOptions(/*max_seqs=*/4, /*slow=*/true));
  for (int i = 0; i < 50; ++i) {
    grpc::ClientContext context;
    auto reader = server.stub().Generate(&context, GreedyTokens({1, 2, 3, i + 4}, 200));
    v1::GenerateResponse message;
    ASSERT_TRUE(reader->Read(&message)) << "request " << i;
    EXPECT_GT(message.tokens_size(), 0);
    context.TryCancel();
    while (reader->Read(&message)) {
    }
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED) << "request " << i;
  }
  EXPECT_TRUE(server.WaitUntilIdle());
  EXPECT_EQ(server.engine().stats().kv_bytes_in_use, 0u);
  EXPECT_EQ(server.engine().stats().active, 0);
  EXPECT_LT(server.engine().stats().tokens_generated, 50u * 200u / 2);
  // A following request still runs to its end.
  const Streamed next = RunGenerate(server.stub(), GreedyTokens({5, 6}, 5));
  ASSERT_TRUE(next.status.ok()) << next.status.error_message();
  EXPECT_EQ(next.tokens.size(), 5u);
}

TEST(InferenceServiceTest, DeadlineExceededStopsTheSequence) {
  InferenceTestServer server(TinyEngineOptions(/*max_seqs=*/4, /*slow=*/true));
  const Streamed streamed =
      RunGenerate(server.stub(), GreedyTokens({7, 8, 9}, 250), std::chrono::milliseconds(200));
  EXPECT_EQ(streamed.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_LT(streamed.tokens.size(), 250u);
  EXPECT_TRUE(server.WaitUntilIdle());
  // The engine stopped the sequence rather than generating all 250 tokens for nobody.
  EXPECT_LT(server.engine().stats().tokens_generated, 250u);
  const Streamed next = RunGenerate(server.stub(), GreedyTokens({5, 6}, 3));
  ASSERT_TRUE(next.status.ok()) << next.status.error_message();
  EXPECT_EQ(next.tokens.size(), 3u);
}

TEST(InferenceServiceTest, ConcurrentStreamsGiveTheSameTokensAsSequentialOnes) {
  InferenceTestServer server(TinyEngineOptions(/*max_seqs=*/8));
  std::vector<v1::GenerateRequest> requests;
  for (int i = 0; i < 8; ++i) requests.push_back(GreedyTokens({i * 31 + 1, i * 7 + 2, 100 - i}, 12));
  std::vector<Streamed> sequential;
  for (const auto& r : requests) sequential.push_back(RunGenerate(server.stub(), r));
  std::vector<Streamed> concurrent(requests.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < requests.size(); ++i) {
    threads.emplace_back([&, i] { concurrent[i] = RunGenerate(server.stub(), requests[i]); });
  }
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < requests.size(); ++i) {
    ASSERT_TRUE(sequential[i].status.ok()) << sequential[i].status.error_message();
    ASSERT_TRUE(concurrent[i].status.ok()) << concurrent[i].status.error_message();
    EXPECT_EQ(concurrent[i].tokens.size(), 12u);
    EXPECT_EQ(concurrent[i].tokens, sequential[i].tokens) << "stream " << i;
    EXPECT_EQ(concurrent[i].text, sequential[i].text) << "stream " << i;
  }
}

TEST(InferenceServiceTest, FullQueueIsResourceExhausted) {
  runtime::EngineOptions options = TinyEngineOptions(/*max_seqs=*/1, /*slow=*/true);
  options.max_queue = 1;
  InferenceTestServer server(options);
  constexpr int kStreams = 6;
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  for (int i = 0; i < kStreams; ++i) {
    contexts.push_back(std::make_unique<grpc::ClientContext>());
    contexts.back()->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  }
  absl::Mutex mu;
  std::vector<grpc::Status> statuses;
  std::atomic<int> exhausted{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kStreams; ++i) {
    threads.emplace_back([&, i] {
      auto reader = server.stub().Generate(contexts[i].get(), GreedyTokens({1, 2, i + 3}, 200));
      v1::GenerateResponse message;
      while (reader->Read(&message)) {
      }
      const grpc::Status status = reader->Finish();
      if (status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) ++exhausted;
      absl::MutexLock lock(&mu);
      statuses.push_back(status);
    });
  }
  const absl::Time end = absl::Now() + absl::Seconds(30);
  while (exhausted.load() == 0 && absl::Now() < end) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  for (auto& context : contexts) context->TryCancel();
  for (auto& t : threads) t.join();
  EXPECT_GE(exhausted.load(), 1);
  EXPECT_LE(exhausted.load(), kStreams - 2);  // one runs and one waits
  for (const grpc::Status& s : statuses) {
    EXPECT_THAT(s.error_code(), ::testing::AnyOf(grpc::StatusCode::RESOURCE_EXHAUSTED, grpc::StatusCode::CANCELLED))
        << s.error_message();
    if (s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
      EXPECT_THAT(s.error_message(), HasSubstr("queue"));
    }
  }
  EXPECT_TRUE(server.WaitUntilIdle());
}

TEST(InferenceServiceTest, BadParametersAreInvalidArgumentNamingTheField) {
  InferenceTestServer server(TinyEngineOptions());
  struct Case {
    std::string field;
    v1::GenerateRequest request;
  };
  std::vector<Case> cases;
  cases.push_back({"temperature", GreedyText("hi", 4)});
  cases.back().request.mutable_sampling()->set_temperature(-0.5f);
  cases.push_back({"top_p", GreedyText("hi", 4)});
  cases.back().request.mutable_sampling()->set_top_p(1.5f);
  cases.push_back({"max_tokens", GreedyText("hi", 4)});
  cases.back().request.mutable_sampling()->set_max_tokens(0);
  cases.push_back({"top_logprobs", GreedyText("hi", 4)});
  cases.back().request.mutable_sampling()->set_logprobs(true);
  cases.back().request.mutable_sampling()->set_top_logprobs(21);
  cases.push_back({"stop_token_ids", GreedyText("hi", 4)});
  cases.back().request.mutable_sampling()->add_stop_token_ids(1 << 30);
  cases.push_back({"prompt", GreedyText("", 4)});
  cases.push_back({"prompt", Greedy(4)});  // neither text nor tokens
  cases.push_back({"prompt", GreedyTokens({}, 4)});
  cases.push_back({"prompt_tokens[1]", GreedyTokens({1, 1 << 30, 2}, 4)});
  cases.push_back({"prompt_tokens[0]", GreedyTokens({-1}, 4)});
  cases.push_back({"context", GreedyTokens(std::vector<int32_t>(300, 1), 4)});
  for (const Case& c : cases) {
    const Streamed streamed = RunGenerate(server.stub(), c.request);
    EXPECT_EQ(streamed.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.field;
    EXPECT_THAT(streamed.status.error_message(), HasSubstr(c.field));
    EXPECT_TRUE(streamed.messages.empty()) << c.field;
  }
  EXPECT_EQ(server.engine().stats().requests_finished, 0u);
}

// Fails every read of the second MoE layer's experts.
class FailingSource : public pack::ExpertSource {
 public:
  explicit FailingSource(std::unique_ptr<pack::ExpertSource> inner) : inner_(std::move(inner)) {}
  absl::StatusOr<const uint8_t*> Blob(int64_t layer, int64_t expert) override {
    if (layer == 1) return absl::DataLossError("experts.bin: short read (moe layer 1)");
    return inner_->Blob(layer, expert);
  }
  std::string_view kind() const override { return "failing"; }
  uint64_t blob_bytes() const override { return inner_->blob_bytes(); }

 private:
  std::unique_ptr<pack::ExpertSource> inner_;
};

TEST(InferenceServiceTest, AFailedGenerationEndsWithAnErrorReasonAndItsStatus) {
  runtime::EngineOptions options = TinyEngineOptions();
  options.source_factory = [](const pack::Pack& p) -> std::unique_ptr<pack::ExpertSource> {
    return std::make_unique<FailingSource>(*pack::OpenExpertSource(p, {}, nullptr));
  };
  InferenceTestServer server(options);
  const Streamed streamed = RunGenerate(server.stub(), GreedyTokens({1, 2, 3}, 5));
  EXPECT_EQ(streamed.status.error_code(), grpc::StatusCode::DATA_LOSS);
  EXPECT_THAT(streamed.status.error_message(), HasSubstr("moe layer 1"));
  ASSERT_EQ(streamed.messages.size(), 1u);
  EXPECT_EQ(streamed.messages[0].finish_reason(), v1::FINISH_REASON_ERROR);
  EXPECT_TRUE(streamed.tokens.empty());
  EXPECT_TRUE(server.WaitUntilIdle());
}

TEST(InferenceServiceTest, HealthIsNotServingUntilThePackHasLoaded) {
  InferenceTestServer server(TinyEngineOptions(), /*load=*/false);
  EXPECT_EQ(HealthStatus(server.channel(), ""), kNotServing);
  EXPECT_EQ(HealthStatus(server.channel(), "strata.v1.Inference"), kNotServing);
  const Streamed early = RunGenerate(server.stub(), GreedyTokens({1, 2}, 2));
  EXPECT_EQ(early.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(early.status.error_message(), HasSubstr("loading"));
  {
    grpc::ClientContext context;
    v1::ModelInfo info;
    EXPECT_EQ(server.stub().GetModelInfo(&context, v1::GetModelInfoRequest(), &info).error_code(),
              grpc::StatusCode::UNAVAILABLE);
  }
  server.Load();
  EXPECT_EQ(HealthStatus(server.channel(), ""), kServing);
  EXPECT_EQ(HealthStatus(server.channel(), "strata.v1.Inference"), kServing);
  const Streamed later = RunGenerate(server.stub(), GreedyTokens({1, 2}, 2));
  EXPECT_TRUE(later.status.ok()) << later.status.error_message();
  EXPECT_EQ(later.tokens.size(), 2u);
}

TEST(InferenceServiceTest, TokenizeAndDetokenizeRoundTrip) {
  InferenceTestServer server(TinyEngineOptions());
  const std::string text = "Hello, world! Strata streams tokens: 42 \xC3\xA9t\xC3\xA9s.";
  v1::TokenizeRequest request;
  request.set_text(text);
  request.set_add_special(false);
  v1::TokenizeResponse tokens;
  {
    grpc::ClientContext context;
    ASSERT_TRUE(server.stub().Tokenize(&context, request, &tokens).ok());
  }
  EXPECT_EQ(std::vector<int32_t>(tokens.tokens().begin(), tokens.tokens().end()),
            server.engine().Tokenize(text, false, false));
  ASSERT_EQ(tokens.pieces_size(), tokens.tokens_size());
  std::string joined;
  for (const std::string& piece : tokens.pieces()) joined += piece;
  EXPECT_EQ(joined, text);

  v1::DetokenizeRequest back;
  *back.mutable_tokens() = tokens.tokens();
  v1::DetokenizeResponse detokenized;
  {
    grpc::ClientContext context;
    ASSERT_TRUE(server.stub().Detokenize(&context, back, &detokenized).ok());
  }
  EXPECT_EQ(detokenized.text(), text);

  // add_special defaults to true, as for a Generate prompt.
  request.clear_add_special();
  {
    grpc::ClientContext context;
    ASSERT_TRUE(server.stub().Tokenize(&context, request, &tokens).ok());
  }
  EXPECT_EQ(std::vector<int32_t>(tokens.tokens().begin(), tokens.tokens().end()),
            server.engine().Tokenize(text, true, false));

  back.add_tokens(1 << 30);
  grpc::ClientContext context;
  const grpc::Status bad = server.stub().Detokenize(&context, back, &detokenized);
  EXPECT_EQ(bad.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(bad.error_message(), HasSubstr("tokens[" + std::to_string(back.tokens_size() - 1) + "]"));
}

TEST(InferenceServiceTest, ModelInfoAndStatsDescribeTheEngine) {
  InferenceTestServer server(TinyEngineOptions());
  v1::ModelInfo info;
  {
    grpc::ClientContext context;
    ASSERT_TRUE(server.stub().GetModelInfo(&context, v1::GetModelInfoRequest(), &info).ok());
  }
  const runtime::EngineInfo& e = server.engine().info();
  EXPECT_EQ(info.architecture(), "qwen3moe");
  EXPECT_EQ(info.n_layer(), 2);
  EXPECT_EQ(info.n_expert(), 8);
  EXPECT_EQ(info.n_expert_used(), 2);
  EXPECT_EQ(info.n_embd(), 128);
  EXPECT_EQ(info.expert_ff(), 128);
  EXPECT_EQ(info.vocab_size(), server.engine().tokenizer().n_vocab());
  EXPECT_GT(info.vocab_size(), 0);
  EXPECT_EQ(info.context(), 256);
  EXPECT_EQ(info.train_context(), 2048);
  EXPECT_EQ(info.scheme(), "s4");
  EXPECT_EQ(info.expert_source(), "arena");
  EXPECT_EQ(info.experts_bytes(), e.experts_bytes);
  EXPECT_GT(info.experts_bytes(), 0u);
  EXPECT_EQ(info.threads(), 1);
  EXPECT_GT(info.load_seconds(), 0);
  EXPECT_EQ(info.expert_bytes_per_token(), e.expert_bytes_per_token);
  // No windowed block: 2 layers x 256 positions x (64 key + 64 value floats) x 4 bytes.
  EXPECT_EQ(info.kv_bytes_per_sequence(), 262144u);
  EXPECT_EQ(info.kv_bytes_per_sequence(), e.kv_bytes_per_sequence);
  EXPECT_TRUE(info.has_chat_template());

  ASSERT_TRUE(RunGenerate(server.stub(), GreedyTokens({3, 4}, 7)).status.ok());
  // The engine counts a request as finished just after its last callback.
  ASSERT_TRUE(server.WaitUntilIdle());
  v1::EngineStats stats;
  grpc::ClientContext context;
  ASSERT_TRUE(server.stub().GetStats(&context, v1::GetStatsRequest(), &stats).ok());
  EXPECT_EQ(stats.requests_finished(), 1u);
  EXPECT_EQ(stats.tokens_generated(), server.engine().stats().tokens_generated);
  EXPECT_GE(stats.tokens_generated(), 6u);
  EXPECT_EQ(stats.prompt_tokens(), 2u);
  EXPECT_EQ(stats.active(), 0);
  EXPECT_EQ(stats.kv_bytes_in_use(), 0u);
}

Streamed RunChat(v1::Inference::Stub& stub, const v1::ChatRequest& request) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  Streamed out;
  auto reader = stub.Chat(&context, request);
  v1::GenerateResponse message;
  while (reader->Read(&message)) {
    out.tokens.insert(out.tokens.end(), message.tokens().begin(), message.tokens().end());
    out.text += message.text();
    out.messages.push_back(message);
  }
  out.status = reader->Finish();
  return out;
}

v1::ChatRequest GreedyChat(int max_tokens) {
  v1::ChatRequest r;
  r.mutable_sampling()->set_temperature(0);
  r.mutable_sampling()->set_max_tokens(max_tokens);
  r.mutable_sampling()->set_ignore_eos(true);
  return r;
}

// The tiny pack carries the built-in vocabulary's ChatML template: Chat must stream what Generate streams
// for the rendered conversation, with its control tokens parsed as special tokens.
TEST(InferenceServiceTest, ChatStreamsWhatGenerateGivesForTheRenderedConversation) {
  InferenceTestServer server(TinyEngineOptions());
  v1::ChatRequest chat = GreedyChat(12);
  chat.set_system_prompt("Be brief.");
  v1::ChatMessage* m = chat.add_messages();
  m->set_role("user");
  m->set_content("Hello there");
  m = chat.add_messages();
  m->set_role("assistant");
  m->set_content("Hi");
  m = chat.add_messages();
  m->set_role("user");
  m->set_content("Tell me more");
  const Streamed streamed = RunChat(server.stub(), chat);
  ASSERT_TRUE(streamed.status.ok()) << streamed.status.error_message();
  EXPECT_EQ(streamed.tokens.size(), 12u);

  v1::GenerateRequest generate = GreedyText(
      "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHello there<|im_end|>\n"
      "<|im_start|>assistant\nHi<|im_end|>\n<|im_start|>user\nTell me more<|im_end|>\n<|im_start|>assistant\n",
      12);
  generate.set_parse_special(true);
  const Streamed raw = RunGenerate(server.stub(), generate);
  ASSERT_TRUE(raw.status.ok()) << raw.status.error_message();
  EXPECT_EQ(streamed.tokens, raw.tokens);
  EXPECT_EQ(streamed.text, raw.text);
  const v1::Usage& usage = streamed.messages.back().usage();
  EXPECT_EQ(usage.prompt_tokens(), raw.messages.back().usage().prompt_tokens());
  // Five turns' control tokens, each one token: the prompt is far shorter than its text spelt out.
  const std::vector<int32_t> spelt = server.engine().Tokenize(generate.text(), true, false);
  EXPECT_LT(usage.prompt_tokens(), static_cast<int64_t>(spelt.size()));
  EXPECT_EQ(streamed.messages.back().finish_reason(), v1::FINISH_REASON_LENGTH);
}

TEST(InferenceServiceTest, BadConversationsAreInvalidArgumentNamingTheMessage) {
  InferenceTestServer server(TinyEngineOptions());
  v1::ChatRequest empty = GreedyChat(4);
  Streamed s = RunChat(server.stub(), empty);
  EXPECT_EQ(s.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.status.error_message(), HasSubstr("messages"));
  EXPECT_TRUE(s.messages.empty());

  v1::ChatRequest bad_role = GreedyChat(4);
  bad_role.add_messages()->set_role("user");
  bad_role.add_messages()->set_role("narrator");
  s = RunChat(server.stub(), bad_role);
  EXPECT_EQ(s.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.status.error_message(), HasSubstr("messages[1].role: 'narrator'"));

  v1::ChatRequest two_systems = GreedyChat(4);
  two_systems.set_system_prompt("a");
  two_systems.add_messages()->set_role("system");
  two_systems.add_messages()->set_role("user");
  s = RunChat(server.stub(), two_systems);
  EXPECT_EQ(s.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.status.error_message(), HasSubstr("system_prompt"));

  v1::ChatRequest hot = GreedyChat(4);
  hot.add_messages()->set_role("user");
  hot.mutable_sampling()->set_temperature(-1);
  s = RunChat(server.stub(), hot);
  EXPECT_EQ(s.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.status.error_message(), HasSubstr("temperature"));
  EXPECT_TRUE(server.WaitUntilIdle());
}

TEST(InferenceServiceTest, ChatIsUnavailableUntilThePackHasLoaded) {
  InferenceTestServer server(TinyEngineOptions(), /*load=*/false);
  v1::ChatRequest chat = GreedyChat(4);
  chat.add_messages()->set_role("user");
  const Streamed s = RunChat(server.stub(), chat);
  EXPECT_EQ(s.status.error_code(), grpc::StatusCode::UNAVAILABLE);
}

}  // namespace
}  // namespace strata::services
