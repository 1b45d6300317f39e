#include "packtool/dense_convert.h"

#include <cmath>
#include <string>
#include <vector>

#include "engine/gguf/ggml_types.h"
#include "engine/gguf/gguf_file.h"
#include "engine/gguf/gguf_writer.h"
#include "engine/runtime/engine.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "packtool/convert.h"
#include "tests/packtool/packtool_test_util.h"
#include "tests/testing/test_util.h"

namespace strata::packtool {
namespace {

using ::strata::testing::ScratchDir;
using testing::EngineLogits;
using testing::TinyOptions;

ConvertOptions Options(const std::string& in, const std::string& out, DenseTarget dense) {
  ConvertOptions c;
  c.input = in;
  c.output_dir = out;
  c.scheme = kernels::Scheme::kS8;
  c.threads = 2;
  c.dense_type = dense;
  return c;
}


TEST(DenseTargetTest, ParsesTheFourChoicesAndNamesTheFieldOtherwise) {
  for (DenseTarget t : {DenseTarget::kKeep, DenseTarget::kF16, DenseTarget::kBF16, DenseTarget::kQ8_0}) {
    auto parsed = ParseDenseTarget(DenseTargetName(t), "--dense-type");
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, t);
  }
  EXPECT_THAT(ParseDenseTarget("q4_0", "--dense-type").status(),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "--dense-type: unknown 'q4_0'; expected keep, f16, bf16 or q8_0"));
}

class DenseTypeConvertTest : public ::testing::TestWithParam<DenseTarget> {};

// Every dense matrix has the type asked (the router and the norms keep theirs), the reported error is the
// error of the tensors as written, and the engine runs the pack with logits close to those of the source's
// f16 dense weights.
TEST_P(DenseTypeConvertTest, StoresTheMatricesInTheTypeAskedAndReportsTheErrorAdded) {
  ScratchDir dir;
  const std::string model = dir.Join("m.gguf"), keep = dir.Join("keep"), out = dir.Join("out");
  ASSERT_THAT(SynthesizeGguf(TinyOptions(model)), IsOk());  // f16 dense weights
  ASSERT_THAT(ConvertGguf(Options(model, keep, DenseTarget::kKeep), nullptr, nullptr).status(), IsOk());
  auto manifest = ConvertGguf(Options(model, out, GetParam()), nullptr, nullptr);
  ASSERT_TRUE(manifest.ok()) << manifest.status();

  const gguf::GgmlType want = GetParam() == DenseTarget::kBF16 ? gguf::GgmlType::kBF16 : gguf::GgmlType::kQ8_0;
  auto src = gguf::GgufFile::Open(model);
  auto dense = gguf::GgufFile::Open(out + "/dense.gguf");
  ASSERT_TRUE(src.ok() && dense.ok());
  double err2 = 0, ref2 = 0, max_abs = 0;
  int converted = 0;
  for (const gguf::TensorInfo& t : (*dense)->tensors()) {
    const gguf::TensorInfo* s = (*src)->FindTensor(t.name);
    ASSERT_NE(s, nullptr) << t.name;
    if (!IsConvertibleDenseMatrix(t)) {
      EXPECT_EQ(t.type, s->type) << t.name;
      ASSERT_EQ(t.bytes, s->bytes) << t.name;
      EXPECT_EQ(0, std::memcmp(t.data, s->data, t.bytes)) << t.name;
      continue;
    }
    ++converted;
    EXPECT_EQ(t.type, want) << t.name;
    auto a = gguf::DequantizeTensor(*s);
    auto b = gguf::DequantizeTensor(t);
    ASSERT_TRUE(a.ok() && b.ok()) << t.name;
    for (size_t i = 0; i < a->size(); ++i) {
      const double e = static_cast<double>((*a)[i]) - (*b)[i];
      err2 += e * e;
      ref2 += static_cast<double>((*a)[i]) * (*a)[i];
      max_abs = std::max(max_abs, std::fabs(e));
    }
  }
  // token_embd, output and the four attention matrices of each of the two layers.
  EXPECT_EQ(converted, 2 + 2 * 4);
  EXPECT_EQ((*dense)->FindTensor("blk.0.ffn_gate_inp.weight")->type, gguf::GgmlType::kF32);

  ASSERT_EQ(manifest->quant_error_size(), 4);
  const pack::v1::RoleError& reported = manifest->quant_error(3);
  EXPECT_EQ(reported.role(), kDenseRoleName);
  const double rel_rms = std::sqrt(err2 / ref2);
  EXPECT_GT(rel_rms, 0.0);
  EXPECT_NEAR(reported.rel_rms(), rel_rms, 1e-9 * rel_rms);
  EXPECT_NEAR(reported.max_abs(), max_abs, 1e-9 * max_abs);
  // q8_0 rounds to 1/254 of a block's range, bf16 to 8 bits of mantissa.
  EXPECT_LT(rel_rms, GetParam() == DenseTarget::kQ8_0 ? 0.01 : 0.005);

  const std::vector<int32_t> tokens = {1, 17, 42, 99, 5, 63, 7, 120};
  const std::vector<float> base = EngineLogits(keep, tokens), logits = EngineLogits(out, tokens);
  ASSERT_EQ(base.size(), logits.size());
  ASSERT_FALSE(base.empty());
  double d2 = 0, b2 = 0;
  for (size_t i = 0; i < base.size(); ++i) {
    d2 += (static_cast<double>(logits[i]) - base[i]) * (static_cast<double>(logits[i]) - base[i]);
    b2 += static_cast<double>(base[i]) * base[i];
  }
  EXPECT_GT(d2, 0.0) << "the engine read the converted weights";
  EXPECT_LT(std::sqrt(d2 / b2), 0.05);
}

INSTANTIATE_TEST_SUITE_P(Types, DenseTypeConvertTest, ::testing::Values(DenseTarget::kQ8_0, DenseTarget::kBF16),
                         [](const auto& info) { return std::string(DenseTargetName(info.param)); });

TEST(DenseConvertTest, AskingForTheSourcesOwnTypeChangesNothingAndReportsNoError) {
  ScratchDir dir;
  const std::string model = dir.Join("m.gguf"), out = dir.Join("out");
  ASSERT_THAT(SynthesizeGguf(TinyOptions(model)), IsOk());  // f16 dense weights
  auto manifest = ConvertGguf(Options(model, out, DenseTarget::kF16), nullptr, nullptr);
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  EXPECT_EQ(manifest->quant_error_size(), 3);
  auto src = gguf::GgufFile::Open(model);
  auto dense = gguf::GgufFile::Open(out + "/dense.gguf");
  ASSERT_TRUE(src.ok() && dense.ok());
  for (const gguf::TensorInfo& t : (*dense)->tensors()) {
    EXPECT_EQ(t.type, (*src)->FindTensor(t.name)->type) << t.name;
  }
}

bool NoExperts(std::string_view) { return false; }

TEST(DenseConvertTest, Q8_0RowsThatAreNotWholeBlocksAreRefusedByTensor) {
  ScratchDir dir;
  gguf::GgufWriter writer;
  writer.SetString("general.architecture", "qwen3moe");
  std::vector<float> w(48 * 2, 0.5f);
  ASSERT_THAT(writer.AddTensorData("blk.0.attn_q.weight", gguf::GgmlType::kF32, {48, 2},
                                   {reinterpret_cast<const uint8_t*>(w.data()), w.size() * sizeof(float)}),
              IsOk());
  ASSERT_THAT(writer.WriteFile(dir.Join("odd.gguf")), IsOk());
  auto model = gguf::GgufModel::Open(dir.Join("odd.gguf"));
  ASSERT_TRUE(model.ok()) << model.status();
  std::vector<pack::v1::RoleError> errors;
  EXPECT_THAT(WriteDenseGguf(**model, NoExperts, DenseTarget::kQ8_0, dir.Join("dense.gguf"), &errors),
              StatusIsWith(absl::StatusCode::kInvalidArgument,
                           "tensor 'blk.0.attn_q.weight' has rows of 48 weights, not a multiple of 32"));
  // f16 takes any row length, and the error it reports is that of rounding 0.5 (none).
  ASSERT_THAT(WriteDenseGguf(**model, NoExperts, DenseTarget::kF16, dir.Join("dense16.gguf"), &errors), IsOk());
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0].rel_rms(), 0.0);
}

TEST(DenseConvertTest, NonFiniteWeightsAreRefusedByTensorAndPosition) {
  ScratchDir dir;
  gguf::GgufWriter writer;
  writer.SetString("general.architecture", "qwen3moe");
  std::vector<float> w(64, 1.0f);
  w[37] = std::nanf("");
  ASSERT_THAT(writer.AddTensorData("output.weight", gguf::GgmlType::kF32, {32, 2},
                                   {reinterpret_cast<const uint8_t*>(w.data()), w.size() * sizeof(float)}),
              IsOk());
  ASSERT_THAT(writer.WriteFile(dir.Join("nan.gguf")), IsOk());
  auto model = gguf::GgufModel::Open(dir.Join("nan.gguf"));
  ASSERT_TRUE(model.ok()) << model.status();
  std::vector<pack::v1::RoleError> errors;
  EXPECT_THAT(WriteDenseGguf(**model, NoExperts, DenseTarget::kQ8_0, dir.Join("dense.gguf"), &errors),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "tensor 'output.weight' row 1 column 5"));
}

}  // namespace
}  // namespace strata::packtool
