#include "packtool/hf_config.h"

#include <cmath>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/status_macros.h"
#include "packtool/hf_fp8.h"
#include "packtool/json_file.h"
#include "packtool/synth_arch.h"

namespace strata::packtool {
namespace {

using nlohmann::json;

absl::StatusOr<int64_t> ReadInt(const json& c, std::string_view key, const std::string& path,
                                std::optional<int64_t> fallback = std::nullopt) {
  const std::string k(key);
  if (!c.contains(k) || c[k].is_null()) {
    if (fallback) return *fallback;
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", k, ": missing (expected a positive integer)"));
  }
  if (!c[k].is_number_unsigned() || c[k].get<uint64_t>() == 0 || c[k].get<uint64_t>() > (uint64_t{1} << 31)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", k, ": expected an integer in 1 .. 2^31"));
  }
  return c[k].get<int64_t>();
}

// A count that may be 0 (absent: `fallback`).
absl::StatusOr<int64_t> ReadCount(const json& c, std::string_view key, const std::string& path, int64_t fallback) {
  const std::string k(key);
  if (!c.contains(k) || c[k].is_null()) return fallback;
  if (!c[k].is_number_unsigned() || c[k].get<uint64_t>() > (uint64_t{1} << 31)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", k, ": expected an integer in 0 .. 2^31"));
  }
  return c[k].get<int64_t>();
}

absl::StatusOr<double> ReadFloat(const json& c, std::string_view key, const std::string& path, double fallback) {
  const std::string k(key);
  if (!c.contains(k) || c[k].is_null()) return fallback;
  if (!c[k].is_number()) return absl::InvalidArgumentError(absl::StrCat(path, ": ", k, ": expected a number"));
  return c[k].get<double>();
}

absl::StatusOr<bool> ReadBool(const json& c, std::string_view key, const std::string& path, bool fallback) {
  const std::string k(key);
  if (!c.contains(k) || c[k].is_null()) return fallback;
  if (!c[k].is_boolean()) return absl::InvalidArgumentError(absl::StrCat(path, ": ", k, ": expected true or false"));
  return c[k].get<bool>();
}

absl::StatusOr<std::string> ReadString(const json& c, std::string_view key, const std::string& path,
                                       std::string fallback) {
  const std::string k(key);
  if (!c.contains(k) || c[k].is_null()) return fallback;
  if (!c[k].is_string()) return absl::InvalidArgumentError(absl::StrCat(path, ": ", k, ": expected a string"));
  return c[k].get<std::string>();
}

// The keys every architecture shares (a GQA transformer's; DeepSeek overrides the attention's).
absl::Status ReadCommon(const json& c, const std::string& path, SynthGeometry* g) {
  ASSIGN_OR_RETURN(g->n_layer, ReadInt(c, "num_hidden_layers", path));
  ASSIGN_OR_RETURN(g->n_embd, ReadInt(c, "hidden_size", path));
  ASSIGN_OR_RETURN(g->n_head, ReadInt(c, "num_attention_heads", path));
  ASSIGN_OR_RETURN(g->n_head_kv, ReadInt(c, "num_key_value_heads", path, g->n_head));
  ASSIGN_OR_RETURN(g->head_dim, ReadInt(c, "head_dim", path, g->n_embd / g->n_head));
  ASSIGN_OR_RETURN(g->n_expert_used, ReadInt(c, "num_experts_per_tok", path));
  ASSIGN_OR_RETURN(g->n_ctx, ReadInt(c, "max_position_embeddings", path));
  ASSIGN_OR_RETURN(g->n_vocab, ReadInt(c, "vocab_size", path));
  ASSIGN_OR_RETURN(const double theta, ReadFloat(c, "rope_theta", path, 10000.0));
  ASSIGN_OR_RETURN(const double eps, ReadFloat(c, "rms_norm_eps", path, 1e-6));
  g->rope_freq_base = static_cast<float>(theta);
  g->rms_norm_eps = static_cast<float>(eps);
  return absl::OkStatus();
}

absl::Status RefuseRopeScaling(const json& c, const std::string& path) {
  if (c.contains("rope_scaling") && !c["rope_scaling"].is_null()) {
    return absl::UnimplementedError(
        absl::StrCat(path, ": rope_scaling: Strata does not implement RoPE scaling for this architecture (expected null)"));
  }
  return absl::OkStatus();
}

// Refuses `key` when present with another value than `expected` (a JSON value), naming what Strata implements.
absl::Status RequireValue(const json& c, const char* key, const json& expected, const std::string& path,
                          const char* why) {
  if (!c.contains(key) || c[key].is_null() || c[key] == expected) return absl::OkStatus();
  return absl::UnimplementedError(
      absl::StrCat(path, ": ", key, ": ", c[key].dump(), " is not supported (expected ", expected.dump(), ": ", why,
                   ")"));
}

absl::Status ReadQwen3Moe(const json& c, const std::string& path, HfModelConfig* out) {
  RETURN_IF_ERROR(RefuseRopeScaling(c, path));
  RETURN_IF_ERROR(RequireValue(c, "mlp_only_layers", json::array(), path, "no dense layers"));
  RETURN_IF_ERROR(RequireValue(c, "decoder_sparse_step", 1, path, "every layer MoE"));
  RETURN_IF_ERROR(RequireValue(c, "norm_topk_prob", true, path, "Strata renormalises the top-k weights"));
  SynthGeometry& g = out->geometry;
  RETURN_IF_ERROR(ReadCommon(c, path, &g));
  ASSIGN_OR_RETURN(g.expert_ff, ReadInt(c, "moe_intermediate_size", path));
  ASSIGN_OR_RETURN(g.n_expert, ReadInt(c, "num_experts", path));
  return absl::OkStatus();
}

absl::Status ReadMixtral(const json& c, const std::string& path, HfModelConfig* out) {
  RETURN_IF_ERROR(RefuseRopeScaling(c, path));
  SynthGeometry& g = out->geometry;
  RETURN_IF_ERROR(ReadCommon(c, path, &g));
  ASSIGN_OR_RETURN(g.expert_ff, ReadInt(c, "intermediate_size", path));
  ASSIGN_OR_RETURN(g.n_expert, ReadInt(c, "num_local_experts", path));
  return absl::OkStatus();
}

// YaRN as Hugging Face configs give it (rope_scaling with rope_type, or the older type, "yarn"): the factor
// and original context into g, and the beta_fast / beta_slow Strata implements (32 and 1) checked.
absl::Status ReadYarn(const json& r, const std::string& where, SynthGeometry* g) {
  const char* type_key = r.contains("rope_type") && !r["rope_type"].is_null() ? "rope_type" : "type";
  ASSIGN_OR_RETURN(const std::string type, ReadString(r, type_key, where, ""));
  if (type != "yarn") {
    return absl::UnimplementedError(
        absl::StrCat(where, ".", type_key, ": '", type, "' is not supported (expected yarn)"));
  }
  ASSIGN_OR_RETURN(const double factor, ReadFloat(r, "factor", where, 0.0));
  if (!(factor > 1.0 && factor <= 1e4)) {
    return absl::InvalidArgumentError(absl::StrCat(where, ".factor: ", factor, ", expected above 1 (up to 10000)"));
  }
  g->yarn_factor = static_cast<float>(factor);
  ASSIGN_OR_RETURN(g->yarn_original_context, ReadInt(r, "original_max_position_embeddings", where));
  for (const auto& [key, expected] : {std::pair<const char*, double>{"beta_fast", 32.0}, {"beta_slow", 1.0}}) {
    ASSIGN_OR_RETURN(const double v, ReadFloat(r, key, where, expected));
    if (v != expected) {
      return absl::UnimplementedError(
          absl::StrCat(where, ".", key, ": ", v, " is not supported (Strata implements ", expected, ")"));
    }
  }
  return absl::OkStatus();
}

// DeepSeek's YaRN (rope_scaling of type yarn, as modeling_deepseek.py reads it): the attention scale takes
// mscale_all_dim (llama.cpp's yarn_log_multiplier 0.1 * mscale_all_dim) and the rotation mscale / mscale_all_dim,
// which Strata implements when they are equal (as in every DeepSeek-V2/V3 config).
absl::Status ReadDeepseekYarn(const json& c, const std::string& path, SynthGeometry* g) {
  if (!c.contains("rope_scaling") || c["rope_scaling"].is_null()) return absl::OkStatus();
  const json& r = c["rope_scaling"];
  const std::string where = absl::StrCat(path, ": rope_scaling");
  if (!r.is_object()) return absl::InvalidArgumentError(absl::StrCat(where, ": expected an object or null"));
  RETURN_IF_ERROR(ReadYarn(r, where, g));
  ASSIGN_OR_RETURN(const double mscale, ReadFloat(r, "mscale", where, 1.0));
  ASSIGN_OR_RETURN(const double mscale_all_dim, ReadFloat(r, "mscale_all_dim", where, 0.0));
  if (mscale != mscale_all_dim) {
    return absl::UnimplementedError(absl::StrCat(where, ".mscale: ", mscale, " differs from mscale_all_dim ",
                                                 mscale_all_dim, "; Strata implements YaRN with the two equal"));
  }
  g->yarn_log_multiplier = static_cast<float>(0.1 * mscale_all_dim);
  return absl::OkStatus();
}

// DeepSeek-V2 (softmax router) and V3 (sigmoid with the score-correction bias): llama.cpp's DeepseekV2Model.
absl::Status ReadDeepseek(const json& c, const std::string& path, HfModelConfig* out) {
  SynthGeometry& g = out->geometry;
  RETURN_IF_ERROR(ReadCommon(c, path, &g));
  g.n_head_kv = 1;  // llama.cpp writes latent attention as one kv head (MQA over the latent)
  ASSIGN_OR_RETURN(const std::string act, ReadString(c, "hidden_act", path, "silu"));
  ASSIGN_OR_RETURN(const bool attention_bias, ReadBool(c, "attention_bias", path, false));
  ASSIGN_OR_RETURN(const bool interleaved, ReadBool(c, "rope_interleave", path, true));
  if (act != "silu") {
    return absl::UnimplementedError(absl::StrCat(path, ": hidden_act: '", act, "' is not supported (expected silu)"));
  }
  if (attention_bias) {
    return absl::UnimplementedError(absl::StrCat(path, ": attention_bias: true is not supported (expected false)"));
  }
  if (!interleaved) {
    return absl::UnimplementedError(absl::StrCat(
        path, ": rope_interleave: false is not supported (DeepSeek's weights rotate interleaved pairs; expected true)"));
  }
  ASSIGN_OR_RETURN(g.q_lora_rank, ReadCount(c, "q_lora_rank", path, 0));
  ASSIGN_OR_RETURN(g.kv_lora_rank, ReadInt(c, "kv_lora_rank", path));
  ASSIGN_OR_RETURN(const int64_t nope, ReadInt(c, "qk_nope_head_dim", path));
  ASSIGN_OR_RETURN(g.rope_dim, ReadInt(c, "qk_rope_head_dim", path));
  ASSIGN_OR_RETURN(g.v_dim, ReadInt(c, "v_head_dim", path));
  g.head_dim = nope + g.rope_dim;
  ASSIGN_OR_RETURN(g.expert_ff, ReadInt(c, "moe_intermediate_size", path));
  ASSIGN_OR_RETURN(g.n_expert, ReadInt(c, "n_routed_experts", path));
  ASSIGN_OR_RETURN(const int64_t n_shared, ReadInt(c, "n_shared_experts", path));
  g.shared_ff = n_shared * g.expert_ff;
  ASSIGN_OR_RETURN(g.n_dense_lead, ReadCount(c, "first_k_dense_replace", path, 0));
  ASSIGN_OR_RETURN(g.dense_ff, ReadInt(c, "intermediate_size", path));
  ASSIGN_OR_RETURN(const int64_t moe_every, ReadInt(c, "moe_layer_freq", path, 1));
  if (moe_every != 1) {
    return absl::UnimplementedError(absl::StrCat(path, ": moe_layer_freq: ", moe_every,
                                                 " is not supported (expected 1: every layer after the dense ones MoE)"));
  }
  ASSIGN_OR_RETURN(g.n_expert_group, ReadInt(c, "n_group", path, 1));
  ASSIGN_OR_RETURN(g.n_group_used, ReadInt(c, "topk_group", path, g.n_expert_group));
  ASSIGN_OR_RETURN(const std::string scoring, ReadString(c, "scoring_func", path, "softmax"));
  ASSIGN_OR_RETURN(const std::string topk_method, ReadString(c, "topk_method", path, "greedy"));
  if (scoring == "sigmoid") {
    g.expert_gating = 2;
    if (topk_method != "noaux_tc") {
      return absl::UnimplementedError(absl::StrCat(path, ": topk_method: '", topk_method,
                                                   "' with scoring_func sigmoid is not supported (expected noaux_tc)"));
    }
  } else if (scoring == "softmax") {
    g.expert_gating = 1;
    // Plain greedy ignores the groups: the same as grouped selection only when every group is used.
    const bool greedy_ok = topk_method == "greedy" && g.n_group_used == g.n_expert_group;
    if (topk_method != "group_limited_greedy" && !greedy_ok) {
      return absl::UnimplementedError(absl::StrCat(
          path, ": topk_method: '", topk_method, "' with scoring_func softmax, n_group ", g.n_expert_group,
          " and topk_group ", g.n_group_used, " is not supported (expected group_limited_greedy, or greedy with ",
          "topk_group equal to n_group)"));
    }
  } else {
    return absl::UnimplementedError(
        absl::StrCat(path, ": scoring_func: '", scoring, "' is not supported (expected softmax or sigmoid)"));
  }
  ASSIGN_OR_RETURN(g.expert_weights_norm, ReadBool(c, "norm_topk_prob", path, false));
  ASSIGN_OR_RETURN(const double routed_scale, ReadFloat(c, "routed_scaling_factor", path, 1.0));
  g.expert_weights_scale = static_cast<float>(routed_scale);
  ASSIGN_OR_RETURN(out->n_mtp_layers, ReadCount(c, "num_nextn_predict_layers", path, 0));
  return ReadDeepseekYarn(c, path, &g);
}

// gpt-oss (llama.cpp's GptOssModel): every even layer sliding-window, YaRN, the clamped SwiGLU of limit 7.
absl::Status ReadGptOss(const json& c, const std::string& path, HfModelConfig* out) {
  SynthGeometry& g = out->geometry;
  RETURN_IF_ERROR(ReadCommon(c, path, &g));
  ASSIGN_OR_RETURN(g.expert_ff, ReadInt(c, "intermediate_size", path));
  ASSIGN_OR_RETURN(g.n_expert, ReadInt(c, "num_local_experts", path));
  ASSIGN_OR_RETURN(g.sliding_window, ReadInt(c, "sliding_window", path));
  ASSIGN_OR_RETURN(const std::string act, ReadString(c, "hidden_act", path, "silu"));
  ASSIGN_OR_RETURN(const bool attention_bias, ReadBool(c, "attention_bias", path, true));
  ASSIGN_OR_RETURN(const double limit, ReadFloat(c, "swiglu_limit", path, 7.0));
  if (act != "silu") {
    return absl::UnimplementedError(absl::StrCat(path, ": hidden_act: '", act, "' is not supported (expected silu)"));
  }
  if (!attention_bias) {
    return absl::UnimplementedError(absl::StrCat(path, ": attention_bias: false is not supported (expected true)"));
  }
  if (limit != 7.0) {
    return absl::UnimplementedError(absl::StrCat(path, ": swiglu_limit: ", limit, " is not supported (Strata implements 7)"));
  }
  if (c.contains("layer_types") && !c["layer_types"].is_null()) {
    const json& types = c["layer_types"];
    bool alternating = types.is_array() && static_cast<int64_t>(types.size()) == g.n_layer;
    for (size_t l = 0; alternating && l < types.size(); ++l) {
      alternating = types[l] == (l % 2 == 0 ? "sliding_attention" : "full_attention");
    }
    if (!alternating) {
      return absl::UnimplementedError(absl::StrCat(
          path, ": layer_types: Strata runs gpt-oss with sliding_attention in even layers and full_attention in odd ",
          "ones, one entry per layer (", g.n_layer, ")"));
    }
  }
  // YaRN as the released models have it. Their "truncate": false (the correction range left unrounded) is
  // read as llama.cpp's converter and engine read it: rounded (a difference in the lowest frequencies' ramp).
  const std::string where = absl::StrCat(path, ": rope_scaling");
  if (!c.contains("rope_scaling") || !c["rope_scaling"].is_object()) {
    return absl::UnimplementedError(absl::StrCat(where, ": missing (Strata runs gpt-oss with yarn)"));
  }
  return ReadYarn(c["rope_scaling"], where, &g);
}

// Qwen1.5-MoE / Qwen2-57B-A14B: q/k/v biases, a shared expert with its sigmoid gate, top-k weights as softmaxed.
absl::Status ReadQwen2Moe(const json& c, const std::string& path, HfModelConfig* out) {
  RETURN_IF_ERROR(RefuseRopeScaling(c, path));
  RETURN_IF_ERROR(RequireValue(c, "norm_topk_prob", false, path, "Strata runs qwen2moe without renormalising"));
  RETURN_IF_ERROR(RequireValue(c, "decoder_sparse_step", 1, path, "every layer MoE"));
  RETURN_IF_ERROR(RequireValue(c, "mlp_only_layers", json::array(), path, "no dense layers"));
  RETURN_IF_ERROR(RequireValue(c, "use_sliding_window", false, path, "full attention"));
  SynthGeometry& g = out->geometry;
  RETURN_IF_ERROR(ReadCommon(c, path, &g));
  ASSIGN_OR_RETURN(g.expert_ff, ReadInt(c, "moe_intermediate_size", path));
  ASSIGN_OR_RETURN(g.n_expert, ReadInt(c, "num_experts", path));
  ASSIGN_OR_RETURN(g.shared_ff, ReadInt(c, "shared_expert_intermediate_size", path));
  return absl::OkStatus();
}

// OLMoE: RMSNorm over the whole q and k projections, top-k weights as softmaxed.
absl::Status ReadOlmoe(const json& c, const std::string& path, HfModelConfig* out) {
  RETURN_IF_ERROR(RefuseRopeScaling(c, path));
  RETURN_IF_ERROR(RequireValue(c, "norm_topk_prob", false, path, "Strata runs olmoe without renormalising"));
  RETURN_IF_ERROR(RequireValue(c, "clip_qkv", json(), path, "no clipping"));
  SynthGeometry& g = out->geometry;
  RETURN_IF_ERROR(ReadCommon(c, path, &g));
  ASSIGN_OR_RETURN(g.expert_ff, ReadInt(c, "intermediate_size", path));
  ASSIGN_OR_RETURN(g.n_expert, ReadInt(c, "num_experts", path));
  return absl::OkStatus();
}

// GLM-4.5 / 4.6 (Air): per-head q/k norm (not Air), partial RoPE, dense leading layers, sigmoid routing with the score-correction bias, a
// shared expert; the multi-token-prediction layers are left out.
absl::Status ReadGlm4Moe(const json& c, const std::string& path, HfModelConfig* out) {
  RETURN_IF_ERROR(RefuseRopeScaling(c, path));
  RETURN_IF_ERROR(RequireValue(c, "attention_bias", true, path, "q/k/v biases"));
  RETURN_IF_ERROR(RequireValue(c, "n_group", 1, path, "Strata's glm4moe routes without expert groups"));
  RETURN_IF_ERROR(RequireValue(c, "topk_group", 1, path, "Strata's glm4moe routes without expert groups"));
  RETURN_IF_ERROR(RequireValue(c, "topk_method", "noaux_tc", path, "sigmoid routing with the bias"));
  SynthGeometry& g = out->geometry;
  RETURN_IF_ERROR(ReadCommon(c, path, &g));
  // GLM-4.5 normalizes each head of q and k (self_attn.q_norm / k_norm); GLM-4.5-Air does not.
  ASSIGN_OR_RETURN(g.head_qk_norm, ReadBool(c, "use_qk_norm", path, false));
  ASSIGN_OR_RETURN(g.expert_ff, ReadInt(c, "moe_intermediate_size", path));
  ASSIGN_OR_RETURN(g.n_expert, ReadInt(c, "n_routed_experts", path));
  ASSIGN_OR_RETURN(const int64_t n_shared, ReadInt(c, "n_shared_experts", path));
  g.shared_ff = n_shared * g.expert_ff;
  ASSIGN_OR_RETURN(g.n_dense_lead, ReadCount(c, "first_k_dense_replace", path, 0));
  ASSIGN_OR_RETURN(g.dense_ff, ReadInt(c, "intermediate_size", path));
  ASSIGN_OR_RETURN(const double rotary, ReadFloat(c, "partial_rotary_factor", path, 0.5));
  const double rope_dim = rotary * static_cast<double>(g.head_dim);
  if (!(rotary > 0.0 && rotary <= 1.0) || rope_dim != std::floor(rope_dim) || static_cast<int64_t>(rope_dim) % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": partial_rotary_factor: ", rotary, " of head_dim ",
                                                   g.head_dim, " is not an even number of values"));
  }
  g.rope_dim = static_cast<int64_t>(rope_dim);
  ASSIGN_OR_RETURN(g.expert_weights_norm, ReadBool(c, "norm_topk_prob", path, true));
  ASSIGN_OR_RETURN(const double routed_scale, ReadFloat(c, "routed_scaling_factor", path, 1.0));
  g.expert_weights_scale = static_cast<float>(routed_scale);
  ASSIGN_OR_RETURN(out->n_mtp_layers, ReadCount(c, "num_nextn_predict_layers", path, 0));
  return absl::OkStatus();
}

using ConfigReader = absl::Status (*)(const json&, const std::string&, HfModelConfig*);

struct HfArchEntry {
  HfArch arch;
  ConfigReader read;
};

const std::vector<HfArchEntry>& Entries() {
  static const std::vector<HfArchEntry> entries = {
      {{"Qwen3MoeForCausalLM", "qwen3moe", "mlp", "gate", "", {"gate_proj", "up_proj", "down_proj"}, false}, ReadQwen3Moe},
      {{"MixtralForCausalLM", "mixtral", "block_sparse_moe", "gate", "", {"w1", "w3", "w2"}, true}, ReadMixtral},
      {{"DeepseekV3ForCausalLM", "deepseek2", "mlp", "gate", "shared_experts", {"gate_proj", "up_proj", "down_proj"}, false},
       ReadDeepseek},
      {{"DeepseekV2ForCausalLM", "deepseek2", "mlp", "gate", "shared_experts", {"gate_proj", "up_proj", "down_proj"}, false},
       ReadDeepseek},
      // gpt-oss's experts are fused tensors (packtool/hf_gpt_oss.h): no per-expert roles.
      {{"GptOssForCausalLM", "gpt-oss", "mlp", "router", "", {"", "", ""}, false}, ReadGptOss},
      {{"Qwen2MoeForCausalLM", "qwen2moe", "mlp", "gate", "shared_expert", {"gate_proj", "up_proj", "down_proj"}, false},
       ReadQwen2Moe},
      {{"OlmoeForCausalLM", "olmoe", "mlp", "gate", "", {"gate_proj", "up_proj", "down_proj"}, false}, ReadOlmoe},
      {{"Glm4MoeForCausalLM", "glm4moe", "mlp", "gate", "shared_experts", {"gate_proj", "up_proj", "down_proj"}, false},
       ReadGlm4Moe},
  };
  return entries;
}

}  // namespace

absl::StatusOr<HfModelConfig> ReadHfConfig(const std::string& dir) {
  const std::string path = dir + "/config.json";
  HfModelConfig out;
  ASSIGN_OR_RETURN(out.json, ReadJsonFile(path));
  if (!out.json.is_object()) return absl::InvalidArgumentError(absl::StrCat(path, ": not a JSON object"));
  const json& c = out.json;
  std::vector<std::string> known;
  for (const HfArchEntry& e : Entries()) known.emplace_back(e.arch.hf_name);
  const std::string expected = absl::StrCat("expected one of: ", absl::StrJoin(known, ", "));
  if (!c.contains("architectures") || !c["architectures"].is_array() || c["architectures"].empty() ||
      !c["architectures"][0].is_string()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": architectures: missing (", expected, ")"));
  }
  const std::string name = c["architectures"][0].get<std::string>();
  const std::vector<HfArchEntry>& entries = Entries();
  for (size_t i = 0; i < entries.size(); ++i) {
    if (entries[i].arch.hf_name != name) continue;
    out.arch = &entries[i].arch;
    out.geometry.arch = std::string(out.arch->synth_name);
    const json* q = c.contains("quantization_config") ? &c["quantization_config"] : nullptr;
    std::string quant_method;
    if (q != nullptr && q->is_object()) {
      ASSIGN_OR_RETURN(quant_method, ReadString(*q, "quant_method", path + ": quantization_config", ""));
    }
    if (out.arch->synth_name == "gpt-oss" && quant_method == "mxfp4") {
      out.mxfp4_experts = true;  // MXFP4 as gpt-oss ships its experts; the rest is BF16
    } else {
      ASSIGN_OR_RETURN(out.fp8_blocks, ReadFp8QuantizationConfig(c, path));
    }
    RETURN_IF_ERROR(entries[i].read(c, path, &out));
    ASSIGN_OR_RETURN(out.tie_word_embeddings, ReadBool(c, "tie_word_embeddings", path, false));
    return out;
  }
  return absl::UnimplementedError(absl::StrCat(path, ": architectures: '", name, "' is not supported (", expected, ")"));
}

void SetHfMetadata(const HfModelConfig& config, gguf::GgufWriter* writer) {
  const SynthArch& arch = **FindSynthArch(config.geometry.arch);
  const SynthGeometry& g = config.geometry;
  SetSynthMetadata(arch, g, writer);
  if (arch.latent_attention) {
    const std::string a(arch.gguf_arch);
    writer->SetUint32(a + ".attention.key_length", static_cast<uint32_t>(g.kv_lora_rank + g.rope_dim));
    writer->SetUint32(a + ".attention.value_length", static_cast<uint32_t>(g.kv_lora_rank));
    writer->SetUint32(a + ".attention.key_length_mla", static_cast<uint32_t>(g.head_dim));
    writer->SetUint32(a + ".attention.value_length_mla", static_cast<uint32_t>(g.v_dim));
  }
  if (arch.sigmoid_router) {  // the checkpoint's routing, where synth writes GLM-4.5's
    const std::string a(arch.gguf_arch);
    writer->SetBool(a + ".expert_weights_norm", g.expert_weights_norm);
    writer->SetFloat32(a + ".expert_weights_scale", g.expert_weights_scale);
  }
  if (arch.gpt_oss) {  // the checkpoint's YaRN, where synth writes the released models'
    const std::string a(arch.gguf_arch);
    writer->SetFloat32(a + ".rope.scaling.factor", g.yarn_factor);
    writer->SetUint32(a + ".rope.scaling.original_context_length", static_cast<uint32_t>(g.yarn_original_context));
  }
}

}  // namespace strata::packtool
