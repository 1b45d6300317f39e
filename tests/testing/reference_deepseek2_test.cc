// The reference model's deepseek2: group choice against hand values, and probes that synth's presets put
// the expert groups, the score-correction bias and YaRN to work, so that the engine-vs-reference tests
// exercise them.

#include "tests/testing/reference_deepseek2.h"

#include <cmath>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "packtool/synth.h"
#include "tests/testing/reference_model.h"
#include "tests/testing/test_util.h"

namespace strata::testing {
namespace {

const std::vector<int32_t> kPrompt = {72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108, 100, 33, 10};

std::unique_ptr<ReferenceModel> Load(const std::string& preset) {
  const std::string path = SharedScratchDir().Join(absl::StrCat("reference-deepseek2-", preset, ".gguf"));
  if (!std::filesystem::exists(path)) {
    packtool::SynthOptions o;
    o.geometry = *packtool::PresetGeometry("deepseek2", preset);
    o.dense_type = gguf::GgmlType::kF32;
    o.expert_type = gguf::GgmlType::kF32;
    o.seed = 11;
    o.threads = 2;
    o.output = path;
    const absl::Status s = packtool::SynthesizeGguf(o);
    EXPECT_TRUE(s.ok()) << s;
  }
  auto model = ReferenceModel::FromGguf(path);
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? std::move(*model) : nullptr;
}

TEST(ReferenceDeepseek2Test, GroupsAreRankedByTheirBestScoreOrTheirTwoBestScores) {
  ReferenceModel::Hparams hp;
  hp.n_expert = 12;
  hp.n_group = 4;
  hp.n_group_used = 2;
  // Groups of three: best 0.9, 0.7, 0.8, 0.6; two best summed 1.0, 1.4, 1.0, 1.2.
  const std::vector<double> scores = {0.9, 0.1, 0.0, 0.7, 0.7, 0.5, 0.8, 0.2, 0.1, 0.6, 0.6, 0.0};
  std::vector<double> by_max = scores, by_two = scores;
  reference_internal::KeepBestGroups(hp, &by_max);
  hp.group_by_top_two = true;
  reference_internal::KeepBestGroups(hp, &by_two);
  for (int e = 0; e < 12; ++e) {
    const bool in_0_or_2 = e / 3 == 0 || e / 3 == 2;
    EXPECT_EQ(by_max[e], in_0_or_2 ? scores[e] : -INFINITY) << e;
    EXPECT_EQ(by_two[e], in_0_or_2 ? -INFINITY : scores[e]) << e;
  }
}

class ReferenceDeepseek2PresetTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ReferenceDeepseek2PresetTest, ChosenExpertsLieInTheBestGroupsAndGroupsChangeSomeRoutes) {
  auto model = Load(GetParam());
  ASSERT_NE(model, nullptr);
  const ReferenceModel::Hparams& hp = model->hparams();
  ASSERT_GT(hp.n_group, 1);
  const int64_t per_group = hp.n_expert / hp.n_group;
  std::vector<std::vector<ReferenceModel::Route>> grouped, ungrouped;
  model->Logits(kPrompt, &grouped);
  int changed = 0;
  model->mutable_hparams().n_group = 1;
  model->Logits(kPrompt, &ungrouped);
  for (int64_t l = hp.n_dense_lead; l < hp.n_layer; ++l) {
    for (size_t pos = 0; pos < kPrompt.size(); ++pos) {
      std::set<int64_t> groups;
      for (int e : grouped[l][pos].experts) groups.insert(e / per_group);
      EXPECT_LE(static_cast<int64_t>(groups.size()), hp.n_group_used) << "layer " << l << " position " << pos;
      changed += grouped[l][pos].experts != ungrouped[l][pos].experts;
    }
  }
  EXPECT_GT(changed, 0);
}

// Position 0 attends to itself only and rotates by 0, so YaRN cannot reach it; every later position sees it.
TEST_P(ReferenceDeepseek2PresetTest, YarnReachesTheLogitsOfEveryPositionButTheFirst) {
  auto model = Load(GetParam());
  ASSERT_NE(model, nullptr);
  ASSERT_GT(model->hparams().yarn_factor, 1.0);
  const std::vector<float> with = model->Logits(kPrompt);
  model->mutable_hparams().yarn_factor = 0.0;
  const std::vector<float> without = model->Logits(kPrompt);
  const int64_t v = model->n_vocab();
  for (size_t pos = 0; pos < kPrompt.size(); ++pos) {
    double diff = 0, scale = 0;
    for (int64_t i = 0; i < v; ++i) {
      diff = std::max(diff, std::fabs(static_cast<double>(with[pos * v + i]) - without[pos * v + i]));
      scale = std::max(scale, std::fabs(static_cast<double>(with[pos * v + i])));
    }
    if (pos == 0) {
      EXPECT_LT(diff / scale, 1e-6);
    } else {
      EXPECT_GT(diff / scale, 1e-4) << "position " << pos;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Presets, ReferenceDeepseek2PresetTest, ::testing::Values("tiny", "small"),
                         [](const auto& info) { return info.param; });

// small (V3's kind) has exp_probs_b: synth's biases change some choices.
TEST(ReferenceDeepseek2Test, SmallPresetsScoreCorrectionBiasChangesSomeRoutes) {
  auto model = Load("small");
  ASSERT_NE(model, nullptr);
  ASSERT_TRUE(model->hparams().sigmoid_router);
  const int64_t last = model->hparams().n_layer - 1;
  std::vector<std::vector<ReferenceModel::Route>> biased, unbiased;
  model->Logits(kPrompt, &biased);
  std::vector<float>& bias = model->mutable_weights().layers[last].router_bias;
  ASSERT_EQ(static_cast<int64_t>(bias.size()), model->hparams().n_expert);
  std::fill(bias.begin(), bias.end(), 0.0f);
  model->Logits(kPrompt, &unbiased);
  int changed = 0;
  for (size_t pos = 0; pos < kPrompt.size(); ++pos) changed += biased[last][pos].experts != unbiased[last][pos].experts;
  EXPECT_GT(changed, 0);
}

}  // namespace
}  // namespace strata::testing
