#include "services/inference_metrics.h"

#include <memory>
#include <string>

#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/services/inference_test_util.h"
#include "tests/services/metrics_test_util.h"
#include "tests/testing/wait.h"

namespace strata::services {
namespace {

using ::strata::services::testing::ParsePrometheusText;
using ::strata::services::testing::TinyEngineOptions;

testing::ParsedMetrics Parse(const MetricsRegistry& registry) {
  auto parsed = ParsePrometheusText(registry.Render());
  EXPECT_TRUE(parsed.ok()) << parsed.status();
  return parsed.ok() ? *parsed : testing::ParsedMetrics();
}

runtime::GenerateRequest Greedy(int max_tokens) {
  runtime::GenerateRequest request;
  request.prompt = "Once upon a time";
  request.sampling.temperature = 0;
  request.sampling.max_tokens = max_tokens;
  request.sampling.ignore_eos = true;
  return request;
}

TEST(InferenceMetricsTest, ObservedRequestsAreTimedAndCountedByStatus) {
  auto engine = runtime::Engine::Create(TinyEngineOptions());
  ASSERT_TRUE(engine.ok()) << engine.status();
  MetricsRegistry registry;
  InferenceMetrics metrics(&registry, [&] { return engine->get(); });

  absl::Notification done;
  int tokens_seen = 0;
  runtime::GenerateCallbacks callbacks;
  callbacks.on_tokens = [&](const runtime::TokenEvent& event) { tokens_seen += event.tokens.size(); };
  callbacks.on_done = [&](const runtime::GenerationResult&) { done.Notify(); };
  auto handle = (*engine)->Submit(Greedy(6), metrics.Observe("grpc", std::move(callbacks)));
  ASSERT_TRUE(handle.ok()) << handle.status();
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(strata::testing::kHangDeadline));
  EXPECT_EQ(tokens_seen, 6);  // the wrapped callbacks still run

  // on_done comes before the scheduler lets the sequence go.
  ASSERT_TRUE(strata::testing::WaitUntil([&] { return (*engine)->stats().active == 0; }));
  metrics.CountRefused("grpc", absl::ResourceExhaustedError("queue full"));
  const testing::ParsedMetrics parsed = Parse(registry);
  EXPECT_EQ(parsed.ValueOr0("strata_requests_total{api=\"grpc\",status=\"ok\"}"), 1);
  EXPECT_EQ(parsed.ValueOr0("strata_requests_total{api=\"grpc\",status=\"resource_exhausted\"}"), 1);
  EXPECT_EQ(parsed.ValueOr0("strata_generated_tokens_total{api=\"grpc\"}"), 6);
  EXPECT_GT(parsed.ValueOr0("strata_prompt_tokens_total{api=\"grpc\"}"), 0);
  EXPECT_EQ(parsed.ValueOr0("strata_time_to_first_token_seconds_count"), 1);
  EXPECT_EQ(parsed.ValueOr0("strata_inter_token_latency_seconds_count"), 5);
  EXPECT_EQ(parsed.ValueOr0("strata_request_decode_tokens_per_second_count"), 1);
  EXPECT_EQ(parsed.Value("strata_model_loaded"), 1);
  EXPECT_EQ(parsed.Value("strata_active_sequences"), 0);
  EXPECT_EQ(parsed.Value("strata_expert_hit_ratio"), 0);  // no VRAM cache on the CPU
  EXPECT_EQ(parsed.Value("strata_host_miss_share"), 0);    // nor a GPU to share the misses with
  EXPECT_EQ(parsed.Value("strata_host_expert_computations_total"), 0);
  EXPECT_EQ(parsed.Value("strata_guessed_experts_total"), 0);  // no copies ahead without a GPU
  EXPECT_EQ(parsed.Value("strata_prefetched_experts_used_total"), 0);
  EXPECT_GT(parsed.ValueOr0("strata_expert_misses_total") + parsed.ValueOr0("strata_expert_read_bytes_total"), 0);
}

TEST(InferenceMetricsTest, ACancelledRequestCountsAsCancelled) {
  auto engine = runtime::Engine::Create(TinyEngineOptions(8, /*slow=*/true));
  ASSERT_TRUE(engine.ok()) << engine.status();
  MetricsRegistry registry;
  InferenceMetrics metrics(&registry, [&] { return engine->get(); });
  absl::Notification done;
  runtime::GenerateCallbacks callbacks;
  callbacks.on_done = [&](const runtime::GenerationResult&) { done.Notify(); };
  auto handle = (*engine)->Submit(Greedy(200), metrics.Observe("http", std::move(callbacks)));
  ASSERT_TRUE(handle.ok()) << handle.status();
  (*handle)->Cancel();
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(strata::testing::kHangDeadline));
  EXPECT_EQ(Parse(registry).ValueOr0("strata_requests_total{api=\"http\",status=\"cancelled\"}"), 1);
}

TEST(InferenceMetricsTest, EngineSeriesWaitForTheModel) {
  MetricsRegistry registry;
  InferenceMetrics metrics(&registry, [] { return nullptr; });
  const testing::ParsedMetrics parsed = Parse(registry);
  EXPECT_EQ(parsed.Value("strata_model_loaded"), 0);
  EXPECT_FALSE(parsed.Value("strata_queue_depth").has_value());
  EXPECT_FALSE(parsed.Value("strata_model_load_seconds").has_value());
}

}  // namespace
}  // namespace strata::services
