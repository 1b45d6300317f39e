#include "tests/testing/hf_checkpoint_writer.h"

#include <cstring>
#include <fstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "engine/gguf/gguf_file.h"
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
        {"attn_q.weight", "self_attn.q_proj.weight"},     {"attn_k.weight", "self_attn.k_proj.weight"}};
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
    if (rest == "ffn_gate_inp.weight") {
      entries.push_back({layer + moe + ".gate.weight", dtype, shape, bytes});
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
  const size_t n = entries.size();
  for (int s = 0; s < options.shards; ++s) {
    std::vector<SafetensorsEntry> shard(entries.begin() + n * s / options.shards,
                                        entries.begin() + n * (s + 1) / options.shards);
    RETURN_IF_ERROR(WriteSafetensors(
        absl::StrFormat("%s/model-%05d-of-%05d.safetensors", dir, s + 1, options.shards), shard));
  }
  return absl::OkStatus();
}

}  // namespace strata::testing
