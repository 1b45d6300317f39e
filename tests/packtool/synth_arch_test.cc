// synth --arch deepseek2: llama.cpp's tensor names, shapes and keys for DeepSeek (src/llama-model.cpp,
// LLM_ARCH_DEEPSEEK2 with attn_kv_b), its presets, the pack written directly, and a pack too large for the disk
// refused before anything is written; --mtp-layers' multi-token-prediction blocks (glm4moe, deepseek2).

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/gguf/gguf_file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "packtool/synth.h"
#include "packtool/synth_arch.h"
#include "tests/packtool/packtool_test_util.h"
#include "tests/testing/test_util.h"

namespace strata::packtool {
namespace {

using ::strata::testing::ReadFileBytes;
using ::strata::testing::ScratchDir;
using testing::ExpectPackOnlyEqualsConvert;
using testing::TinyOptions;

// The ggml shape of each tensor of the file, empty when it is absent.
class Shapes {
 public:
  explicit Shapes(const gguf::GgufFile& file) : file_(file) {}
  std::vector<int64_t> operator()(const std::string& name) const {
    const gguf::TensorInfo* t = file_.FindTensor(name);
    return t == nullptr ? std::vector<int64_t>{} : t->ne;
  }

 private:
  const gguf::GgufFile& file_;
};

// tiny: V2-Lite's kind. Block 0 dense; q projected directly; 4 heads of 32 nope + 16 rope values, 32 value
// values; latent 64; softmax router (no exp_probs_b) in 4 groups; 2 shared experts; YaRN.
TEST(SynthArchTest, Deepseek2TinyHasLlamaCppTensorNamesShapesAndKeys) {
  ScratchDir dir;
  SynthOptions o = TinyOptions(dir.Join("m.gguf"));
  o.geometry = *PresetGeometry("deepseek2", "tiny");
  ASSERT_THAT(SynthesizeGguf(o), IsOk());
  auto file = gguf::GgufFile::Open(o.output);
  ASSERT_TRUE(file.ok()) << file.status();
  const gguf::Metadata& m = (*file)->metadata();
  EXPECT_EQ(*m.GetString("general.architecture"), "deepseek2");
  EXPECT_EQ(*m.GetUint("deepseek2.attention.key_length"), 48u);
  EXPECT_EQ(*m.GetUint("deepseek2.attention.value_length"), 32u);
  EXPECT_EQ(*m.GetUint("deepseek2.attention.kv_lora_rank"), 64u);
  EXPECT_FALSE(m.Has("deepseek2.attention.q_lora_rank"));
  EXPECT_EQ(*m.GetUint("deepseek2.rope.dimension_count"), 16u);
  EXPECT_EQ(*m.GetUint("deepseek2.leading_dense_block_count"), 1u);
  EXPECT_EQ(*m.GetUint("deepseek2.expert_shared_count"), 2u);
  EXPECT_EQ(*m.GetUint("deepseek2.expert_gating_func"), 1u);
  EXPECT_EQ(*m.GetUint("deepseek2.expert_group_count"), 4u);
  EXPECT_EQ(*m.GetUint("deepseek2.expert_group_used_count"), 2u);
  EXPECT_FALSE(*m.GetBool("deepseek2.expert_weights_norm"));
  EXPECT_EQ(*m.GetString("deepseek2.rope.scaling.type"), "yarn");
  EXPECT_FLOAT_EQ(static_cast<float>(*m.GetFloat("deepseek2.rope.scaling.factor")), 4.0f);
  EXPECT_EQ(*m.GetUint("deepseek2.rope.scaling.original_context_length"), 512u);
  const Shapes shape(**file);
  EXPECT_EQ(shape("blk.0.attn_q.weight"), (std::vector<int64_t>{128, 4 * 48}));
  EXPECT_EQ(shape("blk.0.attn_q_a.weight"), std::vector<int64_t>{});
  EXPECT_EQ(shape("blk.0.attn_k.weight"), std::vector<int64_t>{});
  EXPECT_EQ(shape("blk.0.attn_kv_a_mqa.weight"), (std::vector<int64_t>{128, 64 + 16}));
  EXPECT_EQ(shape("blk.0.attn_kv_a_norm.weight"), (std::vector<int64_t>{64}));
  EXPECT_EQ(shape("blk.0.attn_kv_b.weight"), (std::vector<int64_t>{64, 4 * (32 + 32)}));
  EXPECT_EQ(shape("blk.0.attn_output.weight"), (std::vector<int64_t>{4 * 32, 128}));
  EXPECT_EQ(shape("blk.0.ffn_gate.weight"), (std::vector<int64_t>{128, 256}));
  EXPECT_EQ(shape("blk.0.ffn_norm.weight"), (std::vector<int64_t>{128}));
  EXPECT_EQ(shape("blk.0.ffn_gate_inp.weight"), std::vector<int64_t>{});
  EXPECT_EQ(shape("blk.1.ffn_gate_inp.weight"), (std::vector<int64_t>{128, 8}));
  EXPECT_EQ(shape("blk.1.exp_probs_b.bias"), std::vector<int64_t>{});
  EXPECT_EQ(shape("blk.1.ffn_up_exps.weight"), (std::vector<int64_t>{128, 128, 8}));
  EXPECT_EQ(shape("blk.1.ffn_up_shexp.weight"), (std::vector<int64_t>{128, 256}));
  EXPECT_EQ(shape("blk.1.ffn_gate_inp_shexp.weight"), std::vector<int64_t>{});
}

// small: V3's kind. q through a LoRA, sigmoid router with exp_probs_b, renormalised and scaled by 2.5.
TEST(SynthArchTest, Deepseek2SmallHasQLoraAndTheSigmoidRouter) {
  const SynthGeometry g = *PresetGeometry("deepseek2", "small");
  const std::vector<SynthTensor> tensors = SynthTensors(**FindSynthArch("deepseek2"), g);
  auto find = [&](const std::string& name) -> std::vector<int64_t> {
    for (const SynthTensor& t : tensors) {
      if (t.name == name) return t.ne;
    }
    return {};
  };
  EXPECT_EQ(find("blk.1.attn_q_a.weight"), (std::vector<int64_t>{512, 192}));
  EXPECT_EQ(find("blk.1.attn_q_a_norm.weight"), (std::vector<int64_t>{192}));
  EXPECT_EQ(find("blk.1.attn_q_b.weight"), (std::vector<int64_t>{192, 8 * 96}));
  EXPECT_EQ(find("blk.1.attn_q.weight"), std::vector<int64_t>{});
  EXPECT_EQ(find("blk.1.exp_probs_b.bias"), (std::vector<int64_t>{32}));
  EXPECT_EQ(find("blk.0.exp_probs_b.bias"), std::vector<int64_t>{});
  EXPECT_EQ(g.expert_gating, 2);
  EXPECT_TRUE(g.expert_weights_norm);
  EXPECT_FLOAT_EQ(g.expert_weights_scale, 2.5f);
  EXPECT_GT(g.n_expert_group, 1);
  EXPECT_GT(g.n_dense_lead, 0);
  EXPECT_EQ(g.shared_ff, g.expert_ff);
}

// seed: DeepSeek-V3 (deepseek-ai/DeepSeek-V3 config.json).
TEST(SynthArchTest, Deepseek2SeedIsDeepSeekV3) {
  const SynthGeometry g = *PresetGeometry("deepseek2", "seed");
  EXPECT_EQ(g.n_layer, 61);
  EXPECT_EQ(g.n_dense_lead, 3);
  EXPECT_EQ(g.dense_ff, 18432);
  EXPECT_EQ(g.n_expert, 256);
  EXPECT_EQ(g.n_expert_used, 8);
  EXPECT_EQ(g.n_expert_group, 8);
  EXPECT_EQ(g.n_group_used, 4);
  EXPECT_EQ(g.n_embd, 7168);
  EXPECT_EQ(g.expert_ff, 2048);
  EXPECT_EQ(g.shared_ff, 2048);
  EXPECT_EQ(g.n_head, 128);
  EXPECT_EQ(g.head_dim, 128 + 64);
  EXPECT_EQ(g.rope_dim, 64);
  EXPECT_EQ(g.v_dim, 128);
  EXPECT_EQ(g.kv_lora_rank, 512);
  EXPECT_EQ(g.q_lora_rank, 1536);
  EXPECT_FLOAT_EQ(g.yarn_factor, 40.0f);
  EXPECT_EQ(g.yarn_original_context, 4096);
  EXPECT_THAT(CheckSynthGeometry(g), IsOk());
}

TEST(SynthArchTest, Deepseek2GeometryThatDoesNotFitIsRefused) {
  SynthGeometry g = *PresetGeometry("deepseek2", "tiny");
  g.n_expert = 10;  // not a multiple of the 4 groups
  EXPECT_THAT(CheckSynthGeometry(g), StatusIsWith(absl::StatusCode::kInvalidArgument, "deepseek2"));
  g = *PresetGeometry("deepseek2", "tiny");
  g.n_expert_used = 5;  // 2 groups of 2 hold 4
  EXPECT_THAT(CheckSynthGeometry(g), StatusIsWith(absl::StatusCode::kInvalidArgument, "groups"));
}

// The pack written directly skips the dense block as convert does: the same experts and geometry.
TEST(SynthArchTest, Deepseek2PackOnlyEqualsSynthesizeThenConvert) {
  ScratchDir dir;
  const pack::v1::Manifest converted = ExpectPackOnlyEqualsConvert("deepseek2", dir.path());
  EXPECT_EQ(converted.geometry().n_shared_experts(), 2u);
  EXPECT_EQ(converted.geometry().n_moe_layers(), 2u);
}

// V3's geometry with 65536 experts a layer needs petabytes: refused before anything is written, naming the
// directory.
TEST(SynthArchTest, APackTheDiskCannotHoldIsRefusedBeforeWriting) {
  ScratchDir dir;
  SynthOptions o = TinyOptions(dir.Join("huge"));
  o.geometry = *PresetGeometry("deepseek2", "seed");
  o.geometry.n_expert = 65536;
  o.exact_quantize = false;
  auto pack = SynthesizePack(o, nullptr, nullptr);
  EXPECT_THAT(pack.status(), StatusIsWith(absl::StatusCode::kResourceExhausted, dir.path()));
  EXPECT_FALSE(std::filesystem::exists(o.output));
}

// --mtp-layers: GLM-4.5's multi-token-prediction block as llama.cpp's converter writes it (src/llama-model.cpp,
// LLM_ARCH_GLM4_MOE: a MoE block's own tensors plus blk.N.nextn.*), counted in block_count and said by
// nextn_predict_layers; every other tensor is that of the model without it.
TEST(SynthArchTest, MtpLayersAreBlocksWithTheNextnTensorsAfterTheModels) {
  ScratchDir dir;
  SynthOptions o = TinyOptions(dir.Join("plain.gguf"));
  o.geometry = *PresetGeometry("glm4moe", "tiny");  // 2 blocks, n_embd 128, 8 experts of 128
  ASSERT_THAT(SynthesizeGguf(o), IsOk());
  o.geometry.n_mtp_layers = 1;
  o.output = dir.Join("mtp.gguf");
  ASSERT_THAT(SynthesizeGguf(o), IsOk());
  auto plain = gguf::GgufFile::Open(dir.Join("plain.gguf"));
  auto mtp = gguf::GgufFile::Open(dir.Join("mtp.gguf"));
  ASSERT_TRUE(plain.ok() && mtp.ok());
  const Shapes shape(**mtp);
  const int64_t e = 128, v = shape("token_embd.weight").at(1);
  EXPECT_EQ(shape("blk.2.nextn.eh_proj.weight"), (std::vector<int64_t>{2 * e, e}));
  EXPECT_EQ(shape("blk.2.nextn.embed_tokens.weight"), (std::vector<int64_t>{e, v}));
  EXPECT_EQ(shape("blk.2.nextn.shared_head_head.weight"), (std::vector<int64_t>{e, v}));
  for (const char* norm : {"enorm", "hnorm", "shared_head_norm"}) {
    EXPECT_EQ(shape(absl::StrCat("blk.2.nextn.", norm, ".weight")), (std::vector<int64_t>{e})) << norm;
  }
  EXPECT_EQ(shape("blk.2.ffn_gate_exps.weight"), (std::vector<int64_t>{e, 128, 8}));
  EXPECT_EQ(shape("blk.2.exp_probs_b.bias"), (std::vector<int64_t>{8}));
  EXPECT_EQ(shape("blk.2.attn_q.weight"), shape("blk.1.attn_q.weight"));
  EXPECT_TRUE(shape("blk.1.nextn.eh_proj.weight").empty());
  EXPECT_TRUE(shape("blk.3.attn_norm.weight").empty());
  EXPECT_EQ(*(*mtp)->metadata().GetUint("glm4moe.block_count"), 3u);
  EXPECT_EQ(*(*mtp)->metadata().GetUint("glm4moe.nextn_predict_layers"), 1u);
  EXPECT_FALSE((*plain)->metadata().Has("glm4moe.nextn_predict_layers"));
  for (const gguf::TensorInfo& t : (*plain)->tensors()) {
    const gguf::TensorInfo* u = (*mtp)->FindTensor(t.name);
    ASSERT_NE(u, nullptr) << t.name;
    ASSERT_EQ(t.bytes, u->bytes) << t.name;
    EXPECT_EQ(std::memcmp(t.data, u->data, t.bytes), 0) << t.name;
  }
  EXPECT_EQ((*mtp)->tensors().size(), (*plain)->tensors().size() + 17 + 6);  // the block's 17, nextn's 6
}

TEST(SynthArchTest, MtpLayersAreRefusedWhereTheyDoNotBelongNamingTheFlag) {
  ScratchDir dir;
  SynthGeometry g = *PresetGeometry("qwen3moe", "tiny");
  g.n_mtp_layers = 1;
  EXPECT_THAT(CheckSynthGeometry(g),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "--mtp-layers: architecture qwen3moe has no"));
  g = *PresetGeometry("deepseek2", "tiny");
  g.n_mtp_layers = -1;
  EXPECT_THAT(CheckSynthGeometry(g), StatusIsWith(absl::StatusCode::kInvalidArgument, "--mtp-layers: -1 is out of range"));
  g.n_mtp_layers = 1;
  EXPECT_THAT(CheckSynthGeometry(g), IsOk());
  SynthOptions o = TinyOptions(dir.Join("pack"));
  o.geometry = g;
  EXPECT_THAT(SynthesizePack(o, nullptr, nullptr).status(),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "--mtp-layers: 1 with --pack-only"));
  EXPECT_FALSE(std::filesystem::exists(dir.Join("pack")));
}

// GLM-4.5's per-head q/k norm (--qk-norm): head_dim-wide attn_q_norm / attn_k_norm in every block; the other
// architectures have their own norm or none and refuse it.
TEST(SynthArchTest, Glm4MoeQkNormAddsPerHeadNormsAndOthersRefuseIt) {
  SynthGeometry g = *PresetGeometry("glm4moe", "tiny");
  g.head_qk_norm = true;
  EXPECT_THAT(CheckSynthGeometry(g), IsOk());
  const std::vector<SynthTensor> tensors = SynthTensors(**FindSynthArch("glm4moe"), g);
  int norms = 0;
  for (const SynthTensor& t : tensors) {
    if (t.name.find("attn_q_norm") == std::string::npos && t.name.find("attn_k_norm") == std::string::npos) continue;
    ++norms;
    EXPECT_EQ(t.ne, (std::vector<int64_t>{g.head_dim})) << t.name;
  }
  EXPECT_EQ(norms, 2 * g.n_layer);
  g.head_qk_norm = false;
  for (const SynthTensor& t : SynthTensors(**FindSynthArch("glm4moe"), g)) {
    EXPECT_EQ(t.name.find("attn_q_norm"), std::string::npos) << t.name;
  }
  SynthGeometry q = *PresetGeometry("qwen2moe", "tiny");
  q.head_qk_norm = true;
  EXPECT_THAT(CheckSynthGeometry(q), StatusIsWith(absl::StatusCode::kInvalidArgument, "--qk-norm"));
}

}  // namespace
}  // namespace strata::packtool
