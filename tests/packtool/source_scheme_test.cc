#include "packtool/source_scheme.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/gguf/ggml_types.h"
#include "engine/gguf/gguf_writer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "packtool/convert.h"
#include "tests/packtool/packtool_test_util.h"
#include "tests/testing/test_util.h"

namespace strata::packtool {
namespace {

using gguf::GgmlType;
using kernels::Scheme;
using ::strata::testing::ScratchDir;
using testing::TinyOptions;

TEST(SourceSchemeTest, EachDecodableTypeMapsToTheSchemeThatHoldsIt) {
  const std::pair<GgmlType, Scheme> expected[] = {
      {GgmlType::kF32, Scheme::kS4},  {GgmlType::kF16, Scheme::kS4},  {GgmlType::kBF16, Scheme::kS4},
      {GgmlType::kQ4_0, Scheme::kS4}, {GgmlType::kQ4_1, Scheme::kS4}, {GgmlType::kQ4_K, Scheme::kS4},
      {GgmlType::kQ3_K, Scheme::kS8}, {GgmlType::kQ2_K, Scheme::kS8}, {GgmlType::kQ5_0, Scheme::kS8},
      {GgmlType::kQ5_1, Scheme::kS8}, {GgmlType::kQ5_K, Scheme::kS8}, {GgmlType::kQ6_K, Scheme::kS8},
      {GgmlType::kQ8_0, Scheme::kS8}, {GgmlType::kMXFP4, Scheme::kMxfp4}};
  for (const auto& [type, scheme] : expected) {
    auto got = DefaultSchemeFor(type);
    ASSERT_TRUE(got.ok()) << gguf::TypeName(static_cast<uint32_t>(type)) << ": " << got.status();
    EXPECT_EQ(*got, scheme) << gguf::TypeName(static_cast<uint32_t>(type));
  }
  EXPECT_THAT(DefaultSchemeFor(static_cast<GgmlType>(40)).status(),
              StatusIsWith(absl::StatusCode::kUnimplemented, "nvfp4"));
}

TEST(SourceSchemeTest, AutoOrANamedScheme) {
  auto choice = ParseSchemeChoice("auto", "--scheme");
  ASSERT_TRUE(choice.ok());
  EXPECT_FALSE(choice->has_value());
  choice = ParseSchemeChoice("s2", "--scheme");
  ASSERT_TRUE(choice.ok());
  EXPECT_EQ(choice->value(), Scheme::kS2);
  EXPECT_THAT(ParseSchemeChoice("s3", "--scheme").status(),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "--scheme: unknown 's3'; expected auto, f16, s8, s4, s2 or mxfp4"));
}

// The scheme a model's experts call for, and what converting with it adds (bench/RESULTS.md has every
// type with every scheme): nothing for q4_0, q4_1 (s4) and q8_0 (s8), whose codes they hold; the rounding of
// q4_K's scales to half (s4); under 1% for q6_K, q5_K, q3_K and q2_K (s8), where s4 would add 5-7%.
TEST(SourceSchemeTest, ModelsGetTheSchemeOfTheirExpertTypesWhichAddsAlmostNoError) {
  const struct {
    GgmlType type;
    Scheme scheme;
    double bound;  // on the added relative RMS error of each role; 0: none at all
  } cases[] = {{GgmlType::kQ4_0, Scheme::kS4, 0}, {GgmlType::kQ4_1, Scheme::kS4, 0}, {GgmlType::kQ8_0, Scheme::kS8, 0},
               {GgmlType::kMXFP4, Scheme::kMxfp4, 0},
               {GgmlType::kQ4_K, Scheme::kS4, 6e-4}, {GgmlType::kQ6_K, Scheme::kS8, 6e-3},
               {GgmlType::kQ5_K, Scheme::kS8, 6e-3}, {GgmlType::kQ3_K, Scheme::kS8, 6e-3},
               {GgmlType::kQ2_K, Scheme::kS8, 6e-3}};
  for (const auto& [type, scheme, bound] : cases) {
    const std::string name = gguf::TypeName(static_cast<uint32_t>(type));
    ScratchDir dir;
    const std::string model = dir.Join("m.gguf");
    SynthOptions o = TinyOptions(model, type);
    o.geometry.n_embd = 256;  // whole K super-blocks
    o.geometry.expert_ff = 256;
    ASSERT_THAT(SynthesizeGguf(o), IsOk()) << name;
    auto chosen = DefaultSchemeForModel(model);
    ASSERT_TRUE(chosen.ok()) << chosen.status();
    EXPECT_EQ(*chosen, scheme) << name;
    ConvertOptions c;
    c.input = model;
    c.output_dir = dir.Join("pack");
    c.scheme = *chosen;
    c.threads = 2;
    auto manifest = ConvertGguf(c, nullptr, nullptr);
    ASSERT_TRUE(manifest.ok()) << manifest.status();
    ASSERT_EQ(manifest->quant_error_size(), 3);
    for (const auto& e : manifest->quant_error()) {
      std::printf("%s -> %s: %s rel_rms %.3e\n", name.c_str(), std::string(kernels::SchemeName(scheme)).c_str(),
                  e.role().c_str(), e.rel_rms());
      if (bound == 0) {
        EXPECT_EQ(e.rel_rms(), 0.0) << name << " " << e.role();
      } else {
        EXPECT_GT(e.rel_rms(), 0.0) << name << " " << e.role();
        EXPECT_LT(e.rel_rms(), bound) << name << " " << e.role();
      }
    }
  }
}

// A model whose expert tensors have several types gets the scheme the most precise of them needs; one
// without experts, or with an expert type Strata cannot decode, is refused by name.
TEST(SourceSchemeTest, MixedTypesTakeTheMostPreciseAndBadModelsAreNamed) {
  ScratchDir dir;
  auto write = [&](const std::string& name, GgmlType down_type, bool experts) {
    gguf::GgufWriter w;
    w.SetString("general.architecture", "qwen3moe");
    const char* roles[3] = {"gate", "up", "down"};
    for (int r = 0; experts && r < 3; ++r) {
      const GgmlType type = r == 2 ? down_type : GgmlType::kQ4_1;
      const std::vector<int64_t> ne = {256, 2, 1};
      auto bytes = gguf::TensorBytes(type, ne);
      EXPECT_TRUE(bytes.ok()) << bytes.status();
      std::vector<uint8_t> data(bytes.ok() ? *bytes : 0, 0);
      EXPECT_THAT(w.AddTensorData(std::string("blk.0.ffn_") + roles[r] + "_exps.weight", type, ne, data), IsOk());
    }
    std::vector<float> norm(32, 1.0f);
    EXPECT_THAT(w.AddTensorData("output_norm.weight", GgmlType::kF32, {32},
                                {reinterpret_cast<const uint8_t*>(norm.data()), norm.size() * sizeof(float)}),
                IsOk());
    EXPECT_THAT(w.WriteFile(dir.Join(name)), IsOk());
    return dir.Join(name);
  };
  auto mixed = DefaultSchemeForModel(write("mixed.gguf", GgmlType::kQ6_K, true));
  ASSERT_TRUE(mixed.ok()) << mixed.status();
  EXPECT_EQ(*mixed, Scheme::kS8);
  auto uniform = DefaultSchemeForModel(write("uniform.gguf", GgmlType::kQ4_1, true));
  ASSERT_TRUE(uniform.ok()) << uniform.status();
  EXPECT_EQ(*uniform, Scheme::kS4);
  EXPECT_THAT(DefaultSchemeForModel(write("dense.gguf", GgmlType::kQ4_1, false)).status(),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "no expert tensors"));
  EXPECT_THAT(DefaultSchemeForModel(dir.Join("missing.gguf")).status(), StatusIsWith(absl::StatusCode::kNotFound, "missing.gguf"));
}

// The experts of a multi-token-prediction block are not converted: their type does not choose the scheme.
TEST(SourceSchemeTest, MultiTokenPredictionBlocksDoNotChooseTheScheme) {
  ScratchDir dir;
  auto write = [&](const std::string& name, bool mtp) {
    gguf::GgufWriter w;
    w.SetString("general.architecture", "glm4moe");
    w.SetUint32("glm4moe.block_count", 2);
    if (mtp) w.SetUint32("glm4moe.nextn_predict_layers", 1);
    const char* roles[3] = {"gate", "up", "down"};
    for (int block = 0; block < 2; ++block) {
      // Block 0 in q4_1 (s4), block 1 in q8_0 (s8).
      const GgmlType type = block == 0 ? GgmlType::kQ4_1 : GgmlType::kQ8_0;
      for (int r = 0; r < 3; ++r) {
        const std::vector<int64_t> ne = {256, 2, 1};
        auto bytes = gguf::TensorBytes(type, ne);
        EXPECT_TRUE(bytes.ok()) << bytes.status();
        std::vector<uint8_t> data(bytes.ok() ? *bytes : 0, 0);
        EXPECT_THAT(w.AddTensorData(absl::StrCat("blk.", block, ".ffn_", roles[r], "_exps.weight"), type, ne, data),
                    IsOk());
      }
    }
    EXPECT_THAT(w.WriteFile(dir.Join(name)), IsOk());
    return dir.Join(name);
  };
  auto with_mtp = DefaultSchemeForModel(write("mtp.gguf", true));
  ASSERT_TRUE(with_mtp.ok()) << with_mtp.status();
  EXPECT_EQ(*with_mtp, Scheme::kS4);
  auto without = DefaultSchemeForModel(write("plain.gguf", false));
  ASSERT_TRUE(without.ok()) << without.status();
  EXPECT_EQ(*without, Scheme::kS8);
}

}  // namespace
}  // namespace strata::packtool
