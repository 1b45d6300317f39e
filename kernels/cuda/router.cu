// The MoE router: logits, softmax, top-k and the renormalised weights (or another RouterGate: sigmoid
// scores, a choice bias, no renormalisation, a scale, in a second instantiation of the kernels so that the
// default's path is unchanged; gpt-oss's logit bias and softmax over the chosen k in a third).
//
// A decode step (up to 8 tokens) is one launch of RouterKernel. Grid (expert blocks, 1): block e computes
// the logits of experts [2e, 2e + 2): four warps per expert, each taking every fourth run of 32 float4s of
// the row, their sums added in warp order. With a norm, every block first forms its tokens' RMS scales
// (while its first weights load) and normalizes x on the fly; block 0 stores the normed rows. Two experts a
// block give a decode step n_expert / 2 blocks, enough to read the router's rows at the memory rate. Every
// load of a lane's run is issued before any is used (no branch between them), so a block waits for memory
// about once per run rather than once per float4. The last expert block to finish (a counter, which that
// block resets to zero for the next call or graph replay) then reads all of their logits and does the
// softmax and top-k, one warp per token with the token's logits in registers: k rounds of a warp-wide
// maximum (redux.sync) of each lane's best, no shared memory and no block barrier (a block of one token
// uses all its warps instead: BlockTopK).
//
// A prompt step is two launches: RouterLogitsTileKernel, a tile of 8 experts by 8 tokens a block (each
// weight read once for 8 tokens, each activation once for 8 experts, where RouterKernel's blocks would read
// every token's row n_expert / 2 times), then TopKOfLogitsKernel, a warp a token. A logit is the same chain
// of fmaf and the same order of sums in either path, and the top-k the same code, so a sequence's routing
// does not depend on the batch it is stepped in.
//
// Softmax, top-k and the weights follow strata::model::Softmax / TopK and Model::Forward: float exp, sum in
// double, probs times a float 1 / sum, selection on the probs with ties to the lower id, weights as double
// quotients.

#include <climits>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/dense_device.cuh"
#include "kernels/cuda/dense_kernels.h"
#include "kernels/cuda/dependent_launch.cuh"
#include "kernels/cuda/grid_count.cuh"

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
// Float4s of a row a lane of RouterKernel loads before using them (one token block, so few activation
// registers).
constexpr int kDecodeWeightRun = 8;
constexpr int kRouterTokens = 8;  // tokens per token block: one top-k warp each
constexpr int kMaxExperts = 1024;
constexpr int kMaxK = 32;

int TokenBlocks(int n_tokens) { return (n_tokens + kRouterTokens - 1) / kRouterTokens; }

size_t CounterBytes(int n_tokens) {
  const size_t bytes = static_cast<size_t>(TokenBlocks(n_tokens)) * sizeof(unsigned);
  return (bytes + 255) / 256 * 256;
}

__device__ __forceinline__ float4 Zero4() { return make_float4(0.0f, 0.0f, 0.0f, 0.0f); }

// Float4 c4 of a row of n4, or zeros past its end (zeros add nothing to a sum or a dot product).
__device__ __forceinline__ float4 LoadOrZero(const float4* row, int64_t c4, int64_t n4) {
  return c4 < n4 ? __ldg(row + c4) : Zero4();
}

// (x * scale) * g, as strata::model::RmsNorm writes h.
__device__ __forceinline__ float4 Normed(float4 x, float scale, float4 g) {
  return make_float4(x.x * scale * g.x, x.y * scale * g.y, x.z * scale * g.z, x.w * scale * g.w);
}

// A lane's best entry after it drops entry `dropped` (none for -1): the highest key, the lower index (so the
// lower expert id) among equal keys.
template <int kEntries>
__device__ __forceinline__ void DropAndFindBest(unsigned (&key)[kEntries], int dropped, unsigned* best, int* best_i) {
  *best = 0;
  *best_i = 0;
#pragma unroll
  for (int i = 0; i < kEntries; ++i) {
    if (i == dropped) key[i] = 0;
    if (key[i] > *best) {
      *best = key[i];
      *best_i = i;
    }
  }
}

// The softmax and top-k of one token's n_expert logits by one warp; lane j < k writes the j-th choice.
// Expert e is entry e / 32 of lane e % 32, kEntries >= n_expert / 32 entries a lane (the top-k warp is the
// one serial part of the kernel: each entry costs every round a scan, so a lane holds no more than it needs).
// A live expert's key is its prob's bits + 1 (probs are >= 0, so the bits order like the values; a NaN counts
// as the smallest live prob), a chosen or absent one's 0.
template <int kEntries>
__device__ void WarpTopK(const float* logits, int n_expert, int k, int32_t* ids, float* weights) {
  const int lane = threadIdx.x % 32;
  float v[kEntries];
  float local_max = -INFINITY;
#pragma unroll
  for (int i = 0; i < kEntries; ++i) {
    const int e = lane + 32 * i;
    v[i] = e < n_expert ? __ldcg(logits + e) : -INFINITY;  // from L2: written by other blocks
    local_max = fmaxf(local_max, v[i]);
  }
  const float max_logit = detail::WarpMax(local_max);
  double sum = 0;
#pragma unroll
  for (int i = 0; i < kEntries; ++i) {
    if (lane + 32 * i < n_expert) {
      v[i] = expf(v[i] - max_logit);
      sum += v[i];
    }
  }
  const float inv = static_cast<float>(1.0 / detail::WarpSumDouble(sum));
  unsigned key[kEntries];
  unsigned best = 0;
  int best_i = 0;
#pragma unroll
  for (int i = 0; i < kEntries; ++i) {
    const float p = v[i] * inv;
    key[i] = lane + 32 * i >= n_expert ? 0u : (p == p ? __float_as_uint(p) + 1u : 1u);
    if (key[i] > best) {  // entries rise in id: equal keys keep the lower id
      best = key[i];
      best_i = i;
    }
  }
  float my_p = 0.0f;
  int my_id = 0;
  for (int j = 0; j < k; ++j) {
    const unsigned top = __reduce_max_sync(kFullMask, best);
    const unsigned id = __reduce_min_sync(kFullMask, best == top ? static_cast<unsigned>(lane + 32 * best_i) : UINT_MAX);
    if (lane == j) {
      my_id = static_cast<int>(id);
      my_p = top > 1u ? __uint_as_float(top - 1u) : 0.0f;
    }
    if (static_cast<int>(id % 32) == lane) {  // the owner drops the chosen expert and finds its next best
      DropAndFindBest(key, static_cast<int>(id / 32), &best, &best_i);
    }
  }
  // Every lane sums the k probs in the same order; lane j writes the j-th choice.
  double total = 0;
  for (int j = 0; j < k; ++j) total += __shfl_sync(kFullMask, my_p, j);
  if (lane < k) {
    ids[lane] = my_id;
    weights[lane] = static_cast<float>(my_p / total);
  }
}

// WarpTopK for a step of one token by all kRouterWarps warps of the block (which must all call it): expert e
// is entry e / kRouterThreads of thread e % kRouterThreads. Each warp takes the k best of its experts (k rounds
// of a warp maximum over two or four entries a lane instead of sixteen), then warp 0 takes the k best of the
// warps' candidates. The same keys, choice order (ties to the lower id) and weights as WarpTopK, bit for bit:
// warp 0 adds the exps (through shared memory) in WarpTopK's order, so a token's routing does not depend on how
// many tokens its block holds.
template <int kEntries>
__device__ void BlockTopK(const float* logits, int n_expert, int k, int32_t* ids, float* weights) {
  __shared__ float s_max[kRouterWarps];
  __shared__ float s_exp[kMaxExperts];
  __shared__ double s_total_exp;
  __shared__ unsigned s_key[kRouterWarps][kMaxK];
  __shared__ unsigned s_id[kRouterWarps][kMaxK];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float v[kEntries];
  float local_max = -INFINITY;
#pragma unroll
  for (int i = 0; i < kEntries; ++i) {
    const int e = threadIdx.x + kRouterThreads * i;
    v[i] = e < n_expert ? __ldcg(logits + e) : -INFINITY;  // from L2: written by other blocks
    local_max = fmaxf(local_max, v[i]);
  }
  local_max = detail::WarpMax(local_max);
  if (lane == 0) s_max[warp] = local_max;
  __syncthreads();
  float max_logit = s_max[0];
#pragma unroll
  for (int w = 1; w < kRouterWarps; ++w) max_logit = fmaxf(max_logit, s_max[w]);
#pragma unroll
  for (int i = 0; i < kEntries; ++i) {
    const int e = threadIdx.x + kRouterThreads * i;
    if (e < n_expert) {
      v[i] = expf(v[i] - max_logit);
      s_exp[e] = v[i];
    }
  }
  __syncthreads();
  if (warp == 0) {  // lane l adds experts l, l + 32, ... as WarpTopK's lanes do, then the same butterfly
    double sum = 0;
    for (int e = lane; e < n_expert; e += 32) sum += s_exp[e];
    sum = detail::WarpSumDouble(sum);
    if (lane == 0) s_total_exp = sum;
  }
  __syncthreads();
  const float inv = static_cast<float>(1.0 / s_total_exp);
  unsigned key[kEntries];
  unsigned best = 0;
  int best_i = 0;
#pragma unroll
  for (int i = 0; i < kEntries; ++i) {
    const float p = v[i] * inv;
    key[i] = static_cast<int>(threadIdx.x) + kRouterThreads * i >= n_expert ? 0u
                                                                           : (p == p ? __float_as_uint(p) + 1u : 1u);
    if (key[i] > best) {  // entries rise in id: equal keys keep the lower id
      best = key[i];
      best_i = i;
    }
  }
  // This warp's k best (a warp with fewer live experts also offers keys of 0, which never win below).
  for (int j = 0; j < k; ++j) {
    const unsigned top = __reduce_max_sync(kFullMask, best);
    const unsigned mine = threadIdx.x + kRouterThreads * static_cast<unsigned>(best_i);
    const unsigned id = __reduce_min_sync(kFullMask, best == top ? mine : UINT_MAX);
    if (lane == j) {
      s_key[warp][j] = top;
      s_id[warp][j] = id;
    }
    if (id % kRouterThreads == threadIdx.x) {
      DropAndFindBest(key, static_cast<int>(id / kRouterThreads), &best, &best_i);
    }
  }
  __syncthreads();
  if (warp != 0) return;
  // Lane j < k holds pick j of every warp; the best of a lane's is the highest key, then the lowest id.
  unsigned cand_key[kRouterWarps], cand_id[kRouterWarps];
  unsigned best_key = 0, best_id = UINT_MAX;
  int best_w = 0;
#pragma unroll
  for (int w = 0; w < kRouterWarps; ++w) {
    cand_key[w] = lane < k ? s_key[w][lane] : 0u;
    cand_id[w] = lane < k ? s_id[w][lane] : UINT_MAX;
    if (cand_key[w] > best_key || (cand_key[w] == best_key && cand_id[w] < best_id)) {
      best_key = cand_key[w];
      best_id = cand_id[w];
      best_w = w;
    }
  }
  float my_p = 0.0f;
  int my_id = 0;
  for (int j = 0; j < k; ++j) {
    const unsigned top = __reduce_max_sync(kFullMask, best_key);
    const unsigned id = __reduce_min_sync(kFullMask, best_key == top ? best_id : UINT_MAX);
    if (lane == j) {
      my_id = static_cast<int>(id);
      my_p = top > 1u ? __uint_as_float(top - 1u) : 0.0f;
    }
    if (best_key == top && best_id == id) {  // the owner drops the chosen candidate and finds its next best
      best_key = 0;
      best_id = UINT_MAX;
#pragma unroll
      for (int w = 0; w < kRouterWarps; ++w) {
        if (w == best_w) cand_key[w] = 0;
      }
      best_w = 0;
#pragma unroll
      for (int w = 0; w < kRouterWarps; ++w) {
        if (cand_key[w] > best_key || (cand_key[w] == best_key && cand_id[w] < best_id)) {
          best_key = cand_key[w];
          best_id = cand_id[w];
          best_w = w;
        }
      }
    }
  }
  double total = 0;
  for (int j = 0; j < k; ++j) total += __shfl_sync(kFullMask, my_p, j);
  if (lane < k) {
    ids[lane] = my_id;
    weights[lane] = static_cast<float>(my_p / total);
  }
}

// The order of floats as unsigned keys >= 1 (0 stays "chosen or absent"); a NaN is the smallest.
__device__ __forceinline__ unsigned OrderedKey(float f) {
  if (f != f) return 1u;
  const unsigned bits = __float_as_uint(f);
  return max(1u, (bits & 0x80000000u) ? ~bits : bits | 0x80000000u);
}

// The groups whose experts may be chosen (RouterGate::grouped), as a mask of group ids (n_group <= 32), from
// the lanes' choice scores (entry i of a lane is expert lane + 32 i), as strata::model::MaskAllButBestGroups
// ranks them: a group's two best scores (a multiset: equal scores count twice), their float sum or the best
// alone, ties to the lower group.
template <int kEntries>
__device__ unsigned BestGroups(const float (&choice)[kEntries], int n_expert, const RouterGate& gate) {
  const int lane = threadIdx.x % 32;
  const int per_group = n_expert / gate.n_group;
  float group_score = -INFINITY;  // lane g: group g's
  for (int g = 0; g < gate.n_group; ++g) {
    float first = -INFINITY, second = -INFINITY;
#pragma unroll
    for (int i = 0; i < kEntries; ++i) {
      const int e = lane + 32 * i;
      if (e >= n_expert || e / per_group != g || !(choice[i] == choice[i])) continue;  // NaN: never ranked
      second = fmaxf(second, fminf(first, choice[i]));
      first = fmaxf(first, choice[i]);
    }
    for (int offset = 16; offset > 0; offset /= 2) {
      const float other_first = __shfl_xor_sync(kFullMask, first, offset);
      const float other_second = __shfl_xor_sync(kFullMask, second, offset);
      second = fmaxf(fminf(first, other_first), fmaxf(second, other_second));
      first = fmaxf(first, other_first);
    }
    if (lane == g) group_score = gate.group_top_two ? __fadd_rn(first, second) : first;
  }
  unsigned key = lane < gate.n_group ? OrderedKey(group_score) : 0u;
  unsigned chosen = 0;
  for (int j = 0; j < gate.n_group_used; ++j) {
    const unsigned top = __reduce_max_sync(kFullMask, key);
    const unsigned g = __reduce_min_sync(kFullMask, key == top ? static_cast<unsigned>(lane) : 32u);
    chosen |= 1u << g;
    if (lane == static_cast<int>(g)) key = 0;
  }
  return chosen;
}

// WarpTopK for the other gatings (RouterGate): logits plus an optional bias; probs by softmax or sigmoid,
// the choice on probs plus an optional bias (any sign, hence OrderedKey), and the weights from the chosen
// experts' probs, renormalised or not, times the scale; or (softmax_top_k) the choice on the logits and a
// softmax over the chosen ones; as strata::model's CPU router computes them.
// kLogitGating: gpt-oss's logit bias and softmax over the chosen k are read (a third instantiation, so that
// the other gatings' code is what it was without them).
template <bool kLogitGating, int kEntries>
__device__ void WarpTopKGated(const float* logits, int n_expert, int k, const RouterGate& gate, int32_t* ids,
                              float* weights) {
  const int lane = threadIdx.x % 32;
  float v[kEntries];
  float local_max = -INFINITY;
#pragma unroll
  for (int i = 0; i < kEntries; ++i) {
    const int e = lane + 32 * i;
    v[i] = e < n_expert ? __ldcg(logits + e) : -INFINITY;  // from L2: written by other blocks
    if (kLogitGating && gate.logit_bias != nullptr && e < n_expert) {
      v[i] = __fadd_rn(v[i], __ldg(gate.logit_bias + e));
    }
    local_max = fmaxf(local_max, v[i]);
  }
  if (kLogitGating && gate.softmax_top_k) {
    // The choice is on the logits themselves.
  } else if (gate.sigmoid) {
#pragma unroll
    for (int i = 0; i < kEntries; ++i) v[i] = 1.0f / (1.0f + expf(-v[i]));
  } else {
    const float max_logit = detail::WarpMax(local_max);
    double sum = 0;
#pragma unroll
    for (int i = 0; i < kEntries; ++i) {
      if (lane + 32 * i < n_expert) {
        v[i] = expf(v[i] - max_logit);
        sum += v[i];
      }
    }
    const float inv = static_cast<float>(1.0 / detail::WarpSumDouble(sum));
#pragma unroll
    for (int i = 0; i < kEntries; ++i) v[i] = v[i] * inv;
  }
  float choice[kEntries];
#pragma unroll
  for (int i = 0; i < kEntries; ++i) {
    const int e = lane + 32 * i;
    choice[i] = gate.choice_bias != nullptr && !(kLogitGating && gate.softmax_top_k) && e < n_expert
                    ? __fadd_rn(v[i], __ldg(gate.choice_bias + e))
                    : v[i];
  }
  // Experts outside the best groups are absent (key 0), as the CPU's -infinity never wins (k fits the groups).
  const bool grouped = !(kLogitGating && gate.softmax_top_k) && gate.n_group > 1 && gate.n_group_used < gate.n_group;
  const unsigned groups = grouped ? BestGroups<kEntries>(choice, n_expert, gate) : ~0u;
  const int per_group = grouped ? n_expert / gate.n_group : n_expert;
  unsigned key[kEntries];
  unsigned best = 0;
  int best_i = 0;
#pragma unroll
  for (int i = 0; i < kEntries; ++i) {
    const int e = lane + 32 * i;
    key[i] = e >= n_expert || !((groups >> (e / per_group)) & 1u) ? 0u : OrderedKey(choice[i]);
    if (key[i] > best) {  // entries rise in id: equal keys keep the lower id
      best = key[i];
      best_i = i;
    }
  }
  float my_p = 0.0f;
  int my_id = 0;
  for (int j = 0; j < k; ++j) {
    const unsigned top = __reduce_max_sync(kFullMask, best);
    const unsigned id =
        __reduce_min_sync(kFullMask, best == top ? static_cast<unsigned>(lane + 32 * best_i) : UINT_MAX);
    // The owner of the chosen expert has its prob.
    float owned = 0.0f;
#pragma unroll
    for (int i = 0; i < kEntries; ++i) {
      if (i == static_cast<int>(id / 32)) owned = v[i];
    }
    const float p = __shfl_sync(kFullMask, owned, static_cast<int>(id % 32));
    if (lane == j) {
      my_id = static_cast<int>(id);
      my_p = p;
    }
    if (static_cast<int>(id % 32) == lane) {  // the owner drops the chosen expert and finds its next best
      DropAndFindBest(key, static_cast<int>(id / 32), &best, &best_i);
    }
  }
  if (kLogitGating && gate.softmax_top_k) {
    // strata::model::Softmax over the k chosen logits, in choice order: the first is their maximum.
    const float top = __shfl_sync(kFullMask, my_p, 0);
    const float e = lane < k ? expf(my_p - top) : 0.0f;
    double sum = 0;
    for (int j = 0; j < k; ++j) sum += __shfl_sync(kFullMask, e, j);
    const float inv = static_cast<float>(1.0 / sum);
    if (lane < k) {
      ids[lane] = my_id;
      weights[lane] = __fmul_rn(__fmul_rn(e, inv), gate.scale);
    }
    return;
  }
  double total = 1.0;
  if (gate.renorm) {
    total = 0;
    for (int j = 0; j < k; ++j) total += __shfl_sync(kFullMask, my_p, j);
  }
  if (lane < k) {
    ids[lane] = my_id;
    weights[lane] = static_cast<float>(my_p / total * static_cast<double>(gate.scale));
  }
}

// s_scale[t] = the RMS scale of row token0 + t of x, t < block_tokens. The four warps of quarters 0..3 sum
// the squares (sums_squares true; lane l of quarter q adds float4s 32q + l + 128i in rising order, in
// double), the others only wait: every thread of the block calls it. Both router kernels form the scales
// this way, so that a normed row does not depend on which of them routes it.
__device__ __forceinline__ void TokenRmsScales(const float4* x4, int64_t n4, int64_t n, float eps, int token0,
                                               int block_tokens, bool sums_squares, int quarter,
                                               double (&s_squares)[kWarpsPerExpert][kRouterTokens],
                                               float (&s_scale)[kRouterTokens]) {
  const int lane = threadIdx.x % 32;
  const int64_t first = 32 * quarter + lane;
  if (sums_squares) {
    for (int t = 0; t < block_tokens; ++t) {
      const float4* xt = x4 + (token0 + t) * n4;
      double squares = 0;
      for (int64_t run_first = first; run_first < n4; run_first += kDecodeWeightRun * kRowStride) {
        float4 v[kDecodeWeightRun];
#pragma unroll
        for (int u = 0; u < kDecodeWeightRun; ++u) v[u] = LoadOrZero(xt, run_first + u * kRowStride, n4);
#pragma unroll
        for (int u = 0; u < kDecodeWeightRun; ++u) {
          squares += static_cast<double>(v[u].x) * v[u].x + static_cast<double>(v[u].y) * v[u].y +
                     static_cast<double>(v[u].z) * v[u].z + static_cast<double>(v[u].w) * v[u].w;
        }
      }
      squares = detail::WarpSumDouble(squares);
      if (lane == 0) s_squares[quarter][t] = squares;
    }
  }
  __syncthreads();
  if (threadIdx.x < block_tokens) {
    double total = 0;
    for (int q = 0; q < kWarpsPerExpert; ++q) total += s_squares[q][threadIdx.x];
    s_scale[threadIdx.x] = detail::RmsScale(total, n, eps);
  }
  __syncthreads();
}

// norm.out's rows token0 .. token0 + block_tokens - 1, by one quarter's warp (lane l of quarter q stores
// float4s 32q + l + 128i).
__device__ __forceinline__ void StoreNormedRows(const float4* x4, const float4* g4, float4* out4, int64_t n4,
                                                int token0, int block_tokens, int quarter, const float* s_scale) {
  const int64_t first = 32 * quarter + threadIdx.x % 32;
  for (int t = 0; t < block_tokens; ++t) {
    const float4* xt = x4 + (token0 + t) * n4;
    for (int64_t run_first = first; run_first < n4; run_first += kDecodeWeightRun * kRowStride) {
      float4 h[kDecodeWeightRun];
#pragma unroll
      for (int u = 0; u < kDecodeWeightRun; ++u) {
        const int64_t c4 = run_first + u * kRowStride;
        h[u] = Normed(LoadOrZero(xt, c4, n4), s_scale[t], LoadOrZero(g4, c4, n4));
      }
#pragma unroll
      for (int u = 0; u < kDecodeWeightRun; ++u) {
        const int64_t c4 = run_first + u * kRowStride;
        if (c4 < n4) out4[(token0 + t) * n4 + c4] = h[u];
      }
    }
  }
}

// The softmax and top-k of token t's logits by one warp (WarpTopK or WarpTopKGated for kGating, see
// RouterKernel), with a lane entry count that fits n_expert.
template <int kGating>
__device__ __forceinline__ void TokenTopK(const float* logits, int n_expert, int k, const RouterGate& gate, int64_t t,
                                          int32_t* ids, float* weights) {
  const auto top_k = [&](auto entries) {
    constexpr int kEntries = decltype(entries)::value;
    if constexpr (kGating == 0) {
      WarpTopK<kEntries>(logits + t * n_expert, n_expert, k, ids + t * k, weights + t * k);
    } else {
      WarpTopKGated<kGating == 2, kEntries>(logits + t * n_expert, n_expert, k, gate, ids + t * k, weights + t * k);
    }
  };
  if (n_expert <= 128) {
    top_k(std::integral_constant<int, 4>{});
  } else if (n_expert <= 256) {
    top_k(std::integral_constant<int, 8>{});
  } else if (n_expert <= 512) {
    top_k(std::integral_constant<int, 16>{});
  } else {
    top_k(std::integral_constant<int, kMaxExperts / 32>{});
  }
}

// The logits of experts expert0 .. expert0 + kExperts - 1 for the block's tokens from their quarters' sums
// (s_partial[quarter][expert - expert0][token - token0]), added in quarter order: the one order both kernels
// use, so that a logit is the same bits whichever computes it. After a barrier that follows the stores.
template <int kExperts>
__device__ __forceinline__ void StoreLogits(const float (&s_partial)[kWarpsPerExpert][kExperts][kRouterTokens],
                                            int expert0, int n_expert, int token0, int block_tokens, float* logits) {
  if (threadIdx.x < kExperts * kRouterTokens) {
    const int e_slot = threadIdx.x / kRouterTokens, t = threadIdx.x % kRouterTokens;
    const int e = expert0 + e_slot;
    if (e < n_expert && t < block_tokens) {
      float logit = 0.0f;
#pragma unroll
      for (int q = 0; q < kWarpsPerExpert; ++q) logit += s_partial[q][e_slot][t];
      logits[static_cast<int64_t>(token0 + t) * n_expert + e] = logit;
    }
  }
}

// A step of up to kRouterTokens tokens (one token block): logits, then softmax and top-k by the last expert
// block to finish. kGating: 0 the default RouterGate (softmax, renormalised, unscaled); 1 the other gatings,
// read from `gate` by WarpTopKGated; 2 those with gpt-oss's logit bias or softmax over the chosen k.
template <int kGating>
__global__ void __launch_bounds__(kRouterThreads, 2)
    RouterKernel(const float* w, int n_expert, int64_t n, const float* x, RouterNorm norm, RouterGate gate,
                 int n_tokens, int k, int32_t* ids, float* weights, unsigned* counters, float* logits) {
  __shared__ float s_partial[kWarpsPerExpert][kExpertsPerBlock][kRouterTokens];
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
  const bool normed = norm.weight != nullptr;

  // The first run of weights and of the norm's weights is in flight while the kernel before finishes and the
  // norm's sums form.
  float4 wv[kDecodeWeightRun], gv[kDecodeWeightRun];
  auto load_run = [&](int64_t run_first) {
#pragma unroll
    for (int u = 0; u < kDecodeWeightRun; ++u) {
      wv[u] = wr != nullptr ? LoadOrZero(wr, run_first + u * kRowStride, n4) : Zero4();
      gv[u] = normed ? LoadOrZero(g4, run_first + u * kRowStride, n4) : make_float4(1.0f, 1.0f, 1.0f, 1.0f);
    }
  };
  load_run(first);
  WaitForPriorKernels();  // the router's weights are no kernel's output; x is
  // The four quarters of either expert slot cover each row once: slot 0's warps sum the squares.
  if (normed) TokenRmsScales(x4, n4, n, norm.eps, token0, block_tokens, slot == 0, quarter, s_squares, s_scale);

  float acc[kRouterTokens];
#pragma unroll
  for (int t = 0; t < kRouterTokens; ++t) acc[t] = 0.0f;
  for (int64_t run_first = first; run_first < n4; run_first += kDecodeWeightRun * kRowStride) {
    if (run_first != first) load_run(run_first);
#pragma unroll
    for (int t = 0; t < kRouterTokens; ++t) {
      if (t < block_tokens) {  // the same in the whole block
        const float4* xt = x4 + (token0 + t) * n4;
        float4 xv[kDecodeWeightRun];
#pragma unroll
        for (int u = 0; u < kDecodeWeightRun; ++u) xv[u] = LoadOrZero(xt, run_first + u * kRowStride, n4);
#pragma unroll
        for (int u = 0; u < kDecodeWeightRun; ++u) {
          if (normed) xv[u] = Normed(xv[u], s_scale[t], gv[u]);
          acc[t] = fmaf(wv[u].x, xv[u].x, acc[t]);
          acc[t] = fmaf(wv[u].y, xv[u].y, acc[t]);
          acc[t] = fmaf(wv[u].z, xv[u].z, acc[t]);
          acc[t] = fmaf(wv[u].w, xv[u].w, acc[t]);
        }
      }
    }
  }
  // Expert block 0's slot-0 warps store the normed rows (after the products, so that no store sits
  // between the loads above).
  if (normed && blockIdx.x == 0 && slot == 0) {
    StoreNormedRows(x4, g4, reinterpret_cast<float4*>(norm.out), n4, token0, block_tokens, quarter, s_scale);
  }
#pragma unroll
  for (int t = 0; t < kRouterTokens; ++t) {
    if (t < block_tokens) {  // the same in the whole block
      const float sum = detail::WarpSum(acc[t]);
      if (lane == 0) s_partial[quarter][slot][t] = sum;
    }
  }
  __syncthreads();
  StoreLogits(s_partial, blockIdx.x * kExpertsPerBlock, n_expert, token0, block_tokens, logits);

  if (!detail::CountInIsLast(&counters[blockIdx.y], gridDim.x)) return;
  if (kGating == 0 && block_tokens == 1) {  // a decode step of one token: the whole block
    const int64_t t = token0;
    if (n_expert <= kRouterThreads) {
      BlockTopK<1>(logits + t * n_expert, n_expert, k, ids + t * k, weights + t * k);
    } else if (n_expert <= 2 * kRouterThreads) {
      BlockTopK<2>(logits + t * n_expert, n_expert, k, ids + t * k, weights + t * k);
    } else {
      BlockTopK<kMaxExperts / kRouterThreads>(logits + t * n_expert, n_expert, k, ids + t * k, weights + t * k);
    }
  } else if (warp < block_tokens) {
    TokenTopK<kGating>(logits, n_expert, k, gate, token0 + warp, ids, weights);
  }
  if (threadIdx.x == 0) counters[blockIdx.y] = 0;  // every block of this token block has counted
}

// The logits of a prompt step, a tile of kTileExperts experts by kRouterTokens tokens a block, each weight
// and activation float4 loaded once for the tile. Warp w takes quarter w % 4 of the row slots (lane l of
// quarter q: float4s 32q + l + 128i, in rising order) for experts 4 * (w / 4) .. + 3 of the tile and all the
// tile's tokens; a logit is then the same chain of fmaf, the same butterfly over the lanes and the same sum
// of the quarters in order as in RouterKernel, so it is the same bits whichever kernel routes the token.
constexpr int kTileExperts = 8;
constexpr int kTileExpertsPerWarp = kTileExperts * kWarpsPerExpert / kRouterWarps;

__global__ void __launch_bounds__(kRouterThreads, 2)
    RouterLogitsTileKernel(const float* w, int n_expert, int64_t n, const float* x, RouterNorm norm, int n_tokens,
                           float* logits) {
  __shared__ float s_partial[kWarpsPerExpert][kTileExperts][kRouterTokens];
  __shared__ double s_squares[kWarpsPerExpert][kRouterTokens];
  __shared__ float s_scale[kRouterTokens];

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int token0 = blockIdx.y * kRouterTokens;
  const int block_tokens = min(kRouterTokens, n_tokens - token0);
  const int quarter = warp % kWarpsPerExpert, group = warp / kWarpsPerExpert;
  const int expert0 = blockIdx.x * kTileExperts + group * kTileExpertsPerWarp;
  const int64_t n4 = n / 4;
  const int64_t first = 32 * quarter + lane;
  const float4* const x4 = reinterpret_cast<const float4*>(x);
  const float4* const g4 = reinterpret_cast<const float4*>(norm.weight);
  const bool normed = norm.weight != nullptr;
  const float4* wr[kTileExpertsPerWarp];
#pragma unroll
  for (int e = 0; e < kTileExpertsPerWarp; ++e) {
    wr[e] = expert0 + e < n_expert ? reinterpret_cast<const float4*>(w + (expert0 + e) * n) : nullptr;
  }

  WaitForPriorKernels();
  if (normed) TokenRmsScales(x4, n4, n, norm.eps, token0, block_tokens, group == 0, quarter, s_squares, s_scale);

  float acc[kTileExpertsPerWarp][kRouterTokens];
#pragma unroll
  for (int e = 0; e < kTileExpertsPerWarp; ++e) {
#pragma unroll
    for (int t = 0; t < kRouterTokens; ++t) acc[e][t] = 0.0f;
  }
  for (int64_t c4 = first; c4 < n4; c4 += kRowStride) {
    float4 wv[kTileExpertsPerWarp];
#pragma unroll
    for (int e = 0; e < kTileExpertsPerWarp; ++e) wv[e] = wr[e] != nullptr ? __ldg(wr[e] + c4) : Zero4();
    const float4 g = normed ? __ldg(g4 + c4) : make_float4(1.0f, 1.0f, 1.0f, 1.0f);
    float4 xv[kRouterTokens];
#pragma unroll
    for (int t = 0; t < kRouterTokens; ++t) xv[t] = t < block_tokens ? __ldg(x4 + (token0 + t) * n4 + c4) : Zero4();
#pragma unroll
    for (int t = 0; t < kRouterTokens; ++t) {
      if (t < block_tokens) {  // the same in the whole block
        if (normed) xv[t] = Normed(xv[t], s_scale[t], g);
#pragma unroll
        for (int e = 0; e < kTileExpertsPerWarp; ++e) {
          acc[e][t] = fmaf(wv[e].x, xv[t].x, acc[e][t]);
          acc[e][t] = fmaf(wv[e].y, xv[t].y, acc[e][t]);
          acc[e][t] = fmaf(wv[e].z, xv[t].z, acc[e][t]);
          acc[e][t] = fmaf(wv[e].w, xv[t].w, acc[e][t]);
        }
      }
    }
  }
  if (normed && blockIdx.x == 0 && group == 0) {
    StoreNormedRows(x4, g4, reinterpret_cast<float4*>(norm.out), n4, token0, block_tokens, quarter, s_scale);
  }
#pragma unroll
  for (int e = 0; e < kTileExpertsPerWarp; ++e) {
#pragma unroll
    for (int t = 0; t < kRouterTokens; ++t) {
      if (t < block_tokens) {  // the same in the whole block
        const float sum = detail::WarpSum(acc[e][t]);
        if (lane == 0) s_partial[quarter][group * kTileExpertsPerWarp + e][t] = sum;
      }
    }
  }
  __syncthreads();
  StoreLogits(s_partial, blockIdx.x * kTileExperts, n_expert, token0, block_tokens, logits);
}

// The softmax and top-k of a prompt step's logits (RouterLogitsTileKernel's): one warp a token, as the last
// block of RouterKernel does them for a token block of several tokens.
template <int kGating>
__global__ void __launch_bounds__(kRouterThreads)
    TopKOfLogitsKernel(const float* logits, int n_expert, RouterGate gate, int n_tokens, int k, int32_t* ids,
                       float* weights) {
  WaitForPriorKernels();
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kRouterWarps + threadIdx.x / 32;
  if (t < n_tokens) TokenTopK<kGating>(logits, n_expert, k, gate, t, ids, weights);
}

}  // namespace

size_t RouterWorkspaceBytes(int n_tokens, int n_expert) {
  if (n_tokens <= 0 || n_expert <= 0) return 0;
  return CounterBytes(n_tokens) + static_cast<size_t>(n_tokens) * n_expert * sizeof(float);
}

absl::Status RouterTopK(const float* w, int n_expert, int64_t n, const float* x, const RouterNorm& norm,
                        const RouterGate& gate, int n_tokens, int k, int32_t* ids, float* weights, void* workspace,
                        size_t workspace_bytes, cudaStream_t stream) {
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
  if (!std::isfinite(gate.scale)) {
    return absl::InvalidArgumentError(absl::StrCat("RouterTopK: gate.scale is ", gate.scale, ", not a finite number"));
  }
  if (gate.grouped()) {
    if (gate.n_group > 32 || n_expert % gate.n_group != 0) {
      return BadArgument(kFn, "gate.n_group", gate.n_group,
                         absl::StrCat("it must be at most 32 and divide n_expert (", n_expert, ")"));
    }
    if (gate.n_group_used < 1 || gate.n_group_used * (n_expert / gate.n_group) < k) {
      return BadArgument(kFn, "gate.n_group_used", gate.n_group_used,
                         absl::StrCat("it must be >= 1 and its groups hold at least k (", k, ") experts"));
    }
    if (gate.softmax_top_k) return absl::InvalidArgumentError("RouterTopK: a grouped gate with softmax_top_k");
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
  const int gating = gate.plain() ? 0 : (gate.logit_bias != nullptr || gate.softmax_top_k ? 2 : 1);
  if (n_tokens <= kRouterTokens) {
    const dim3 grid((n_expert + kExpertsPerBlock - 1) / kExpertsPerBlock, 1);
    const auto kernel = gating == 0 ? RouterKernel<0> : gating == 1 ? RouterKernel<1> : RouterKernel<2>;
    return LaunchKernel("RouterKernel", kernel, grid, kRouterThreads, 0, stream, w, n_expert, n, x, norm, gate,
                        n_tokens, k, ids, weights, counters, logits);
  }
  const dim3 tile_grid((n_expert + kTileExperts - 1) / kTileExperts, TokenBlocks(n_tokens));
  absl::Status launched = LaunchKernel("RouterLogitsTileKernel", RouterLogitsTileKernel, tile_grid, kRouterThreads, 0,
                                       stream, w, n_expert, n, x, norm, n_tokens, logits);
  if (!launched.ok()) return launched;
  const auto top_k = gating == 0 ? TopKOfLogitsKernel<0> : gating == 1 ? TopKOfLogitsKernel<1> : TopKOfLogitsKernel<2>;
  return LaunchKernel("TopKOfLogitsKernel", top_k, dim3(TokenBlocks(n_tokens)), kRouterThreads, 0, stream, logits,
                      n_expert, gate, n_tokens, k, ids, weights);
}

}  // namespace strata::kernels::cuda
