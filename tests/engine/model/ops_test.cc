// YaRN's RoPE frequencies and magnitude (engine/model/ops.cc) against values worked out by hand.

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

}  // namespace
}  // namespace strata::model
