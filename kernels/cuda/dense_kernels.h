#ifndef STRATA_KERNELS_CUDA_DENSE_KERNELS_H_
#define STRATA_KERNELS_CUDA_DENSE_KERNELS_H_

// CUDA kernels of the dense (non-expert) part of the forward pass: weight products, norms, RoPE and the KV
// cache store, attention, the token embedding and the router. They reproduce engine/model (Model::Forward)
// to float rounding.
//
// Rules every launcher follows:
// - Pointers are device memory unless a comment says otherwise. Buffers must not overlap unless a
//   comment allows it.
// - A launcher only enqueues work on `stream`: it never synchronizes, allocates or frees. The caller owns
//   every buffer and workspace and keeps them alive until the work has run.
// - Grids depend only on the host arguments (sizes, n_tokens, max_positions). Token ids, positions and
//   cache pointers are read from device memory (TokenSlot) when the kernels run, so a captured CUDA graph
//   may be replayed after the caller rewrites the slots.
// - Arguments are checked before anything is enqueued: INVALID_ARGUMENT names the argument and its value.
//   After that a launch failure is returned as CudaStatus gives it (INTERNAL, or INVALID_ARGUMENT for a
//   launch configuration the device rejects). Values in device memory (positions, token ids) cannot be
//   checked; out-of-range ones are undefined behaviour, so the caller checks them on the host.
// - n_tokens == 0 is valid and enqueues nothing.
// - "16-byte aligned" pointers are what cudaMalloc returns, plus offsets that are multiples of 16 bytes.

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/format/dense_type.h"

struct cublasContext;

namespace strata::kernels::cuda {

// ---------------------------------------------------------------------------------------------------------
// Dense matrix products.

// The largest n_tokens that DenseMatmul computes with its GEMV kernel (each weight row read once for all
// tokens); above it, cuBLAS on f32 weights (MatmulContext).
inline constexpr int kMaxGemvTokens = 32;

// What the prefill path of DenseMatmul needs: a cuBLAS handle (FP32 math mode; TF32 only where a call asks for
// it), a cuBLAS workspace, an f32 workspace that non-F32 weights are widened into before the product, and,
// optionally, a workspace for the activations' TF32 parts. One context serves one stream at a time; it is not
// thread-safe.
//
// With that split workspace (max_split_elements > 0: the opt-in), products of more than kMaxGemvTokens tokens
// by F16 or BF16 weights whose x fits it run as two TF32 tensor-core products, W x_hi + W x_lo, where x_hi is x
// with the low 13 significand bits cleared (a TF32 value) and x_lo = x - x_hi. Widened F16 and BF16 weights are
// TF32 values, so the inputs lose at most 2^-21 of each |x| (against 2^-11 for a single TF32 product); the
// tensor cores' own accumulation is the larger error. Measured on the H200 (bench/RESULTS.md): prompt steps
// 11-16% faster, but the engine's prompt logits agree less closely with the CPU's, enough that the glm4moe and
// gpt-oss small packs of the GPU engine tests exceed their one-in-eight allowance of first-token events; hence
// opt-in. Everything else (F32 and Q8_0 weights, an x larger than the workspace, a device below compute
// capability 8.0 without TF32 tensor cores, no workspace) takes cuBLAS SGEMM on the CUDA cores, as the CPU
// computes it up to the order of the additions.
class MatmulContext {
 public:
  // `max_dequant_elements`: size of the widening workspace, in weights. A matrix with more weights is
  // widened and multiplied in row blocks of at most that many weights, so the caller trades memory for
  // launches: rows * cols of the largest matrix gives one product per matrix. When it is smaller than one
  // row, non-F32 products with more than kMaxGemvTokens tokens run the GEMV once per 32 tokens instead.
  // `max_split_elements`: activation elements (n_tokens x cols) the split workspace holds, 0 for none (above);
  // the largest prompt step's tokens x its widest x for every product of the engine.
  // `stream` is the stream the handle is first bound to (launchers rebind it when given another).
  // INVALID_ARGUMENT for a size outside [0, 2^40]; RESOURCE_EXHAUSTED when the workspaces do not fit; INTERNAL or
  // UNAVAILABLE when cuBLAS cannot start or the device's occupancy cannot be read.
  static absl::StatusOr<std::unique_ptr<MatmulContext>> Create(cudaStream_t stream, int64_t max_dequant_elements,
                                                               int64_t max_split_elements);
  // Device bytes Create takes (the workspaces; cuBLAS's handle aside).
  static uint64_t DeviceBytes(int64_t max_dequant_elements, int64_t max_split_elements);
  ~MatmulContext();
  MatmulContext(const MatmulContext&) = delete;
  MatmulContext& operator=(const MatmulContext&) = delete;

  // For the launchers: the handle bound to `stream` (with the context's cuBLAS workspace).
  absl::StatusOr<cublasContext*> CublasFor(cudaStream_t stream);
  float* dequant_workspace() const { return dequant_.as<float>(); }
  int64_t dequant_elements() const { return dequant_elements_; }
  // x_hi and x_lo of the split products, split_elements() floats each.
  float* split_high() const { return split_.as<float>(); }
  float* split_low() const { return split_.as<float>() + split_elements_; }
  int64_t split_elements() const { return split_elements_; }
  bool has_tf32() const { return has_tf32_; }
  // Blocks of the GEMV kernel for `type` and a token bucket (bucket b: up to 1 << b tokens, b in
  // [0, kGemvBuckets)) the device holds at once: the persistent GEMV's grid. Measured by Create.
  static constexpr int kGemvBuckets = 6;
  int gemv_resident_blocks(DenseType type, int bucket) const {
    return gemv_resident_blocks_[static_cast<int>(type)][bucket];
  }

 private:
  MatmulContext() = default;

  cublasContext* handle_ = nullptr;
  bool bound_ = false;  // whether stream_ is the stream the handle is bound to
  cudaStream_t stream_ = nullptr;
  DeviceBuffer cublas_workspace_;
  DeviceBuffer dequant_;
  int64_t dequant_elements_ = 0;
  DeviceBuffer split_;  // 2 * split_elements_ floats
  int64_t split_elements_ = 0;
  bool has_tf32_ = false;  // compute capability 8.0 or later
  int gemv_resident_blocks_[4][kGemvBuckets] = {};  // [DenseType][bucket]
};

// y[t*y_stride + r] = (accumulate ? y[t*y_stride + r] : 0) + sum_c W[r][c] * x[t*x_stride + c]
// for r < rows and t < n_tokens. W (`w`) is row-major with DenseRowBytes(type, cols) bytes a row.
//
// Requirements (INVALID_ARGUMENT otherwise): rows >= 1; cols a positive multiple of 8 (32 for Q8_0);
// x_stride >= cols and a multiple of 4; y_stride >= rows; w, x and y non-null; w and x 16-byte aligned.
// y must not overlap w or x.
//
// n_tokens <= kMaxGemvTokens: one GEMV launch (reads W once). Larger: cuBLAS (SGEMM, or TF32 with the context's
// split workspace), after widening W into the context's workspace when it is not F32 (rows, cols and strides must
// then fit in an int). Results differ from the CPU's DenseGemv by f32 rounding (split TF32: by the tensor cores'
// rounding): the additions run in another order, and the GEMV applies a Q8_0 block's scale to the sum of its
// 8-weight pieces.
absl::Status DenseMatmul(MatmulContext& ctx, DenseType type, const uint8_t* w, int64_t rows, int64_t cols,
                         const float* x, int64_t x_stride, int n_tokens, float* y, int64_t y_stride, bool accumulate,
                         cudaStream_t stream);

struct MatmulOutput {
  const uint8_t* w;  // rows x cols, in the group's type
  int64_t rows;
  float* y;  // y[t*y_stride + r] = W x_t (overwritten)
  int64_t y_stride;
};

// Up to 3 products that share x, type and cols (Wq, Wk, Wv), each as DenseMatmul with accumulate = false.
// GEMV path: one launch for all of them. Requirements as DenseMatmul for each output, and 1 <= outputs.size()
// <= 3 (INVALID_ARGUMENT naming the count otherwise). `outputs` is host memory, read before returning.
absl::Status DenseMatmulGroup(MatmulContext& ctx, DenseType type, int64_t cols, std::span<const MatmulOutput> outputs,
                              const float* x, int64_t x_stride, int n_tokens, cudaStream_t stream);

// ---------------------------------------------------------------------------------------------------------
// Norms.

// out[r*out_stride + i] = x[r*x_stride + i] / sqrt(mean_i(x^2) + eps) * weight[i] for i < n, r < rows, as
// strata::model::RmsNorm computes it (sum of squares in double). out may be x itself (same stride); else they
// must not overlap. One launch (a block per row).
// INVALID_ARGUMENT: n < 1, rows < 0, x_stride or out_stride < n, a null pointer.
absl::Status RmsNorm(const float* x, int64_t x_stride, const float* weight, int64_t n, int rows, float eps, float* out,
                     int64_t out_stride, cudaStream_t stream);

// The MoE combine of one layer fused with the next layer's norm, for t < n_tokens, i < n:
//   x[t*n + i] += sum_j weights[t*k + j] * parts[(t*k + j)*n + i]   (j in order, no fused multiply-add,
//                                                                     as the CPU adds them)
//   h[t*n + i] = RmsNorm(x[t])[i] * norm_weight[i]                   (only when norm_weight != nullptr)
// One launch (a block per token). h (needed only with norm_weight) must not overlap x or parts.
// INVALID_ARGUMENT: n < 1, k < 1, n_tokens < 0, a null pointer.
absl::Status CombineAndNorm(const float* parts, const float* weights, int n_tokens, int k, int64_t n, float* x,
                            const float* norm_weight, float eps, float* h, cudaStream_t stream);

// ---------------------------------------------------------------------------------------------------------
// Attention.

// Per-token state that the attention-side kernels read when they run (a device array, one per token of
// the batch). Laid out the same on host and device; the caller fills it with cudaMemcpyAsync. Kernels read it
// before they wait for the kernel before them (dependent_launch.cuh), so it must be in place before the step's
// first kernel: a copy, not the output of a kernel of the step.
struct TokenSlot {
  float* keys;       // the token's sequence cache: f32 [slot][kv_dim], slots laid out by KvPlace, 16-byte aligned
  float* values;     // same shape
  int64_t capacity;  // positions per full-length layer in that cache
  int32_t pos;       // the token's position: 0 <= pos < capacity
  int32_t token;     // the token id (EmbedRows): 0 <= token < the table's rows
  // Slots of each windowed layer's ring in that cache (model::KvCache::slots of such a layer, every ring the
  // same length); read only for a KvPlace with rings before it or its own, where it must be >= 1.
  int64_t ring_slots = 0;
  // Positions below it were written by earlier steps: the decode attention reads their keys and values before
  // it waits for the step's kernels before it (one of which writes this step's positions). 0 for none; at most
  // the lowest position the step holds for this token's sequence.
  int32_t first_new = 0;
};

// Where one layer's keys and values sit in each token's cache, as model::KvCache lays them out: after
// full_before full-length layers of capacity slots and windowed_before rings of ring_slots slots; position p
// in slot p, or in slot p % ring_slots when the layer is windowed. A layer index converts to the layout of a
// cache without rings, [layer][capacity][kv_dim].
struct KvPlace {
  KvPlace(int64_t layer = 0) : full_before(layer) {}  // NOLINT(google-explicit-constructor): a plain layer index
  KvPlace(int64_t full, int64_t rings, bool in_ring) : full_before(full), windowed_before(rings), windowed(in_ring) {}
  int64_t full_before = 0;
  int64_t windowed_before = 0;
  bool windowed = false;
};

// For each token t, with kv_dim = n_head_kv * head_dim:
// - each of the n_head heads of q[t*n_head*head_dim ...] and the n_head_kv heads of k[t*kv_dim ...]:
//   RmsNorm over head_dim with q_norm / k_norm (head_dim floats each; null = no norm), then RoPE of the
//   head's first rope_dim values (the rest unchanged: partial RoPE) with theta_i = double(pos) * freq[i],
//   cos and sin computed in double and rounded to float (freq: rope_dim/2 doubles,
//   strata::model::RopeFrequencies); rope_style 0 rotates the pairs (2i, 2i+1), 1 (NeoX) the pairs
//   (i, i + rope_dim/2). Arithmetic in the CPU's order without fused multiply-adds.
// - q is written back in place; k (rotated) and v (unchanged) are stored in the slot of pos at `place` (for a
//   plain layer index, keys/values + (layer*capacity + pos)*kv_dim) of the token's cache (tokens that share
//   a cache and a position, such as padding, store in no particular order). k and v are not modified.
// - rope_magnitude multiplies the float cos and sin before the rotation (YaRN's mscale,
//   strata::model::YarnMagnitude; 1 for plain RoPE, which leaves them exact), as strata::model::RopeAngles.
// slots, freq and the norms are read before the wait for the kernel before (weights and the step's inputs).
// One launch. INVALID_ARGUMENT: n_tokens outside [0, 65535], n_head < 1, n_head_kv < 1, head_dim odd or
// outside [2, 256], rope_dim odd or outside [2, head_dim], rope_style not 0 or 1, a negative count in place, a
// null q, k, v, slots or freq, a rope_magnitude that is not finite and positive.
absl::Status QkNormRopeStore(float* q, const float* k, const float* v, const TokenSlot* slots, int n_tokens,
                             const KvPlace& place, int n_head, int n_head_kv, int head_dim, int rope_dim,
                             const float* q_norm, const float* k_norm, float eps, const double* freq,
                             float rope_magnitude, int rope_style, cudaStream_t stream);

// What some architectures do to the q, k and v projections before QkNormRopeStore, in place, for each token
// t (q[t*q_dim ...], k and v [t*kv_dim ...]), in the CPU's order (Model::Forward):
//   q += bq, k += bk, v += bv                  (a null bias: none; Qwen2-MoE, GLM-4.5)
//   q = RmsNorm(q) * q_norm over all q_dim values, k = RmsNorm(k) * k_norm over all kv_dim
//                                              (null norms: none; OLMoE's q/k norm over the whole projection)
// One launch (a block per token). INVALID_ARGUMENT: q_dim or kv_dim < 1, n_tokens outside [0, 2^31), a null
// q, k or v, exactly one of q_norm and k_norm null.
absl::Status QkvBiasAndNorm(float* q, float* k, float* v, int n_tokens, int64_t q_dim, int64_t kv_dim, const float* bq,
                            const float* bk, const float* bv, const float* q_norm, const float* k_norm, float eps,
                            cudaStream_t stream);

// x[t*n + i] += bias[i] for t < n_tokens, i < n (a float sum, as strata::model::AddBias): gpt-oss's attention
// output bias, after the output projection has been added to x. One launch (a block per token).
// INVALID_ARGUMENT: n < 1, n_tokens < 0, a null pointer.
absl::Status AddRowBias(float* x, const float* bias, int64_t n, int n_tokens, cudaStream_t stream);

// ---------------------------------------------------------------------------------------------------------
// The dense SwiGLU FFN's activation (a shared expert, a dense leading block; the products are DenseMatmul's).

// For t < n_tokens, i < ff:
//   out[t*ff + i] = gate[t*ff + i] * sigmoid(gate[t*ff + i]) * up[t*ff + i] * s_t
// with s_t = 1, or with a gate_inp (Qwen2-MoE's shared expert gate, n floats) s_t = sigmoid(gate_inp . h_t)
// (h_t = h[t*n ...], the dot product summed in double as strata::model::Dot). The sigmoids are the CPU's
// 1 / (1 + exp(-x)) in float. (The CPU scales the FFN's output by s_t instead of its activation: the down
// product's rounding differs.) out may be gate itself; else no buffers overlap. One launch (a block per
// token). INVALID_ARGUMENT: ff < 1, n < 1 with a gate_inp, n_tokens < 0, a null gate, up, out, or h with a
// gate_inp.
absl::Status SwiGlu(const float* gate, const float* up, int64_t ff, int n_tokens, const float* gate_inp,
                    const float* h, int64_t n, float* out, cudaStream_t stream);

// Bytes of workspace that serve every Attention call with at most n_tokens tokens and at most
// max_positions positions. It starts with counters that must be zero before the first call
// (cudaMemsetAsync the whole workspace once); every call leaves them zero again.
size_t AttentionWorkspaceBytes(int n_tokens, int n_head, int n_head_kv, int head_dim, int max_positions);

// gpt-oss's attention options (an argument of Attention); the default is plain causal attention over every
// earlier position.
struct AttentionSinkWindow {
  // n_head floats (device), null for none: head h's sink is one more logit in each of its softmaxes,
  // unscaled and with no value, so it joins the denominator only (ggml_soft_max_ext's sinks).
  const float* sinks = nullptr;
  // > 0: a query at position p attends to positions (p - window, p] only (a sliding-window layer); 0: all.
  int window = 0;
};

// For each token t and head h (kv head h / (n_head / n_head_kv)), with D = head_dim:
//   out[(t*n_head + h)*D + d] = sum_p softmax_p(scale * q_t,h . key(p)) * value(p)[d]
// over p in [0, pos_t] of token t's cache at `place` (for a plain layer index key(p) = keys +
// (layer*capacity + p)*kv_dim + kv_head*D; a windowed layer's ring keeps the last ring_slots positions), or
// over (pos_t - sink_window.window, pos_t] only, with sink_window.sinks[h] added to the softmax's denominator
// as exp(sink - max) (AttentionSinkWindow). q: [t][n_head][D] f32, 16-byte aligned.
// The keys and values of every position attended to must have been stored (those of this batch by
// QkNormRopeStore). Nothing in a cache after the largest position the batch has in it is read, nor any other
// layer; a window's decode splits wholly before it read nothing.
// max_positions >= every pos_t + 1 sizes the grid: long contexts are split over positions and the splits
// merged through `workspace` (AttentionWorkspaceBytes(n_tokens, n_head, n_head_kv, head_dim,
// max_positions) bytes, or those of any larger sizes, are enough).
// Batches of <= 32 tokens with <= 16 query heads per kv head (decode) give each (token, kv head, split) a
// block that reads K and V straight from the cache; the last split of a token to finish merges them (one
// launch). Larger batches (prefill) tile 64/G consecutive tokens with the G heads of a kv head, so each K/V
// load serves every query of the tile that belongs to the same cache, and merge splits in a second launch.
// Any mix of sequences is correct either way; a large batch of tokens from different sequences is slow
// (each tile then reads one sequence at a time).
// The first call for a head_dim also raises that kernel's shared-memory limit (cudaFuncSetAttribute, a
// host-side setting). The workspace must not be shared by two calls that may run at the same time.
// INVALID_ARGUMENT: n_tokens outside [0, 65535], n_head_kv < 1, n_head not a multiple of n_head_kv,
// n_head / n_head_kv > 64, head_dim not 32, 64 or 128, max_positions < 1, a negative count in place, a short
// workspace, q or workspace not 16-byte aligned, a null pointer, a negative sink_window.window.
absl::Status Attention(const float* q, const TokenSlot* slots, int n_tokens, const KvPlace& place, int n_head,
                       int n_head_kv, int head_dim, float scale, const AttentionSinkWindow& sink_window,
                       int max_positions, float* out, void* workspace, size_t workspace_bytes, cudaStream_t stream);

// QkNormRopeStore's inputs (q is rotated in place by it), one argument.
struct QkRopeInputs {
  float* q = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
  int rope_dim = 0;
  const float* q_norm = nullptr;
  const float* k_norm = nullptr;
  float eps = 0.0f;
  const double* freq = nullptr;
  float rope_magnitude = 1.0f;
  int rope_style = 0;
};

// QkNormRopeStore(rope ...) then Attention(rope.q, ...), with the same contracts. Where the decode kernel serves
// the batch, v is 16-byte aligned and `one_token_each` says that every token is the only one of its sequence in
// the batch (the caller vouches for it as for TokenSlot::first_new, which is then best set to pos), one launch
// does both: each decode block norms and rotates its query heads into shared memory, and the block whose
// split holds a token's position stores that token's key and value before reading them. A decode step then has
// one kernel less. The keys and values stored and `out` are bit for bit those of the two calls; on the fused
// path q is read, not rotated in place. Errors: those of the two functions (named QkNormRopeAttention on the
// fused path).
absl::Status QkNormRopeAttention(const QkRopeInputs& rope, bool one_token_each, const TokenSlot* slots, int n_tokens,
                                 const KvPlace& place, int n_head, int n_head_kv, int head_dim, float scale,
                                 const AttentionSinkWindow& sink_window, int max_positions, float* out,
                                 void* workspace, size_t workspace_bytes, cudaStream_t stream);

// ---------------------------------------------------------------------------------------------------------
// Embedding and router.

// x[t*n + i] = row slots[t].token of `table` (cols = n, row-major in `type`), widened to f32 exactly.
// One launch. INVALID_ARGUMENT: n not a positive multiple of 8 (32 for Q8_0), n_tokens outside
// [0, 65535], table or x not 16-byte aligned, a null pointer.
absl::Status EmbedRows(DenseType type, const uint8_t* table, int64_t n, const TokenSlot* slots, int n_tokens, float* x,
                       cudaStream_t stream);

// Bytes of workspace RouterTopK needs. It starts with counters that must be zero before the first call
// (cudaMemsetAsync the whole workspace once); every call leaves them zero again. A workspace sized for
// some n_tokens serves any smaller n_tokens.
size_t RouterWorkspaceBytes(int n_tokens, int n_expert);

// The RMS norm RouterTopK may apply to x first (weight == nullptr: none).
struct RouterNorm {
  const float* weight = nullptr;  // n floats, 16-byte aligned
  float eps = 0.0f;
  float* out = nullptr;  // receives the normed rows [n_tokens][n], 16-byte aligned; must not overlap x
};

// How RouterTopK turns logits into scores, choices and weights. The default is Qwen3-MoE's and Mixtral's
// (softmax, renormalised top k), which runs the kernel's fastest path.
struct RouterGate {
  bool sigmoid = false;             // probs[e] = 1 / (1 + exp(-logit[e])) (float) instead of the softmax
  const float* choice_bias = nullptr;  // n_expert floats added to the probs for the choice only (exp_probs_b)
  bool renorm = true;               // the weights are divided by the sum of the k chosen probs
  float scale = 1.0f;               // the weights are multiplied by it (the routed scaling factor)
  const float* logit_bias = nullptr;  // n_expert floats added to the logits before anything else (gpt-oss)
  // gpt-oss (llama.cpp's SOFTMAX_WEIGHT): the k largest logits are chosen, and the weights are a softmax over
  // those k alone (float exp, sum in double, times a float 1 / sum, as strata::model::Softmax), times the
  // scale in float. sigmoid, choice_bias and renorm are then ignored.
  bool softmax_top_k = false;
  // Grouped choice (DeepSeek-V2/V3): the experts in n_group equal consecutive groups, each ranked by its best
  // choice score (group_top_two: the float sum of its two best), ties to the lower group; only experts of the
  // n_group_used best groups are chosen (strata::model::MaskAllButBestGroups). n_group 1: no groups.
  int n_group = 1;
  int n_group_used = 1;
  bool group_top_two = false;
  bool grouped() const { return n_group > 1 && n_group_used < n_group; }
  bool plain() const {
    return !sigmoid && choice_bias == nullptr && renorm && scale == 1.0f && logit_bias == nullptr && !softmax_top_k &&
           !grouped();
  }
};

// For each token t (x[t*n ...], f32), with h_t = x_t, or with a norm h_t = RmsNorm(x_t) * norm.weight
// (as RmsNorm computes it; stored to norm.out):
//   logits = W h_t (+ gate.logit_bias) (W: F32, n_expert x n, row-major), probs = softmax(logits) (or
//                  gate.sigmoid's; gate.softmax_top_k: the logits themselves for the choice, see RouterGate),
//   ids[t*k ...] = the k largest probs (plus gate.choice_bias when given, a float sum) in descending order
//                  (ties to the lower expert id),
//   weights[t*k + j] = float(probs[ids[j]] / sum * gate.scale), sum = sum_j probs[ids[j]] in double
//                  (1 without gate.renorm), as the CPU does.
// Up to 8 tokens: one launch, whose last block (an atomic counter in the workspace) does the softmax and
// top-k; more: a launch for the logits (tiles of 8 experts by 8 tokens) and one for the top-k. A token's ids
// and weights are the same bits for any n_tokens and any place in the batch. The workspace must not be
// shared by two RouterTopK calls that may run at the same time.
// INVALID_ARGUMENT: n_expert outside [1, 1024], k outside [1, min(n_expert, 32)], n not a positive
// multiple of 4, n_tokens outside [0, 524280], a short workspace, w, x, norm.weight, norm.out or workspace
// not 16-byte aligned, a null pointer (norm.out with a norm.weight), a gate.scale that is not finite, a
// grouped gate whose n_group is above 32 or does not divide n_expert, or whose n_group_used is outside
// [1, n_group] or leaves fewer than k experts, or with softmax_top_k.
absl::Status RouterTopK(const float* w, int n_expert, int64_t n, const float* x, const RouterNorm& norm,
                        const RouterGate& gate, int n_tokens, int k, int32_t* ids, float* weights, void* workspace,
                        size_t workspace_bytes, cudaStream_t stream);

}  // namespace strata::kernels::cuda

#endif  // STRATA_KERNELS_CUDA_DENSE_KERNELS_H_
