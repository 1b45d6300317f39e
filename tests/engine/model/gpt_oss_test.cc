// gpt-oss's configuration (engine/model/gpt_oss.cc) and the RoPE scaling keys it brings
// (engine/model/rope_scaling.cc).

#include <string>
#include <utility>
#include <vector>

#include "engine/model/model_config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/test_util.h"

namespace strata::model {
namespace {

// The keys llama.cpp's converter writes for gpt-oss-120b, with a small geometry.
gguf::Metadata GptOssMetadata() {
  gguf::Metadata m;
  m.Add("general.architecture", gguf::Value::String("gpt-oss"));
  for (const auto& [key, v] : std::vector<std::pair<std::string, uint32_t>>{
           {"block_count", 4}, {"embedding_length", 128}, {"attention.head_count", 8},
           {"attention.head_count_kv", 2}, {"attention.key_length", 32}, {"attention.value_length", 32},
           {"context_length", 131072}, {"expert_count", 16}, {"expert_used_count", 4},
           {"expert_feed_forward_length", 64}, {"attention.sliding_window", 128},
           {"rope.scaling.original_context_length", 4096}}) {
    m.Add("gpt-oss." + key, gguf::Value::Uint32(v));
  }
  m.Add("gpt-oss.rope.freq_base", gguf::Value::Float32(150000.0f));
  m.Add("gpt-oss.rope.scaling.type", gguf::Value::String("yarn"));
  m.Add("gpt-oss.rope.scaling.factor", gguf::Value::Float32(32.0f));
  m.Add("tokenizer.ggml.tokens", gguf::Value::MakeArray(gguf::ValueType::kString, {gguf::Value::String("a")}));
  return m;
}

TEST(GptOssConfigTest, ReadsItsAttentionRouterExpertsAndYarn) {
  auto c = ReadModelConfig(GptOssMetadata());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->arch, "gpt-oss");
  EXPECT_EQ(c->expert_ff, 64);
  EXPECT_EQ(c->head_dim, 32);
  EXPECT_EQ(c->rope_style, RopeStyle::kNeox);
  EXPECT_TRUE(c->qkv_bias);
  EXPECT_TRUE(c->attn_sinks);
  EXPECT_TRUE(c->attn_output_bias);
  EXPECT_EQ(c->sliding_window, 128);
  EXPECT_EQ(c->router_gating, RouterGating::kSoftmaxTopK);
  EXPECT_TRUE(c->router_logit_bias);
  EXPECT_TRUE(c->expert_biases);
  EXPECT_TRUE(c->clamped_swiglu);
  EXPECT_EQ(c->ffn_norm_name, "post_attention_norm");
  ASSERT_TRUE(c->rope_yarn);
  EXPECT_FLOAT_EQ(c->yarn.factor, 32.0f);
  EXPECT_EQ(c->yarn.original_context, 4096);
  EXPECT_FLOAT_EQ(c->yarn.beta_fast, 32.0f);  // llama.cpp's defaults
  EXPECT_FLOAT_EQ(c->yarn.beta_slow, 1.0f);
  EXPECT_FLOAT_EQ(c->yarn.attn_factor, 1.0f);
  EXPECT_EQ(BlocksNeeded(*c), (std::vector<Block>{Block::kQkvBias, Block::kSinkWindowAttention, Block::kYarnRope,
                                                 Block::kSoftmaxTopKRouter, Block::kBiasedClampedExperts}));
}

TEST(GptOssConfigTest, EvenBlocksAreWindowedAsInLlamaCpp) {
  const ModelConfig c = *ReadModelConfig(GptOssMetadata());
  EXPECT_EQ(AttentionWindow(c, 0), 128);
  EXPECT_EQ(AttentionWindow(c, 1), 0);
  EXPECT_EQ(AttentionWindow(c, 2), 128);
  EXPECT_EQ(AttentionWindow(c, 3), 0);
  ModelConfig unwindowed = c;
  unwindowed.sliding_window = 0;
  EXPECT_EQ(AttentionWindow(unwindowed, 0), 0);
  // llama.cpp's pattern in general: of every swa_pattern blocks, all but the last are windowed.
  ModelConfig every_third = c;
  every_third.swa_pattern = 3;
  EXPECT_EQ(AttentionWindow(every_third, 0), 128);
  EXPECT_EQ(AttentionWindow(every_third, 1), 128);
  EXPECT_EQ(AttentionWindow(every_third, 2), 0);
  EXPECT_EQ(AttentionWindow(every_third, 3), 128);
}

TEST(GptOssConfigTest, RefusesMissingOrMathChangingKeysNamingThem) {
  struct Case {
    std::string key;
    gguf::Value value;
    absl::StatusCode code;
  };
  const std::vector<Case> cases = {
      {"gpt-oss.rope.scaling.type", gguf::Value::String("longrope"), absl::StatusCode::kUnimplemented},
      {"gpt-oss.rope.scaling.factor", gguf::Value::Float32(0.5f), absl::StatusCode::kInvalidArgument},
      {"gpt-oss.rope.scaling.yarn_log_multiplier", gguf::Value::Float32(0.1f), absl::StatusCode::kUnimplemented},
      {"gpt-oss.rope.scaling.yarn_ext_factor", gguf::Value::Float32(0.5f), absl::StatusCode::kUnimplemented},
      {"gpt-oss.rope.scaling.yarn_beta_fast", gguf::Value::Float32(-1.0f), absl::StatusCode::kInvalidArgument},
      {"gpt-oss.rope.scaling.original_context_length", gguf::Value::Uint32(0), absl::StatusCode::kInvalidArgument},
      {"gpt-oss.attention.sliding_window", gguf::Value::Uint32(0), absl::StatusCode::kInvalidArgument},
      {"gpt-oss.expert_gating_func", gguf::Value::Uint32(1), absl::StatusCode::kUnimplemented},
  };
  for (const Case& c : cases) {
    gguf::Metadata m = GptOssMetadata();
    m.Add(c.key, c.value);
    EXPECT_THAT(ReadModelConfig(m).status(), StatusIsWith(c.code, c.key)) << c.key;
  }
  // llama.cpp's value for its gating (SOFTMAX_WEIGHT) is accepted.
  gguf::Metadata m = GptOssMetadata();
  m.Add("gpt-oss.expert_gating_func", gguf::Value::Uint32(3));
  EXPECT_TRUE(ReadModelConfig(m).ok()) << ReadModelConfig(m).status();
  for (const std::string key : {"gpt-oss.attention.sliding_window", "gpt-oss.expert_feed_forward_length"}) {
    const gguf::Metadata full = GptOssMetadata();
    gguf::Metadata without;
    for (const auto& [k, v] : full.entries()) {
      if (k != key) without.Add(k, v);
    }
    EXPECT_THAT(ReadModelConfig(without).status(), StatusIsWith(absl::StatusCode::kNotFound, key)) << key;
  }
}

TEST(RopeScalingTest, YarnIsReadForAnyArchitectureAndLinearOnlyWithFactorOne) {
  gguf::Metadata m = GptOssMetadata();
  m.Add("gpt-oss.rope.scaling.yarn_beta_fast", gguf::Value::Float32(16.0f));
  m.Add("gpt-oss.rope.scaling.yarn_attn_factor", gguf::Value::Float32(0.5f));
  auto c = ReadModelConfig(m);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FLOAT_EQ(c->yarn.beta_fast, 16.0f);
  EXPECT_FLOAT_EQ(c->yarn.attn_factor, 0.5f);
  // Without original_context_length, llama.cpp's fallback: the training context.
  const gguf::Metadata full = GptOssMetadata();
  gguf::Metadata no_orig;
  for (const auto& [k, v] : full.entries()) {
    if (k != "gpt-oss.rope.scaling.original_context_length") no_orig.Add(k, v);
  }
  EXPECT_EQ(ReadModelConfig(no_orig)->yarn.original_context, 131072);
  gguf::Metadata none = GptOssMetadata();
  none.Add("gpt-oss.rope.scaling.type", gguf::Value::String("none"));
  none.Add("gpt-oss.rope.scaling.factor", gguf::Value::Float32(1.0f));
  ASSERT_TRUE(ReadModelConfig(none).ok());
  EXPECT_FALSE(ReadModelConfig(none)->rope_yarn);
  none.Add("gpt-oss.rope.scaling.type", gguf::Value::String("linear"));
  none.Add("gpt-oss.rope.scaling.factor", gguf::Value::Float32(2.0f));
  EXPECT_THAT(ReadModelConfig(none).status(),
              StatusIsWith(absl::StatusCode::kUnimplemented, "gpt-oss.rope.scaling.factor is 2"));
}

}  // namespace
}  // namespace strata::model
