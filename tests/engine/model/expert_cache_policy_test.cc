#include "engine/model/expert_cache_policy.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/test_util.h"

namespace strata::model {
namespace {

using ::testing::ElementsAre;
using Admission = ExpertCachePolicy::Admission;

// One step's routing of one layer (k = 1: one expert per token).
std::vector<Admission> Step(ExpertCachePolicy& policy, std::vector<int32_t> experts,
                            std::vector<uint64_t>* missed = nullptr) {
  const int32_t* layers[] = {experts.data()};
  return policy.Observe(1, layers, static_cast<int>(experts.size()), 1, missed);
}

void LandAll(ExpertCachePolicy& policy, const std::vector<Admission>& admissions) {
  for (const Admission& a : admissions) policy.Landed(a.blob);
}

CacheOptions Options(CachePolicy policy, int64_t slots) {
  CacheOptions o;
  o.policy = policy;
  o.slots = slots;
  return o;
}

TEST(ExpertCachePolicyTest, ParsesPolicyNamesAndNamesABadOne) {
  EXPECT_EQ(*ParseCachePolicy("lru"), CachePolicy::kLru);
  EXPECT_EQ(*ParseCachePolicy("lfu-decay"), CachePolicy::kLfuDecay);
  EXPECT_EQ(*ParseCachePolicy("static"), CachePolicy::kStatic);
  EXPECT_THAT(ParseCachePolicy("fifo").status(), StatusIsWith(absl::StatusCode::kInvalidArgument, "'fifo'"));
  for (CachePolicy p : {CachePolicy::kLru, CachePolicy::kLfuDecay, CachePolicy::kStatic}) {
    EXPECT_EQ(*ParseCachePolicy(CachePolicyName(p)), p);
  }
}

TEST(ExpertCachePolicyTest, WarmStartIsRoundRobinOverLayersOrTheHottestOfAProfile) {
  ExpertCachePolicy policy(Options(CachePolicy::kLfuDecay, 5), /*n_moe_layers=*/2, /*n_expert=*/4);
  // Expert 0 of layers 0 and 1, then expert 1 of both, then expert 2 of layer 0.
  EXPECT_THAT(*policy.WarmStart({}), ElementsAre(0, 4, 1, 5, 2));
  const std::vector<double> counts = {1, 9, 3, 3, 0, 7, 8, 2};
  EXPECT_THAT(*policy.WarmStart(counts), ElementsAre(1, 6, 5, 2, 3));  // ties keep the lower blob first
  EXPECT_THAT(policy.WarmStart(std::vector<double>(7, 1.0)).status(),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "7 counts for 8 experts"));
}

TEST(ExpertCachePolicyTest, PlaceMakesBlobsResidentAndRefusesBadPlacements) {
  ExpertCachePolicy policy(Options(CachePolicy::kLru, 2), 1, 4);
  EXPECT_THAT(policy.Place(std::vector<uint64_t>{0, 1, 2}, {}),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "3 experts for 2 slots"));
  EXPECT_THAT(policy.Place(std::vector<uint64_t>{7}, {}),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "blob 7"));
  ASSERT_TRUE(policy.Place(std::vector<uint64_t>{3, 1}, {}).ok());
  EXPECT_TRUE(policy.resident(3));
  EXPECT_TRUE(policy.resident(1));
  EXPECT_FALSE(policy.resident(0));
  EXPECT_EQ(policy.slot_of(3), 0);
  EXPECT_EQ(policy.slot_of(1), 1);
}

TEST(ExpertCachePolicyTest, AnAdmittedExpertIsResidentOnlyOnceItsCopyHasLanded) {
  ExpertCachePolicy policy(Options(CachePolicy::kLru, 2), 1, 4);
  std::vector<uint64_t> missed;
  const std::vector<Admission> a = Step(policy, {2, 2, 3}, &missed);
  EXPECT_THAT(missed, ElementsAre(2, 3));  // distinct, in order of first use
  ASSERT_EQ(a.size(), 2u);
  EXPECT_EQ(a[0].blob, 2u);
  EXPECT_EQ(a[0].victim, -1);  // free slots first
  EXPECT_TRUE(policy.filling(2));
  EXPECT_FALSE(policy.resident(2));
  policy.Landed(2);
  EXPECT_TRUE(policy.resident(2));
  EXPECT_FALSE(policy.resident(3));
}

TEST(ExpertCachePolicyTest, LruEvictsTheExpertUnusedLongestButNeverOneTheStepUsedOrOneFilling) {
  ExpertCachePolicy policy(Options(CachePolicy::kLru, 2), 1, 8);
  LandAll(policy, Step(policy, {0}));
  LandAll(policy, Step(policy, {1}));
  Step(policy, {0});  // 1 is now the least recently used
  std::vector<Admission> a = Step(policy, {5});
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].blob, 5u);
  EXPECT_EQ(a[0].victim, 1);
  EXPECT_FALSE(policy.resident(1));
  // 5 is still filling and 0 is used by this step: no victim for 6.
  EXPECT_TRUE(Step(policy, {0, 6}).empty());
  policy.Landed(5);
  a = Step(policy, {0, 6});  // 5 is the only resident expert not used by this step
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].victim, 5);
}

TEST(ExpertCachePolicyTest, LfuDecayAdmitsAMissOnlyWhenItOutscoresTheColdestResident) {
  CacheOptions o = Options(CachePolicy::kLfuDecay, 1);
  o.decay_tokens = 1000;
  ExpertCachePolicy policy(o, 1, 4);
  LandAll(policy, Step(policy, {0, 0, 0}));  // 0: score 3
  EXPECT_TRUE(Step(policy, {1}).empty());    // 1: score 1 <= 3
  EXPECT_TRUE(Step(policy, {1, 1}).empty());  // 3 <= 3
  const std::vector<Admission> a = Step(policy, {1});  // 4 > 3
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].blob, 1u);
  EXPECT_EQ(a[0].victim, 0);
}

TEST(ExpertCachePolicyTest, LfuDecayHalvesTheCountsSoOldFavouritesFade) {
  CacheOptions o = Options(CachePolicy::kLfuDecay, 1);
  o.decay_tokens = 4;
  ExpertCachePolicy policy(o, 1, 4);
  LandAll(policy, Step(policy, {0, 0, 0, 0}));  // 0: 4, halved to 2 (4 tokens)
  EXPECT_TRUE(Step(policy, {1, 1}).empty());      // 1: 2, not above 0's 2
  EXPECT_FALSE(Step(policy, {1, 1}).empty());     // 4 tokens since the decay: 1 halves to 2, 0 to 1
}

TEST(ExpertCachePolicyTest, StaticNeverChangesItsExperts) {
  ExpertCachePolicy policy(Options(CachePolicy::kStatic, 2), 1, 4);
  ASSERT_TRUE(policy.Place(std::vector<uint64_t>{0, 1}, {}).ok());
  for (int i = 0; i < 10; ++i) EXPECT_TRUE(Step(policy, {2, 3, 3}).empty());
  EXPECT_TRUE(policy.resident(0));
  EXPECT_FALSE(policy.resident(3));
}

TEST(ExpertCachePolicyTest, PlansAtMostMaxFillsPerStepAndSkipsIdsOutOfRange) {
  CacheOptions o = Options(CachePolicy::kLru, 8);
  o.max_fills_per_step = 3;
  ExpertCachePolicy policy(o, 2, 8);
  std::vector<int32_t> layer0 = {0, -1, 8, 1};
  std::vector<int32_t> layer1 = {5, 6, 6, 99};
  const int32_t* ids[] = {layer0.data(), layer1.data()};
  std::vector<uint64_t> missed;
  const std::vector<Admission> a = policy.Observe(2, ids, 4, 1, &missed);
  EXPECT_THAT(missed, ElementsAre(0, 1, 13, 14));
  EXPECT_EQ(a.size(), 3u);
}

TEST(ExpertCachePolicyTest, NoSlotsMeansEveryExpertIsAMiss) {
  ExpertCachePolicy policy(Options(CachePolicy::kLru, 0), 1, 4);
  EXPECT_EQ(policy.n_slots(), 0);
  EXPECT_TRUE(Step(policy, {0, 1, 2}).empty());
  EXPECT_FALSE(policy.resident(0));
}

}  // namespace
}  // namespace strata::model
