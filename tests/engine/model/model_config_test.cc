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

}  // namespace
}  // namespace strata::model
