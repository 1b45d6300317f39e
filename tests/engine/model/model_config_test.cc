#include "engine/model/model_config.h"

#include <cmath>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/test_util.h"

namespace strata::model {
namespace {

gguf::Metadata Qwen3Metadata() {
  gguf::Metadata m;
  m.Add("general.architecture", gguf::Value::String("qwen3moe"));
  for (const auto& [key, v] : std::vector<std::pair<std::string, uint32_t>>{
           {"block_count", 2}, {"embedding_length", 128}, {"attention.head_count", 4},
           {"attention.head_count_kv", 2}, {"attention.key_length", 32}, {"context_length", 512},
           {"expert_count", 8}, {"expert_used_count", 2}, {"expert_feed_forward_length", 128}}) {
    m.Add("qwen3moe." + key, gguf::Value::Uint32(v));
  }
  m.Add("tokenizer.ggml.tokens", gguf::Value::MakeArray(gguf::ValueType::kString, {gguf::Value::String("a")}));
  return m;
}

TEST(ModelConfigTest, ReadsQwen3MoeFromMetadata) {
  auto c = ReadModelConfig(Qwen3Metadata());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->n_layer, 2);
  EXPECT_EQ(c->head_dim, 32);
  EXPECT_EQ(c->expert_ff, 128);
  EXPECT_EQ(c->rope_style, RopeStyle::kNeox);
  EXPECT_TRUE(c->qk_norm);
}

TEST(ModelConfigTest, RefusesWhatTheForwardPassDoesNotImplement) {
  gguf::Metadata m = Qwen3Metadata();
  m.Add("qwen3moe.rope.scaling.factor", gguf::Value::Float32(4.0f));
  EXPECT_THAT(ReadModelConfig(m).status(), StatusIsWith(absl::StatusCode::kUnimplemented, "rope.scaling.factor"));
  m = Qwen3Metadata();
  m.Add("qwen3moe.rope.dimension_count", gguf::Value::Uint32(16));
  EXPECT_THAT(ReadModelConfig(m).status(), StatusIsWith(absl::StatusCode::kUnimplemented, "rope.dimension_count"));
  m = Qwen3Metadata();
  m.Add("general.architecture", gguf::Value::String("gpt2"));
  EXPECT_THAT(ReadModelConfig(m).status(), StatusIsWith(absl::StatusCode::kUnimplemented, "gpt2"));
  m = Qwen3Metadata();
  m.Add("qwen3moe.expert_used_count", gguf::Value::Uint32(9));
  EXPECT_THAT(ReadModelConfig(m).status(), StatusIsWith(absl::StatusCode::kInvalidArgument, "expert_used_count"));
}

TEST(ModelConfigTest, RefusesOutOfRangeHyperParametersNamingTheKey) {
  struct Case {
    std::string key;
    gguf::Value value;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"qwen3moe.attention.head_count_kv", gguf::Value::Uint64(uint64_t{1} << 40),
       "qwen3moe.attention.head_count_kv is 1099511627776, expected 1 .. 2^31"},
      {"qwen3moe.attention.key_length", gguf::Value::Uint32(0), "qwen3moe.attention.key_length is 0"},
      {"qwen3moe.expert_feed_forward_length", gguf::Value::Uint64(uint64_t{1} << 33),
       "qwen3moe.expert_feed_forward_length is 8589934592"},
      {"qwen3moe.rope.freq_base", gguf::Value::Float32(0.0f), "qwen3moe.rope.freq_base is 0"},
      {"qwen3moe.rope.freq_base", gguf::Value::Float32(std::nanf("")), "qwen3moe.rope.freq_base is nan"},
      {"qwen3moe.attention.layer_norm_rms_epsilon", gguf::Value::Float32(-1e-6f),
       "qwen3moe.attention.layer_norm_rms_epsilon is -1e-06"},
  };
  for (const Case& c : cases) {
    gguf::Metadata m = Qwen3Metadata();
    m.Add(c.key, c.value);
    EXPECT_THAT(ReadModelConfig(m).status(), StatusIsWith(absl::StatusCode::kInvalidArgument, c.message)) << c.key;
  }
}

// The keys llama.cpp's converter writes for `arch`, with the geometry of Qwen3Metadata.
gguf::Metadata ArchMetadata(const std::string& arch, const std::vector<std::pair<std::string, uint32_t>>& extra) {
  gguf::Metadata m;
  m.Add("general.architecture", gguf::Value::String(arch));
  for (const auto& [key, v] : std::vector<std::pair<std::string, uint32_t>>{
           {"block_count", 2}, {"embedding_length", 128}, {"attention.head_count", 4},
           {"attention.head_count_kv", 4}, {"context_length", 512}, {"expert_count", 8}, {"expert_used_count", 2}}) {
    m.Add(arch + "." + key, gguf::Value::Uint32(v));
  }
  for (const auto& [key, v] : extra) m.Add(arch + "." + key, gguf::Value::Uint32(v));
  m.Add("tokenizer.ggml.tokens", gguf::Value::MakeArray(gguf::ValueType::kString, {gguf::Value::String("a")}));
  return m;
}

gguf::Metadata Qwen2Metadata() {
  return ArchMetadata("qwen2moe", {{"feed_forward_length", 512},
                                   {"expert_feed_forward_length", 64},
                                   {"expert_shared_feed_forward_length", 256}});
}

gguf::Metadata OlmoeMetadata() { return ArchMetadata("olmoe", {{"feed_forward_length", 96}}); }

// GLM-4.5-Air's keys (block 0 dense, one shared expert, half of each head rotated).
gguf::Metadata Glm4MoeMetadata() {
  gguf::Metadata m = ArchMetadata("glm4moe", {{"feed_forward_length", 512},
                                              {"expert_feed_forward_length", 64},
                                              {"expert_shared_count", 1},
                                              {"leading_dense_block_count", 1},
                                              {"rope.dimension_count", 16},
                                              {"expert_gating_func", 2}});
  m.Add("glm4moe.expert_weights_norm", gguf::Value::Bool(true));
  m.Add("glm4moe.expert_weights_scale", gguf::Value::Float32(2.5f));
  return m;
}

TEST(ModelConfigTest, ReadsGlm4MoeWithItsRouterDenseBlocksAndPartialRope) {
  auto c = ReadModelConfig(Glm4MoeMetadata());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->expert_ff, 64);
  EXPECT_EQ(c->shared_expert_ff, 64);
  EXPECT_FALSE(c->shared_expert_gate);
  EXPECT_EQ(c->n_dense_lead, 1);
  EXPECT_EQ(c->dense_ff, 512);
  EXPECT_EQ(c->head_dim, 32);
  EXPECT_EQ(c->rope_dim, 16);
  EXPECT_EQ(c->rope_style, RopeStyle::kNeox);
  EXPECT_EQ(c->router_gating, RouterGating::kSigmoid);
  EXPECT_TRUE(c->router_score_bias);
  EXPECT_TRUE(c->router_renorm);
  EXPECT_FLOAT_EQ(c->routed_scale, 2.5f);
  EXPECT_TRUE(c->qkv_bias);
  EXPECT_EQ(c->ffn_norm_name, "post_attention_norm");
  EXPECT_EQ(BlocksNeeded(*c), (std::vector<Block>{Block::kQkvBias, Block::kSharedExpert, Block::kPartialRope,
                                                 Block::kSigmoidRouter, Block::kRoutedScale,
                                                 Block::kDenseLeadingBlocks}));
}

TEST(ModelConfigTest, Glm4MoeRefusesWhatItDoesNotImplementNamingTheKey) {
  struct Case {
    std::string key;
    gguf::Value value;
    absl::StatusCode code;
  };
  const std::vector<Case> cases = {
      // With 2 blocks, the first dense: an MTP block would leave no MoE block to run.
      {"glm4moe.nextn_predict_layers", gguf::Value::Uint32(1), absl::StatusCode::kInvalidArgument},
      {"glm4moe.expert_gating_func", gguf::Value::Uint32(1), absl::StatusCode::kUnimplemented},
      {"glm4moe.expert_group_count", gguf::Value::Uint32(8), absl::StatusCode::kUnimplemented},
      {"glm4moe.rope.dimension_sections", gguf::Value::Uint32(8), absl::StatusCode::kUnimplemented},
      {"glm4moe.leading_dense_block_count", gguf::Value::Uint32(2), absl::StatusCode::kInvalidArgument},
      {"glm4moe.rope.dimension_count", gguf::Value::Uint32(15), absl::StatusCode::kInvalidArgument},
      {"glm4moe.rope.dimension_count", gguf::Value::Uint32(64), absl::StatusCode::kInvalidArgument},
  };
  for (const Case& c : cases) {
    gguf::Metadata m = Glm4MoeMetadata();
    m.Add(c.key, c.value);
    EXPECT_THAT(ReadModelConfig(m).status(), StatusIsWith(c.code, c.key)) << c.key;
  }
  // Partial RoPE is glm4moe's: qwen3moe still refuses it.
  gguf::Metadata qwen = Qwen3Metadata();
  qwen.Add("qwen3moe.rope.dimension_count", gguf::Value::Uint32(16));
  EXPECT_THAT(ReadModelConfig(qwen).status(), StatusIsWith(absl::StatusCode::kUnimplemented, "rope.dimension_count"));
}

// GLM-4.5's GGUFs count their multi-token-prediction block in block_count (GLM-4.5-Air: 46 + 1 = 47) and
// say so in nextn_predict_layers: Strata runs the others, as llama.cpp does.
TEST(ModelConfigTest, LeavesOutTheMultiTokenPredictionBlocks) {
  gguf::Metadata m = Glm4MoeMetadata();
  m.Add("glm4moe.block_count", gguf::Value::Uint32(47));
  m.Add("glm4moe.nextn_predict_layers", gguf::Value::Uint32(1));
  auto c = ReadModelConfig(m);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->n_layer, 46);
  EXPECT_EQ(c->n_mtp_blocks, 1);
  EXPECT_EQ(c->n_dense_lead, 1);
  auto blocks = ReadBlockCount(m, "glm4moe");
  ASSERT_TRUE(blocks.ok()) << blocks.status();
  EXPECT_EQ(blocks->total, 47);
  EXPECT_EQ(blocks->mtp, 1);
  EXPECT_EQ(blocks->run(), 46);
  // The MTP block's tensors are told apart by their block.
  EXPECT_EQ(TensorBlock("blk.46.nextn.eh_proj.weight"), 46);
  EXPECT_EQ(TensorBlock("blk.0.attn_q.weight"), 0);
  EXPECT_EQ(TensorBlock("token_embd.weight"), -1);
  EXPECT_EQ(TensorBlock("blk.x.attn_q.weight"), -1);
  EXPECT_EQ(TensorBlock("blk.7"), -1);
  // Without the key every block runs.
  auto plain = ReadModelConfig(Glm4MoeMetadata());
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->n_layer, 2);
  EXPECT_EQ(plain->n_mtp_blocks, 0);
}

// MTP blocks that leave no block, or no MoE block after the dense ones, are refused naming the keys and
// their values.
TEST(ModelConfigTest, RefusesTooManyMultiTokenPredictionBlocksNamingTheKeys) {
  gguf::Metadata m = Glm4MoeMetadata();  // 2 blocks, the first dense
  m.Add("glm4moe.nextn_predict_layers", gguf::Value::Uint32(2));
  EXPECT_THAT(ReadModelConfig(m).status(),
              StatusIsWith(absl::StatusCode::kInvalidArgument,
                           "glm4moe.nextn_predict_layers is 2, expected fewer than glm4moe.block_count (2)"));
  EXPECT_THAT(ReadBlockCount(m, "glm4moe").status(),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "glm4moe.nextn_predict_layers is 2"));
  m.Add("glm4moe.nextn_predict_layers", gguf::Value::Uint32(1));
  EXPECT_THAT(ReadModelConfig(m).status(),
              StatusIsWith(absl::StatusCode::kInvalidArgument,
                           "glm4moe.leading_dense_block_count is 1 and glm4moe.nextn_predict_layers is 1, expected "
                           "their sum below glm4moe.block_count (2)"));
  m.Add("glm4moe.block_count", gguf::Value::Uint32(3));
  auto c = ReadModelConfig(m);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->n_layer, 2);
}

TEST(ModelConfigTest, ReadsQwen2MoeWithItsSharedExpertAndBiases) {
  auto c = ReadModelConfig(Qwen2Metadata());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->expert_ff, 64);
  EXPECT_EQ(c->shared_expert_ff, 256);
  EXPECT_TRUE(c->shared_expert_gate);
  EXPECT_TRUE(c->qkv_bias);
  EXPECT_FALSE(c->router_renorm);
  EXPECT_FALSE(c->qk_norm);
  EXPECT_FALSE(c->qk_norm_whole);
  EXPECT_EQ(c->rope_style, RopeStyle::kNeox);
  EXPECT_EQ(c->head_dim, 32);
}

TEST(ModelConfigTest, Qwen2MoeWidthsFallBackToFeedForwardLengthAsLlamaCppDoes) {
  // Without the two expert keys: the experts are feed_forward_length / expert_used_count wide, the shared
  // expert feed_forward_length.
  auto c = ReadModelConfig(ArchMetadata("qwen2moe", {{"feed_forward_length", 512}}));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->expert_ff, 256);
  EXPECT_EQ(c->shared_expert_ff, 512);
  EXPECT_THAT(ReadModelConfig(ArchMetadata("qwen2moe", {{"expert_feed_forward_length", 64}})).status(),
              StatusIsWith(absl::StatusCode::kNotFound, "qwen2moe.expert_shared_feed_forward_length"));
}

TEST(ModelConfigTest, ReadsOlmoeWithItsWholeProjectionQkNorm) {
  auto c = ReadModelConfig(OlmoeMetadata());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->expert_ff, 96);
  EXPECT_TRUE(c->qk_norm_whole);
  EXPECT_FALSE(c->qk_norm);
  EXPECT_FALSE(c->router_renorm);
  EXPECT_FALSE(c->qkv_bias);
  EXPECT_EQ(c->shared_expert_ff, 0);
  EXPECT_EQ(c->rope_style, RopeStyle::kNeox);
}

TEST(ModelConfigTest, RefusesRouterAndRopeKeysThatChangeTheMathNamingTheKey) {
  struct Case {
    gguf::Metadata metadata;
    std::string key;
    gguf::Value value;
  };
  const std::vector<Case> cases = {
      {Qwen2Metadata(), "qwen2moe.expert_weights_norm", gguf::Value::Bool(true)},
      {Qwen3Metadata(), "qwen3moe.expert_weights_norm", gguf::Value::Bool(false)},
      {OlmoeMetadata(), "olmoe.expert_gating_func", gguf::Value::Uint32(2)},
      {OlmoeMetadata(), "olmoe.expert_weights_scale", gguf::Value::Float32(2.5f)},
      {Qwen2Metadata(), "qwen2moe.rope.scaling.type", gguf::Value::String("longrope")},
  };
  for (const Case& c : cases) {
    gguf::Metadata m = c.metadata;
    m.Add(c.key, c.value);
    EXPECT_THAT(ReadModelConfig(m).status(), StatusIsWith(absl::StatusCode::kUnimplemented, c.key)) << c.key;
  }
  // The values that say what the architecture does are accepted.
  gguf::Metadata m = Qwen2Metadata();
  m.Add("qwen2moe.expert_weights_norm", gguf::Value::Bool(false));
  m.Add("qwen2moe.expert_gating_func", gguf::Value::Uint32(1));
  m.Add("qwen2moe.rope.scaling.type", gguf::Value::String("none"));
  EXPECT_TRUE(ReadModelConfig(m).ok()) << ReadModelConfig(m).status();
}

TEST(ModelConfigTest, BlocksNeededListWhatEachArchitectureAddsToTheBase) {
  EXPECT_TRUE(BlocksNeeded(*ReadModelConfig(Qwen3Metadata())).empty());
  EXPECT_EQ(BlocksNeeded(*ReadModelConfig(Qwen2Metadata())),
            (std::vector<Block>{Block::kQkvBias, Block::kRouterWithoutRenorm, Block::kSharedExpert,
                                Block::kSharedExpertGate}));
  EXPECT_EQ(BlocksNeeded(*ReadModelConfig(OlmoeMetadata())),
            (std::vector<Block>{Block::kWholeQkNorm, Block::kRouterWithoutRenorm}));
}

TEST(ModelConfigTest, ABackendLackingABlockIsRefusedNamingTheArchitectureAndTheBlock) {
  const ModelConfig olmoe = *ReadModelConfig(OlmoeMetadata());
  EXPECT_THAT(CheckBackendBlocks(olmoe, "CUDA", {}),
              StatusIsWith(absl::StatusCode::kUnimplemented,
                           "architecture 'olmoe' needs the q/k RMSNorm over the whole projection block, which the "
                           "CUDA backend does not implement"));
  EXPECT_THAT(CheckBackendBlocks(olmoe, "CUDA", {Block::kWholeQkNorm}),
              StatusIsWith(absl::StatusCode::kUnimplemented, "softmax router without top-k renormalisation"));
  EXPECT_TRUE(CheckBackendBlocks(olmoe, "CUDA", {Block::kWholeQkNorm, Block::kRouterWithoutRenorm}).ok());
  EXPECT_TRUE(CheckBackendBlocks(*ReadModelConfig(Qwen3Metadata()), "CUDA", {}).ok());
}

}  // namespace
}  // namespace strata::model
