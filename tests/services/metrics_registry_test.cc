#include "services/metrics_registry.h"

#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/services/metrics_test_util.h"

namespace strata::services {
namespace {

using ::strata::services::testing::ParsePrometheusText;
using ::testing::HasSubstr;

TEST(MetricsRegistryTest, RendersEachKindInTheTextFormat) {
  MetricsRegistry registry;
  registry.AddCounter("strata_requests_total", "Requests", {"api", "status"}).WithLabels({"http", "ok"}).Increment(3);
  registry.AddGauge("strata_queue_depth", "Waiting").Get().Set(7);
  Histogram& latency = registry.AddHistogram("strata_latency_seconds", "Latency", {0.1, 1}).Get();
  latency.Observe(0.05);
  latency.Observe(0.5);
  latency.Observe(5);

  const std::string text = registry.Render();
  EXPECT_THAT(text, HasSubstr("# HELP strata_requests_total Requests\n# TYPE strata_requests_total counter\n"));
  EXPECT_THAT(text, HasSubstr("strata_requests_total{api=\"http\",status=\"ok\"} 3\n"));
  EXPECT_THAT(text, HasSubstr("# TYPE strata_queue_depth gauge\nstrata_queue_depth 7\n"));
  EXPECT_THAT(text, HasSubstr("strata_latency_seconds_bucket{le=\"0.10000000000000001\"} 1\n"
                              "strata_latency_seconds_bucket{le=\"1\"} 2\n"
                              "strata_latency_seconds_bucket{le=\"+Inf\"} 3\n"
                              "strata_latency_seconds_sum 5.5499999999999998\n"
                              "strata_latency_seconds_count 3\n"));
  auto parsed = ParsePrometheusText(text);
  ASSERT_TRUE(parsed.ok()) << parsed.status() << "\n" << text;
  EXPECT_EQ(parsed->types.at("strata_latency_seconds"), "histogram");
  EXPECT_EQ(parsed->ValueOr0("strata_latency_seconds_bucket{le=\"1\"}"), 2);
}

TEST(MetricsRegistryTest, LabelValuesAreEscaped) {
  MetricsRegistry registry;
  registry.AddCounter("strata_odd_total", "Odd \\ help\nsecond line", {"path"}).WithLabels({"a\"b\\c\nd"}).Increment();
  const std::string text = registry.Render();
  EXPECT_THAT(text, HasSubstr("# HELP strata_odd_total Odd \\\\ help\\nsecond line\n"));
  EXPECT_THAT(text, HasSubstr("strata_odd_total{path=\"a\\\"b\\\\c\\nd\"} 1\n"));
  EXPECT_TRUE(ParsePrometheusText(text).ok()) << text;
}

TEST(MetricsRegistryTest, FunctionSeriesAreReadAtRenderAndLeftOutWhenUnknown) {
  MetricsRegistry registry;
  std::optional<double> value;
  registry.AddGaugeFunction("strata_loaded", "Loaded", [&] { return value; });
  EXPECT_THAT(registry.Render(), ::testing::Not(HasSubstr("\nstrata_loaded ")));
  value = 1;
  EXPECT_THAT(registry.Render(), HasSubstr("strata_loaded 1\n"));
  value = 0.25;
  EXPECT_THAT(registry.Render(), HasSubstr("strata_loaded 0.25\n"));
}

TEST(MetricsRegistryTest, CountersNeverGoDownAndGaugesDo) {
  MetricsRegistry registry;
  Counter& counter = registry.AddCounter("strata_c_total", "c").Get();
  counter.Increment(2);
  counter.Increment(-5);
  EXPECT_EQ(counter.value(), 2);
  Gauge& gauge = registry.AddGauge("strata_g", "g").Get();
  gauge.Add(3);
  gauge.Add(-5);
  EXPECT_EQ(gauge.value(), -2);
}

TEST(MetricsRegistryTest, AddingAFamilyTwiceReturnsTheFirst) {
  MetricsRegistry registry;
  registry.AddCounter("strata_x_total", "x").Get().Increment();
  registry.AddCounter("strata_x_total", "x again").Get().Increment();
  const std::string text = registry.Render();
  EXPECT_THAT(text, HasSubstr("strata_x_total 2\n"));
  EXPECT_TRUE(ParsePrometheusText(text).ok()) << text;  // one HELP, one TYPE
}

TEST(MetricsRegistryTest, ConcurrentUpdatesAreAllCounted) {
  MetricsRegistry registry;
  auto& counters = registry.AddCounter("strata_hits_total", "hits", {"thread"});
  Histogram& histogram = registry.AddHistogram("strata_h_seconds", "h", ExponentialBuckets(0.001, 10, 4)).Get();
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 10000; ++i) {
        counters.WithLabels({std::to_string(t % 2)}).Increment();
        histogram.Observe(0.01);
        if (i % 1000 == 0) (void)registry.Render();
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  auto parsed = ParsePrometheusText(registry.Render());
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->ValueOr0("strata_hits_total{thread=\"0\"}"), 20000);
  EXPECT_EQ(parsed->ValueOr0("strata_hits_total{thread=\"1\"}"), 20000);
  EXPECT_EQ(parsed->ValueOr0("strata_h_seconds_count"), 40000);
  EXPECT_NEAR(parsed->ValueOr0("strata_h_seconds_sum"), 400, 1e-6);
}

TEST(MetricsRegistryTest, StatusLabelIsTheCodeInLowerCase) {
  EXPECT_EQ(StatusLabel(absl::StatusCode::kOk), "ok");
  EXPECT_EQ(StatusLabel(absl::StatusCode::kResourceExhausted), "resource_exhausted");
}

TEST(PrometheusTextParserTest, RefusesMalformedPages) {
  using strata::services::testing::ParsePrometheusText;
  EXPECT_FALSE(ParsePrometheusText("strata_x 1\n").ok());                                              // no HELP/TYPE
  EXPECT_FALSE(ParsePrometheusText("# HELP strata_x x\n# TYPE strata_x counter\nstrata_x 1\n").ok());  // not _total
  EXPECT_FALSE(ParsePrometheusText("# HELP strata_x x\n# TYPE strata_x gauge\nstrata_x one\n").ok());
  EXPECT_FALSE(ParsePrometheusText("# HELP h h\n# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 1\n"
                                   "h_sum 1\nh_count 1\n")
                   .ok());
}

}  // namespace
}  // namespace strata::services
