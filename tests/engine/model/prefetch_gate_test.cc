#include "engine/model/prefetch_gate.h"

#include "gtest/gtest.h"

namespace strata::model {
namespace {

TEST(PrefetchGateTest, StaysOpenWhileMostGuessesAreRight) {
  PrefetchGate gate(4);
  EXPECT_EQ(gate.limit(), 4);
  for (int step = 0; step < 200; ++step) EXPECT_EQ(gate.Observe(40, 30), 4) << "step " << step;
  EXPECT_NEAR(gate.right_fraction(), 0.75, 1e-9);
}

TEST(PrefetchGateTest, ClosesWhenGuessesAreMostlyWrongAndReopensWhenTheyImprove) {
  PrefetchGate gate(4, 0.5, 1024);
  // Fewer guesses than the first decision needs: open whatever they say.
  EXPECT_EQ(gate.Observe(40, 0), 4);
  EXPECT_EQ(gate.Observe(40, 0), 0);
  for (int step = 0; step < 100; ++step) gate.Observe(40, 8);  // 0.2 right
  EXPECT_EQ(gate.limit(), 0);
  EXPECT_NEAR(gate.right_fraction(), 0.2, 0.05);
  // Right guesses again: the decayed counts cross min_right + hysteresis within a few windows.
  int steps_to_open = 0;
  while (gate.Observe(40, 36) == 0) ASSERT_LT(++steps_to_open, 200);
  EXPECT_GE(gate.right_fraction(), 0.55);
  EXPECT_GT(steps_to_open, 0);
}

TEST(PrefetchGateTest, HysteresisKeepsAClosedGateClosedJustAboveTheThreshold) {
  PrefetchGate gate(2, 0.5, 1024);
  for (int step = 0; step < 50; ++step) gate.Observe(40, 10);
  ASSERT_EQ(gate.limit(), 0);
  for (int step = 0; step < 500; ++step) EXPECT_EQ(gate.Observe(100, 52), 0) << "step " << step;
}

TEST(PrefetchGateTest, NoExpertsMeansNeverOpen) {
  PrefetchGate gate(0);
  EXPECT_EQ(gate.Observe(40, 40), 0);
  EXPECT_EQ(gate.limit(), 0);
}

TEST(PrefetchGateTest, MoreRightThanGuessedCountsAsAllRight) {
  PrefetchGate gate(3);
  gate.Observe(100, 500);
  EXPECT_DOUBLE_EQ(gate.right_fraction(), 1.0);
}

}  // namespace
}  // namespace strata::model
