#include "packtool/inspect.h"

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
}

TEST(InspectTest, NamesWhatIsWrong) {
  strata::testing::ScratchDir dir;
  EXPECT_THAT(Inspect(dir.Join("absent.gguf")).status(), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(Inspect(dir.path()).status(), StatusIsWith(absl::StatusCode::kNotFound, "manifest.json"));
}

}  // namespace
}  // namespace strata::packtool
