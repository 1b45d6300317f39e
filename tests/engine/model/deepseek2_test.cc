// deepseek2's configuration: the keys of DeepSeek-V2-Lite and V3 GGUFs, and every refusal naming the key.

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "engine/model/model_config.h"
#include "engine/model/ops.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/test_util.h"

namespace strata::model {
namespace {

// DeepSeek-V3's keys at a small size: q LoRA, sigmoid router in 4 groups, YaRN.
gguf::Metadata V3Metadata() {
  gguf::Metadata m;
  m.Add("general.architecture", gguf::Value::String("deepseek2"));
  for (const auto& [key, v] : std::vector<std::pair<std::string, uint32_t>>{
           {"block_count", 3}, {"embedding_length", 128}, {"attention.head_count", 4},
           {"attention.head_count_kv", 4}, {"attention.key_length", 48}, {"attention.value_length", 32},
           {"attention.q_lora_rank", 96}, {"attention.kv_lora_rank", 64}, {"rope.dimension_count", 16},
           {"context_length", 16384}, {"expert_count", 16}, {"expert_used_count", 4},
           {"expert_feed_forward_length", 64}, {"feed_forward_length", 256}, {"expert_shared_count", 1},
           {"leading_dense_block_count", 1}, {"expert_gating_func", 2}, {"expert_group_count", 4},
           {"expert_group_used_count", 2}, {"rope.scaling.original_context_length", 4096}}) {
    m.Add("deepseek2." + key, gguf::Value::Uint32(v));
  }
  m.Add("deepseek2.expert_weights_norm", gguf::Value::Bool(true));
  m.Add("deepseek2.expert_weights_scale", gguf::Value::Float32(2.5f));
  m.Add("deepseek2.rope.scaling.type", gguf::Value::String("yarn"));
  m.Add("deepseek2.rope.scaling.factor", gguf::Value::Float32(40.0f));
  m.Add("deepseek2.rope.scaling.yarn_log_multiplier", gguf::Value::Float32(0.1f));
  m.Add("tokenizer.ggml.tokens", gguf::Value::MakeArray(gguf::ValueType::kString, {gguf::Value::String("a")}));
  return m;
}

// V2-Lite's: no q LoRA, no groups, no gating key (softmax, as older GGUFs), no rope scaling.
gguf::Metadata V2LiteMetadata() {
  gguf::Metadata m;
  m.Add("general.architecture", gguf::Value::String("deepseek2"));
  for (const auto& [key, v] : std::vector<std::pair<std::string, uint32_t>>{
           {"block_count", 2}, {"embedding_length", 128}, {"attention.head_count", 4},
           {"attention.key_length", 48}, {"attention.value_length", 32}, {"attention.kv_lora_rank", 64},
           {"rope.dimension_count", 16}, {"context_length", 2048}, {"expert_count", 8}, {"expert_used_count", 2},
           {"expert_feed_forward_length", 64}, {"expert_shared_count", 2}}) {
    m.Add("deepseek2." + key, gguf::Value::Uint32(v));
  }
  m.Add("tokenizer.ggml.tokens", gguf::Value::MakeArray(gguf::ValueType::kString, {gguf::Value::String("a")}));
  return m;
}

TEST(Deepseek2ConfigTest, ReadsV3WithLatentAttentionGroupsAndYarn) {
  auto c = ReadModelConfig(V3Metadata());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->head_dim, 48);
  EXPECT_EQ(c->rope_dim, 16);
  EXPECT_EQ(c->mla.nope_dim, 32);
  EXPECT_EQ(c->mla.v_dim, 32);
  EXPECT_EQ(c->mla.q_lora_rank, 96);
  EXPECT_EQ(c->mla.kv_lora_rank, 64);
  EXPECT_EQ(c->rope_style, RopeStyle::kNormal);
  EXPECT_EQ(c->router_gating, RouterGating::kSigmoid);
  EXPECT_TRUE(c->router_score_bias);
  EXPECT_TRUE(c->router_renorm);
  EXPECT_FLOAT_EQ(c->routed_scale, 2.5f);
  EXPECT_EQ(c->n_expert_group, 4);
  EXPECT_EQ(c->n_group_used, 2);
  EXPECT_EQ(c->group_score, GroupScore::kTopTwoSum);
  EXPECT_EQ(c->shared_expert_ff, 64);
  EXPECT_EQ(c->n_dense_lead, 1);
  EXPECT_EQ(c->dense_ff, 256);
  EXPECT_TRUE(c->rope_yarn);
  EXPECT_FLOAT_EQ(c->yarn.factor, 40.0f);
  EXPECT_EQ(c->yarn.original_context, 4096);
  // YaRN's magnitude is in the attention scale, not in the rotation (llama.cpp's deepseek2 graph).
  EXPECT_FALSE(c->yarn.rotation_magnitude);
  EXPECT_FLOAT_EQ(YarnMagnitude(c->yarn), 1.0f);
  // llama.cpp's kq_scale: (1 + 0.1 ln 40)^2 / sqrt(48) = 1.36889^2 / 6.9282 = 0.270466.
  EXPECT_NEAR(c->attention_scale, 0.270466f, 1e-5f);
  // The cache holds the latent and the RoPE'd key part, no values.
  EXPECT_EQ(CacheLayout(*c).key_dim, 64 + 16);
  EXPECT_EQ(CacheLayout(*c).value_dim, 0);
  EXPECT_EQ(BlocksNeeded(*c), (std::vector<Block>{Block::kSharedExpert, Block::kSigmoidRouter, Block::kRoutedScale,
                                                 Block::kDenseLeadingBlocks, Block::kYarnRope,
                                                 Block::kGroupedRouter, Block::kLatentAttention}));
}

TEST(Deepseek2ConfigTest, ReadsV2LiteWithItsDefaults) {
  auto c = ReadModelConfig(V2LiteMetadata());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->mla.q_lora_rank, 0);
  EXPECT_EQ(c->router_gating, RouterGating::kSoftmax);
  EXPECT_FALSE(c->router_score_bias);
  EXPECT_FALSE(c->router_renorm);
  EXPECT_FLOAT_EQ(c->routed_scale, 1.0f);
  EXPECT_EQ(c->n_expert_group, 1);
  EXPECT_EQ(c->shared_expert_ff, 128);
  EXPECT_EQ(c->n_dense_lead, 0);
  EXPECT_FALSE(c->rope_yarn);
  EXPECT_NEAR(c->attention_scale, 1.0f / std::sqrt(48.0f), 1e-7f);
  // A softmax router ranks groups by their best expert (V2's group_limited_greedy).
  gguf::Metadata grouped = V2LiteMetadata();
  grouped.Add("deepseek2.expert_group_count", gguf::Value::Uint32(4));
  grouped.Add("deepseek2.expert_group_used_count", gguf::Value::Uint32(2));
  auto g = ReadModelConfig(grouped);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->group_score, GroupScore::kMax);
}

// Newer converters split attn_kv_b: key_length / value_length then give the cached latent's sizes and the
// _mla keys the heads'.
TEST(Deepseek2ConfigTest, ReadsTheHeadSizesOfSplitGgufsFromTheMlaKeys) {
  gguf::Metadata m = V3Metadata();
  m.Add("deepseek2.attention.key_length", gguf::Value::Uint32(64 + 16));
  m.Add("deepseek2.attention.value_length", gguf::Value::Uint32(64));
  m.Add("deepseek2.attention.key_length_mla", gguf::Value::Uint32(48));
  m.Add("deepseek2.attention.value_length_mla", gguf::Value::Uint32(32));
  auto c = ReadModelConfig(m);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->head_dim, 48);
  EXPECT_EQ(c->mla.nope_dim, 32);
  EXPECT_EQ(c->mla.v_dim, 32);
  EXPECT_NEAR(c->attention_scale, 0.270466f, 1e-5f);  // over sqrt(48), not sqrt(80)
  m.Add("deepseek2.attention.key_length", gguf::Value::Uint32(48));
  EXPECT_THAT(ReadModelConfig(m).status(),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "deepseek2.attention.key_length is 48"));
  gguf::Metadata half = V3Metadata();
  half.Add("deepseek2.attention.key_length_mla", gguf::Value::Uint32(48));
  EXPECT_THAT(ReadModelConfig(half).status(),
              StatusIsWith(absl::StatusCode::kNotFound, "deepseek2.attention.value_length_mla"));
}

// DeepSeek-V3's GGUFs may count a multi-token-prediction block in block_count: it is left out.
TEST(Deepseek2ConfigTest, LeavesOutTheMultiTokenPredictionBlocks) {
  gguf::Metadata m = V3Metadata();
  m.Add("deepseek2.nextn_predict_layers", gguf::Value::Uint32(1));
  auto c = ReadModelConfig(m);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->n_layer, 2);
  EXPECT_EQ(c->n_mtp_blocks, 1);
  EXPECT_EQ(c->n_dense_lead, 1);
  m.Add("deepseek2.nextn_predict_layers", gguf::Value::Uint32(2));
  EXPECT_THAT(ReadModelConfig(m).status(),
              StatusIsWith(absl::StatusCode::kInvalidArgument,
                           "deepseek2.leading_dense_block_count is 1 and deepseek2.nextn_predict_layers is 2"));
}

TEST(Deepseek2ConfigTest, RefusesWhatItDoesNotImplementNamingTheKey) {
  struct Case {
    std::string key;
    gguf::Value value;
    absl::StatusCode code;
  };
  const std::vector<Case> cases = {
      // 3 blocks, the first dense: 2 MTP blocks would leave no MoE block, 3 no block at all.
      {"deepseek2.nextn_predict_layers", gguf::Value::Uint32(2), absl::StatusCode::kInvalidArgument},
      {"deepseek2.nextn_predict_layers", gguf::Value::Uint32(3), absl::StatusCode::kInvalidArgument},
      {"deepseek2.expert_gating_func", gguf::Value::Uint32(3), absl::StatusCode::kUnimplemented},
      {"deepseek2.rope.scaling.yarn_attn_factor", gguf::Value::Float32(2.0f), absl::StatusCode::kUnimplemented},
      {"deepseek2.rope.scaling.yarn_ext_factor", gguf::Value::Float32(0.5f), absl::StatusCode::kUnimplemented},
      {"deepseek2.rope.scaling.factor", gguf::Value::Float32(0.5f), absl::StatusCode::kInvalidArgument},
      {"deepseek2.rope.scaling.yarn_log_multiplier", gguf::Value::Float32(-1.0f), absl::StatusCode::kInvalidArgument},
      {"deepseek2.expert_group_count", gguf::Value::Uint32(3), absl::StatusCode::kInvalidArgument},
      {"deepseek2.expert_group_used_count", gguf::Value::Uint32(5), absl::StatusCode::kInvalidArgument},
      {"deepseek2.rope.dimension_count", gguf::Value::Uint32(15), absl::StatusCode::kInvalidArgument},
      {"deepseek2.rope.dimension_count", gguf::Value::Uint32(48), absl::StatusCode::kInvalidArgument},
      {"deepseek2.attention.kv_lora_rank", gguf::Value::Uint32(0), absl::StatusCode::kInvalidArgument},
      {"deepseek2.leading_dense_block_count", gguf::Value::Uint32(3), absl::StatusCode::kInvalidArgument},
      {"deepseek2.expert_shared_count", gguf::Value::Uint32(65), absl::StatusCode::kInvalidArgument},
  };
  for (const Case& c : cases) {
    gguf::Metadata m = V3Metadata();
    m.Add(c.key, c.value);
    EXPECT_THAT(ReadModelConfig(m).status(), StatusIsWith(c.code, c.key)) << c.key;
  }
  // Groups too few for the experts used: 16 experts in 8 groups of 2, 1 group used, 4 experts wanted.
  gguf::Metadata few = V3Metadata();
  few.Add("deepseek2.expert_group_count", gguf::Value::Uint32(8));
  few.Add("deepseek2.expert_group_used_count", gguf::Value::Uint32(1));
  EXPECT_THAT(ReadModelConfig(few).status(),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "deepseek2.expert_group_used_count"));
  // A sigmoid router ranks groups by their two best experts: groups of one are refused.
  gguf::Metadata singles = V3Metadata();
  singles.Add("deepseek2.expert_group_count", gguf::Value::Uint32(16));
  singles.Add("deepseek2.expert_group_used_count", gguf::Value::Uint32(8));
  EXPECT_THAT(ReadModelConfig(singles).status(),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "deepseek2.expert_group_count"));
  // Other rope scaling kinds are refused by the generic check, naming the key.
  gguf::Metadata longrope = V3Metadata();
  longrope.Add("deepseek2.rope.scaling.type", gguf::Value::String("longrope"));
  EXPECT_THAT(ReadModelConfig(longrope).status(),
              StatusIsWith(absl::StatusCode::kUnimplemented, "deepseek2.rope.scaling.type"));
  // yarn without its original context takes the training context, as llama.cpp does (n_ctx_orig_yarn).
  gguf::Metadata no_context = V2LiteMetadata();
  no_context.Add("deepseek2.rope.scaling.type", gguf::Value::String("yarn"));
  no_context.Add("deepseek2.rope.scaling.factor", gguf::Value::Float32(4.0f));
  absl::StatusOr<ModelConfig> defaulted = ReadModelConfig(no_context);
  ASSERT_TRUE(defaulted.ok()) << defaulted.status();
  EXPECT_TRUE(defaulted->rope_yarn);
  EXPECT_EQ(defaulted->yarn.original_context, defaulted->n_ctx_train);
}

TEST(Deepseek2ConfigTest, OtherArchitecturesRefuseGroupsAndTheYarnLogMultiplier) {
  gguf::Metadata m;
  m.Add("general.architecture", gguf::Value::String("qwen3moe"));
  for (const auto& [key, v] : std::vector<std::pair<std::string, uint32_t>>{
           {"block_count", 2}, {"embedding_length", 128}, {"attention.head_count", 4}, {"context_length", 512},
           {"expert_count", 8}, {"expert_used_count", 2}, {"expert_feed_forward_length", 128}}) {
    m.Add("qwen3moe." + key, gguf::Value::Uint32(v));
  }
  m.Add("tokenizer.ggml.tokens", gguf::Value::MakeArray(gguf::ValueType::kString, {gguf::Value::String("a")}));
  gguf::Metadata groups = m;
  groups.Add("qwen3moe.expert_group_count", gguf::Value::Uint32(4));
  EXPECT_THAT(ReadModelConfig(groups).status(),
              StatusIsWith(absl::StatusCode::kUnimplemented, "qwen3moe.expert_group_count"));
  // YaRN itself is read for every architecture; DeepSeek's log multiplier (an attention scale) only for deepseek2.
  gguf::Metadata yarn = m;
  yarn.Add("qwen3moe.rope.scaling.type", gguf::Value::String("yarn"));
  yarn.Add("qwen3moe.rope.scaling.factor", gguf::Value::Float32(4.0f));
  ASSERT_TRUE(ReadModelConfig(yarn).ok());
  yarn.Add("qwen3moe.rope.scaling.yarn_log_multiplier", gguf::Value::Float32(0.1f));
  EXPECT_THAT(ReadModelConfig(yarn).status(),
              StatusIsWith(absl::StatusCode::kUnimplemented, "qwen3moe.rope.scaling.yarn_log_multiplier"));
}

}  // namespace
}  // namespace strata::model
