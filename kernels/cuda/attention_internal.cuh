#ifndef STRATA_KERNELS_CUDA_ATTENTION_INTERNAL_CUH_
#define STRATA_KERNELS_CUDA_ATTENTION_INTERNAL_CUH_

// Between Attention (attention.cu: argument checks, the workspace, the tiled kernel for prefill) and the
// decode kernel (attention_decode.cu). Included by those two files only.

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/dense_kernels.h"
#include "kernels/cuda/qk_rope.cuh"

namespace strata::kernels::cuda::detail {

// Batches of at most this many tokens take the decode kernel (when the group fits it).
constexpr int kDecodeMaxTokens = 32;

// True when a batch of n_tokens with `group` query heads per kv head takes the decode kernel.
bool UseDecodeAttention(int n_tokens, int group);

struct DecodeSplitPlan {
  int n_splits;
  int split_len;  // positions, a multiple of 64
};

// The decode kernel's splits for a grid sized by max_positions.
DecodeSplitPlan PlanDecodeSplits(int n_tokens, int n_head_kv, int max_positions);

// The decode kernel fused with QkNormRopeStore: the raw k and v projections ([n_tokens][kv_dim]) and the
// norm and RoPE parameters; k null: not fused (q is then already rotated).
struct FusedQkRope {
  const float* k = nullptr;
  const float* v = nullptr;
  QkRopeParams rope;
};

struct DecodeAttentionArgs {
  const float* q;  // [n_tokens][n_head][D]; raw (not normed nor rotated) when fused
  const TokenSlot* slots;
  float* out;
  float* part_o;       // [split][n_tokens * n_head][D]
  float* part_m;       // [split][n_tokens * n_head]
  float* part_l;       // same
  unsigned* counters;  // [n_tokens][n_head_kv], zero on entry and on exit
  KvPlace place;
  int n_tokens;
  int n_head;
  int n_head_kv;
  int group;
  int split_len;
  int n_splits;
  float scale;
  const float* sinks;  // AttentionSinkWindow
  int window;
  FusedQkRope fused;
};

#ifdef __CUDACC__
// o / l with a sink logit joining the denominator: o e^(m - M) / (l e^(m - M) + e^(sink - M)), M = max(m, sink)
// (o and l are sums of exp(s - m) terms).
__device__ __forceinline__ float DivideWithSink(float o, float m, float l, float sink) {
  const float top = fmaxf(m, sink);
  const float f = expf(m - top);
  return o * f / (l * f + expf(sink - top));
}
#endif

// Launches the decode kernel (head_dim 32, 64 or 128; arguments already checked).
absl::Status LaunchDecodeAttention(const DecodeAttentionArgs& args, int head_dim, cudaStream_t stream);

}  // namespace strata::kernels::cuda::detail

#endif  // STRATA_KERNELS_CUDA_ATTENTION_INTERNAL_CUH_
