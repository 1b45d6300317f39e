#include "packtool/hf_config.h"

#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "engine/gguf/gguf_file.h"
#include "engine/gguf/gguf_writer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/test_util.h"

namespace strata::packtool {
namespace {

using ::strata::testing::ScratchDir;
using ::testing::HasSubstr;
using nlohmann::json;

// DeepSeek-V3's config.json as released (deepseek-ai/DeepSeek-V3), training-only keys left out.
json DeepseekV3Config() {
  return json::parse(R"({
    "architectures": ["DeepseekV3ForCausalLM"], "attention_bias": false, "bos_token_id": 0, "eos_token_id": 1,
    "first_k_dense_replace": 3, "hidden_act": "silu", "hidden_size": 7168, "intermediate_size": 18432,
    "kv_lora_rank": 512, "max_position_embeddings": 163840, "model_type": "deepseek_v3",
    "moe_intermediate_size": 2048, "moe_layer_freq": 1, "n_group": 8, "n_routed_experts": 256,
    "n_shared_experts": 1, "norm_topk_prob": true, "num_attention_heads": 128, "num_experts_per_tok": 8,
    "num_hidden_layers": 61, "num_key_value_heads": 128, "num_nextn_predict_layers": 1, "q_lora_rank": 1536,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
    "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                            "weight_block_size": [128, 128]},
    "rms_norm_eps": 1e-06,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                     "original_max_position_embeddings": 4096, "type": "yarn"},
    "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "tie_word_embeddings": false,
    "topk_group": 4, "topk_method": "noaux_tc", "torch_dtype": "bfloat16", "v_head_dim": 128, "vocab_size": 129280})");
}

// gpt-oss-20b's config.json as released (openai/gpt-oss-20b).
json GptOss20bConfig() {
  json c = json::parse(R"({
    "architectures": ["GptOssForCausalLM"], "attention_bias": true, "eos_token_id": 200002, "experts_per_token": 4,
    "head_dim": 64, "hidden_act": "silu", "hidden_size": 2880, "initial_context_length": 4096,
    "intermediate_size": 2880, "max_position_embeddings": 131072, "model_type": "gpt_oss",
    "num_attention_heads": 64, "num_experts_per_tok": 4, "num_hidden_layers": 24, "num_key_value_heads": 8,
    "num_local_experts": 32, "pad_token_id": 199999,
    "quantization_config": {"modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                       "model.embed_tokens", "lm_head"],
                            "quant_method": "mxfp4"},
    "rms_norm_eps": 1e-05,
    "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0, "original_max_position_embeddings": 4096,
                     "rope_type": "yarn", "truncate": false},
    "rope_theta": 150000, "sliding_window": 128, "swiglu_limit": 7.0, "tie_word_embeddings": false,
    "vocab_size": 201088})");
  for (int l = 0; l < 24; ++l) c["layer_types"].push_back(l % 2 == 0 ? "sliding_attention" : "full_attention");
  return c;
}

// Qwen1.5-MoE-A2.7B's, OLMoE-1B-7B's and GLM-4.5-Air's config.json as released (the keys Strata reads).
json OtherConfig(const std::string& arch) {
  if (arch == "qwen2moe") {
    return json::parse(R"({"architectures": ["Qwen2MoeForCausalLM"], "decoder_sparse_step": 1, "hidden_size": 2048,
      "intermediate_size": 5632, "max_position_embeddings": 8192, "moe_intermediate_size": 1408,
      "mlp_only_layers": [], "norm_topk_prob": false, "num_attention_heads": 16, "num_experts": 60,
      "num_experts_per_tok": 4, "num_hidden_layers": 24, "num_key_value_heads": 16, "rms_norm_eps": 1e-06,
      "rope_theta": 1000000.0, "shared_expert_intermediate_size": 5632, "use_sliding_window": false,
      "vocab_size": 151936})");
  }
  if (arch == "olmoe") {
    return json::parse(R"({"architectures": ["OlmoeForCausalLM"], "clip_qkv": null, "hidden_size": 2048,
      "intermediate_size": 1024, "max_position_embeddings": 4096, "norm_topk_prob": false,
      "num_attention_heads": 16, "num_experts": 64, "num_experts_per_tok": 8, "num_hidden_layers": 16,
      "num_key_value_heads": 16, "rms_norm_eps": 1e-05, "rope_scaling": null, "rope_theta": 10000.0,
      "vocab_size": 50304})");
  }
  return json::parse(R"({"architectures": ["Glm4MoeForCausalLM"], "attention_bias": true,
    "first_k_dense_replace": 1, "head_dim": 128, "hidden_size": 4096, "intermediate_size": 10944,
    "max_position_embeddings": 131072, "moe_intermediate_size": 1408, "n_group": 1, "n_routed_experts": 128,
    "n_shared_experts": 1, "norm_topk_prob": true, "num_attention_heads": 96, "num_experts_per_tok": 8,
    "num_hidden_layers": 46, "num_key_value_heads": 8, "num_nextn_predict_layers": 1,
    "partial_rotary_factor": 0.5, "rms_norm_eps": 1e-05, "rope_scaling": null, "rope_theta": 1000000,
    "routed_scaling_factor": 1.0, "topk_group": 1, "use_qk_norm": false, "vocab_size": 151552})");
}

absl::StatusOr<HfModelConfig> Read(const ScratchDir& dir, const json& config) {
  std::ofstream(dir.Join("config.json")) << config.dump();
  return ReadHfConfig(dir.path());
}

// SetHfMetadata's keys, written into a GGUF and read back.
std::unique_ptr<gguf::GgufFile> WrittenMetadata(const HfModelConfig& c, const ScratchDir& dir) {
  gguf::GgufWriter w;
  SetHfMetadata(c, &w);
  const absl::Status written = w.WriteFile(dir.Join("metadata.gguf"));
  EXPECT_TRUE(written.ok()) << written;
  auto file = gguf::GgufFile::Open(dir.Join("metadata.gguf"));
  EXPECT_TRUE(file.ok()) << file.status();
  return file.ok() ? std::move(*file) : nullptr;
}

TEST(HfConfigTest, ReadsDeepseekV3AsLlamaCppWritesIt) {
  ScratchDir dir;
  absl::StatusOr<HfModelConfig> c = Read(dir, DeepseekV3Config());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->arch->synth_name, "deepseek2");
  EXPECT_TRUE(c->fp8_blocks);
  EXPECT_EQ(c->n_mtp_layers, 1);
  // Synth's "seed" preset is DeepSeek-V3's geometry; latent attention is one kv head in llama.cpp's GGUF.
  const SynthGeometry& g = c->geometry;
  const SynthGeometry v3 = *PresetGeometry("deepseek2", "seed");
  EXPECT_EQ(g.n_head_kv, 1);
  EXPECT_EQ(std::tie(g.n_layer, g.n_embd, g.n_head, g.head_dim, g.rope_dim, g.v_dim, g.q_lora_rank, g.kv_lora_rank),
            std::tie(v3.n_layer, v3.n_embd, v3.n_head, v3.head_dim, v3.rope_dim, v3.v_dim, v3.q_lora_rank, v3.kv_lora_rank));
  EXPECT_EQ(std::tie(g.n_expert, g.n_expert_used, g.expert_ff, g.shared_ff, g.n_dense_lead, g.dense_ff, g.n_ctx),
            std::tie(v3.n_expert, v3.n_expert_used, v3.expert_ff, v3.shared_ff, v3.n_dense_lead, v3.dense_ff, v3.n_ctx));
  EXPECT_EQ(std::tie(g.n_expert_group, g.n_group_used, g.expert_gating, g.expert_weights_norm),
            std::tie(v3.n_expert_group, v3.n_group_used, v3.expert_gating, v3.expert_weights_norm));
  EXPECT_EQ(g.expert_weights_scale, 2.5f);
  EXPECT_EQ(g.yarn_factor, 40.0f);
  EXPECT_EQ(g.yarn_original_context, 4096);
  EXPECT_FLOAT_EQ(g.yarn_log_multiplier, 0.1f);  // 0.1 * mscale_all_dim
  EXPECT_EQ(g.n_vocab, 129280);

  const std::unique_ptr<gguf::GgufFile> file = WrittenMetadata(*c, dir);
  ASSERT_NE(file, nullptr);
  const gguf::Metadata& m = file->metadata();
  EXPECT_EQ(m.GetUint("deepseek2.attention.head_count_kv").value_or(0), 1u);
  EXPECT_EQ(m.GetUint("deepseek2.attention.key_length").value_or(0), 512u + 64u);   // the cached latent
  EXPECT_EQ(m.GetUint("deepseek2.attention.value_length").value_or(0), 512u);
  EXPECT_EQ(m.GetUint("deepseek2.attention.key_length_mla").value_or(0), 192u);     // the heads
  EXPECT_EQ(m.GetUint("deepseek2.attention.value_length_mla").value_or(0), 128u);
  EXPECT_EQ(m.GetUint("deepseek2.expert_gating_func").value_or(0), 2u);
  EXPECT_EQ(m.GetUint("deepseek2.expert_shared_count").value_or(0), 1u);
  EXPECT_EQ(m.GetString("deepseek2.rope.scaling.type").value_or(""), "yarn");
}

TEST(HfConfigTest, ReadsGptOss20b) {
  ScratchDir dir;
  json config = GptOss20bConfig();
  config["rope_scaling"]["factor"] = 16.0;  // the checkpoint's, not the released models' that synth writes
  absl::StatusOr<HfModelConfig> c = Read(dir, config);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->mxfp4_experts);
  EXPECT_FALSE(c->fp8_blocks);
  const SynthGeometry& g = c->geometry;
  EXPECT_EQ(std::tie(g.n_layer, g.n_embd, g.expert_ff, g.n_expert, g.n_expert_used, g.n_head, g.n_head_kv, g.head_dim),
            std::make_tuple(24, 2880, 2880, 32, 4, 64, 8, 64));
  EXPECT_EQ(g.sliding_window, 128);
  const std::unique_ptr<gguf::GgufFile> file = WrittenMetadata(*c, dir);
  ASSERT_NE(file, nullptr);
  const gguf::Metadata& m = file->metadata();
  EXPECT_EQ(m.GetFloat("gpt-oss.rope.scaling.factor").value_or(0), 16.0);
  EXPECT_EQ(m.GetUint("gpt-oss.rope.scaling.original_context_length").value_or(0), 4096u);
  EXPECT_EQ(m.GetUint("gpt-oss.attention.sliding_window").value_or(0), 128u);
}

TEST(HfConfigTest, ReadsQwen2MoeOlmoeGlm45AirAndGlm45) {
  ScratchDir dir;
  absl::StatusOr<HfModelConfig> qwen = Read(dir, OtherConfig("qwen2moe"));
  ASSERT_TRUE(qwen.ok()) << qwen.status();
  EXPECT_EQ(std::tie(qwen->geometry.expert_ff, qwen->geometry.shared_ff, qwen->geometry.n_expert),
            std::make_tuple(1408, 5632, 60));
  absl::StatusOr<HfModelConfig> olmoe = Read(dir, OtherConfig("olmoe"));
  ASSERT_TRUE(olmoe.ok()) << olmoe.status();
  EXPECT_EQ(std::tie(olmoe->geometry.expert_ff, olmoe->geometry.n_expert), std::make_tuple(1024, 64));
  absl::StatusOr<HfModelConfig> glm = Read(dir, OtherConfig("glm4moe"));
  ASSERT_TRUE(glm.ok()) << glm.status();
  const SynthGeometry& g = glm->geometry;
  EXPECT_EQ(std::tie(g.head_dim, g.rope_dim, g.expert_ff, g.shared_ff, g.n_dense_lead, g.dense_ff),
            std::make_tuple(128, 64, 1408, 1408, 1, 10944));
  EXPECT_EQ(glm->n_mtp_layers, 1);
  // GLM-4.5-Air's routing, where synth writes GLM-4.5's scale of 2.5.
  const std::unique_ptr<gguf::GgufFile> file = WrittenMetadata(*glm, dir);
  ASSERT_NE(file, nullptr);
  EXPECT_EQ(file->metadata().GetFloat("glm4moe.expert_weights_scale").value_or(0), 1.0);
  EXPECT_TRUE(file->metadata().GetBool("glm4moe.expert_weights_norm").value_or(false));
  EXPECT_FALSE(g.head_qk_norm);
  // GLM-4.5 (not Air): use_qk_norm true, a per-head q/k norm.
  json full = OtherConfig("glm4moe");
  full["use_qk_norm"] = true;
  absl::StatusOr<HfModelConfig> glm45 = Read(dir, full);
  ASSERT_TRUE(glm45.ok()) << glm45.status();
  EXPECT_TRUE(glm45->geometry.head_qk_norm);
  full["use_qk_norm"] = "yes";
  const absl::Status bad = Read(dir, full).status();
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument) << bad;
  EXPECT_THAT(std::string(bad.message()), HasSubstr("use_qk_norm: expected true or false"));
}

using ConfigEdit = std::function<void(json&)>;

// Each edit of a released config is refused, naming the field.
void ExpectRefusals(const json& base, const std::vector<std::pair<ConfigEdit, std::string>>& cases) {
  ScratchDir dir;
  for (const auto& [edit, message] : cases) {
    json c = base;
    edit(c);
    absl::StatusOr<HfModelConfig> r = Read(dir, c);
    ASSERT_FALSE(r.ok()) << message;
    EXPECT_THAT(std::string(r.status().message()), HasSubstr("config.json: " + message));
  }
}

TEST(HfConfigTest, RefusesWhatDeepseekTwoOrThreeDoesNotImplement) {
  ExpectRefusals(DeepseekV3Config(), {
      {[](json& c) { c["scoring_func"] = "relu"; }, "scoring_func: 'relu' is not supported"},
      {[](json& c) { c["topk_method"] = "greedy"; },
       "topk_method: 'greedy' with scoring_func sigmoid is not supported (expected noaux_tc)"},
      {[](json& c) { c["scoring_func"] = "softmax", c["topk_method"] = "greedy"; },
       "topk_method: 'greedy' with scoring_func softmax, n_group 8 and topk_group 4 is not supported"},
      {[](json& c) { c["rope_scaling"]["mscale"] = 0.5; }, "rope_scaling.mscale: 0.5 differs from mscale_all_dim 1"},
      {[](json& c) { c["rope_scaling"]["type"] = "linear"; }, "rope_scaling.type: 'linear' is not supported"},
      {[](json& c) { c["rope_scaling"]["beta_fast"] = 16; }, "rope_scaling.beta_fast: 16 is not supported"},
      {[](json& c) { c["rope_scaling"].erase("original_max_position_embeddings"); },
       "rope_scaling: original_max_position_embeddings: missing"},
      {[](json& c) { c.erase("kv_lora_rank"); }, "kv_lora_rank: missing"},
      {[](json& c) { c.erase("n_shared_experts"); }, "n_shared_experts: missing"},
      {[](json& c) { c["moe_layer_freq"] = 2; }, "moe_layer_freq: 2 is not supported"},
      {[](json& c) { c["rope_interleave"] = false; }, "rope_interleave: false is not supported"},
      {[](json& c) { c["attention_bias"] = true; }, "attention_bias: true is not supported"},
      {[](json& c) { c["hidden_act"] = "gelu"; }, "hidden_act: 'gelu' is not supported"},
      {[](json& c) { c["quantization_config"]["weight_block_size"] = {64, 64}; },
       "quantization_config.weight_block_size: [64,64] is not supported"},
  });
}

TEST(HfConfigTest, RefusesWhatGptOssDoesNotImplement) {
  ExpectRefusals(GptOss20bConfig(), {
      {[](json& c) { c["layer_types"][0] = "full_attention"; },
       "layer_types: Strata runs gpt-oss with sliding_attention in even layers"},
      {[](json& c) { c["layer_types"].erase(23); }, "layer_types: Strata runs gpt-oss"},
      {[](json& c) { c["swiglu_limit"] = 10.0; }, "swiglu_limit: 10 is not supported"},
      {[](json& c) { c.erase("rope_scaling"); }, "rope_scaling: missing"},
      {[](json& c) { c["rope_scaling"]["rope_type"] = "linear"; }, "rope_scaling.rope_type: 'linear' is not supported"},
      {[](json& c) { c["rope_scaling"]["beta_slow"] = 2.0; }, "rope_scaling.beta_slow: 2 is not supported"},
      {[](json& c) { c.erase("sliding_window"); }, "sliding_window: missing"},
      {[](json& c) { c["attention_bias"] = false; }, "attention_bias: false is not supported"},
      {[](json& c) { c["quantization_config"]["quant_method"] = "awq"; },
       "quantization_config.quant_method: 'awq' is not supported"},
      {[](json& c) { c["quantization_config"]["quant_method"] = 4; },
       "quantization_config: quant_method: expected a string"},
  });
}

TEST(HfConfigTest, RefusesWhatQwen2MoeOlmoeAndGlm4MoeDoNotImplement) {
  ExpectRefusals(OtherConfig("qwen2moe"), {
      {[](json& c) { c["norm_topk_prob"] = true; }, "norm_topk_prob: true is not supported (expected false"},
      {[](json& c) { c["use_sliding_window"] = true; }, "use_sliding_window: true is not supported"},
      {[](json& c) { c["mlp_only_layers"] = {0}; }, "mlp_only_layers: [0] is not supported"},
      {[](json& c) { c.erase("shared_expert_intermediate_size"); }, "shared_expert_intermediate_size: missing"},
      // MXFP4 is gpt-oss's: another architecture's quantization_config naming it is refused.
      {[](json& c) { c["quantization_config"] = {{"quant_method", "mxfp4"}}; },
       "quantization_config.quant_method: 'mxfp4' is not supported"},
  });
  ExpectRefusals(OtherConfig("olmoe"), {
      {[](json& c) { c["clip_qkv"] = 8; }, "clip_qkv: 8 is not supported (expected null"},
      {[](json& c) { c["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}}; }, "rope_scaling:"},
  });
  ExpectRefusals(OtherConfig("glm4moe"), {
      {[](json& c) { c["n_group"] = 8; }, "n_group: 8 is not supported"},
      {[](json& c) { c["partial_rotary_factor"] = 0.3; }, "partial_rotary_factor: 0.3 of head_dim 128"},
  });
}

}  // namespace
}  // namespace strata::packtool
