#ifndef STRATA_KERNELS_CUDA_LATENT_ATTENTION_H_
#define STRATA_KERNELS_CUDA_LATENT_ATTENTION_H_

// Multi-head latent attention (DeepSeek-V2/V3, arXiv 2405.04434 section 2.1) on a CUDA device, in the absorbed
// form for every step, prompts included: a query head's non-RoPE part is carried into the latent space
// through W_UK, the scores are taken against the cached latents themselves (plus the shared RoPE'd key part),
// and the softmax-weighted latent sum goes back out through W_UV. The CPU (engine/model/cpu_latent_attention.cc)
// rebuilds keys and values for prompts instead; both are the same sums in a different order.
//
// With W_UK[h] and W_UV[h] the rows [h*(nope+v), +nope) and [h*(nope+v)+nope, +v) of attn_kv_b
// (kv_b: n_head*(nope+v) rows of `rank` columns, a DenseType), a step of n_tokens tokens runs, in order:
//   LatentRopeStore    the cache position [RmsNorm(c) * kv_norm, RoPE(k_pe)], and RoPE on q's rope values
//   LatentQueryAbsorb  q_latent[t][h] = [W_UK[h]^T q_nope[t][h], q_pe[t][h]]             (rank + rope floats)
//   LatentAttention    latent[t][h]   = sum_p softmax_p(scale * q_latent[t][h] . cache(p)) * cache(p)[0, rank)
//   LatentValueProject out[t][h]      = W_UV[h] latent[t][h]                              (v floats)
// The cache is the TokenSlot's keys, [layer][capacity][rank + rope] (model::CacheLayout of latent attention);
// nothing is stored as values. The launchers follow dense_kernels.h's contract (only enqueue work, arguments
// checked first, n_tokens == 0 enqueues nothing, grids from host arguments only so a graph may replay them).

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/dense_kernels.h"
#include "kernels/format/dense_type.h"

namespace strata::kernels::cuda {

// One layer's sizes. A query head is nope_dim values without RoPE, then rope_dim with it (as attn_q / attn_q_b
// lay them out). Checked by every launcher: n_head in [1, 1024], nope_dim and v_dim in [1, 1024], rope_dim
// even in [2, 256], rank a multiple of 8 (of 32 for a Q8_0 kv_b) in [8, 1024], rank + rope_dim a multiple of 4.
struct LatentShape {
  int n_head = 0;
  int nope_dim = 0;
  int rope_dim = 0;
  int v_dim = 0;
  int rank = 0;  // kv_lora_rank: a cache position holds rank + rope_dim floats
  int key_dim() const { return rank + rope_dim; }
  int q_dim() const { return n_head * (nope_dim + rope_dim); }
};

// OK when every launcher takes `shape` with a kv_b of `type`; else INVALID_ARGUMENT naming the field.
absl::Status CheckLatentShape(const LatentShape& shape, DenseType type);

// For each token t (q: [t][n_head][nope + rope], kv: [t][rank + rope], the attn_kv_a_mqa product):
//   cache(layer, pos_t)[0, rank)          = RmsNorm(kv[t][0, rank)) * kv_norm        (as strata::model::RmsNorm)
//   cache(layer, pos_t)[rank, rank + rope) = RoPE(kv[t][rank, rank + rope))
//   q[t][h][nope, nope + rope)            = RoPE of itself, for every head
// with RoPE as QkNormRopeStore's (theta_i = double(pos) * freq[i], cos and sin in double rounded to float and
// times rope_magnitude; rope_style 0 NORMAL, 1 NEOX). One launch. INVALID_ARGUMENT: a bad shape, n_tokens
// outside [0, 65535], layer < 0, rope_style not 0 or 1, a null pointer, a rope_magnitude that is not finite and
// positive.
absl::Status LatentRopeStore(float* q, const float* kv, const TokenSlot* slots, int n_tokens, int64_t layer,
                             const LatentShape& shape, const float* kv_norm, float eps, const double* freq,
                             float rope_magnitude, int rope_style, cudaStream_t stream);

// q_latent[t][h] = [sum_d W_UK[h][d][:] * q[t][h][d] (d < nope), q[t][h][nope, nope + rope)], for t < n_tokens.
// kv_b rows 16-byte aligned (F32, F16, BF16: rank a multiple of 8 does it) or Q8_0 blocks. One launch (a block
// per head and 8 tokens). INVALID_ARGUMENT: a bad shape, n_tokens outside [0, 65535], a null pointer.
absl::Status LatentQueryAbsorb(DenseType type, const uint8_t* kv_b, const float* q, int n_tokens,
                               const LatentShape& shape, float* q_latent, cudaStream_t stream);

// Bytes of workspace that serve every LatentAttention call with at most n_tokens tokens and at most
// max_positions positions (0 when none of them splits over positions).
size_t LatentAttentionWorkspaceBytes(int n_tokens, const LatentShape& shape, int max_positions);

// latent[t][h][r] = sum_p softmax_p(scale * q_latent[t][h] . cache(p)) * cache(p)[r], r < rank, over p in
// [0, pos_t] of token t's cache at `layer` (those of this batch stored by LatentRopeStore first); q_latent:
// [t][n_head][rank + rope], 16-byte aligned. Nothing past a token's position is read. max_positions >= every
// pos_t + 1 sizes the grid: a step with few tokens splits the positions over blocks and merges the splits in a
// second launch through `workspace` (LatentAttentionWorkspaceBytes). The first call raises the kernel's
// shared-memory limit (cudaFuncSetAttribute, a host-side setting). The workspace must not be shared by two
// calls that may run at the same time. INVALID_ARGUMENT: a bad shape, n_tokens outside [0, 65535],
// max_positions < 1, layer < 0, a short workspace, a null or misaligned pointer.
absl::Status LatentAttention(const float* q_latent, const TokenSlot* slots, int n_tokens, int64_t layer,
                             const LatentShape& shape, float scale, int max_positions, float* latent, void* workspace,
                             size_t workspace_bytes, cudaStream_t stream);

// out[t][h][d] = W_UV[h][d] . latent[t][h] (d < v_dim; out is [t][n_head * v_dim], the attention output
// projection's input). One launch (a warp 4 rows of a head, 8 tokens a block). INVALID_ARGUMENT: a bad shape,
// n_tokens outside [0, 65535], a null or misaligned latent.
absl::Status LatentValueProject(DenseType type, const uint8_t* kv_b, const float* latent, int n_tokens,
                                const LatentShape& shape, float* out, cudaStream_t stream);

}  // namespace strata::kernels::cuda

#endif  // STRATA_KERNELS_CUDA_LATENT_ATTENTION_H_
