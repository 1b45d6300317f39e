#include "engine/model/miss_path.h"

#include "gtest/gtest.h"

namespace strata::model {
namespace {

TEST(MissPathTest, EveryNameParsesBackToItselfAndOthersAreRefusedNamingTheChoices) {
  for (MissPath path : {MissPath::kGpu, MissPath::kCpu, MissPath::kBoth}) {
    const absl::StatusOr<MissPath> parsed = ParseMissPath(MissPathName(path));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, path);
  }
  for (const char* bad : {"", "GPU", "host", "both "}) {
    const absl::StatusOr<MissPath> parsed = ParseMissPath(bad);
    ASSERT_FALSE(parsed.ok()) << bad;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(parsed.status().message().find("(gpu, cpu or both)"), std::string::npos) << parsed.status();
  }
}

TEST(MissPathTest, TheHostShareFallsWhenTheGpuWaitsAndRisesWhenItDoesNot) {
  EXPECT_FLOAT_EQ(NextHostShare(0.6f, 48, 48), 0.6f - 0.025f);  // the GPU waited in every layer
  EXPECT_FLOAT_EQ(NextHostShare(0.6f, 48, 0), 0.6f + 0.025f);   // never
  EXPECT_FLOAT_EQ(NextHostShare(0.6f, 48, 24), 0.6f);           // balanced
  EXPECT_FLOAT_EQ(NextHostShare(0.6f, 0, 0), 0.6f);             // no layer gave the host a share
  EXPECT_FLOAT_EQ(NextHostShare(0.99f, 10, 0), 1.0f);           // within [0, 1]
  EXPECT_FLOAT_EQ(NextHostShare(0.01f, 10, 10), 0.0f);
  EXPECT_FLOAT_EQ(NextHostShare(0.5f, 10, 30), 0.475f);         // counts beyond the posts are clamped
  // From any start, steps of a host twice as slow as the GPU's share settle where it waits half the time:
  // a simulated layer waits when the host's share of the work exceeds the GPU's.
  float share = 0.9f;
  for (int step = 0; step < 200; ++step) {
    int waited = 0;
    for (int layer = 0; layer < 48; ++layer) {
      const double host_time = 2.0 * share * (1 + 0.05 * ((layer % 7) - 3));
      const double gpu_time = 1.0 * (1 - share);
      waited += host_time > gpu_time;
    }
    share = NextHostShare(share, 48, waited);
  }
  EXPECT_NEAR(share, 1.0 / 3.0, 0.05);
}

}  // namespace
}  // namespace strata::model
