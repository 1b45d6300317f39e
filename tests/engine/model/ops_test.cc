// YaRN's RoPE frequencies and magnitude, and grouped expert choice (engine/model/ops.cc), against values
// worked out by hand.

#include "engine/model/ops.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"

namespace strata::model {
namespace {

// rope_dim 8, base 10000, original context 4096, factor 4, beta_fast 32, beta_slow 1:
//   c(b) = 8 ln(4096 / (2 pi b)) / (2 ln 10000): c(32) = 1.309 -> low = 1, c(1) = 2.814 -> high = 3;
//   ramp_i = 1 - clamp((i - 1) / 2, 0, 1) = 1, 1, 0.5, 0 for i = 0..3;
//   f_i = 10000^(-i/4) ((1 - ramp_i) / 4 + ramp_i) = 1, 0.1, 0.01 * 0.625, 0.001 / 4.
TEST(OpsTest, YarnFrequenciesMixInterpolationByTheRampAsGgmlDoes) {
  RopeYarn yarn;
  yarn.factor = 4.0f;
  yarn.original_context = 4096;
  const std::vector<double> f = YarnFrequencies(8, 10000.0f, yarn);
  ASSERT_EQ(f.size(), 4u);
  EXPECT_NEAR(f[0], 1.0, 1e-9);
  EXPECT_NEAR(f[1], 0.1, 1e-9);
  EXPECT_NEAR(f[2], 0.00625, 1e-9);
  EXPECT_NEAR(f[3], 0.00025, 1e-10);
  EXPECT_NEAR(YarnMagnitude(yarn), 1.0 + 0.1 * std::log(4.0), 1e-6);  // 1.1386
  yarn.attn_factor = 0.5f;
  EXPECT_NEAR(YarnMagnitude(yarn), 0.5 * (1.0 + 0.1 * std::log(4.0)), 1e-6);
}

TEST(OpsTest, RopeAnglesScaleCosAndSinByTheMagnitude) {
  const std::vector<double> f = {0.5};
  float cos = 0, sin = 0;
  RopeAngles(f, 3, &cos, &sin, 2.0f);
  EXPECT_NEAR(cos, 2.0 * std::cos(1.5), 1e-6);
  EXPECT_NEAR(sin, 2.0 * std::sin(1.5), 1e-6);
}

TEST(MaskAllButBestGroupsTest, TheGroupScoreDecidesWhichGroupsStay) {
  // Four groups of three. By the best score: group 0 (0.9) and group 2 (0.8) stay. By the sum of the two best:
  // group 1 (0.7 + 0.7 = 1.4) and group 3 (0.6 + 0.6 = 1.2) beat group 0 (0.9 + 0.1) and group 2 (0.8 + 0.2).
  const std::vector<float> scores = {0.9f, 0.1f, 0.0f, 0.7f, 0.7f, 0.5f, 0.8f, 0.2f, 0.1f, 0.6f, 0.6f, 0.0f};
  std::vector<float> by_max = scores;
  MaskAllButBestGroups(by_max.data(), 12, 4, 2, GroupScore::kMax);
  std::vector<float> by_sum = scores;
  MaskAllButBestGroups(by_sum.data(), 12, 4, 2, GroupScore::kTopTwoSum);
  for (int e = 0; e < 12; ++e) {
    const int group = e / 3;
    if (group == 0 || group == 2) {
      EXPECT_EQ(by_max[e], scores[e]) << e;
      EXPECT_EQ(by_sum[e], -INFINITY) << e;
    } else {
      EXPECT_EQ(by_max[e], -INFINITY) << e;
      EXPECT_EQ(by_sum[e], scores[e]) << e;
    }
  }
  // TopK then picks within the kept groups: the top 3 by max-groups are 0.9, 0.8, 0.2 (not 0.7).
  int32_t ids[3];
  TopK(by_max.data(), 12, 3, ids);
  EXPECT_EQ(ids[0], 0);
  EXPECT_EQ(ids[1], 6);
  EXPECT_EQ(ids[2], 7);
}

TEST(MaskAllButBestGroupsTest, TiesGoToTheLowerGroupAndOneGroupOrAllGroupsChangeNothing) {
  std::vector<float> tied = {0.5f, 0.5f, 0.5f, 0.5f};
  MaskAllButBestGroups(tied.data(), 4, 2, 1, GroupScore::kMax);
  EXPECT_EQ(tied, (std::vector<float>{0.5f, 0.5f, -INFINITY, -INFINITY}));
  const std::vector<float> scores = {0.1f, 0.4f, 0.3f, 0.2f};
  std::vector<float> one = scores, all = scores;
  MaskAllButBestGroups(one.data(), 4, 1, 1, GroupScore::kMax);
  MaskAllButBestGroups(all.data(), 4, 2, 2, GroupScore::kTopTwoSum);
  EXPECT_EQ(one, scores);
  EXPECT_EQ(all, scores);
}

TEST(OpsTest, YarnKeepsFastDimensionsDividesSlowOnesAndRampsBetween) {
  // rope_dim 16, base 10000, original context 512, factor 4: the correction range is
  // [floor(16 ln(512 / (2 pi 32)) / (2 ln 10000)), ceil(16 ln(512 / (2 pi)) / (2 ln 10000))] = [floor(0.81),
  // ceil(3.82)] = [0, 4], so pair i keeps 1 - i/4 of its frequency's original and takes i/4 of it divided by 4.
  const std::vector<double> plain = RopeFrequencies(16, 10000.0f);
  RopeYarn yarn;
  yarn.factor = 4.0f;
  yarn.original_context = 512;
  const std::vector<double> scaled = YarnFrequencies(16, 10000.0f, yarn);
  ASSERT_EQ(scaled.size(), 8u);
  const double ratio[8] = {1.0, 0.8125, 0.625, 0.4375, 0.25, 0.25, 0.25, 0.25};
  for (int i = 0; i < 8; ++i) {
    EXPECT_NEAR(plain[i], std::pow(10000.0, -2.0 * i / 16), 1e-15) << i;
    EXPECT_NEAR(scaled[i] / plain[i], ratio[i], 1e-12) << i;
  }
  // Factor 1 is no scaling.
  yarn.factor = 1.0f;
  const std::vector<double> unit = YarnFrequencies(16, 10000.0f, yarn);
  for (int i = 0; i < 8; ++i) EXPECT_NEAR(unit[i], plain[i], 1e-15) << i;
}

}  // namespace
}  // namespace strata::model
