#include "packtool/synth_arch.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace strata::packtool {

const std::vector<SynthArch>& SynthArchTable() {
  // Mixtral is llama.cpp's "llama" architecture with expert_count > 0 (NORM RoPE, no q/k norm).
  static const std::vector<SynthArch> table = {
      {"qwen3moe", "qwen3moe", /*qk_norm=*/true},
      {"mixtral", "llama", /*qk_norm=*/false},
      {"qwen2moe", "qwen2moe", /*qk_norm=*/false, /*qk_norm_whole=*/false, /*qkv_bias=*/true,
       /*shared_expert=*/true, /*shared_gate=*/true},
      {"olmoe", "olmoe", /*qk_norm=*/false, /*qk_norm_whole=*/true},
      {"glm4moe", "glm4moe", /*qk_norm=*/false, /*qk_norm_whole=*/false, /*qkv_bias=*/true,
       /*shared_expert=*/true, /*shared_gate=*/false, /*sigmoid_router=*/true},
      {"gpt-oss", "gpt-oss", /*qk_norm=*/false, /*qk_norm_whole=*/false, /*qkv_bias=*/true,
       /*shared_expert=*/false, /*shared_gate=*/false, /*sigmoid_router=*/false, /*gpt_oss=*/true},
      {"deepseek2", "deepseek2", /*qk_norm=*/false, /*qk_norm_whole=*/false, /*qkv_bias=*/false,
       /*shared_expert=*/true, /*shared_gate=*/false, /*sigmoid_router=*/false, /*gpt_oss=*/false,
       /*latent_attention=*/true},
  };
  return table;
}

absl::StatusOr<const SynthArch*> FindSynthArch(std::string_view name) {
  std::vector<std::string> names;
  for (const SynthArch& arch : SynthArchTable()) {
    if (arch.name == name) return &arch;
    names.emplace_back(arch.name);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--arch: unknown architecture '", std::string(name), "' (expected one of: ", absl::StrJoin(names, ", "), ")"));
}

namespace {

// The GQA attention tensors of block l.
void AddGqaAttention(const SynthArch& arch, const SynthGeometry& g, int64_t l, std::vector<SynthTensor>* out) {
  std::vector<SynthTensor>& t = *out;
  const std::string p = absl::StrCat("blk.", l, ".");
  const float inv_sqrt_embd = 1.0f / std::sqrt(static_cast<float>(g.n_embd));
  const int64_t q_dim = g.n_head * g.head_dim;
  const int64_t kv_dim = g.n_head_kv * g.head_dim;
  t.push_back({p + "attn_q.weight", {g.n_embd, q_dim}, SynthTensorKind::kWeight, inv_sqrt_embd, 0.0f, l});
  t.push_back({p + "attn_k.weight", {g.n_embd, kv_dim}, SynthTensorKind::kWeight, inv_sqrt_embd, 0.0f, l});
  t.push_back({p + "attn_v.weight", {g.n_embd, kv_dim}, SynthTensorKind::kWeight, inv_sqrt_embd, 0.0f, l});
  t.push_back({p + "attn_output.weight", {q_dim, g.n_embd}, SynthTensorKind::kWeight,
               1.0f / std::sqrt(static_cast<float>(q_dim)), 0.0f, l});
  if (arch.qkv_bias) {
    t.push_back({p + "attn_q.bias", {q_dim}, SynthTensorKind::kBias, 0.1f, 0.0f, l});
    t.push_back({p + "attn_k.bias", {kv_dim}, SynthTensorKind::kBias, 0.1f, 0.0f, l});
    t.push_back({p + "attn_v.bias", {kv_dim}, SynthTensorKind::kBias, 0.1f, 0.0f, l});
  }
  if (arch.gpt_oss) {
    t.push_back({p + "attn_output.bias", {g.n_embd}, SynthTensorKind::kBias, 0.1f, 0.0f, l});
    // Sink logits of the order of the attention scores, so that they take a varying share.
    t.push_back({p + "attn_sinks.weight", {g.n_head}, SynthTensorKind::kBias, 1.0f, 0.0f, l});
  }
  const bool head_norm = arch.qk_norm || g.head_qk_norm;
  if (head_norm || arch.qk_norm_whole) {
    t.push_back({p + "attn_q_norm.weight", {head_norm ? g.head_dim : q_dim}, SynthTensorKind::kNorm, 0.05f, 1.0f, l});
    t.push_back({p + "attn_k_norm.weight", {head_norm ? g.head_dim : kv_dim}, SynthTensorKind::kNorm, 0.05f, 1.0f, l});
  }
}

// DeepSeek's attention tensors (llama.cpp's names and shapes for deepseek2 with attn_kv_b).
void AddLatentAttention(const SynthGeometry& g, int64_t l, std::vector<SynthTensor>* t) {
  const std::string p = absl::StrCat("blk.", l, ".");
  auto inv_sqrt = [](int64_t n) { return 1.0f / std::sqrt(static_cast<float>(n)); };
  const int64_t q_dim = g.n_head * g.head_dim, nope = g.head_dim - g.rope_dim;
  if (g.q_lora_rank > 0) {
    t->push_back({p + "attn_q_a.weight", {g.n_embd, g.q_lora_rank}, SynthTensorKind::kWeight, inv_sqrt(g.n_embd), 0.0f, l});
    t->push_back({p + "attn_q_a_norm.weight", {g.q_lora_rank}, SynthTensorKind::kNorm, 0.05f, 1.0f, l});
    t->push_back({p + "attn_q_b.weight", {g.q_lora_rank, q_dim}, SynthTensorKind::kWeight, inv_sqrt(g.q_lora_rank), 0.0f, l});
  } else {
    t->push_back({p + "attn_q.weight", {g.n_embd, q_dim}, SynthTensorKind::kWeight, inv_sqrt(g.n_embd), 0.0f, l});
  }
  t->push_back({p + "attn_kv_a_mqa.weight", {g.n_embd, g.kv_lora_rank + g.rope_dim}, SynthTensorKind::kWeight,
                inv_sqrt(g.n_embd), 0.0f, l});
  t->push_back({p + "attn_kv_a_norm.weight", {g.kv_lora_rank}, SynthTensorKind::kNorm, 0.05f, 1.0f, l});
  t->push_back({p + "attn_kv_b.weight", {g.kv_lora_rank, g.n_head * (nope + g.v_dim)}, SynthTensorKind::kWeight,
                inv_sqrt(g.kv_lora_rank), 0.0f, l});
  t->push_back({p + "attn_output.weight", {g.n_head * g.v_dim, g.n_embd}, SynthTensorKind::kWeight,
                inv_sqrt(g.n_head * g.v_dim), 0.0f, l});
}

// The tensors of block l: attention, then a dense FFN (l < n_dense_lead) or the router and the experts.
void AddBlock(const SynthArch& arch, const SynthGeometry& g, int64_t l, std::vector<SynthTensor>* out) {
  std::vector<SynthTensor>& t = *out;
  const float inv_sqrt_embd = 1.0f / std::sqrt(static_cast<float>(g.n_embd));
  const float inv_sqrt_ff = 1.0f / std::sqrt(static_cast<float>(g.expert_ff));
  const std::string p = absl::StrCat("blk.", l, ".");
  t.push_back({p + "attn_norm.weight", {g.n_embd}, SynthTensorKind::kNorm, 0.05f, 1.0f, l});
  if (arch.latent_attention) {
    AddLatentAttention(g, l, &t);
  } else {
    AddGqaAttention(arch, g, l, &t);
  }
  t.push_back({p + (arch.sigmoid_router || arch.gpt_oss ? "post_attention_norm.weight" : "ffn_norm.weight"), {g.n_embd},
               SynthTensorKind::kNorm, 0.05f, 1.0f, l});
  if (l < g.n_dense_lead) {
    const float inv_sqrt_dense = 1.0f / std::sqrt(static_cast<float>(g.dense_ff));
    t.push_back({p + "ffn_gate.weight", {g.n_embd, g.dense_ff}, SynthTensorKind::kWeight, inv_sqrt_embd, 0.0f, l});
    t.push_back({p + "ffn_up.weight", {g.n_embd, g.dense_ff}, SynthTensorKind::kWeight, inv_sqrt_embd, 0.0f, l});
    t.push_back({p + "ffn_down.weight", {g.dense_ff, g.n_embd}, SynthTensorKind::kWeight, inv_sqrt_dense, 0.0f, l});
    return;
  }
  // A router with a larger spread than the other weights so that routing differs between tokens.
  t.push_back({p + "ffn_gate_inp.weight", {g.n_embd, g.n_expert}, SynthTensorKind::kRouter,
               2.0f * inv_sqrt_embd, 0.0f, l});
  if (arch.gpt_oss) {
    t.push_back({p + "ffn_gate_inp.bias", {g.n_expert}, SynthTensorKind::kBias, 0.5f, 0.0f, l});
    // Gate and up biases wide enough that some pre-activations pass the clamped SwiGLU's limit of 7.
    t.push_back({p + "ffn_gate_exps.bias", {g.expert_ff, g.n_expert}, SynthTensorKind::kBias, 3.0f, 0.0f, l});
    t.push_back({p + "ffn_up_exps.bias", {g.expert_ff, g.n_expert}, SynthTensorKind::kBias, 3.0f, 0.0f, l});
    t.push_back({p + "ffn_down_exps.bias", {g.n_embd, g.n_expert}, SynthTensorKind::kBias, 0.1f, 0.0f, l});
  }
  if (arch.sigmoid_router || (arch.latent_attention && g.expert_gating == 2)) {
    // A bias of the order of the sigmoid scores' spread, so that it changes some choices.
    t.push_back({p + "exp_probs_b.bias", {g.n_expert}, SynthTensorKind::kBias, 0.1f, 0.0f, l});
  }
  t.push_back({p + "ffn_gate_exps.weight", {g.n_embd, g.expert_ff, g.n_expert}, SynthTensorKind::kExpert,
               inv_sqrt_embd, 0.0f, l, 0});
  t.push_back({p + "ffn_up_exps.weight", {g.n_embd, g.expert_ff, g.n_expert}, SynthTensorKind::kExpert,
               inv_sqrt_embd, 0.0f, l, 1});
  t.push_back({p + "ffn_down_exps.weight", {g.expert_ff, g.n_embd, g.n_expert}, SynthTensorKind::kExpert,
               inv_sqrt_ff, 0.0f, l, 2});
  if (arch.shared_expert) {
    // A gate spread of ~2 puts sigmoid(gate . h) anywhere in (0.1, 0.9) across tokens.
    if (arch.shared_gate) {
      t.push_back({p + "ffn_gate_inp_shexp.weight", {g.n_embd}, SynthTensorKind::kRouter, 2.0f * inv_sqrt_embd, 0.0f, l});
    }
    const float inv_sqrt_shared = 1.0f / std::sqrt(static_cast<float>(g.shared_ff));
    t.push_back({p + "ffn_gate_shexp.weight", {g.n_embd, g.shared_ff}, SynthTensorKind::kWeight, inv_sqrt_embd, 0.0f, l});
    t.push_back({p + "ffn_up_shexp.weight", {g.n_embd, g.shared_ff}, SynthTensorKind::kWeight, inv_sqrt_embd, 0.0f, l});
    t.push_back({p + "ffn_down_shexp.weight", {g.shared_ff, g.n_embd}, SynthTensorKind::kWeight, inv_sqrt_shared, 0.0f, l});
  }
}

// What llama.cpp's converter adds to a multi-token-prediction block l (llama.cpp's MODEL_TENSOR.NEXTN_*, with
// the shapes src/llama-model.cpp loads for glm4moe and deepseek2).
void AddNextnTensors(const SynthGeometry& g, int64_t l, std::vector<SynthTensor>* t) {
  const std::string p = absl::StrCat("blk.", l, ".nextn.");
  const float inv_sqrt_2embd = 1.0f / std::sqrt(static_cast<float>(2 * g.n_embd));
  const float inv_sqrt_embd = 1.0f / std::sqrt(static_cast<float>(g.n_embd));
  t->push_back({p + "eh_proj.weight", {2 * g.n_embd, g.n_embd}, SynthTensorKind::kWeight, inv_sqrt_2embd, 0.0f, l});
  t->push_back({p + "embed_tokens.weight", {g.n_embd, g.n_vocab}, SynthTensorKind::kEmbedding, 1.0f, 0.0f, l});
  t->push_back({p + "enorm.weight", {g.n_embd}, SynthTensorKind::kNorm, 0.05f, 1.0f, l});
  t->push_back({p + "hnorm.weight", {g.n_embd}, SynthTensorKind::kNorm, 0.05f, 1.0f, l});
  t->push_back({p + "shared_head_head.weight", {g.n_embd, g.n_vocab}, SynthTensorKind::kWeight, inv_sqrt_embd, 0.0f, l});
  t->push_back({p + "shared_head_norm.weight", {g.n_embd}, SynthTensorKind::kNorm, 0.05f, 1.0f, l});
}

}  // namespace

std::vector<SynthTensor> SynthTensors(const SynthArch& arch, const SynthGeometry& g) {
  const float inv_sqrt_embd = 1.0f / std::sqrt(static_cast<float>(g.n_embd));
  std::vector<SynthTensor> t;
  t.push_back({"token_embd.weight", {g.n_embd, g.n_vocab}, SynthTensorKind::kEmbedding, 1.0f, 0.0f});
  for (int64_t l = 0; l < g.n_layer; ++l) AddBlock(arch, g, l, &t);
  // After the model's blocks, so that the other tensors keep their order and bytes without them.
  for (int64_t l = g.n_layer; l < g.n_layer + g.n_mtp_layers; ++l) {
    AddBlock(arch, g, l, &t);
    AddNextnTensors(g, l, &t);
  }
  t.push_back({"output_norm.weight", {g.n_embd}, SynthTensorKind::kNorm, 0.05f, 1.0f});
  // Logits with a spread of about 2 give varied, not degenerate, sampling.
  t.push_back({"output.weight", {g.n_embd, g.n_vocab}, SynthTensorKind::kWeight, 2.0f * inv_sqrt_embd, 0.0f});
  return t;
}

void SetSynthMetadata(const SynthArch& arch, const SynthGeometry& g, gguf::GgufWriter* w) {
  const std::string a(arch.gguf_arch);
  w->SetString("general.architecture", a);
  w->SetString("general.name", absl::StrCat("strata-synth-", std::string(arch.name)));
  w->SetUint32(a + ".block_count", static_cast<uint32_t>(g.n_layer + g.n_mtp_layers));
  if (g.n_mtp_layers > 0) w->SetUint32(a + ".nextn_predict_layers", static_cast<uint32_t>(g.n_mtp_layers));
  w->SetUint32(a + ".context_length", static_cast<uint32_t>(g.n_ctx));
  w->SetUint32(a + ".embedding_length", static_cast<uint32_t>(g.n_embd));
  // llama.cpp's Mixtral and OLMoE take the expert width from feed_forward_length; qwen3moe and qwen2moe have
  // their own key, and qwen2moe's feed_forward_length is the shared expert's width (as its converter writes).
  const bool dense_blocks = arch.sigmoid_router || arch.latent_attention;
  const int64_t ff = dense_blocks ? g.dense_ff : arch.shared_expert ? g.shared_ff : g.expert_ff;
  w->SetUint32(a + ".feed_forward_length", static_cast<uint32_t>(ff));
  if (arch.name == "qwen3moe" || arch.name == "qwen2moe" || dense_blocks || arch.gpt_oss) {
    w->SetUint32(a + ".expert_feed_forward_length", static_cast<uint32_t>(g.expert_ff));
  }
  if (arch.shared_expert && !arch.sigmoid_router) {
    w->SetUint32(a + ".expert_shared_feed_forward_length", static_cast<uint32_t>(g.shared_ff));
  }
  if (arch.sigmoid_router) {
    // GLM-4.5's values: llama.cpp reads the shared expert's width as expert_shared_count experts.
    w->SetUint32(a + ".expert_shared_count", static_cast<uint32_t>(g.shared_ff / g.expert_ff));
    w->SetUint32(a + ".leading_dense_block_count", static_cast<uint32_t>(g.n_dense_lead));
    w->SetUint32(a + ".expert_gating_func", 2);  // sigmoid
    w->SetBool(a + ".expert_weights_norm", true);
    w->SetFloat32(a + ".expert_weights_scale", 2.5f);
  }
  if (arch.gpt_oss) {
    // gpt-oss's YaRN (factor 32 over an original context of 4096) and its sliding window.
    w->SetUint32(a + ".attention.sliding_window", static_cast<uint32_t>(g.sliding_window));
    w->SetString(a + ".rope.scaling.type", "yarn");
    w->SetFloat32(a + ".rope.scaling.factor", 32.0f);
    w->SetUint32(a + ".rope.scaling.original_context_length", 4096);
  }
  if (arch.latent_attention) {
    // DeepSeek-V3's converter output (convert_hf_to_gguf.py DeepseekV2Model, attn_kv_b kept whole).
    w->SetUint32(a + ".expert_shared_count", static_cast<uint32_t>(g.shared_ff / g.expert_ff));
    w->SetUint32(a + ".leading_dense_block_count", static_cast<uint32_t>(g.n_dense_lead));
    w->SetUint32(a + ".expert_gating_func", static_cast<uint32_t>(g.expert_gating));
    w->SetBool(a + ".expert_weights_norm", g.expert_weights_norm);
    w->SetFloat32(a + ".expert_weights_scale", g.expert_weights_scale);
    w->SetUint32(a + ".expert_group_count", static_cast<uint32_t>(g.n_expert_group));
    w->SetUint32(a + ".expert_group_used_count", static_cast<uint32_t>(g.n_group_used));
    if (g.q_lora_rank > 0) w->SetUint32(a + ".attention.q_lora_rank", static_cast<uint32_t>(g.q_lora_rank));
    w->SetUint32(a + ".attention.kv_lora_rank", static_cast<uint32_t>(g.kv_lora_rank));
    if (g.yarn_factor > 0.0f) {
      w->SetString(a + ".rope.scaling.type", "yarn");
      w->SetFloat32(a + ".rope.scaling.factor", g.yarn_factor);
      w->SetUint32(a + ".rope.scaling.original_context_length", static_cast<uint32_t>(g.yarn_original_context));
      w->SetFloat32(a + ".rope.scaling.yarn_log_multiplier", g.yarn_log_multiplier);
    }
  }
  w->SetUint32(a + ".attention.head_count", static_cast<uint32_t>(g.n_head));
  w->SetUint32(a + ".attention.head_count_kv", static_cast<uint32_t>(g.n_head_kv));
  w->SetUint32(a + ".attention.key_length", static_cast<uint32_t>(g.head_dim));
  w->SetUint32(a + ".attention.value_length", static_cast<uint32_t>(arch.latent_attention ? g.v_dim : g.head_dim));
  w->SetUint32(a + ".rope.dimension_count", static_cast<uint32_t>(g.rope_dim == 0 ? g.head_dim : g.rope_dim));
  w->SetFloat32(a + ".rope.freq_base", g.rope_freq_base);
  w->SetFloat32(a + ".attention.layer_norm_rms_epsilon", g.rms_norm_eps);
  w->SetUint32(a + ".expert_count", static_cast<uint32_t>(g.n_expert));
  w->SetUint32(a + ".expert_used_count", static_cast<uint32_t>(g.n_expert_used));
  w->SetUint32(a + ".vocab_size", static_cast<uint32_t>(g.n_vocab));
}

}  // namespace strata::packtool
