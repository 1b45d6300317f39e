#include "packtool/inspect.h"

#include "engine/pack/routing_profile.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/packtool/packtool_test_util.h"
#include "tests/testing/test_util.h"

namespace strata::packtool {
namespace {

using ::testing::HasSubstr;

TEST(InspectTest, DescribesAGgufModel) {
  strata::testing::ScratchDir dir;
  ASSERT_THAT(SynthesizeGguf(testing::TinyOptions(dir.Join("m.gguf"))), IsOk());
  auto in = Inspect(dir.Join("m.gguf"));
  ASSERT_TRUE(in.ok()) << in.status();
  EXPECT_EQ(in->kind, "gguf");
  EXPECT_EQ(in->architecture, "qwen3moe");
  EXPECT_EQ(in->geometry.n_layer(), 2u);
  EXPECT_EQ(in->geometry.n_moe_layers(), 2u);
  EXPECT_EQ(in->geometry.n_expert(), 8u);
  EXPECT_EQ(in->geometry.expert_ff(), 128u);
  EXPECT_EQ(in->tokenizer_model, "gpt2");
  const std::string text = FormatInspection(*in);
  EXPECT_THAT(text, HasSubstr("qwen3moe"));
  EXPECT_THAT(text, HasSubstr("blk.1.ffn_down_exps.weight"));
}

// A GGUF with a multi-token-prediction block: the geometry is that of the blocks that run, and the text says
// what else the file holds.
TEST(InspectTest, CountsMultiTokenPredictionBlocksApart) {
  strata::testing::ScratchDir dir;
  SynthOptions o = testing::TinyOptions(dir.Join("m.gguf"));
  o.geometry = *PresetGeometry("glm4moe", "tiny");  // 2 blocks, the first dense
  o.geometry.n_mtp_layers = 1;
  ASSERT_THAT(SynthesizeGguf(o), IsOk());
  auto in = Inspect(dir.Join("m.gguf"));
  ASSERT_TRUE(in.ok()) << in.status();
  EXPECT_EQ(in->geometry.n_layer(), 2u);
  EXPECT_EQ(in->geometry.n_moe_layers(), 1u);
  EXPECT_EQ(in->mtp_blocks, 1);
  const std::string text = FormatInspection(*in);
  EXPECT_THAT(text, HasSubstr("layers         2 (1 with routed experts)"));
  EXPECT_THAT(text, HasSubstr("MTP blocks     1 more in the file (multi-token prediction): Strata does not run them"));
  EXPECT_THAT(text, HasSubstr("blk.2.nextn.eh_proj.weight"));
}

TEST(InspectTest, DescribesAPack) {
  strata::testing::ScratchDir dir;
  testing::MakeTinyPack(dir.Join("m.gguf"), dir.Join("pack"), kernels::Scheme::kS2);
  auto in = Inspect(dir.Join("pack"));
  ASSERT_TRUE(in.ok()) << in.status();
  EXPECT_EQ(in->kind, "pack");
  EXPECT_EQ(in->scheme, "s2");
  EXPECT_EQ(in->geometry.n_expert_used(), 2u);
  for (const TensorSummary& t : in->tensors) EXPECT_EQ(t.name.find("_exps"), std::string::npos);
  EXPECT_THAT(FormatInspection(*in), HasSubstr("scheme         s2"));
  EXPECT_THAT(FormatInspection(*in), HasSubstr("profile        none (strata-pack profile makes one)"));
}

TEST(InspectTest, DescribesAPacksRoutingProfileOrWhyItIsInvalid) {
  strata::testing::ScratchDir dir;
  const pack::v1::Manifest m = testing::MakeTinyPack(dir.Join("m.gguf"), dir.Join("pack"));
  // 4 tokens, top-2 of 8 experts: layer 0 picks experts 0 and 1 every time (4 = 4x its mean of 1), layer 1
  // spreads over all 8.
  pack::RoutingProfile profile = pack::EmptyRoutingProfile(m);
  profile.tokens = 4;
  profile.prompts = 2;
  profile.counts = {4, 4, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1};
  ASSERT_THAT(pack::WriteRoutingProfile(profile, m, dir.Join("pack")), IsOk());
  auto in = Inspect(dir.Join("pack"));
  ASSERT_TRUE(in.ok()) << in.status();
  EXPECT_EQ(in->routing_profile, "4 tokens of 2 prompts; hottest expert 4.00x its layer's mean, 6 of 16 never picked");

  std::vector<uint8_t> bytes = strata::testing::ReadFileBytes(dir.Join("pack/routing_profile.bin"));
  bytes.pop_back();
  strata::testing::WriteFileBytes(dir.Join("pack/routing_profile.bin"), bytes);
  in = Inspect(dir.Join("pack"));
  ASSERT_TRUE(in.ok()) << in.status();
  EXPECT_THAT(FormatInspection(*in), HasSubstr("profile        invalid: routing_profile.bin: truncated: "));
}

TEST(InspectTest, NamesWhatIsWrong) {
  strata::testing::ScratchDir dir;
  EXPECT_THAT(Inspect(dir.Join("absent.gguf")).status(), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(Inspect(dir.path()).status(), StatusIsWith(absl::StatusCode::kNotFound, "manifest.json"));
}

}  // namespace
}  // namespace strata::packtool
