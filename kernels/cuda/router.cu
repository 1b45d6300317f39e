// The MoE router in one launch: logits, softmax, top-k and the renormalised weights.
//
// Grid (expert blocks, token blocks). Block (e, t) computes the logits of experts [2e, 2e + 2) for tokens
// [8t, 8t + 8): four warps per expert, each taking every fourth run of 32 float4s of the row, their sums
// added in warp order (so a logit does not depend on the grid). With a norm, every block first forms its
// tokens' RMS scales (while its first weights load) and normalizes x on the fly; block 0 stores the
// normed rows. Two experts a block give a decode step n_expert / 2 blocks, enough to read the router's
// rows at the memory rate. The last of the expert blocks of token block t to finish (a counter per token
// block, which that block resets to zero for the next call or graph replay) then reads all of their logits
// and does the softmax and top-k: the block's 8 warps split between its tokens (8 warps on a decode token's
// 512 experts, a warp each for 8 tokens), each warp a top-k of its slice, merged by the token's first warp.
// Softmax, top-k and the weights follow strata::model::Softmax / TopK and Model::Forward: float exp, sum in
// double, probs times a float 1 / sum, selection on the probs with ties to the lower id, weights as double
// quotients.

#include <climits>
#include <cmath>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/dense_device.cuh"
#include "kernels/cuda/dense_kernels.h"
#include "kernels/cuda/dependent_launch.cuh"

namespace strata::kernels::cuda {
namespace {

using detail::BadArgument;
using detail::kFullMask;
using detail::NullArgument;

constexpr int kRouterWarps = 8;
constexpr int kRouterThreads = 32 * kRouterWarps;
constexpr int kExpertsPerBlock = 2;
constexpr int kWarpsPerExpert = kRouterWarps / kExpertsPerBlock;
constexpr int kRowStride = 32 * kWarpsPerExpert;  // float4s between a lane's consecutive ones in a row
// Float4s of a row a lane loads before using them: a run of 8 for a decode step (one token block, so
// few activation registers); one at a time for larger batches, whose 8 tokens' activations fill the
// registers instead.
constexpr int kDecodeWeightRun = 8;
constexpr int kRouterTokens = 8;  // tokens per token block: one softmax warp each
constexpr int kMaxExperts = 1024;
constexpr int kMaxK = 32;

int TokenBlocks(int n_tokens) { return (n_tokens + kRouterTokens - 1) / kRouterTokens; }

size_t CounterBytes(int n_tokens) {
  const size_t bytes = static_cast<size_t>(TokenBlocks(n_tokens)) * sizeof(unsigned);
  return (bytes + 255) / 256 * 256;
}

// The warp's largest (p, id): larger p, then lower id; every lane gets it.
__device__ __forceinline__ void WarpArgMax(float& p, int& id) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    const float other = __shfl_xor_sync(kFullMask, p, offset);
    const int other_id = __shfl_xor_sync(kFullMask, id, offset);
    if (other > p || (other == p && other_id < id)) {
      p = other;
      id = other_id;
    }
  }
}

// Dynamic shared memory: kRouterWarps * n_expert floats (each softmax warp's probabilities).
template <int kWeightRun>
__global__ void __launch_bounds__(kRouterThreads)
    RouterKernel(const float* w, int n_expert, int64_t n, const float* x, RouterNorm norm, int n_tokens, int k,
                 int32_t* ids, float* weights, unsigned* counters, float* logits) {
  extern __shared__ float s_probs[];
  __shared__ float s_warp_max[kRouterWarps];
  __shared__ double s_warp_sum[kRouterWarps];
  __shared__ float s_top_p[kRouterWarps][kMaxK];
  __shared__ int s_top_id[kRouterWarps][kMaxK];
  __shared__ bool s_is_last;
  __shared__ float s_partial[kRouterWarps][kRouterTokens];
  __shared__ double s_squares[kWarpsPerExpert][kRouterTokens];
  __shared__ float s_scale[kRouterTokens];

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int token0 = blockIdx.y * kRouterTokens;
  const int block_tokens = min(kRouterTokens, n_tokens - token0);
  const int slot = warp / kWarpsPerExpert, quarter = warp % kWarpsPerExpert;
  const int expert = blockIdx.x * kExpertsPerBlock + slot;
  const int64_t n4 = n / 4;
  const int64_t first = 32 * quarter + lane;  // this lane's float4s of a row: first + i * kRowStride
  const float4* const wr = expert < n_expert ? reinterpret_cast<const float4*>(w + expert * n) : nullptr;
  const float4* const x4 = reinterpret_cast<const float4*>(x);
  const float4* const g4 = reinterpret_cast<const float4*>(norm.weight);

  // The first run of weights is in flight while the norm's sums of squares are formed.
  float4 wv[kWeightRun];
  auto load_run = [&](int64_t run_first) {
#pragma unroll
    for (int u = 0; u < kWeightRun; ++u) {
      const int64_t c4 = run_first + u * kRowStride;
      wv[u] = wr != nullptr && c4 < n4 ? __ldg(wr + c4) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
  };
  load_run(first);
  WaitForPriorKernels();  // the router's weights are no kernel's output; x is
  if (norm.weight != nullptr) {
    // The four quarters of either expert slot cover each row once: slot 0's warps sum the squares.
    if (slot == 0) {
      for (int t = 0; t < block_tokens; ++t) {
        double squares = 0;
        for (int64_t c4 = first; c4 < n4; c4 += kRowStride) {
          const float4 v = __ldg(x4 + (token0 + t) * n4 + c4);
          squares += static_cast<double>(v.x) * v.x + static_cast<double>(v.y) * v.y +
                     static_cast<double>(v.z) * v.z + static_cast<double>(v.w) * v.w;
        }
        squares = detail::WarpSumDouble(squares);
        if (lane == 0) s_squares[quarter][t] = squares;
      }
    }
    __syncthreads();
    if (threadIdx.x < block_tokens) {
      double total = 0;
      for (int q = 0; q < kWarpsPerExpert; ++q) total += s_squares[q][threadIdx.x];
      s_scale[threadIdx.x] = detail::RmsScale(total, n, norm.eps);
    }
    __syncthreads();
  }
  // Expert block 0's slot-0 warps also store the normed rows.
  const bool store_h = norm.weight != nullptr && blockIdx.x == 0 && slot == 0;

  float acc[kRouterTokens];
#pragma unroll
  for (int t = 0; t < kRouterTokens; ++t) acc[t] = 0.0f;
#pragma unroll(kWeightRun == 1 ? 4 : 1)
  for (int64_t run_first = first; run_first < n4; run_first += kWeightRun * kRowStride) {
    if (run_first != first) load_run(run_first);
#pragma unroll
    for (int u = 0; u < kWeightRun; ++u) {
      const int64_t c4 = run_first + u * kRowStride;
      if (c4 >= n4) break;
      float4 g = make_float4(1.0f, 1.0f, 1.0f, 1.0f);
      if (norm.weight != nullptr) g = __ldg(g4 + c4);
#pragma unroll
      for (int t = 0; t < kRouterTokens; ++t) {
        if (t < block_tokens) {
          float4 xv = __ldg(x4 + (token0 + t) * n4 + c4);
          if (norm.weight != nullptr) {
            const float scale = s_scale[t];
            xv = make_float4(xv.x * scale * g.x, xv.y * scale * g.y, xv.z * scale * g.z, xv.w * scale * g.w);
            if (store_h) reinterpret_cast<float4*>(norm.out)[(token0 + t) * n4 + c4] = xv;
          }
          acc[t] = fmaf(wv[u].x, xv.x, acc[t]);
          acc[t] = fmaf(wv[u].y, xv.y, acc[t]);
          acc[t] = fmaf(wv[u].z, xv.z, acc[t]);
          acc[t] = fmaf(wv[u].w, xv.w, acc[t]);
        }
      }
    }
  }
#pragma unroll
  for (int t = 0; t < kRouterTokens; ++t) {
    if (t < block_tokens) {  // the same in the whole block
      const float sum = detail::WarpSum(acc[t]);
      if (lane == 0) s_partial[warp][t] = sum;
    }
  }
  __syncthreads();
  if (threadIdx.x < kExpertsPerBlock * kRouterTokens) {
    const int e_slot = threadIdx.x / kRouterTokens, t = threadIdx.x % kRouterTokens;
    const int e = blockIdx.x * kExpertsPerBlock + e_slot;
    if (e < n_expert && t < block_tokens) {
      float logit = 0.0f;
#pragma unroll
      for (int q = 0; q < kWarpsPerExpert; ++q) logit += s_partial[e_slot * kWarpsPerExpert + q][t];
      logits[static_cast<int64_t>(token0 + t) * n_expert + e] = logit;
    }
  }

  // Publish the logits, then count this block in.
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) s_is_last = atomicAdd(&counters[blockIdx.y], 1u) == gridDim.x - 1;
  __syncthreads();
  if (!s_is_last) return;
  __threadfence();  // see the other blocks' logits

  // The softmax and top-k of the block's tokens: a group of `group_warps` warps per token (all 8 for a
  // decode token), each warp taking a slice of the experts, their local top-k merged by the group's first
  // warp. Every thread reaches each __syncthreads below.
  int token_groups = 1;
  while (token_groups < block_tokens) token_groups *= 2;
  const int group_warps = kRouterWarps / token_groups;
  const int g = warp / group_warps, wi = warp % group_warps;
  const bool has_token = g < block_tokens;
  const int64_t t = token0 + g;
  const int slice = (n_expert + group_warps - 1) / group_warps;
  const int e_begin = min(wi * slice, n_expert), e_end = min(e_begin + slice, n_expert);
  float* probs = s_probs + g * n_expert;
  float local_max = -INFINITY;
  if (has_token) {
    const float* lt = logits + t * n_expert;
    // Unrolled so a lane's loads are in flight together rather than one L2 round trip each.
#pragma unroll 4
    for (int e = e_begin + lane; e < e_end; e += 32) {
      probs[e] = __ldcg(lt + e);  // from L2: written by other blocks
      local_max = fmaxf(local_max, probs[e]);
    }
    local_max = detail::WarpMax(local_max);
    if (lane == 0) s_warp_max[warp] = local_max;
  }
  __syncthreads();
  if (has_token) {
    float max_logit = -INFINITY;
    for (int i = 0; i < group_warps; ++i) max_logit = fmaxf(max_logit, s_warp_max[g * group_warps + i]);
    double sum = 0;
#pragma unroll 4
    for (int e = e_begin + lane; e < e_end; e += 32) {
      probs[e] = expf(probs[e] - max_logit);
      sum += probs[e];
    }
    sum = detail::WarpSumDouble(sum);
    if (lane == 0) s_warp_sum[warp] = sum;
  }
  __syncthreads();
  if (has_token) {
    double total = 0;
    for (int i = 0; i < group_warps; ++i) total += s_warp_sum[g * group_warps + i];
    const float inv = static_cast<float>(1.0 / total);
    for (int e = e_begin + lane; e < e_end; e += 32) probs[e] *= inv;
    __syncwarp();
    // This warp's top-k of its slice by rounds of a warp arg-max (largest prob, then lowest id); a chosen
    // prob becomes -inf. A slice with fewer than k experts pads with (-inf, INT_MAX).
    for (int j = 0; j < k; ++j) {
      float best = -INFINITY;
      int best_id = INT_MAX;
      for (int e = e_begin + lane; e < e_end; e += 32) {
        if (probs[e] > best) {  // ids rise within a lane: equal probs keep the lower id
          best = probs[e];
          best_id = e;
        }
      }
      WarpArgMax(best, best_id);
      if (lane == 0) {
        s_top_p[warp][j] = best;
        s_top_id[warp][j] = best_id;
        if (best_id < n_expert) probs[best_id] = -INFINITY;
      }
      __syncwarp();
    }
  }
  __syncthreads();
  if (has_token && wi == 0) {
    // The group's top-k of its warps' candidates, held in registers: entry c of a lane is candidate
    // lane + 32 c of group_warps * k.
    constexpr int kMaxPerLane = kRouterWarps * kMaxK / 32;
    const int n_cand = group_warps * k;
    float cand_p[kMaxPerLane];
    int cand_id[kMaxPerLane];
#pragma unroll
    for (int c = 0; c < kMaxPerLane; ++c) {
      const int i = lane + 32 * c;
      cand_p[c] = i < n_cand ? s_top_p[warp + i / k][i % k] : -INFINITY;
      cand_id[c] = i < n_cand ? s_top_id[warp + i / k][i % k] : INT_MAX;
    }
    float my_p = 0.0f;
    int my_id = 0;
    for (int j = 0; j < k; ++j) {
      float best = -INFINITY;
      int best_id = INT_MAX;
#pragma unroll
      for (int c = 0; c < kMaxPerLane; ++c) {
        if (cand_p[c] > best || (cand_p[c] == best && cand_id[c] < best_id)) {
          best = cand_p[c];
          best_id = cand_id[c];
        }
      }
      WarpArgMax(best, best_id);
#pragma unroll
      for (int c = 0; c < kMaxPerLane; ++c) {
        if (cand_id[c] == best_id) cand_p[c] = -INFINITY;  // ids are distinct among real candidates
      }
      if (lane == j) {
        my_p = best;
        my_id = best_id;
      }
    }
    // Every lane sums the k probs in the same order; lane j writes the j-th choice.
    double total = 0;
    for (int j = 0; j < k; ++j) total += __shfl_sync(kFullMask, my_p, j);
    if (lane < k) {
      ids[t * k + lane] = my_id;
      weights[t * k + lane] = static_cast<float>(my_p / total);
    }
  }
  if (threadIdx.x == 0) counters[blockIdx.y] = 0;  // every block of this token block has counted
}

}  // namespace

size_t RouterWorkspaceBytes(int n_tokens, int n_expert) {
  if (n_tokens <= 0 || n_expert <= 0) return 0;
  return CounterBytes(n_tokens) + static_cast<size_t>(n_tokens) * n_expert * sizeof(float);
}

absl::Status RouterTopK(const float* w, int n_expert, int64_t n, const float* x, const RouterNorm& norm, int n_tokens,
                        int k, int32_t* ids, float* weights, void* workspace, size_t workspace_bytes,
                        cudaStream_t stream) {
  constexpr absl::string_view kFn = "RouterTopK";
  if (n_expert < 1 || n_expert > kMaxExperts) return BadArgument(kFn, "n_expert", n_expert, "it must be in [1, 1024]");
  if (k < 1 || k > n_expert || k > kMaxK) {
    return BadArgument(kFn, "k", k, absl::StrCat("it must be in [1, min(n_expert, 32)] (n_expert ", n_expert, ")"));
  }
  if (n < 4 || n % 4 != 0) return BadArgument(kFn, "n", n, "it must be a positive multiple of 4");
  constexpr int kMaxTokens = 65535 * kRouterTokens;
  if (n_tokens < 0 || n_tokens > kMaxTokens) return BadArgument(kFn, "n_tokens", n_tokens, "it must be in [0, 524280]");
  if (w == nullptr) return NullArgument(kFn, "w");
  if (x == nullptr) return NullArgument(kFn, "x");
  if (!detail::Aligned16(w)) return detail::Misaligned(kFn, "w", w);
  if (!detail::Aligned16(x)) return detail::Misaligned(kFn, "x", x);
  if (norm.weight != nullptr) {
    if (!detail::Aligned16(norm.weight)) return detail::Misaligned(kFn, "norm.weight", norm.weight);
    if (norm.out == nullptr) return NullArgument(kFn, "norm.out (with a norm.weight)");
    if (!detail::Aligned16(norm.out)) return detail::Misaligned(kFn, "norm.out", norm.out);
  }
  if (ids == nullptr) return NullArgument(kFn, "ids");
  if (weights == nullptr) return NullArgument(kFn, "weights");
  const size_t needed = RouterWorkspaceBytes(n_tokens, n_expert);
  if (workspace_bytes < needed) {
    return BadArgument(kFn, "workspace_bytes", static_cast<int64_t>(workspace_bytes),
                       absl::StrCat("these sizes need ", needed));
  }
  if (n_tokens == 0) return absl::OkStatus();
  if (workspace == nullptr) return NullArgument(kFn, "workspace");
  if (!detail::Aligned16(workspace)) return detail::Misaligned(kFn, "workspace", workspace);

  unsigned* counters = static_cast<unsigned*>(workspace);
  float* logits = reinterpret_cast<float*>(static_cast<char*>(workspace) + CounterBytes(n_tokens));
  const dim3 grid((n_expert + kExpertsPerBlock - 1) / kExpertsPerBlock, TokenBlocks(n_tokens));
  const size_t smem = static_cast<size_t>(kRouterWarps) * n_expert * sizeof(float);
  const auto kernel = n_tokens <= kRouterTokens ? RouterKernel<kDecodeWeightRun> : RouterKernel<1>;
  return LaunchKernel("RouterKernel", kernel, grid, kRouterThreads, smem, stream, w, n_expert, n, x, norm, n_tokens, k,
                      ids, weights, counters, logits);
}

}  // namespace strata::kernels::cuda
