#include "services/progress_printer.h"

#include <sstream>

#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace strata::services {
namespace {

using ::testing::HasSubstr;

packtool::ConvertProgress Experts(uint64_t done, uint64_t total) {
  packtool::ConvertProgress p;
  p.phase = "experts";
  p.bytes_done = done;
  p.bytes_total = total;
  p.experts_done = done / 1000;
  p.experts_total = total / 1000;
  p.bytes_per_second = 2.5e9;
  return p;
}

// A clock the test moves by hand.
struct FakeClock {
  absl::Time now = absl::FromUnixSeconds(1000);
  ProgressPrinter::Clock Fn() {
    return [this] { return now; };
  }
};

TEST(FormatBytesTest, PicksAReadableUnit) {
  EXPECT_EQ(FormatBytes(812), "812 B");
  EXPECT_EQ(FormatBytes(12345), "12.3 KB");
  EXPECT_EQ(FormatBytes(4.56e6), "4.56 MB");
  EXPECT_EQ(FormatBytes(1.234e9), "1.23 GB");
}

TEST(ProgressPrinterTest, PlainModePrintsPhasesAndEveryFivePercent) {
  std::ostringstream out;
  FakeClock clock;
  ProgressPrinter printer(&out, /*terminal=*/false, clock.Fn());
  packtool::ConvertProgress dense;
  dense.phase = "dense";
  printer.Update(dense);
  for (uint64_t done = 0; done <= 1000000; done += 1000) printer.Update(Experts(done, 1000000));
  printer.Finish();
  const std::vector<std::string> lines = absl::StrSplit(out.str(), '\n', absl::SkipEmpty());
  // dense, then 0%, 5%, ..., 100%: 1 + 21 lines, never a carriage return.
  EXPECT_EQ(lines.size(), 22u) << out.str();
  EXPECT_THAT(lines[0], HasSubstr("dense"));
  EXPECT_THAT(lines.back(), HasSubstr("100%"));
  EXPECT_THAT(lines.back(), HasSubstr("1000 of 1000 experts"));
  EXPECT_EQ(out.str().find('\r'), std::string::npos);
}

TEST(ProgressPrinterTest, PlainModeRepeatsAfterTenSecondsWithoutProgress) {
  std::ostringstream out;
  FakeClock clock;
  ProgressPrinter printer(&out, false, clock.Fn());
  printer.Update(Experts(1, 1000000));
  printer.Update(Experts(2, 1000000));  // same 5% step, same time: nothing
  clock.now += absl::Seconds(11);
  printer.Update(Experts(3, 1000000));
  const std::vector<std::string> lines = absl::StrSplit(out.str(), '\n', absl::SkipEmpty());
  EXPECT_EQ(lines.size(), 2u) << out.str();
}

TEST(ProgressPrinterTest, TerminalModeRedrawsAtMostTenTimesASecond) {
  std::ostringstream out;
  FakeClock clock;
  ProgressPrinter printer(&out, /*terminal=*/true, clock.Fn());
  for (int i = 0; i < 100; ++i) {
    printer.Update(Experts(i * 1000, 1000000));
    clock.now += absl::Milliseconds(5);  // 100 updates in 0.5 s
  }
  printer.Finish();
  const std::string text = out.str();
  const auto redraws = std::count(text.begin(), text.end(), '\r');
  EXPECT_GE(redraws, 4);
  EXPECT_LE(redraws, 6);
  EXPECT_EQ(text.back(), '\n');
  EXPECT_THAT(text, HasSubstr("GB/s"));
  EXPECT_THAT(text, HasSubstr("["));
}

TEST(ProgressPrinterTest, EtaFollowsTheMeasuredRate) {
  std::ostringstream out;
  FakeClock clock;
  ProgressPrinter printer(&out, false, clock.Fn());
  printer.Update(Experts(0, 1000000));
  clock.now += absl::Seconds(1);
  printer.Update(Experts(100000, 1000000));  // 10% a second: 9 s left
  EXPECT_THAT(out.str(), HasSubstr("ETA 0:09"));
  EXPECT_THAT(out.str(), HasSubstr("2.50 GB/s"));
}

}  // namespace
}  // namespace strata::services
