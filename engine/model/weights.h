#ifndef STRATA_ENGINE_MODEL_WEIGHTS_H_
#define STRATA_ENGINE_MODEL_WEIGHTS_H_

// The dense (non-expert) weights of a model, read from a pack's dense.gguf.
//
// Matrices in F32, F16, BF16 and Q8_0 are used in place (they point into the mapped file, which must
// outlive the weights); other types (the K-quants, Q4_0 ...) are widened to F32 at load. Norm weights and
// the router are always held as F32. Immutable after Load.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/gguf/gguf_file.h"
#include "engine/model/model_config.h"
#include "kernels/cpu/dense_gemv.h"

namespace strata::model {

// A rows x cols matrix (y = W x maps cols inputs to rows outputs).
struct DenseMatrix {
  std::string name;
  kernels::DenseType type = kernels::DenseType::kF32;
  int64_t rows = 0;
  int64_t cols = 0;
  const uint8_t* data = nullptr;
  std::vector<uint8_t> owned;  // backing store when widened at load
  uint64_t bytes() const { return kernels::DenseRowBytes(type, cols) * static_cast<uint64_t>(rows); }
};

// A SwiGLU FFN run on every token, the shared expert or a dense block's FFN: down(silu(gate h) * up h), scaled
// by sigmoid(gate_inp . h) when gate_inp is not empty.
struct FfnWeights {
  DenseMatrix gate, up;         // ff x n_embd
  DenseMatrix down;             // n_embd x ff
  std::vector<float> gate_inp;  // n_embd; empty unless shared_expert_gate
};

// Multi-head latent attention's projections (ModelConfig::mla), with ggml's names.
struct LatentAttentionWeights {
  DenseMatrix q_a;               // q_lora x n_embd (attn_q_a); rows == 0 without q LoRA (LayerWeights::wq then)
  std::vector<float> q_a_norm;   // q_lora (attn_q_a_norm)
  DenseMatrix q_b;               // n_head * head_dim x q_lora (attn_q_b); per head nope values, then rope ones
  DenseMatrix kv_a;              // (kv_lora + rope_dim) x n_embd (attn_kv_a_mqa): the latent, then the shared k_pe
  std::vector<float> kv_a_norm;  // kv_lora (attn_kv_a_norm)
  DenseMatrix kv_b;              // n_head * (nope + v) x kv_lora (attn_kv_b): per head W_UK's rows, then W_UV's
                                 // (rebuilt in f32 from attn_k_b / attn_v_b where the file splits it)
  std::vector<float> uk_t;       // [n_head][kv_lora][nope], f32: W_UK transposed, for the absorbed form
                                 // (built at load: 32 MiB a layer for DeepSeek-V3)
};

// The per-expert biases of a MoE block (gpt-oss), f32, expert e's at e * width: added to the gate and up
// projections before the activation and to the down projection before the router weight. They are small
// (2 * ff + n_embd floats an expert), so a pack keeps them in dense.gguf under llama.cpp's names
// (blk.N.ffn_{gate,up,down}_exps.bias), not in the expert blobs.
struct ExpertBiases {
  std::vector<float> gate, up;  // n_expert x expert_ff
  std::vector<float> down;      // n_expert x n_embd
};

struct LayerWeights {
  std::vector<float> attn_norm;
  DenseMatrix wq, wk, wv, wo;  // latent attention: wq only without q LoRA, wk and wv empty, wo n_embd x n_head * v
  LatentAttentionWeights mla;  // rows == 0 unless latent attention
  std::vector<float> bq, bk, bv;      // qkv_bias architectures only
  std::vector<float> bo;              // n_embd; attn_output_bias only
  std::vector<float> attn_sinks;      // n_head sink logits; attn_sinks only
  std::vector<float> q_norm, k_norm;  // head_dim (qk_norm) or the whole q / k width (qk_norm_whole)
  std::vector<float> ffn_norm;
  DenseMatrix router;               // n_expert x n_embd, F32; rows == 0 in a dense block
  std::vector<float> router_bias;   // n_expert (exp_probs_b); router_score_bias architectures only
  std::vector<float> router_logit_bias;  // n_expert (ffn_gate_inp.bias); router_logit_bias only
  ExpertBiases expert_biases;       // expert_biases only
  FfnWeights shared;                // rows == 0 without a shared expert
  FfnWeights dense_ffn;             // the FFN of a dense leading block; rows == 0 in a MoE block
};

struct ModelWeights {
  const gguf::TensorInfo* token_embd = nullptr;  // rows decoded on demand, any decodable type
  std::vector<LayerWeights> layers;
  std::vector<float> output_norm;
  DenseMatrix output;  // n_vocab x n_embd (token_embd when the model ties them)
  uint64_t dense_bytes_per_token = 0;  // bytes of matrices one decoded token reads
};

// Loads every tensor the configuration needs; errors name the tensor and the shape expected.
absl::StatusOr<std::unique_ptr<ModelWeights>> LoadWeights(const gguf::GgufFile& dense, const ModelConfig& config);

}  // namespace strata::model

#endif  // STRATA_ENGINE_MODEL_WEIGHTS_H_
