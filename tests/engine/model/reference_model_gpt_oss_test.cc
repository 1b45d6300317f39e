// Probes of the reference model's gpt-oss blocks (tests/testing/reference_model.h): each one, switched off in
// the loaded model, changes exactly the logits it should. The engine is compared with this reference in
// tests/engine/runtime/engine_reference_test.cc.

#include <cmath>
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "packtool/synth.h"
#include "tests/testing/reference_model.h"
#include "tests/testing/test_util.h"

namespace strata::testing {
namespace {

class GptOssReferenceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    packtool::SynthOptions o;
    o.geometry = *packtool::PresetGeometry("gpt-oss", "tiny");
    o.dense_type = gguf::GgmlType::kF32;
    o.expert_type = gguf::GgmlType::kF32;
    o.seed = 5;
    o.output = dir_.Join("m.gguf");
    o.threads = 2;
    ASSERT_TRUE(packtool::SynthesizeGguf(o).ok());
    auto ref = ReferenceModel::FromGguf(o.output);
    ASSERT_TRUE(ref.ok()) << ref.status();
    ref_ = std::move(*ref);
  }

  // The largest relative difference of the logits at `position` between two runs.
  double Difference(const std::vector<float>& a, const std::vector<float>& b, int64_t position) const {
    const int64_t n = ref_->n_vocab();
    double d = 0, r = 0;
    for (int64_t i = position * n; i < (position + 1) * n; ++i) {
      d += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
      r += static_cast<double>(b[i]) * b[i];
    }
    return std::sqrt(d / r);
  }

  ScratchDir dir_;
  std::unique_ptr<ReferenceModel> ref_;
  const std::vector<int32_t> prompt_ = {5, 77, 140, 3, 250, 31, 9, 200, 18, 64, 7, 91};
};

TEST_F(GptOssReferenceTest, ItReadsGptOssHyperParameters) {
  const ReferenceModel::Hparams& hp = ref_->hparams();
  EXPECT_TRUE(hp.gpt_oss);
  EXPECT_EQ(hp.sliding_window, 8);
  EXPECT_DOUBLE_EQ(hp.yarn.factor, 32.0);
  EXPECT_EQ(hp.yarn.original_context, 4096);
  EXPECT_EQ(ref_->weights().layers[0].sinks.size(), 4u);
  EXPECT_EQ(ref_->weights().layers[1].experts[3].down_bias.size(), 128u);
}

// The window drops keys only once a position is sliding_window (8) past them: positions 0..7 are unchanged
// without it, later ones are not.
TEST_F(GptOssReferenceTest, TheWindowChangesOnlyPositionsPastIt) {
  const std::vector<float> windowed = ref_->Logits(prompt_);
  ref_->mutable_hparams().sliding_window = 0;
  const std::vector<float> full = ref_->Logits(prompt_);
  for (int64_t p = 0; p < 8; ++p) EXPECT_EQ(Difference(windowed, full, p), 0.0) << "position " << p;
  for (int64_t p = 8; p < static_cast<int64_t>(prompt_.size()); ++p) {
    EXPECT_GT(Difference(windowed, full, p), 1e-3) << "position " << p;
  }
}

// A sink takes a share of every softmax, the first position's too (where the only key would get weight 1).
TEST_F(GptOssReferenceTest, SinksChangeEveryPosition) {
  const std::vector<float> with_sinks = ref_->Logits(prompt_);
  for (ReferenceModel::Layer& layer : ref_->mutable_weights().layers) {
    for (float& s : layer.sinks) s = -1e30f;  // exp(-1e30 - max) = 0: no sink
  }
  const std::vector<float> without = ref_->Logits(prompt_);
  for (int64_t p = 0; p < static_cast<int64_t>(prompt_.size()); ++p) {
    EXPECT_GT(Difference(with_sinks, without, p), 1e-3) << "position " << p;
  }
}

// YaRN changes the rotation from position 1 on and the magnitude (so the scores) everywhere.
TEST_F(GptOssReferenceTest, YarnChangesTheLogits) {
  const std::vector<float> yarn = ref_->Logits(prompt_);
  ref_->mutable_hparams().yarn.factor = 1.0;
  const std::vector<float> plain = ref_->Logits(prompt_);
  for (int64_t p = 1; p < static_cast<int64_t>(prompt_.size()); ++p) {
    EXPECT_GT(Difference(yarn, plain, p), 1e-3) << "position " << p;
  }
}

// The router's weights are a softmax over the chosen logits: they sum to 1, in pick order.
TEST_F(GptOssReferenceTest, RouteWeightsAreASoftmaxOverTheChosenExperts) {
  std::vector<std::vector<ReferenceModel::Route>> routes;
  ref_->Logits(prompt_, &routes);
  for (const auto& layer : routes) {
    for (const ReferenceModel::Route& r : layer) {
      ASSERT_EQ(r.weights.size(), 2u);
      EXPECT_NEAR(r.weights[0] + r.weights[1], 1.0, 1e-6);
      EXPECT_GE(r.weights[0], r.weights[1]);
    }
  }
}

}  // namespace
}  // namespace strata::testing
