#include "packtool/synth.h"

#include <cmath>
#include <filesystem>
#include <vector>

#include "engine/gguf/gguf_file.h"
#include "engine/pack/pack_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "packtool/synth_values.h"
#include "tests/packtool/packtool_test_util.h"
#include "tests/testing/test_util.h"

namespace strata::packtool {
namespace {

using ::strata::testing::ReadFileBytes;
using ::strata::testing::ScratchDir;
using ::testing::HasSubstr;
using testing::TinyOptions;

TEST(SynthTest, SameOptionsGiveTheSameBytesAndAnotherSeedDoesNot) {
  ScratchDir dir;
  SynthOptions a = TinyOptions(dir.Join("a.gguf"), gguf::GgmlType::kF16);
  SynthOptions b = a;
  b.output = dir.Join("b.gguf");
  b.threads = 1;  // the thread count must not change the bytes
  SynthOptions c = a;
  c.output = dir.Join("c.gguf");
  c.seed = 8;
  ASSERT_THAT(SynthesizeGguf(a), IsOk());
  ASSERT_THAT(SynthesizeGguf(b), IsOk());
  ASSERT_THAT(SynthesizeGguf(c), IsOk());
  EXPECT_EQ(ReadFileBytes(a.output), ReadFileBytes(b.output));
  EXPECT_NE(ReadFileBytes(a.output), ReadFileBytes(c.output));
}

TEST(SynthTest, AnExistingOutputIsNeverOverwritten) {
  ScratchDir dir;
  const SynthOptions o = TinyOptions(dir.Join("model.gguf"), gguf::GgmlType::kF16);
  const std::vector<uint8_t> precious = {1, 2, 3};
  strata::testing::WriteFileBytes(o.output, precious);
  EXPECT_THAT(SynthesizeGguf(o), StatusIsWith(absl::StatusCode::kAlreadyExists, "model.gguf: already exists"));
  EXPECT_EQ(ReadFileBytes(o.output), precious);
  EXPECT_FALSE(std::filesystem::exists(o.output + ".partial"));
}

TEST(SynthTest, Qwen3MoeHasLlamaCppTensorNamesShapesAndKeys) {
  ScratchDir dir;
  SynthOptions o = TinyOptions(dir.Join("m.gguf"));
  ASSERT_THAT(SynthesizeGguf(o), IsOk());
  auto file = gguf::GgufFile::Open(o.output);
  ASSERT_TRUE(file.ok()) << file.status();
  const gguf::Metadata& m = (*file)->metadata();
  EXPECT_EQ(*m.GetString("general.architecture"), "qwen3moe");
  EXPECT_EQ(*m.GetUint("qwen3moe.block_count"), 2u);
  EXPECT_EQ(*m.GetUint("qwen3moe.expert_count"), 8u);
  EXPECT_EQ(*m.GetUint("qwen3moe.expert_used_count"), 2u);
  EXPECT_EQ(*m.GetUint("qwen3moe.expert_feed_forward_length"), 128u);
  EXPECT_EQ(*m.GetUint("qwen3moe.attention.key_length"), 32u);
  EXPECT_EQ(*m.GetString("tokenizer.ggml.model"), "gpt2");
  const int64_t n_vocab = static_cast<int64_t>(m.GetStringArray("tokenizer.ggml.tokens")->size());
  EXPECT_GT(n_vocab, 256);
  const gguf::TensorInfo* gate = (*file)->FindTensor("blk.1.ffn_gate_exps.weight");
  ASSERT_NE(gate, nullptr);
  EXPECT_EQ(gate->ne, (std::vector<int64_t>{128, 128, 8}));
  const gguf::TensorInfo* down = (*file)->FindTensor("blk.0.ffn_down_exps.weight");
  ASSERT_NE(down, nullptr);
  EXPECT_EQ(down->ne, (std::vector<int64_t>{128, 128, 8}));
  EXPECT_NE((*file)->FindTensor("blk.0.attn_q_norm.weight"), nullptr);
  EXPECT_EQ((*file)->FindTensor("blk.0.attn_q.weight")->ne, (std::vector<int64_t>{128, 4 * 32}));
  EXPECT_EQ((*file)->FindTensor("blk.0.attn_k.weight")->ne, (std::vector<int64_t>{128, 2 * 32}));
  EXPECT_EQ((*file)->FindTensor("token_embd.weight")->ne, (std::vector<int64_t>{128, n_vocab}));
  EXPECT_EQ((*file)->FindTensor("output.weight")->ne, (std::vector<int64_t>{128, n_vocab}));
  EXPECT_EQ((*file)->FindTensor("blk.0.ffn_gate_inp.weight")->type, gguf::GgmlType::kF32);
  EXPECT_EQ((*file)->FindTensor("blk.0.attn_norm.weight")->type, gguf::GgmlType::kF32);
  EXPECT_EQ((*file)->FindTensor("blk.0.attn_q.weight")->type, gguf::GgmlType::kF16);
}

TEST(SynthTest, MixtralIsLlamaArchitectureWithoutQkNorm) {
  ScratchDir dir;
  SynthOptions o = TinyOptions(dir.Join("m.gguf"));
  o.geometry = *PresetGeometry("mixtral", "tiny");
  ASSERT_THAT(SynthesizeGguf(o), IsOk());
  auto file = gguf::GgufFile::Open(o.output);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(*(*file)->metadata().GetString("general.architecture"), "llama");
  EXPECT_EQ(*(*file)->metadata().GetUint("llama.expert_count"), 8u);
  EXPECT_EQ(*(*file)->metadata().GetUint("llama.feed_forward_length"), 128u);
  EXPECT_EQ((*file)->FindTensor("blk.0.attn_q_norm.weight"), nullptr);
  EXPECT_NE((*file)->FindTensor("blk.1.ffn_up_exps.weight"), nullptr);
}

TEST(SynthTest, WeightsFollowTheValueStreamInEveryType) {
  ScratchDir dir;
  for (gguf::GgmlType type : {gguf::GgmlType::kF32, gguf::GgmlType::kF16, gguf::GgmlType::kBF16,
                              gguf::GgmlType::kQ8_0}) {
    SynthOptions o = TinyOptions(dir.Join("t" + gguf::TypeName(static_cast<uint32_t>(type)) + ".gguf"), type);
    ASSERT_THAT(SynthesizeGguf(o), IsOk());
    auto file = gguf::GgufFile::Open(o.output);
    ASSERT_TRUE(file.ok()) << file.status();
    const gguf::TensorInfo* t = (*file)->FindTensor("blk.1.ffn_up_exps.weight");
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->type, type);
    std::vector<float> got(128 * 128);
    const uint64_t expert3 = t->bytes / 8 * 3;
    ASSERT_THAT(gguf::Dequantize(t->type, t->data + expert3, got.data(), 128 * 128), IsOk());
    const uint64_t stream = SynthStream(o.seed, t->name);
    const float scale = 1.0f / std::sqrt(128.0f);
    double err2 = 0, ref2 = 0;
    for (int i = 0; i < 128 * 128; ++i) {
      const double ref = scale * SynthNormal(stream, 3 * 128 * 128 + i);
      err2 += (ref - got[i]) * (ref - got[i]);
      ref2 += ref * ref;
    }
    EXPECT_LT(std::sqrt(err2 / ref2), type == gguf::GgmlType::kQ8_0 ? 0.01 : 0.005)
        << gguf::TypeName(static_cast<uint32_t>(type));
  }
}

TEST(SynthTest, ValuesAreRoughlyStandardNormal) {
  double sum = 0, sum2 = 0;
  const int n = 200000;
  const uint64_t stream = SynthStream(1, "x");
  for (int i = 0; i < n; ++i) {
    const double v = SynthNormal(stream, i);
    sum += v;
    sum2 += v * v;
  }
  EXPECT_NEAR(sum / n, 0.0, 0.02);
  EXPECT_NEAR(sum2 / n, 1.0, 0.02);
}

TEST(SynthTest, CopiesTokenizerFromAVocabFile) {
  ScratchDir dir;
  SynthOptions o = TinyOptions(dir.Join("v.gguf"));
  o.vocab_path = strata::testing::TestDataDir() + "/vocab/ggml-vocab-gpt-2.gguf";
  ASSERT_THAT(SynthesizeGguf(o), IsOk());
  auto file = gguf::GgufFile::Open(o.output);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->metadata().GetStringArray("tokenizer.ggml.tokens")->size(), 50257u);
  EXPECT_EQ((*file)->FindTensor("output.weight")->ne[1], 50257);
}

TEST(SynthTest, PresetsAndGeometryErrorsNameTheFlag) {
  auto seed = PresetGeometry("qwen3moe", "seed");
  ASSERT_TRUE(seed.ok());
  EXPECT_EQ(seed->n_layer, 48);
  EXPECT_EQ(seed->n_expert, 512);
  EXPECT_EQ(seed->n_expert_used, 10);
  EXPECT_EQ(seed->n_embd, 2560);
  EXPECT_EQ(seed->expert_ff, 640);
  EXPECT_THAT(PresetGeometry("qwen3moe", "huge").status(), StatusIsWith(absl::StatusCode::kInvalidArgument, "--preset"));
  EXPECT_THAT(PresetGeometry("gpt5", "tiny").status(), StatusIsWith(absl::StatusCode::kInvalidArgument, "--arch"));
  SynthGeometry g = *PresetGeometry("qwen3moe", "tiny");
  g.n_expert_used = 9;
  EXPECT_THAT(CheckSynthGeometry(g), StatusIsWith(absl::StatusCode::kInvalidArgument, "--experts-used"));
  g = *PresetGeometry("qwen3moe", "tiny");
  g.n_embd = 100;
  EXPECT_THAT(CheckSynthGeometry(g), StatusIsWith(absl::StatusCode::kInvalidArgument, "--embd"));
  g = *PresetGeometry("qwen3moe", "tiny");
  g.n_head_kv = 3;
  EXPECT_THAT(CheckSynthGeometry(g), StatusIsWith(absl::StatusCode::kInvalidArgument, "--heads"));
  EXPECT_THAT(ParseSynthType("q3_K").status(), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(SynthTest, PackOnlyEqualsSynthesizeThenConvert) {
  ScratchDir dir;
  const pack::v1::Manifest converted = testing::MakeTinyPack(dir.Join("m.gguf"), dir.Join("converted"),
                                                              kernels::Scheme::kS4);
  SynthOptions o = TinyOptions(dir.Join("direct"));
  o.pack_scheme = kernels::Scheme::kS4;
  auto direct = SynthesizePack(o, nullptr, nullptr);
  ASSERT_TRUE(direct.ok()) << direct.status();
  EXPECT_EQ(direct->created_by(), "synth");
  EXPECT_EQ(converted.created_by(), "convert");
  ASSERT_EQ(direct->blob_xxh3_size(), converted.blob_xxh3_size());
  for (int i = 0; i < direct->blob_xxh3_size(); ++i) EXPECT_EQ(direct->blob_xxh3(i), converted.blob_xxh3(i)) << i;
  EXPECT_EQ(ReadFileBytes(dir.Join("direct/experts.bin")), ReadFileBytes(dir.Join("converted/experts.bin")));
  // Both dense.gguf files hold the same tensors with the same bytes.
  auto a = gguf::GgufFile::Open(dir.Join("direct/dense.gguf"));
  auto b = gguf::GgufFile::Open(dir.Join("converted/dense.gguf"));
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ((*a)->tensors().size(), (*b)->tensors().size());
  for (const gguf::TensorInfo& t : (*a)->tensors()) {
    const gguf::TensorInfo* u = (*b)->FindTensor(t.name);
    ASSERT_NE(u, nullptr) << t.name;
    ASSERT_EQ(t.bytes, u->bytes);
    EXPECT_EQ(0, std::memcmp(t.data, u->data, t.bytes)) << t.name;
  }
}

}  // namespace
}  // namespace strata::packtool
