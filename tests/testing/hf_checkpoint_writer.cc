#include "tests/testing/hf_checkpoint_writer.h"

#include <cstring>
#include <deque>
#include <fstream>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "engine/gguf/gguf_file.h"
#include "engine/gguf/gguf_writer.h"
#include "engine/status_macros.h"
#include "nlohmann/json.hpp"
#include "packtool/hf_checkpoint.h"
#include "packtool/hf_tokenizer.h"
#include "tests/testing/safetensors_writer.h"

namespace strata::testing {
namespace {

using nlohmann::ordered_json;

absl::StatusOr<std::string> Dtype(gguf::GgmlType t) {
  switch (t) {
    case gguf::GgmlType::kF32: return std::string("F32");
    case gguf::GgmlType::kF16: return std::string("F16");
    case gguf::GgmlType::kBF16: return std::string("BF16");
    default: return absl::InvalidArgumentError("hf writer: only F32, F16 and BF16 tensors");
  }
}

absl::Status WriteText(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  return out ? absl::OkStatus() : absl::InternalError(absl::StrCat("cannot write ", path));
}

// DeepSeek-V2's config.json (softmax router) or V3's (sigmoid with the score-correction bias) for a synth
// deepseek2 GGUF, with the keys and defaults of DeepSeek's own files.
ordered_json DeepseekConfig(const gguf::Metadata& m, size_t n_vocab) {
  auto u = [&](const std::string& key) { return m.GetUint("deepseek2." + key).value_or(0); };
  auto f = [&](const std::string& key) { return m.GetFloat("deepseek2." + key).value_or(0); };
  const bool v3 = u("expert_gating_func") == 2;
  const uint64_t rope = u("rope.dimension_count"), expert_ff = u("expert_feed_forward_length");
  ordered_json c;
  c["architectures"] = {v3 ? "DeepseekV3ForCausalLM" : "DeepseekV2ForCausalLM"};
  c["model_type"] = v3 ? "deepseek_v3" : "deepseek_v2";
  c["hidden_size"] = u("embedding_length");
  c["intermediate_size"] = u("feed_forward_length");
  c["moe_intermediate_size"] = expert_ff;
  c["num_hidden_layers"] = u("block_count");
  c["num_attention_heads"] = u("attention.head_count");
  c["num_key_value_heads"] = u("attention.head_count");
  c["n_shared_experts"] = u("expert_shared_count");
  c["n_routed_experts"] = u("expert_count");
  c["num_experts_per_tok"] = u("expert_used_count");
  c["routed_scaling_factor"] = f("expert_weights_scale");
  c["kv_lora_rank"] = u("attention.kv_lora_rank");
  c["q_lora_rank"] = m.Has("deepseek2.attention.q_lora_rank") ? ordered_json(u("attention.q_lora_rank")) : ordered_json();
  c["qk_rope_head_dim"] = rope;
  c["v_head_dim"] = u("attention.value_length");
  c["qk_nope_head_dim"] = u("attention.key_length") - rope;
  c["topk_method"] = v3 ? "noaux_tc" : "group_limited_greedy";
  c["n_group"] = u("expert_group_count");
  c["topk_group"] = u("expert_group_used_count");
  c["moe_layer_freq"] = 1;
  c["first_k_dense_replace"] = u("leading_dense_block_count");
  c["norm_topk_prob"] = m.GetBool("deepseek2.expert_weights_norm").value_or(false);
  c["scoring_func"] = v3 ? "sigmoid" : "softmax";
  c["hidden_act"] = "silu";
  c["max_position_embeddings"] = u("context_length");
  c["rms_norm_eps"] = f("attention.layer_norm_rms_epsilon");
  c["rope_theta"] = f("rope.freq_base");
  if (m.Has("deepseek2.rope.scaling.type")) {
    // DeepSeek's YaRN: llama.cpp's log multiplier is 0.1 * mscale_all_dim; mscale equals it.
    const double mscale = f("rope.scaling.yarn_log_multiplier") / 0.1;
    c["rope_scaling"] = {{"beta_fast", 32}, {"beta_slow", 1}, {"factor", f("rope.scaling.factor")},
                         {"mscale", mscale}, {"mscale_all_dim", mscale},
                         {"original_max_position_embeddings", u("rope.scaling.original_context_length")},
                         {"type", "yarn"}};
  } else {
    c["rope_scaling"] = nullptr;
  }
  c["attention_bias"] = false;
  c["tie_word_embeddings"] = false;
  c["num_nextn_predict_layers"] = 0;
  c["vocab_size"] = n_vocab;
  c["torch_dtype"] = "bfloat16";
  return c;
}

// gpt-oss's config.json (as openai/gpt-oss-20b's) for a synth gpt-oss GGUF; `mxfp4` adds its
// quantization_config.
ordered_json GptOssConfig(const gguf::Metadata& m, size_t n_vocab, bool mxfp4) {
  auto u = [&](const std::string& key) { return m.GetUint("gpt-oss." + key).value_or(0); };
  auto f = [&](const std::string& key) { return m.GetFloat("gpt-oss." + key).value_or(0); };
  ordered_json c;
  c["architectures"] = {"GptOssForCausalLM"};
  c["attention_bias"] = true;
  c["experts_per_token"] = u("expert_used_count");
  c["head_dim"] = u("attention.key_length");
  c["hidden_act"] = "silu";
  c["hidden_size"] = u("embedding_length");
  c["initial_context_length"] = u("rope.scaling.original_context_length");
  c["intermediate_size"] = u("expert_feed_forward_length");
  ordered_json types = ordered_json::array();
  for (uint64_t l = 0; l < u("block_count"); ++l) types.push_back(l % 2 == 0 ? "sliding_attention" : "full_attention");
  c["layer_types"] = types;
  c["max_position_embeddings"] = u("context_length");
  c["model_type"] = "gpt_oss";
  c["num_attention_heads"] = u("attention.head_count");
  c["num_experts_per_tok"] = u("expert_used_count");
  c["num_hidden_layers"] = u("block_count");
  c["num_key_value_heads"] = u("attention.head_count_kv");
  c["num_local_experts"] = u("expert_count");
  if (mxfp4) {
    c["quantization_config"] = {
        {"modules_to_not_convert", {"model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"}},
        {"quant_method", "mxfp4"}};
  }
  c["rms_norm_eps"] = f("attention.layer_norm_rms_epsilon");
  c["rope_scaling"] = {{"beta_fast", 32.0}, {"beta_slow", 1.0}, {"factor", f("rope.scaling.factor")},
                       {"original_max_position_embeddings", u("rope.scaling.original_context_length")},
                       {"rope_type", "yarn"}, {"truncate", false}};
  c["rope_theta"] = f("rope.freq_base");
  c["sliding_window"] = u("attention.sliding_window");
  c["swiglu_limit"] = 7.0;
  c["tie_word_embeddings"] = false;
  c["vocab_size"] = n_vocab;
  return c;
}

// gpt-oss's fused expert tensors of each layer from the GGUF's per-role ones: gate and up interleaved row by
// row into gate_up_proj, MXFP4 blocks split into _blocks (value 2j in byte j's low nibble, 2j + 1 in its
// high) and _scales, float experts transposed to [E, K, rows]; biases interleaved the same way, in the GGUF's
// dtype.
absl::Status AddGptOssExperts(const gguf::GgufFile& file, std::vector<SafetensorsEntry>* entries) {
  ASSIGN_OR_RETURN(const uint64_t n_layer, file.metadata().GetUint("gpt-oss.block_count"));
  for (uint64_t l = 0; l < n_layer; ++l) {
    const std::string blk = absl::StrCat("blk.", l, "."), hf = absl::StrCat("model.layers.", l, ".mlp.experts.");
    auto tensor = [&](const std::string& name) -> absl::StatusOr<const gguf::TensorInfo*> {
      const gguf::TensorInfo* t = file.FindTensor(blk + name);
      if (t == nullptr) return absl::NotFoundError(absl::StrCat("hf writer: no ", blk, name));
      return t;
    };
    ASSIGN_OR_RETURN(const gguf::TensorInfo* gate, tensor("ffn_gate_exps.weight"));
    ASSIGN_OR_RETURN(const gguf::TensorInfo* up, tensor("ffn_up_exps.weight"));
    ASSIGN_OR_RETURN(const gguf::TensorInfo* down, tensor("ffn_down_exps.weight"));
    const int64_t E = gate->ne[2];
    // [E][rows][row_bytes] of gate and up as [E][2 * rows][row_bytes], gate's rows even.
    auto interleave = [E](const gguf::TensorInfo* a, const gguf::TensorInfo* b, int64_t rows) {
      const size_t row_bytes = a->bytes / static_cast<size_t>(E * rows);
      std::vector<uint8_t> out(2 * a->bytes);
      for (int64_t e = 0; e < E; ++e) {
        for (int64_t r = 0; r < rows; ++r) {
          std::memcpy(&out[((e * rows + r) * 2) * row_bytes], a->data + (e * rows + r) * row_bytes, row_bytes);
          std::memcpy(&out[((e * rows + r) * 2 + 1) * row_bytes], b->data + (e * rows + r) * row_bytes, row_bytes);
        }
      }
      return out;
    };
    for (const bool is_down : {false, true}) {
      const gguf::TensorInfo* w = is_down ? down : gate;
      const int64_t k = w->ne[0], rows = is_down ? w->ne[1] : 2 * w->ne[1];
      const std::string name = hf + (is_down ? "down_proj" : "gate_up_proj");
      const std::vector<uint8_t> fused = is_down ? std::vector<uint8_t>(w->data, w->data + w->bytes)
                                                 : interleave(gate, up, w->ne[1]);
      if (w->type == gguf::GgmlType::kMXFP4) {
        const size_t n = fused.size() / 17;
        std::vector<uint8_t> blocks(n * 16), scales(n);
        for (size_t i = 0; i < n; ++i) {
          const uint8_t* b = &fused[i * 17];
          scales[i] = b[0];
          uint8_t v[32];
          for (int j = 0; j < 16; ++j) v[j] = b[1 + j] & 0x0F, v[j + 16] = b[1 + j] >> 4;
          for (int j = 0; j < 16; ++j) blocks[i * 16 + j] = static_cast<uint8_t>(v[2 * j] | v[2 * j + 1] << 4);
        }
        entries->push_back({name + "_blocks", "U8", {E, rows, k / 32, 16}, std::move(blocks)});
        entries->push_back({name + "_scales", "U8", {E, rows, k / 32}, std::move(scales)});
      } else {
        ASSIGN_OR_RETURN(const std::string dtype, Dtype(w->type));
        const size_t el = fused.size() / static_cast<size_t>(E * rows * k);
        std::vector<uint8_t> transposed(fused.size());
        for (int64_t e = 0; e < E; ++e) {
          for (int64_t r = 0; r < rows; ++r) {
            for (int64_t c = 0; c < k; ++c) {
              std::memcpy(&transposed[((e * k + c) * rows + r) * el], &fused[((e * rows + r) * k + c) * el], el);
            }
          }
        }
        entries->push_back({name, dtype, {E, k, rows}, std::move(transposed)});
      }
    }
    ASSIGN_OR_RETURN(const gguf::TensorInfo* gate_b, tensor("ffn_gate_exps.bias"));
    ASSIGN_OR_RETURN(const gguf::TensorInfo* up_b, tensor("ffn_up_exps.bias"));
    ASSIGN_OR_RETURN(const gguf::TensorInfo* down_b, tensor("ffn_down_exps.bias"));
    ASSIGN_OR_RETURN(const std::string bias_dtype, Dtype(gate_b->type));
    entries->push_back({hf + "gate_up_proj_bias", bias_dtype, {E, 2 * gate_b->ne[0]}, interleave(gate_b, up_b, gate_b->ne[0])});
    entries->push_back({hf + "down_proj_bias", bias_dtype, {E, down_b->ne[0]},
                        std::vector<uint8_t>(down_b->data, down_b->data + down_b->bytes)});
  }
  return absl::OkStatus();
}

// Qwen2-MoE's, OLMoE's or GLM-4.5's config.json for a synth GGUF of `arch` (qwen2moe, olmoe, glm4moe).
ordered_json OtherMoeConfig(const std::string& arch, const gguf::Metadata& m, size_t n_vocab) {
  auto u = [&](const std::string& key) { return m.GetUint(arch + "." + key).value_or(0); };
  auto f = [&](const std::string& key) { return m.GetFloat(arch + "." + key).value_or(0); };
  ordered_json c;
  c["architectures"] = {arch == "qwen2moe" ? "Qwen2MoeForCausalLM" : arch == "olmoe" ? "OlmoeForCausalLM" : "Glm4MoeForCausalLM"};
  c["hidden_size"] = u("embedding_length");
  c["num_hidden_layers"] = u("block_count");
  c["num_attention_heads"] = u("attention.head_count");
  c["num_key_value_heads"] = u("attention.head_count_kv");
  c["num_experts_per_tok"] = u("expert_used_count");
  c["max_position_embeddings"] = u("context_length");
  c["rope_theta"] = f("rope.freq_base");
  c["rms_norm_eps"] = f("attention.layer_norm_rms_epsilon");
  c["rope_scaling"] = nullptr;
  c["tie_word_embeddings"] = false;
  c["vocab_size"] = n_vocab;
  if (arch == "qwen2moe") {
    c["model_type"] = "qwen2_moe";
    c["intermediate_size"] = 4 * u("expert_feed_forward_length");  // the dense MLP's, unused
    c["moe_intermediate_size"] = u("expert_feed_forward_length");
    c["shared_expert_intermediate_size"] = u("expert_shared_feed_forward_length");
    c["num_experts"] = u("expert_count");
    c["norm_topk_prob"] = false;
    c["decoder_sparse_step"] = 1;
    c["mlp_only_layers"] = ordered_json::array();
    c["use_sliding_window"] = false;
  } else if (arch == "olmoe") {
    c["model_type"] = "olmoe";
    c["intermediate_size"] = u("feed_forward_length");
    c["num_experts"] = u("expert_count");
    c["norm_topk_prob"] = false;
    c["clip_qkv"] = nullptr;
  } else {
    c["model_type"] = "glm4_moe";
    c["head_dim"] = u("attention.key_length");
    c["partial_rotary_factor"] = static_cast<double>(u("rope.dimension_count")) / static_cast<double>(u("attention.key_length"));
    c["intermediate_size"] = u("feed_forward_length");
    c["moe_intermediate_size"] = u("expert_feed_forward_length");
    c["n_routed_experts"] = u("expert_count");
    c["n_shared_experts"] = u("expert_shared_count");
    c["first_k_dense_replace"] = u("leading_dense_block_count");
    c["routed_scaling_factor"] = f("expert_weights_scale");
    c["norm_topk_prob"] = m.GetBool("glm4moe.expert_weights_norm").value_or(false);
    c["n_group"] = 1;
    c["topk_group"] = 1;
    c["use_qk_norm"] = false;
    c["attention_bias"] = true;
    c["num_nextn_predict_layers"] = 0;
  }
  return c;
}

}  // namespace

absl::Status WriteHfCheckpointFromGguf(const std::string& gguf_path, const std::string& dir,
                                       const HfWriteOptions& options) {
  ASSIGN_OR_RETURN(std::unique_ptr<gguf::GgufFile> file, gguf::GgufFile::Open(gguf_path));
  const gguf::Metadata& m = file->metadata();
  ASSIGN_OR_RETURN(const std::string arch, m.GetString("general.architecture"));
  const bool mixtral = arch == "llama";
  const std::string p = arch + ".";
  auto u = [&](const std::string& key) { return m.GetUint(p + key).value_or(0); };
  const int64_t n_head = static_cast<int64_t>(u("attention.head_count"));
  const int64_t n_head_kv = static_cast<int64_t>(u("attention.head_count_kv"));
  const int64_t head_dim = static_cast<int64_t>(u("attention.key_length"));
  ASSIGN_OR_RETURN(const std::vector<std::string> tokens, m.GetStringArray("tokenizer.ggml.tokens"));

  ordered_json config;
  const bool gpt_oss = arch == "gpt-oss";
  if (arch == "deepseek2") {
    config = DeepseekConfig(m, tokens.size());
  } else if (arch == "qwen2moe" || arch == "olmoe" || arch == "glm4moe") {
    config = OtherMoeConfig(arch, m, tokens.size());
    // GLM-4.5 (not Air): the per-head q/k norm, which the GGUF says by its tensors.
    if (arch == "glm4moe") config["use_qk_norm"] = file->FindTensor("blk.0.attn_q_norm.weight") != nullptr;
  } else if (gpt_oss) {
    const gguf::TensorInfo* gate = file->FindTensor("blk.0.ffn_gate_exps.weight");
    config = GptOssConfig(m, tokens.size(), gate != nullptr && gate->type == gguf::GgmlType::kMXFP4);
  } else {
    config["architectures"] = {mixtral ? "MixtralForCausalLM" : "Qwen3MoeForCausalLM"};
    config["model_type"] = mixtral ? "mixtral" : "qwen3_moe";
    config["hidden_size"] = u("embedding_length");
    config["num_hidden_layers"] = u("block_count");
    config["num_attention_heads"] = n_head;
    config["num_key_value_heads"] = n_head_kv;
    config["head_dim"] = head_dim;
    config[mixtral ? "intermediate_size" : "moe_intermediate_size"] = u("feed_forward_length");
    if (!mixtral) config["intermediate_size"] = 6 * u("feed_forward_length");  // the dense MLP's, unused
    config[mixtral ? "num_local_experts" : "num_experts"] = u("expert_count");
    config["num_experts_per_tok"] = u("expert_used_count");
    config["max_position_embeddings"] = u("context_length");
    config["rope_theta"] = m.GetFloat(p + "rope.freq_base").value_or(0);
    config["rms_norm_eps"] = m.GetFloat(p + "attention.layer_norm_rms_epsilon").value_or(0);
    config["vocab_size"] = tokens.size();
    config["rope_scaling"] = nullptr;
    config["tie_word_embeddings"] = false;
    config["torch_dtype"] = "bfloat16";
    if (!mixtral) config["norm_topk_prob"] = true, config["decoder_sparse_step"] = 1, config["mlp_only_layers"] = ordered_json::array();
  }
  RETURN_IF_ERROR(WriteText(dir + "/config.json", config.dump(2)));

  if (options.tokenizer) {
    ASSIGN_OR_RETURN(const std::vector<int64_t> types, m.GetIntArray("tokenizer.ggml.token_type"));
    ASSIGN_OR_RETURN(const std::vector<std::string> merges, m.GetStringArray("tokenizer.ggml.merges"));
    ordered_json vocab = ordered_json::object(), added = ordered_json::array(), merge_list = ordered_json::array();
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (types[i] == 1) vocab[tokens[i]] = i;
      if (types[i] == 3 || types[i] == 4) {
        added.push_back({{"id", i}, {"content", tokens[i]}, {"single_word", false}, {"lstrip", false},
                         {"rstrip", false}, {"normalized", false}, {"special", types[i] == 3}});
      }
      // Type 5 (unused padding) is absent from Hugging Face's files: the converter pads up to vocab_size.
    }
    for (const std::string& merge : merges) {
      if (!options.array_merges) {
        merge_list.push_back(merge);
      } else {
        std::vector<std::string> ab = absl::StrSplit(merge, absl::MaxSplits(' ', 1));
        merge_list.push_back({ab[0], ab[1]});
      }
    }
    ordered_json tok;
    tok["version"] = "1.0";
    tok["added_tokens"] = added;
    tok["normalizer"] = {{"type", "NFC"}};
    tok["pre_tokenizer"] = {
        {"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"}, {"pattern", {{"Regex", packtool::kHfQwen2PreRegex}}}, {"behavior", "Isolated"}, {"invert", false}},
          {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}}}}};
    tok["decoder"] = {{"type", "ByteLevel"}};
    tok["model"] = {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"byte_fallback", false},
                    {"vocab", vocab}, {"merges", merge_list}};
    RETURN_IF_ERROR(WriteText(dir + "/tokenizer.json", tok.dump()));

    ordered_json tc;
    auto token_key = [&](const char* gguf_key, const char* hf_key) {
      absl::StatusOr<uint64_t> id = m.GetUint(gguf_key);
      if (id.ok() && *id < tokens.size()) tc[hf_key] = tokens[*id];
    };
    token_key("tokenizer.ggml.eos_token_id", "eos_token");
    token_key("tokenizer.ggml.bos_token_id", "bos_token");
    token_key("tokenizer.ggml.padding_token_id", "pad_token");
    if (absl::StatusOr<bool> b = m.GetBool("tokenizer.ggml.add_bos_token"); b.ok()) tc["add_bos_token"] = *b;
    if (absl::StatusOr<std::string> t = m.GetString("tokenizer.chat_template"); t.ok()) tc["chat_template"] = *t;
    RETURN_IF_ERROR(WriteText(dir + "/tokenizer_config.json", tc.dump(2)));
  }

  // Tensors: GGUF name -> Hugging Face names and bytes.
  std::vector<SafetensorsEntry> entries;
  const std::string moe = mixtral ? "block_sparse_moe" : "mlp";
  const char* roles_hf[3] = {mixtral ? "w1" : "gate_proj", mixtral ? "w3" : "up_proj", mixtral ? "w2" : "down_proj"};
  for (const gguf::TensorInfo& t : file->tensors()) {
    if (gpt_oss && absl::StrContains(t.name, "_exps.")) continue;  // fused below
    ASSIGN_OR_RETURN(const std::string dtype, Dtype(t.type));
    std::vector<int64_t> shape(t.ne.rbegin(), t.ne.rend());
    std::vector<uint8_t> bytes(t.data, t.data + t.bytes);
    if (t.name == "token_embd.weight") {
      entries.push_back({"model.embed_tokens.weight", dtype, shape, bytes});
      continue;
    }
    if (t.name == "output_norm.weight") {
      entries.push_back({"model.norm.weight", dtype, shape, bytes});
      continue;
    }
    if (t.name == "output.weight") {
      entries.push_back({"lm_head.weight", dtype, shape, bytes});
      continue;
    }
    std::vector<std::string> parts = absl::StrSplit(t.name, absl::MaxSplits('.', 2));  // blk, N, rest
    const std::string layer = absl::StrCat("model.layers.", parts[1], ".");
    const std::string& rest = parts[2];
    static const std::vector<std::pair<std::string, std::string>> plain = {
        {"attn_norm.weight", "input_layernorm.weight"},   {"ffn_norm.weight", "post_attention_layernorm.weight"},
        {"attn_v.weight", "self_attn.v_proj.weight"},     {"attn_output.weight", "self_attn.o_proj.weight"},
        {"attn_q_norm.weight", "self_attn.q_norm.weight"}, {"attn_k_norm.weight", "self_attn.k_norm.weight"},
        {"attn_q.weight", "self_attn.q_proj.weight"},     {"attn_k.weight", "self_attn.k_proj.weight"},
        // deepseek2
        {"attn_q_a.weight", "self_attn.q_a_proj.weight"}, {"attn_q_a_norm.weight", "self_attn.q_a_layernorm.weight"},
        {"attn_q_b.weight", "self_attn.q_b_proj.weight"},
        {"attn_kv_a_mqa.weight", "self_attn.kv_a_proj_with_mqa.weight"},
        {"attn_kv_a_norm.weight", "self_attn.kv_a_layernorm.weight"},
        {"attn_kv_b.weight", "self_attn.kv_b_proj.weight"},
        {"ffn_gate.weight", "mlp.gate_proj.weight"},       {"ffn_up.weight", "mlp.up_proj.weight"},
        {"ffn_down.weight", "mlp.down_proj.weight"},
        {"exp_probs_b.bias", "mlp.gate.e_score_correction_bias"},

        // gpt-oss
        {"attn_q.bias", "self_attn.q_proj.bias"},         {"attn_k.bias", "self_attn.k_proj.bias"},
        {"attn_v.bias", "self_attn.v_proj.bias"},         {"attn_output.bias", "self_attn.o_proj.bias"},
        {"attn_sinks.weight", "self_attn.sinks"},
        {"post_attention_norm.weight", "post_attention_layernorm.weight"}};
    bool done = false;
    for (const auto& [g, h] : plain) {
      if (rest != g) continue;
      if (mixtral && (g == "attn_q.weight" || g == "attn_k.weight")) {
        std::vector<uint8_t> hf(bytes.size());
        const int64_t heads = g == "attn_q.weight" ? n_head : n_head_kv;
        packtool::UnpermuteRowsForNormalRope(bytes, hf, heads, head_dim, bytes.size() / (heads * head_dim));
        bytes = std::move(hf);
      }
      entries.push_back({layer + h, dtype, shape, bytes});
      done = true;
    }
    if (done) continue;
    if (absl::EndsWith(rest, "_shexp.weight")) {
      // Qwen2-MoE's one shared expert (with its gate, a [1, n_embd] linear layer), DeepSeek's and GLM's shared experts.
      const std::string shared = arch == "qwen2moe" ? "mlp.shared_expert" : "mlp.shared_experts";
      if (rest == "ffn_gate_inp_shexp.weight") {
        entries.push_back({layer + "mlp.shared_expert_gate.weight", dtype, {1, shape[0]}, bytes});
      } else {
        const std::string role = rest.substr(4, rest.find('_', 4) - 4);  // gate, up, down
        entries.push_back({absl::StrCat(layer, shared, ".", role, "_proj.weight"), dtype, shape, bytes});
      }
      continue;
    }
    if (rest == "ffn_gate_inp.weight" || rest == "ffn_gate_inp.bias") {
      entries.push_back({absl::StrCat(layer, moe, gpt_oss ? ".router." : ".gate.", rest.substr(13)), dtype, shape, bytes});
      continue;
    }
    const int role = rest == "ffn_gate_exps.weight" ? 0 : rest == "ffn_up_exps.weight" ? 1 : rest == "ffn_down_exps.weight" ? 2 : -1;
    if (role < 0) return absl::InvalidArgumentError(absl::StrCat("hf writer: unexpected tensor ", t.name));
    const int64_t n_expert = t.ne[2];
    const size_t per = bytes.size() / static_cast<size_t>(n_expert);
    for (int64_t e = 0; e < n_expert; ++e) {
      entries.push_back({absl::StrCat(layer, moe, ".experts.", e, ".", roles_hf[role], ".weight"), dtype,
                         {shape[1], shape[2]},
                         std::vector<uint8_t>(bytes.begin() + e * per, bytes.begin() + (e + 1) * per)});
    }
  }
  if (gpt_oss) {
    RETURN_IF_ERROR(AddGptOssExperts(*file, &entries));
  }
  const size_t n = entries.size();
  for (int s = 0; s < options.shards; ++s) {
    std::vector<SafetensorsEntry> shard(entries.begin() + n * s / options.shards,
                                        entries.begin() + n * (s + 1) / options.shards);
    RETURN_IF_ERROR(WriteSafetensors(
        absl::StrFormat("%s/model-%05d-of-%05d.safetensors", dir, s + 1, options.shards), shard));
  }
  return absl::OkStatus();
}

absl::Status SplitDeepseekKvB(const std::string& src, const std::string& dst) {
  ASSIGN_OR_RETURN(std::unique_ptr<gguf::GgufFile> file, gguf::GgufFile::Open(src));
  const gguf::Metadata& m = file->metadata();
  auto u = [&](const char* key) -> absl::StatusOr<int64_t> {
    ASSIGN_OR_RETURN(const uint64_t v, m.GetUint(absl::StrCat("deepseek2.", key)));
    return static_cast<int64_t>(v);
  };
  ASSIGN_OR_RETURN(const int64_t heads, u("attention.head_count"));
  ASSIGN_OR_RETURN(const int64_t rank, u("attention.kv_lora_rank"));
  ASSIGN_OR_RETURN(const int64_t rope, u("rope.dimension_count"));
  ASSIGN_OR_RETURN(const int64_t key, u("attention.key_length"));
  ASSIGN_OR_RETURN(const int64_t vd, u("attention.value_length"));
  const int64_t nope = key - rope, per_head = nope + vd;
  gguf::GgufWriter w(file->alignment());
  for (const auto& [k, value] : m.entries()) {
    if (k != "general.alignment") w.Set(k, value);
  }
  w.SetUint32("deepseek2.attention.head_count_kv", 1);
  w.SetUint32("deepseek2.attention.key_length", static_cast<uint32_t>(rank + rope));
  w.SetUint32("deepseek2.attention.value_length", static_cast<uint32_t>(rank));
  w.SetUint32("deepseek2.attention.key_length_mla", static_cast<uint32_t>(key));
  w.SetUint32("deepseek2.attention.value_length_mla", static_cast<uint32_t>(vd));
  std::deque<std::vector<uint8_t>> split;  // outlives WriteFile; emplace_back keeps references valid
  for (const gguf::TensorInfo& t : file->tensors()) {
    if (!absl::EndsWith(t.name, ".attn_kv_b.weight")) {
      RETURN_IF_ERROR(w.AddTensorData(t.name, t.type, t.ne, {t.data, t.bytes}));
      continue;
    }
    const size_t e = t.bytes / static_cast<size_t>(heads * per_head * rank);  // bytes an element
    std::vector<uint8_t>& k_b = split.emplace_back(static_cast<size_t>(heads * rank * nope) * e);
    std::vector<uint8_t>& v_b = split.emplace_back(static_cast<size_t>(heads * vd * rank) * e);
    // kv_b row (h * per_head + d) of `rank` values; k_b[h][r][d] = kv_b[h * per_head + d][r], v_b[h][j][r] =
    // kv_b[h * per_head + nope + j][r].
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t r = 0; r < rank; ++r) {
        for (int64_t d = 0; d < nope; ++d) {
          std::memcpy(&k_b[((h * rank + r) * nope + d) * e], t.data + ((h * per_head + d) * rank + r) * e, e);
        }
        for (int64_t j = 0; j < vd; ++j) {
          std::memcpy(&v_b[((h * vd + j) * rank + r) * e], t.data + ((h * per_head + nope + j) * rank + r) * e, e);
        }
      }
    }
    const std::string prefix = t.name.substr(0, t.name.size() - std::string("attn_kv_b.weight").size());
    RETURN_IF_ERROR(w.AddTensorData(prefix + "attn_k_b.weight", t.type, {nope, rank, heads}, k_b));
    RETURN_IF_ERROR(w.AddTensorData(prefix + "attn_v_b.weight", t.type, {rank, vd, heads}, v_b));
  }
  return w.WriteFile(dst);
}

}  // namespace strata::testing
