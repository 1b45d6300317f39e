#ifndef STRATA_TESTS_TESTING_REFERENCE_MODEL_H_
#define STRATA_TESTS_TESTING_REFERENCE_MODEL_H_

// A plain f32 forward pass of a MoE model, written for readability: the oracle the engine's tests compare
// against. Every weight is dequantized to f32 at load; dot products accumulate in double.
//
// Semantics follow llama.cpp for the architectures "qwen3moe", "llama" with expert_count > 0 (Mixtral),
// "qwen2moe", "olmoe" and "glm4moe", as read from llama.cpp's graph builders (src/models/qwen3moe.cpp,
// llama.cpp, qwen2moe.cpp, olmoe.cpp, glm4-moe.cpp) and llama_model_rope_type:
//   - Pre-norm blocks: x += Wo Attn(RMSNorm(x) * attn_norm); x += MoE(RMSNorm(x) * ffn_norm).
//   - RMSNorm(x) = x / sqrt(mean(x^2) + eps), eps = attention.layer_norm_rms_epsilon.
//   - qwen2moe and glm4moe add biases (attn_{q,k,v}.bias) to the q, k and v projections. glm4moe names
//     the FFN's pre-norm post_attention_norm (ffn_norm elsewhere).
//   - qwen3moe applies a per-head RMSNorm (attn_q_norm / attn_k_norm, same eps) to q and k before RoPE;
//     olmoe applies one RMSNorm over the whole q projection and one over the whole k projection.
//   - RoPE: qwen3moe, qwen2moe, olmoe and glm4moe are NEOX style (rotates (i, i + d/2)), llama is NORMAL
//     style (rotates (2i, 2i + 1)); glm4moe rotates only the first d = rope.dimension_count values of a head,
//     theta_i = pos * freq_base^(-2i / d) with d = head_dim (llama.cpp asserts n_rot == head_dim here).
//   - Causal GQA attention scaled by 1/sqrt(head_dim); query head h reads kv head h / (n_head / n_head_kv).
//   - Router: softmax over all experts, top-k (ties go to the lower index); qwen3moe and llama renormalize the
//     k probabilities to sum 1 (build_moe_ffn with norm_w = true; for Mixtral this equals a softmax over the
//     top-k logits), qwen2moe and olmoe use them as they are (norm_w = false). glm4moe scores each expert
//     with a sigmoid, picks the top k of score + exp_probs_b, weighs them by their scores, renormalized when
//     expert_weights_norm, times expert_weights_scale.
//   - glm4moe's first leading_dense_block_count blocks have a dense FFN (ffn_{gate,up,down}) instead.
//   - Expert: down(silu(gate h) * up h). qwen2moe adds a shared expert of the same form on h
//     (ffn_{gate,up,down}_shexp), scaled by sigmoid(ffn_gate_inp_shexp . h); glm4moe's is not scaled.
//   - Final RMSNorm with output_norm, then output.weight, or the token embedding when output.weight is
//     absent (tied).
// gpt-oss (llama.cpp "gpt-oss", src/models/openai-moe-iswa.cpp, llama-hparams.cpp, ggml's rope and soft_max
// with sinks, ggml_swiglu_oai, build_moe_ffn with LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX_WEIGHT):
//   - q/k/v biases, an output bias (attn_output.bias), NEOX RoPE with YaRN (below), the FFN's pre-norm
//     post_attention_norm.
//   - Each head's softmax has one more logit, the head's attn_sinks value (not scaled, no value vector).
//   - Even blocks (set_swa_pattern(2): il % 2 < 1) attend only to keys at p0 with p1 - p0 < sliding_window.
//   - Router: logits = ffn_gate_inp h + ffn_gate_inp.bias; the k largest logits are picked and their
//     weights are a softmax over those k logits.
//   - Expert: g = gate h + b_gate, u = up h + b_up, g' = min(g, 7), u' = clamp(u, -7, 7),
//     out = down(g' sigmoid(1.702 g') (u' + 1)) + b_down, then times the router weight.
//   - YaRN (rope.scaling.type yarn), ggml's rope_yarn with ext_factor 1: theta_i = pos base^(-2i/d) times
//     (1 - ramp_i) / factor + ramp_i, ramp_i = 1 - clamp((i - low) / max(0.001, high - low), 0, 1),
//     low = max(0, floor(c(beta_fast))), high = min(d - 1, ceil(c(beta_slow))),
//     c(b) = d ln(original_context / (2 pi b)) / (2 ln base); cos and sin times attn_factor (1 + 0.1 ln factor).
// Every block must be a MoE block; RoPE scaling other than YaRN is refused as unimplemented.
//
// A ReferenceModel owns its weights. Logits() is const and may be called from several threads at once;
// mutable_weights() and mutable_hparams() are for tests that edit a loaded model and must not race with
// Logits().

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace strata::testing {

enum class RopeStyle { kNormal, kNeox };

// YaRN's parameters (rope.scaling.*); factor 1 is no scaling.
struct Yarn {
  double factor = 1.0;
  int64_t original_context = 0;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  double attn_factor = 1.0;
};

// Rotates one head (head.size() = head_dim, even) in place for position `pos`, YaRN-scaled when
// yarn.factor != 1.
void ApplyRope(RopeStyle style, double freq_base, int64_t pos, std::span<float> head, const Yarn& yarn = {});

class ReferenceModel {
 public:
  struct Hparams {
    std::string arch;  // general.architecture: "qwen3moe", "llama", "qwen2moe", "olmoe", "glm4moe" or "gpt-oss"
    int64_t n_layer = 0;
    int64_t n_embd = 0;
    int64_t n_head = 0;
    int64_t n_head_kv = 0;
    int64_t head_dim = 0;
    int64_t n_expert = 0;
    int64_t n_expert_used = 0;
    int64_t expert_ff = 0;
    int64_t n_vocab = 0;
    double rope_freq_base = 10000.0;
    double rms_eps = 1e-6;
    RopeStyle rope_style = RopeStyle::kNormal;
    bool qk_norm = false;        // per head
    bool qk_norm_whole = false;  // over the whole q / k projection
    bool qkv_bias = false;
    bool renormalize_top_k = true;
    int64_t shared_ff = 0;  // width of the shared expert; 0 = none
    int64_t rope_dim = 0;   // leading values of a head RoPE rotates
    bool sigmoid_router = false;  // with the score-correction bias exp_probs_b
    double routed_scale = 1.0;
    int64_t n_dense_lead = 0;  // leading blocks with a dense FFN
    int64_t dense_ff = 0;
    bool gpt_oss = false;        // sinks, window, output and expert biases, top-k softmax, clamped SwiGLU
    int64_t sliding_window = 0;  // gpt-oss: the even blocks' window
    Yarn yarn;
    // deepseek2: latent attention (kv_lora_rank > 0; head_dim = nope_dim + rope_dim), expert groups, YaRN.
    int64_t q_lora_rank = 0;
    int64_t kv_lora_rank = 0;
    int64_t nope_dim = 0;
    int64_t v_dim = 0;
    int64_t n_group = 1;
    int64_t n_group_used = 1;
    bool group_by_top_two = false;  // groups ranked by their two best scores' sum (V3), else their best (V2)
    double yarn_factor = 0.0;       // 0: no YaRN
    int64_t yarn_original_context = 0;
    double yarn_log_multiplier = 0.0;
  };

  // A rows x cols matrix, row-major: y[r] = sum_c w[r * cols + c] x[c]. A ggml tensor of ne = [in, out]
  // is rows = out, cols = in.
  struct Matrix {
    int64_t rows = 0;
    int64_t cols = 0;
    std::vector<float> w;
  };
  struct Expert {
    Matrix gate;  // expert_ff x n_embd
    Matrix up;    // expert_ff x n_embd
    Matrix down;  // n_embd x expert_ff
    std::vector<float> gate_bias, up_bias, down_bias;  // gpt-oss only
  };
  struct Layer {
    std::vector<float> attn_norm, ffn_norm;  // n_embd
    std::vector<float> q_norm, k_norm;       // head_dim (qk_norm), q / k width (qk_norm_whole) or empty
    Matrix wq, wk, wv, wo;
    std::vector<float> bq, bk, bv;           // empty unless qkv_bias
    std::vector<float> bo, sinks;            // gpt-oss: n_embd output bias, n_head sink logits
    std::vector<float> router_logit_bias;    // gpt-oss: n_expert (ffn_gate_inp.bias)
    Matrix router;  // n_expert x n_embd
    std::vector<Expert> experts;
    Expert shared;                        // shared_ff wide; empty unless shared_ff > 0
    std::vector<float> shared_gate;       // n_embd; empty when the shared expert is not gated
    std::vector<float> router_bias;       // n_expert (exp_probs_b); empty unless sigmoid_router
    Expert dense_ffn;                     // dense leading blocks only (which have no router and no experts)
    // Latent attention (deepseek2) instead of wq (unless no q LoRA), wk, wv.
    Matrix q_a, q_b, kv_a, kv_b;            // attn_q_a, attn_q_b, attn_kv_a_mqa, attn_kv_b
    std::vector<float> q_a_norm, kv_a_norm;
  };
  struct Weights {
    Matrix token_embd;  // n_vocab x n_embd: row t is token t's embedding
    std::vector<Layer> layers;
    std::vector<float> output_norm;
    Matrix output;  // n_vocab x n_embd (a copy of token_embd when tied)
  };

  // The experts one MoE block picked for one position, in pick order, with their normalized weights, and how
  // near the choice was to another: the last picked expert's choice value less the best unpicked one's
  // (infinity when every expert is picked).
  struct Route {
    std::vector<int> experts;
    std::vector<float> weights;
    double margin = 0;
  };

  // A full GGUF holding the expert tensors blk.N.ffn_{gate,up,down}_exps.weight (one file or split shards).
  static absl::StatusOr<std::unique_ptr<ReferenceModel>> FromGguf(const std::string& path);

  // A pack: dense tensors and metadata from dense.gguf, experts from experts.bin, each role decoded with
  // kernels::DequantizeRole (so quantized schemes are seen exactly as stored).
  static absl::StatusOr<std::unique_ptr<ReferenceModel>> FromPack(const std::string& pack_dir);

  // Logits of every position: tokens.size() rows of n_vocab(), recomputed causally from scratch (position
  // i is at RoPE position i). Returns an empty vector when a token is outside [0, n_vocab). When `routes`
  // is given it receives routes[layer][position].
  std::vector<float> Logits(std::span<const int32_t> tokens,
                            std::vector<std::vector<Route>>* routes = nullptr) const;

  int64_t n_vocab() const { return hparams_.n_vocab; }
  const Hparams& hparams() const { return hparams_; }
  const Weights& weights() const { return weights_; }
  Weights& mutable_weights() { return weights_; }
  Hparams& mutable_hparams() { return hparams_; }  // for probes; same rule as mutable_weights

 private:
  ReferenceModel() = default;

  std::vector<float> MoeForward(const Layer& layer, const std::vector<float>& h, Route* route) const;

  Hparams hparams_;
  Weights weights_;
};

}  // namespace strata::testing

#endif  // STRATA_TESTS_TESTING_REFERENCE_MODEL_H_
