#include "packtool/synth.h"

#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "engine/gguf/gguf_file.h"
#include "engine/pack/pack_format.h"
#include "engine/runtime/engine.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/quantize.h"
#include "kernels/format/fp16.h"
#include "kernels/format/mxfp4.h"
#include "kernels/format/role_layout.h"
#include "packtool/synth_codes.h"
#include "packtool/synth_values.h"
#include "packtool/validate.h"
#include "tests/packtool/packtool_test_util.h"
#include "tests/testing/reference_model.h"
#include "tests/testing/test_util.h"

namespace strata::packtool {
namespace {

using ::strata::testing::ReadFileBytes;
using ::strata::testing::ScratchDir;
using ::testing::HasSubstr;
using testing::ExpectPackOnlyEqualsConvert;
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

// Expert tensors in every K type a user's GGUF may hold: each decodes to the value stream within the type's
// error; rows that are not whole 256-weight super-blocks are refused naming the flag and the tensor.
TEST(SynthTest, KQuantExpertsFollowTheValueStreamAndNeedWholeSuperBlocks) {
  ScratchDir dir;
  const std::pair<gguf::GgmlType, double> types[] = {{gguf::GgmlType::kQ6_K, 0.02}, {gguf::GgmlType::kQ5_K, 0.04},
                                                     {gguf::GgmlType::kQ4_K, 0.08}, {gguf::GgmlType::kQ3_K, 0.18},
                                                     {gguf::GgmlType::kQ2_K, 0.35}};
  for (const auto& [type, bound] : types) {
    const std::string name = gguf::TypeName(static_cast<uint32_t>(type));
    auto parsed = ParseSynthType(name);
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, type);
    SynthOptions o = TinyOptions(dir.Join("t" + name + ".gguf"), type);
    o.geometry.n_embd = 256;
    o.geometry.expert_ff = 256;
    ASSERT_THAT(SynthesizeGguf(o), IsOk()) << name;
    auto file = gguf::GgufFile::Open(o.output);
    ASSERT_TRUE(file.ok()) << file.status();
    const gguf::TensorInfo* t = (*file)->FindTensor("blk.1.ffn_down_exps.weight");
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->type, type);
    const int64_t n = 256 * 256;
    std::vector<float> got(n);
    ASSERT_THAT(gguf::Dequantize(t->type, t->data + t->bytes / 8 * 3, got.data(), n), IsOk());
    const uint64_t stream = SynthStream(o.seed, t->name);
    const float scale = 1.0f / std::sqrt(256.0f);
    double err2 = 0, ref2 = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double ref = scale * SynthNormal(stream, 3 * n + i);
      err2 += (ref - got[i]) * (ref - got[i]);
      ref2 += ref * ref;
    }
    EXPECT_LT(std::sqrt(err2 / ref2), bound) << name;
  }
  SynthOptions tiny = TinyOptions(dir.Join("bad.gguf"), gguf::GgmlType::kQ4_K);  // n_embd 128
  EXPECT_THAT(SynthesizeGguf(tiny), StatusIsWith(absl::StatusCode::kInvalidArgument, "--expert-type q4_K: tensor 'blk.0.ffn_gate_exps.weight' has rows of 128 weights"));
  EXPECT_FALSE(std::filesystem::exists(tiny.output));
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
  o.vocab_path = strata::testing::TestDataFile("vocab/ggml-vocab-gpt-2.gguf.gz");
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
  EXPECT_THAT(ParseSynthType("q5_0").status(), StatusIsWith(absl::StatusCode::kInvalidArgument, "'q5_0' is not one synth writes"));
}

// The shapes llama.cpp's loader creates for qwen2moe (src/models/qwen2moe.cpp): q/k/v biases, the shared
// expert's three matrices and its [n_embd] gate, with the widths in the keys it reads.
TEST(SynthTest, Qwen2MoeHasLlamaCppTensorNamesShapesAndKeys) {
  ScratchDir dir;
  SynthOptions o = TinyOptions(dir.Join("m.gguf"));
  o.geometry = *PresetGeometry("qwen2moe", "tiny");
  ASSERT_THAT(SynthesizeGguf(o), IsOk());
  auto file = gguf::GgufFile::Open(o.output);
  ASSERT_TRUE(file.ok()) << file.status();
  const gguf::Metadata& m = (*file)->metadata();
  EXPECT_EQ(*m.GetString("general.architecture"), "qwen2moe");
  EXPECT_EQ(*m.GetUint("qwen2moe.expert_feed_forward_length"), 128u);
  EXPECT_EQ(*m.GetUint("qwen2moe.expert_shared_feed_forward_length"), 512u);
  EXPECT_EQ(*m.GetUint("qwen2moe.feed_forward_length"), 512u);
  auto shape = [&](const std::string& name) {
    const gguf::TensorInfo* t = (*file)->FindTensor(name);
    return t == nullptr ? std::vector<int64_t>{} : t->ne;
  };
  EXPECT_EQ(shape("blk.1.attn_q.bias"), (std::vector<int64_t>{128}));
  EXPECT_EQ(shape("blk.1.attn_k.bias"), (std::vector<int64_t>{64}));
  EXPECT_EQ(shape("blk.1.attn_v.bias"), (std::vector<int64_t>{64}));
  EXPECT_EQ(shape("blk.1.ffn_gate_inp_shexp.weight"), (std::vector<int64_t>{128}));
  EXPECT_EQ(shape("blk.1.ffn_gate_shexp.weight"), (std::vector<int64_t>{128, 512}));
  EXPECT_EQ(shape("blk.1.ffn_up_shexp.weight"), (std::vector<int64_t>{128, 512}));
  EXPECT_EQ(shape("blk.1.ffn_down_shexp.weight"), (std::vector<int64_t>{512, 128}));
  EXPECT_EQ((*file)->FindTensor("blk.0.attn_q.bias")->type, gguf::GgmlType::kF32);
  EXPECT_EQ((*file)->FindTensor("blk.0.ffn_gate_inp_shexp.weight")->type, gguf::GgmlType::kF32);
  EXPECT_EQ((*file)->FindTensor("blk.0.ffn_up_shexp.weight")->type, gguf::GgmlType::kF16);
  EXPECT_EQ((*file)->FindTensor("blk.0.attn_q_norm.weight"), nullptr);
}

// llama.cpp's olmoe loads attn_q_norm and attn_k_norm with n_embd weights: norms over the whole projection,
// so the preset has as many kv heads as heads.
TEST(SynthTest, OlmoeHasWholeProjectionQkNormsAndLlamaCppKeys) {
  ScratchDir dir;
  SynthOptions o = TinyOptions(dir.Join("m.gguf"));
  o.geometry = *PresetGeometry("olmoe", "tiny");
  EXPECT_EQ(o.geometry.n_head_kv, o.geometry.n_head);
  ASSERT_THAT(SynthesizeGguf(o), IsOk());
  auto file = gguf::GgufFile::Open(o.output);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(*(*file)->metadata().GetString("general.architecture"), "olmoe");
  EXPECT_EQ(*(*file)->metadata().GetUint("olmoe.feed_forward_length"), 128u);
  EXPECT_EQ((*file)->FindTensor("blk.1.attn_q_norm.weight")->ne, (std::vector<int64_t>{128}));
  EXPECT_EQ((*file)->FindTensor("blk.1.attn_k_norm.weight")->ne, (std::vector<int64_t>{128}));
  EXPECT_EQ((*file)->FindTensor("blk.0.attn_q.bias"), nullptr);
  EXPECT_EQ((*file)->FindTensor("blk.0.ffn_up_shexp.weight"), nullptr);
}

// llama.cpp's glm4moe loader (src/models/glm4-moe.cpp): block 0 dense with ffn_{gate,up,down}, the others
// MoE with exp_probs_b and a shared expert of expert_shared_count experts' width, the FFN's norm named
// post_attention_norm, half of each head rotated.
TEST(SynthTest, Glm4MoeHasLlamaCppTensorNamesShapesAndKeys) {
  ScratchDir dir;
  SynthOptions o = TinyOptions(dir.Join("m.gguf"));
  o.geometry = *PresetGeometry("glm4moe", "tiny");
  ASSERT_THAT(SynthesizeGguf(o), IsOk());
  auto file = gguf::GgufFile::Open(o.output);
  ASSERT_TRUE(file.ok()) << file.status();
  const gguf::Metadata& m = (*file)->metadata();
  EXPECT_EQ(*m.GetString("general.architecture"), "glm4moe");
  EXPECT_EQ(*m.GetUint("glm4moe.leading_dense_block_count"), 1u);
  EXPECT_EQ(*m.GetUint("glm4moe.expert_shared_count"), 1u);
  EXPECT_EQ(*m.GetUint("glm4moe.expert_feed_forward_length"), 128u);
  EXPECT_EQ(*m.GetUint("glm4moe.feed_forward_length"), 512u);
  EXPECT_EQ(*m.GetUint("glm4moe.rope.dimension_count"), 16u);
  EXPECT_EQ(*m.GetUint("glm4moe.expert_gating_func"), 2u);
  EXPECT_TRUE(*m.GetBool("glm4moe.expert_weights_norm"));
  EXPECT_FLOAT_EQ(static_cast<float>(*m.GetFloat("glm4moe.expert_weights_scale")), 2.5f);
  auto shape = [&](const std::string& name) {
    const gguf::TensorInfo* t = (*file)->FindTensor(name);
    return t == nullptr ? std::vector<int64_t>{} : t->ne;
  };
  EXPECT_EQ(shape("blk.0.ffn_gate.weight"), (std::vector<int64_t>{128, 512}));
  EXPECT_EQ(shape("blk.0.ffn_down.weight"), (std::vector<int64_t>{512, 128}));
  EXPECT_EQ(shape("blk.0.ffn_gate_inp.weight"), std::vector<int64_t>{});
  EXPECT_EQ(shape("blk.0.ffn_up_exps.weight"), std::vector<int64_t>{});
  EXPECT_EQ(shape("blk.0.post_attention_norm.weight"), (std::vector<int64_t>{128}));
  EXPECT_EQ(shape("blk.1.ffn_norm.weight"), std::vector<int64_t>{});
  EXPECT_EQ(shape("blk.1.exp_probs_b.bias"), (std::vector<int64_t>{8}));
  EXPECT_EQ(shape("blk.1.ffn_up_exps.weight"), (std::vector<int64_t>{128, 128, 8}));
  EXPECT_EQ(shape("blk.1.ffn_up_shexp.weight"), (std::vector<int64_t>{128, 128}));
  EXPECT_EQ(shape("blk.1.ffn_gate_inp_shexp.weight"), std::vector<int64_t>{});
  EXPECT_EQ(shape("blk.1.attn_q.bias"), (std::vector<int64_t>{128}));
  EXPECT_EQ((*file)->FindTensor("blk.1.exp_probs_b.bias")->type, gguf::GgmlType::kF32);
}

// The pack written directly skips the dense block as convert does: the same experts, block 0 not among them.
TEST(SynthTest, Glm4MoePackOnlyEqualsSynthesizeThenConvert) {
  ScratchDir dir;
  ExpectPackOnlyEqualsConvert("glm4moe", dir.path());
}

// llama.cpp's gpt-oss loader (llama-model.cpp, LLM_ARCH_OPENAI_MOE): q/k/v and output biases, attn_sinks, the
// FFN norm named post_attention_norm, the router's bias and per-expert biases ([width, n_expert], f32), the
// sliding window and YaRN keys.
TEST(SynthTest, GptOssHasLlamaCppTensorNamesShapesAndKeys) {
  ScratchDir dir;
  SynthOptions o = TinyOptions(dir.Join("m.gguf"));
  o.geometry = *PresetGeometry("gpt-oss", "tiny");
  ASSERT_THAT(SynthesizeGguf(o), IsOk());
  auto file = gguf::GgufFile::Open(o.output);
  ASSERT_TRUE(file.ok()) << file.status();
  const gguf::Metadata& m = (*file)->metadata();
  EXPECT_EQ(*m.GetString("general.architecture"), "gpt-oss");
  EXPECT_EQ(*m.GetUint("gpt-oss.expert_feed_forward_length"), 128u);
  EXPECT_EQ(*m.GetUint("gpt-oss.attention.sliding_window"), 8u);
  EXPECT_EQ(*m.GetString("gpt-oss.rope.scaling.type"), "yarn");
  EXPECT_FLOAT_EQ(static_cast<float>(*m.GetFloat("gpt-oss.rope.scaling.factor")), 32.0f);
  EXPECT_EQ(*m.GetUint("gpt-oss.rope.scaling.original_context_length"), 4096u);
  EXPECT_FLOAT_EQ(static_cast<float>(*m.GetFloat("gpt-oss.rope.freq_base")), 150000.0f);
  auto shape = [&](const std::string& name) {
    const gguf::TensorInfo* t = (*file)->FindTensor(name);
    return t == nullptr ? std::vector<int64_t>{} : t->ne;
  };
  EXPECT_EQ(shape("blk.0.attn_q.bias"), (std::vector<int64_t>{128}));
  EXPECT_EQ(shape("blk.0.attn_output.bias"), (std::vector<int64_t>{128}));
  EXPECT_EQ(shape("blk.0.attn_sinks.weight"), (std::vector<int64_t>{4}));
  EXPECT_EQ(shape("blk.0.post_attention_norm.weight"), (std::vector<int64_t>{128}));
  EXPECT_EQ(shape("blk.0.ffn_norm.weight"), std::vector<int64_t>{});
  EXPECT_EQ(shape("blk.1.ffn_gate_inp.bias"), (std::vector<int64_t>{8}));
  EXPECT_EQ(shape("blk.1.ffn_gate_exps.bias"), (std::vector<int64_t>{128, 8}));
  EXPECT_EQ(shape("blk.1.ffn_up_exps.bias"), (std::vector<int64_t>{128, 8}));
  EXPECT_EQ(shape("blk.1.ffn_down_exps.bias"), (std::vector<int64_t>{128, 8}));
  EXPECT_EQ((*file)->FindTensor("blk.1.ffn_down_exps.bias")->type, gguf::GgmlType::kF32);
}

// The expert biases travel in dense.gguf (f32, llama.cpp's names), whether synth writes the pack or convert
// makes it from the GGUF; both packs validate and hold the same experts.
TEST(SynthTest, GptOssPackOnlyEqualsSynthesizeThenConvertWithTheExpertBiasesInDenseGguf) {
  ScratchDir dir;
  ExpectPackOnlyEqualsConvert("gpt-oss", dir.path());
  for (const std::string pack : {"direct", "converted"}) {
    auto dense = gguf::GgufFile::Open(dir.Join(pack + "/dense.gguf"));
    ASSERT_TRUE(dense.ok()) << dense.status();
    for (const std::string role : {"gate", "up", "down"}) {
      const gguf::TensorInfo* t = (*dense)->FindTensor("blk.1.ffn_" + role + "_exps.bias");
      ASSERT_NE(t, nullptr) << pack << " " << role;
      EXPECT_EQ(t->type, gguf::GgmlType::kF32);
      EXPECT_EQ(t->ne, (std::vector<int64_t>{128, 8}));
    }
    EXPECT_EQ((*dense)->FindTensor("blk.1.ffn_gate_exps.weight"), nullptr);
    auto report = ValidatePack(dir.Join(pack), ValidateOptions{});
    ASSERT_TRUE(report.ok()) << report.status();
    for (const ValidationProblem& p : report->problems) ADD_FAILURE() << pack << ": " << p.file << ": " << p.message;
  }
}

// gpt-oss-120b's geometry, as the real-size preset.
TEST(SynthTest, GptOssSeedPresetIsGptOss120b) {
  const SynthGeometry g = *PresetGeometry("gpt-oss", "seed");
  EXPECT_EQ(g.n_layer, 36);
  EXPECT_EQ(g.n_expert, 128);
  EXPECT_EQ(g.n_expert_used, 4);
  EXPECT_EQ(g.n_embd, 2880);
  EXPECT_EQ(g.expert_ff, 2880);
  EXPECT_EQ(g.n_head, 64);
  EXPECT_EQ(g.n_head_kv, 8);
  EXPECT_EQ(g.head_dim, 64);
  EXPECT_EQ(g.sliding_window, 128);
  EXPECT_THAT(CheckSynthGeometry(g), IsOk());
}

TEST(SynthTest, PackOnlyEqualsSynthesizeThenConvert) {
  ScratchDir dir;
  const pack::v1::Manifest converted = testing::MakeTinyPack(dir.Join("m.gguf"), dir.Join("converted"),
                                                              kernels::Scheme::kS4);
  SynthOptions o = TinyOptions(dir.Join("direct"));
  o.pack_scheme = kernels::Scheme::kS4;
  o.exact_quantize = true;
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

// ---- Random codes (exact_quantize = false) ----

constexpr kernels::Scheme kAllSchemes[] = {kernels::Scheme::kF16, kernels::Scheme::kS8, kernels::Scheme::kS4,
                                           kernels::Scheme::kS2, kernels::Scheme::kMxfp4};

std::string Name(kernels::Scheme scheme) { return std::string(kernels::SchemeName(scheme)); }

// A tiny model whose roles differ in spread (gate and up 1/sqrt(128), down 1/sqrt(256)), as random codes.
SynthOptions RandomCodeOptions(const std::string& path, kernels::Scheme scheme) {
  SynthOptions o = TinyOptions(path);
  o.geometry.expert_ff = 256;
  o.pack_scheme = scheme;
  o.exact_quantize = false;
  return o;
}

// The standard deviation of the f32 weights of role r (what the float path draws).
double RoleStd(const SynthGeometry& g, int r) {
  return 1.0 / std::sqrt(static_cast<double>(r == kernels::kDown ? g.expert_ff : g.n_embd));
}

// The blobs of a pack, one vector of bytes.
struct PackBlobs {
  pack::BlobLayout layout;
  std::vector<uint8_t> bytes;
  int64_t count = 0;
  const uint8_t* Role(int64_t blob, int r) const { return bytes.data() + blob * layout.blob_bytes + layout.role_offset[r]; }
};

PackBlobs ReadBlobs(const std::string& pack_dir, const SynthOptions& o) {
  PackBlobs b;
  b.layout = *pack::ComputeBlobLayout(o.pack_scheme, o.geometry.n_embd, o.geometry.expert_ff);
  b.bytes = ReadFileBytes(pack_dir + "/experts.bin");
  b.count = o.geometry.n_layer * o.geometry.n_expert;
  EXPECT_EQ(b.bytes.size(), static_cast<uint64_t>(b.count) * b.layout.blob_bytes);
  return b;
}

TEST(SynthRandomCodesTest, PacksOfEverySchemeValidateAndSayTheyAreRandomCodes) {
  ScratchDir dir;
  for (kernels::Scheme scheme : kAllSchemes) {
    const SynthOptions o = RandomCodeOptions(dir.Join(Name(scheme)), scheme);
    auto manifest = SynthesizePack(o, nullptr, nullptr);
    ASSERT_TRUE(manifest.ok()) << Name(scheme) << ": " << manifest.status();
    EXPECT_EQ(manifest->scheme(), Name(scheme));
    EXPECT_EQ(manifest->created_by(), kSynthRandomCodesCreatedBy);
    EXPECT_EQ(manifest->quant_error_size(), 0) << "random codes have no quantization error to report";
    EXPECT_FALSE(std::filesystem::exists(o.output + ".partial"));
    auto report = ValidatePack(o.output, ValidateOptions{});
    ASSERT_TRUE(report.ok()) << report.status();
    for (const ValidationProblem& p : report->problems) ADD_FAILURE() << Name(scheme) << ": " << p.file << ": " << p.message;
    EXPECT_EQ(report->blobs_checked, 16u);
  }
}

TEST(SynthRandomCodesTest, SameSeedGivesTheSameBytesAndAnotherSeedDoesNot) {
  ScratchDir dir;
  SynthOptions a = RandomCodeOptions(dir.Join("a"), kernels::Scheme::kS2);
  SynthOptions b = a;
  b.output = dir.Join("b");
  b.threads = 1;  // the thread count must not change the bytes
  SynthOptions c = a;
  c.output = dir.Join("c");
  c.seed = 8;
  auto ma = SynthesizePack(a, nullptr, nullptr);
  auto mb = SynthesizePack(b, nullptr, nullptr);
  auto mc = SynthesizePack(c, nullptr, nullptr);
  ASSERT_TRUE(ma.ok() && mb.ok() && mc.ok());
  const std::vector<uint8_t> experts_a = ReadFileBytes(a.output + "/experts.bin");
  EXPECT_EQ(experts_a, ReadFileBytes(b.output + "/experts.bin"));
  EXPECT_NE(experts_a, ReadFileBytes(c.output + "/experts.bin"));
  EXPECT_EQ(ReadFileBytes(a.output + "/dense.gguf"), ReadFileBytes(b.output + "/dense.gguf"));
  // Every expert has its own codes.
  const std::set<std::string> distinct(ma->blob_xxh3().begin(), ma->blob_xxh3().end());
  EXPECT_EQ(distinct.size(), static_cast<size_t>(ma->blob_xxh3_size()));
}

TEST(SynthRandomCodesTest, DecodedWeightsHaveTheSpreadOfTheFloatWeights) {
  ScratchDir dir;
  for (kernels::Scheme scheme : kAllSchemes) {
    const SynthOptions o = RandomCodeOptions(dir.Join(Name(scheme)), scheme);
    ASSERT_TRUE(SynthesizePack(o, nullptr, nullptr).ok()) << Name(scheme);
    const PackBlobs blobs = ReadBlobs(o.output, o);
    const int64_t rows[3] = {o.geometry.expert_ff, o.geometry.expert_ff, o.geometry.n_embd};
    const int64_t cols[3] = {o.geometry.n_embd, o.geometry.n_embd, o.geometry.expert_ff};
    for (int r = 0; r < 3; ++r) {
      std::vector<float> w(static_cast<size_t>(rows[r] * cols[r]));
      double sum = 0, sum2 = 0;
      for (int64_t blob = 0; blob < blobs.count; ++blob) {
        kernels::DequantizeRole(scheme, blobs.Role(blob, r), rows[r], cols[r], w.data());
        for (float v : w) {
          ASSERT_TRUE(std::isfinite(v));
          sum += v;
          sum2 += static_cast<double>(v) * v;
        }
      }
      const double n = static_cast<double>(w.size() * blobs.count);
      const double mean = sum / n, spread = std::sqrt(sum2 / n - mean * mean);
      const double expected = RoleStd(o.geometry, r);
      // Over 16 x 32768 weights the sample's own spread is ~0.1%; scales rounded to half add ~0.05%; mxfp4's
      // powers of two up to 5%.
      EXPECT_NEAR(spread / expected, 1.0, scheme == kernels::Scheme::kMxfp4 ? 0.05 : 0.01)
          << Name(scheme) << " " << kernels::kRoleNames[r];
      EXPECT_LT(std::fabs(mean), 0.01 * expected) << Name(scheme) << " " << kernels::kRoleNames[r];
    }
  }
}

TEST(SynthRandomCodesTest, CodesAreInRangeAndScalesPositiveAndS4Centred) {
  ScratchDir dir;
  namespace layout = kernels::layout;
  for (kernels::Scheme scheme :
       {kernels::Scheme::kS8, kernels::Scheme::kS4, kernels::Scheme::kS2, kernels::Scheme::kMxfp4}) {
    const SynthOptions o = RandomCodeOptions(dir.Join(Name(scheme)), scheme);
    ASSERT_TRUE(SynthesizePack(o, nullptr, nullptr).ok()) << Name(scheme);
    const PackBlobs blobs = ReadBlobs(o.output, o);
    int min_code = 0, max_code = 0;
    for (int64_t blob = 0; blob < blobs.count; ++blob) {
      for (int r = 0; r < 3; ++r) {
        const int64_t rows = blobs.layout.rows(r), cols = blobs.layout.cols(r);
        const uint8_t* role = blobs.Role(blob, r);
        const int64_t codes = layout::CodesBytes(scheme, rows, cols);
        if (scheme == kernels::Scheme::kS8) {
          for (int64_t i = 0; i < codes; ++i) {
            const int q = static_cast<int8_t>(role[i]);
            ASSERT_NE(q, -128) << "blob " << blob << " role " << r << " byte " << i;
            min_code = std::min(min_code, q);
            max_code = std::max(max_code, q);
          }
        }
        for (int64_t row = 0; row < rows; ++row) {
          for (int64_t g = 0; g < cols / layout::Group(scheme); ++g) {
            const uint8_t* at = role + layout::ScaleOffset(scheme, rows, cols, row, g);
            const float d = scheme == kernels::Scheme::kMxfp4 ? kernels::Mxfp4Scale(*at)
                                                              : kernels::HalfToFloat(kernels::LoadHalf(at));
            ASSERT_TRUE(d > 0 && std::isfinite(d)) << Name(scheme) << " scale " << d;
            if (scheme == kernels::Scheme::kS4) {
              // w = d q + m over q = 0 .. 15 is centred when m = -7.5 d (up to rounding m to half).
              const float m = kernels::HalfToFloat(kernels::LoadHalf(at + layout::kMinOffsetInRecord));
              ASSERT_NEAR(m, -7.5f * d, 7.5f * d / 1024) << "blob " << blob << " role " << r;
            }
          }
        }
      }
    }
    if (scheme == kernels::Scheme::kS8) {
      EXPECT_EQ(min_code, -127);
      EXPECT_EQ(max_code, 127);
    }
  }
}

TEST(SynthRandomCodesTest, ProgressCancellationAndExistingOutputAsForTheExactPath) {
  ScratchDir dir;
  SynthOptions o = RandomCodeOptions(dir.Join("p"), kernels::Scheme::kS4);
  std::vector<std::string> phases;
  ConvertProgress last;
  auto manifest = SynthesizePack(
      o,
      [&](const ConvertProgress& p) {
        if (phases.empty() || phases.back() != p.phase) phases.push_back(p.phase);
        last = p;
      },
      nullptr);
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  EXPECT_THAT(phases, ::testing::ElementsAre("dense", "experts", "finish", "done"));
  EXPECT_EQ(last.experts_done, 16u);
  EXPECT_EQ(last.bytes_done, manifest->experts_bytes());
  EXPECT_TRUE(std::isnan(last.rel_rms_error)) << "not measured, so not a number";
  // An existing output is never touched.
  EXPECT_THAT(SynthesizePack(o, nullptr, nullptr).status(), StatusIs(absl::StatusCode::kAlreadyExists));

  // Cancelled while writing experts: nothing is left behind.
  std::atomic<bool> cancel{false};
  SynthOptions c = RandomCodeOptions(dir.Join("c"), kernels::Scheme::kS4);
  auto cancelled = SynthesizePack(
      c,
      [&](const ConvertProgress& p) {
        if (p.phase == "experts") cancel = true;
      },
      &cancel);
  EXPECT_THAT(cancelled.status(), StatusIs(absl::StatusCode::kCancelled));
  EXPECT_FALSE(std::filesystem::exists(c.output));
  EXPECT_FALSE(std::filesystem::exists(c.output + ".partial"));
}

TEST(SynthRandomCodesTest, RoleFillerRefusesABadSpreadAndKnowsItsLevels) {
  std::vector<uint8_t> role(kernels::RoleBytes(kernels::Scheme::kS2, 16, 64));
  EXPECT_THAT(FillRandomRole(kernels::Scheme::kS2, 16, 64, 0.0f, 1, 0, role.data()),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(FillRandomRole(kernels::Scheme::kS2, 16, 64, NAN, 1, 0, role.data()),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(FillRandomRole(kernels::Scheme::kS8, 16, 64, 1e30f, 1, 0, role.data()),
              StatusIs(absl::StatusCode::kInternal));
  EXPECT_DOUBLE_EQ(RandomCodeLevelMeanSquare(kernels::Scheme::kS2), 5.0);
  EXPECT_DOUBLE_EQ(RandomCodeLevelMeanSquare(kernels::Scheme::kS4), 21.25);
  EXPECT_DOUBLE_EQ(RandomCodeLevelMeanSquare(kernels::Scheme::kS8), 5397.5);
  EXPECT_DOUBLE_EQ(RandomCodeLevelMeanSquare(kernels::Scheme::kMxfp4), 34.25);  // 2 x 274 / 16
}

class SynthRandomCodesEngineTest : public ::testing::TestWithParam<kernels::Scheme> {};

// The engine decodes a pack of random codes into finite, varied logits, the same as the float reference
// reading the same pack (up to the int8 activations of the integer schemes).
TEST_P(SynthRandomCodesEngineTest, DecodesTokensWithFiniteLogits) {
  ScratchDir dir;
  SynthOptions o = TinyOptions(dir.Join("pack"));
  o.pack_scheme = GetParam();
  o.exact_quantize = false;
  ASSERT_TRUE(SynthesizePack(o, nullptr, nullptr).ok());
  runtime::EngineOptions eo;
  eo.pack_dir = o.output;
  eo.threads = 2;
  eo.max_seqs = 1;
  eo.max_ctx = 64;
  auto engine = runtime::Engine::Create(eo);
  ASSERT_TRUE(engine.ok()) << engine.status();
  runtime::GenerateRequest req;
  req.prompt_tokens = {5, 77, 140, 3, 250, 31};
  req.sampling.temperature = 0;
  req.sampling.max_tokens = 8;
  req.sampling.ignore_eos = true;
  auto first = (*engine)->Generate(req);
  ASSERT_TRUE(first.ok() && first->result.status.ok());
  ASSERT_EQ(first->result.tokens.size(), 8u);

  // The logits of every position of prompt + decoded tokens.
  req.prompt_tokens.insert(req.prompt_tokens.end(), first->result.tokens.begin(), first->result.tokens.end());
  req.sampling.max_tokens = 1;
  req.prompt_logits = true;
  auto all = (*engine)->Generate(req);
  ASSERT_TRUE(all.ok() && all->result.status.ok());
  auto ref = strata::testing::ReferenceModel::FromPack(o.output);
  ASSERT_TRUE(ref.ok()) << ref.status();
  const int64_t n_vocab = (*ref)->n_vocab();
  const std::vector<float> expected = (*ref)->Logits(req.prompt_tokens);
  const std::vector<float>& logits = all->result.prompt_logits;
  ASSERT_EQ(logits.size(), expected.size());
  for (size_t p = 0; p < req.prompt_tokens.size(); ++p) {
    const float* row = logits.data() + p * n_vocab;
    const float* want = expected.data() + p * n_vocab;
    double sum = 0, sum2 = 0, err2 = 0, ref2 = 0;
    for (int64_t v = 0; v < n_vocab; ++v) {
      ASSERT_TRUE(std::isfinite(row[v])) << "position " << p << " token " << v;
      sum += row[v];
      sum2 += static_cast<double>(row[v]) * row[v];
      err2 += (static_cast<double>(row[v]) - want[v]) * (static_cast<double>(row[v]) - want[v]);
      ref2 += static_cast<double>(want[v]) * want[v];
    }
    const double mean = sum / n_vocab;
    // The float path's logits have a spread of about 2 (output weights of std 2/sqrt(n_embd)).
    EXPECT_GT(std::sqrt(sum2 / n_vocab - mean * mean), 0.5) << "position " << p;
    EXPECT_LT(std::sqrt(err2 / ref2), GetParam() == kernels::Scheme::kF16 ? 1e-3 : 0.02) << "position " << p;
  }
}

INSTANTIATE_TEST_SUITE_P(SynthRandomCodeSchemes, SynthRandomCodesEngineTest, ::testing::ValuesIn(kAllSchemes),
                         [](const auto& info) { return Name(info.param); });

}  // namespace
}  // namespace strata::packtool
