#include "services/count_progress.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace strata::services {
namespace {

using ::testing::ElementsAre;

// A clock the test moves by hand.
struct FakeClock {
  absl::Time now = absl::FromUnixSeconds(1000);
  CountProgress::Clock Fn() {
    return [this] { return now; };
  }
};

TEST(CountProgressTest, AJobDoneWithinTheDelayPrintsNothing) {
  FakeClock clock;
  std::vector<std::string> lines;
  CountProgress p("prefill", CountProgress::Unit::kTokens, [&](const std::string& l) { lines.push_back(l); },
                  absl::Seconds(1), absl::Seconds(2), clock.Fn());
  clock.now += absl::Milliseconds(500);
  p.Update(100, 200);
  clock.now += absl::Milliseconds(400);
  p.Update(200, 200);
  clock.now += absl::Seconds(5);
  p.Update(200, 200);  // after the end: nothing
  EXPECT_TRUE(lines.empty());
}

TEST(CountProgressTest, ALongJobPrintsEveryIntervalAndItsEndWithTheRate) {
  FakeClock clock;
  std::vector<std::string> lines;
  CountProgress p("prefill", CountProgress::Unit::kTokens, [&](const std::string& l) { lines.push_back(l); },
                  absl::Seconds(1), absl::Seconds(2), clock.Fn());
  clock.now += absl::Seconds(2);
  p.Update(1000, 15000);  // past the delay: first line
  clock.now += absl::Seconds(1);
  p.Update(1500, 15000);  // within the interval: none
  clock.now += absl::Seconds(1);
  p.Update(2000, 15000);  // an interval after the first
  clock.now += absl::Milliseconds(100);
  p.Update(15000, 15000);  // the end, whatever the interval
  p.Update(15000, 15000);
  EXPECT_THAT(lines, ElementsAre("prefill: 1000 of 15000 tokens (7%), 500 tokens/s",
                                 "prefill: 2000 of 15000 tokens (13%), 500 tokens/s",
                                 "prefill: 15000 of 15000 tokens (100%), 3659 tokens/s"));
}

TEST(CountProgressTest, BytesAreShownInReadableUnits) {
  FakeClock clock;
  std::vector<std::string> lines;
  CountProgress p("loading experts", CountProgress::Unit::kBytes, [&](const std::string& l) { lines.push_back(l); },
                  absl::ZeroDuration(), absl::Seconds(2), clock.Fn());
  clock.now += absl::Seconds(4);
  p.Update(uint64_t{8} << 30, uint64_t{32} << 30);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0], "loading experts: 8.59 GB of 34.36 GB (25%), 2.15 GB/s");
}

}  // namespace
}  // namespace strata::services
