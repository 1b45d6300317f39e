#include "services/inference_protos.h"

#include "gtest/gtest.h"

namespace strata::services {
namespace {

// The engine's counters reach GetStats field by field, the VRAM cache's and the copies ahead included.
TEST(InferenceProtosTest, EngineStatsCarryTheCacheAndPrefetchCounters) {
  runtime::EngineStats stats;
  stats.steps = 7;
  stats.expert_hits = 30;
  stats.expert_misses = 12;
  stats.device = "cuda";
  stats.cache.slots = 64;
  stats.cache.policy = "lru";
  stats.cache.admissions = 5;
  stats.cache.evictions = 4;
  stats.cache.pcie_bytes = 123456;
  stats.cache.host_share = 0.625;
  stats.cache.host_experts = 9;
  stats.cache.guessed = 40;
  stats.cache.guessed_right = 31;
  stats.cache.prefetched = 20;
  stats.cache.prefetch_used = 17;
  const v1::EngineStats p = EngineStatsToProto(stats);
  EXPECT_EQ(p.steps(), 7u);
  EXPECT_EQ(p.expert_hits(), 30u);
  EXPECT_EQ(p.expert_misses(), 12u);
  EXPECT_EQ(p.device(), "cuda");
  EXPECT_EQ(p.vram_expert_slots(), 64);
  EXPECT_EQ(p.cache_policy(), "lru");
  EXPECT_EQ(p.cache_admissions(), 5u);
  EXPECT_EQ(p.cache_evictions(), 4u);
  EXPECT_EQ(p.pcie_bytes(), 123456u);
  EXPECT_DOUBLE_EQ(p.host_share(), 0.625);
  EXPECT_EQ(p.host_experts(), 9u);
  EXPECT_EQ(p.guessed_experts(), 40u);
  EXPECT_EQ(p.guessed_right(), 31u);
  EXPECT_EQ(p.prefetched_experts(), 20u);
  EXPECT_EQ(p.prefetch_used(), 17u);
}

}  // namespace
}  // namespace strata::services
