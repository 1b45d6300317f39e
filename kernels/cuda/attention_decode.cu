// Attention of a few tokens each over its own cache (decode): a block per (token, kv head, split of the
// positions), eight warps, no shared-memory staging of K and V.
//
// Warp w takes positions w, w + 8, ... of its split. Scores: a lane holds D/32 consecutive dims of a key
// row (one coalesced load per row) and of each of the group's G query heads (shared memory); the G partial
// dot products are reduced across the warp together (WarpReduceMany: log2(32) steps that each halve the
// values a lane carries). Probabilities: a warp per head, over the split. Output: a lane holds D/32 dims of
// a value row times every head; the eight warps' sums are added in warp order through shared memory.
// A split holds at least kDecodeGranule positions; when a token's positions span several splits, each
// writes its (m, l, O) to the workspace and the last of them to finish (a counter per (token, kv head),
// which it resets) merges them in split order. Splits wholly past a token's position, or wholly before its
// sliding window (AttentionSinkWindow), exit at once; the window's first live split starts at the window.
// A sink joins the denominator where the output is divided (DivideWithSink). Keys and values of positions
// an earlier step wrote (below TokenSlot::first_new) are loaded before the wait for the kernel before, so
// that after it a block's chain starts with q and the step's new positions alone.
// Fused with QkNormRopeStore (kFused, QkNormRopeAttention; every token its sequence's only one in the step): the
// block's warps norm and rotate its G query heads from the projection straight into shared memory, and the
// block whose split holds the token's position also stores that position's key and value (warp G % 8), keeping
// a copy in shared memory for its own warps; the cos, sin and norm weights are formed before the wait.

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/attention_internal.cuh"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/dense_device.cuh"
#include "kernels/cuda/dependent_launch.cuh"
#include "kernels/cuda/grid_count.cuh"
#include "kernels/cuda/qk_rope.cuh"

namespace strata::kernels::cuda::detail {
namespace {

constexpr int kDecodeWarps = 8;
constexpr int kDecodeThreads = 32 * kDecodeWarps;
constexpr int kDecodeGranule = 64;    // split lengths are multiples of this many positions
constexpr int kDecodeMaxSplit = 512;  // positions of the score buffer
constexpr int kDecodeTargetBlocks = 264;
constexpr int kDecodeMaxSplits = 1024;
// K / V rows a warp loads before using them: eight where the registers allow (the first pass's keys and
// values are held from before the wait to the products), four for the largest groups.
__host__ __device__ constexpr int RowsPerPass(int ng, int per) { return ng * per <= 32 ? 8 : 4; }

// Reduces N values (N a power of two, <= 32) over the warp at once. Returns, in lane l, the sum over the
// warp of value index l >> (5 - log2 N) (for N = 1, the sum of v[0] in every lane). Clobbers v.
template <int N>
__device__ __forceinline__ float WarpReduceMany(float (&v)[N], int lane) {
  int count = N;
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    if (count > 1) {
      const bool upper = (lane & offset) != 0;
#pragma unroll
      for (int i = 0; i < N / 2; ++i) {
        if (i < count / 2) {
          const float send = upper ? v[i] : v[i + count / 2];
          const float keep = upper ? v[i + count / 2] : v[i];
          v[i] = keep + __shfl_xor_sync(kFullMask, send, offset);
        }
      }
      count /= 2;
    } else {
      v[0] += __shfl_xor_sync(kFullMask, v[0], offset);
    }
  }
  return v[0];
}

template <int kPer>
__device__ __forceinline__ void LoadRow(const float* p, float (&r)[kPer]) {
  if constexpr (kPer == 4) {
    const float4 v = __ldcg(reinterpret_cast<const float4*>(p));
    r[0] = v.x, r[1] = v.y, r[2] = v.z, r[3] = v.w;
  } else if constexpr (kPer == 2) {
    const float2 v = __ldcg(reinterpret_cast<const float2*>(p));
    r[0] = v.x, r[1] = v.y;
  } else {
    r[0] = __ldcg(p);
  }
}

__host__ __device__ constexpr int Log2(int n) { return n <= 1 ? 0 : 1 + Log2(n / 2); }

// Dynamic shared memory: q [G][D], probabilities [G][split_len], warp outputs [8][G][D].
size_t DecodeSharedBytes(int group, int head_dim, int split_len) {
  return (static_cast<size_t>(group) * head_dim + static_cast<size_t>(group) * split_len +
          static_cast<size_t>(kDecodeWarps) * group * head_dim) *
         sizeof(float);
}

// D: head_dim; NG: G rounded up to a power of two (the values each lane reduces at once); kFused: q and the
// new k and v come raw from the projections (DecodeAttentionArgs::fused).
template <int D, int NG, bool kFused>
__global__ void __launch_bounds__(kDecodeThreads) DecodeAttentionKernel(const DecodeAttentionArgs a) {
  constexpr int kPer = D / 32;
  constexpr int kPairs = (D / 2 + 31) / 32;  // rotation pairs a lane owns (qk_rope.cuh)
  constexpr int kShift = 5 - Log2(NG);
  constexpr int kRows = RowsPerPass(NG, kPer);
  extern __shared__ float4 decode_shared_raw[];
  float* const s_q = reinterpret_cast<float*>(decode_shared_raw);
  float* const s_p = s_q + a.group * D;
  float* const s_o = s_p + a.group * a.split_len;
  __shared__ float s_m[NG], s_l[NG];

  const int token = blockIdx.x, kv_head = blockIdx.y, split = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int G = a.group;
  // The slots are the step's input, uploaded before its first kernel: read before the wait.
  const TokenSlot slot = a.slots[token];
  // Positions [first, pos] are attended to; the live splits are those that hold some of them.
  const int first = a.window > 0 ? max(0, slot.pos - a.window + 1) : 0;
  const int first_split = first / a.split_len;
  const int split_begin = split * a.split_len;
  const int begin = max(split_begin, first);
  const int n_pos = min(split_begin + a.split_len, slot.pos + 1) - begin;
  const bool live = n_pos > 0 && split >= first_split;
  const int64_t kv_dim = static_cast<int64_t>(a.n_head_kv) * D;
  const int64_t base = LayerFirstSlot(slot, a.place) * kv_dim + static_cast<int64_t>(kv_head) * D + lane * kPer;
  const float* const keys = slot.keys + base;
  const float* const values = slot.values + base;
  // Row j of this split: position begin + j, in its slot (a windowed layer's ring wraps).
  const auto row = [&](int j) { return PositionSlot(slot, a.place, begin + j) * kv_dim; };
  // This warp's rows of the first pass, keys and values, those at positions an earlier step wrote
  // (TokenSlot::first_new) loaded before the wait: the chain after it then starts with q alone.
  float k0[kRows][kPer], v0[kRows][kPer];
  const auto written_before = [&](int j) { return j < n_pos && begin + j < slot.first_new; };
  if (live) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int j = warp + r * kDecodeWarps;
      if (written_before(j)) {
        LoadRow<kPer>(keys + row(j), k0[r]);
        LoadRow<kPer>(values + row(j), v0[r]);
      }
    }
  }
  // Fused: this lane's rotation and norm weights (the position and weights are inputs of the step), and
  // whether this block holds the token's position, whose key and value it then stores.
  const bool stores_new = kFused && live && slot.pos < split_begin + a.split_len;
  LaneRope<kPairs> lane_rope{};
  LaneNorm<kPairs> q_norm{}, k_norm{};
  if constexpr (kFused) {
    if (live) {
      lane_rope = PrepareLaneRope<kPairs>(a.fused.rope, D, slot.pos, lane);
      q_norm = LoadLaneNorm(a.fused.rope.q_norm, lane_rope);
      if (stores_new) k_norm = LoadLaneNorm(a.fused.rope.k_norm, lane_rope);
    }
  }
  WaitForPriorKernels();
  // Past the token's position or wholly before its window: no part to write, not counted.
  if (!live) return;
  const int live_splits = (slot.pos + a.split_len) / a.split_len - first_split;
  const int64_t row0 = static_cast<int64_t>(token) * a.n_head + static_cast<int64_t>(kv_head) * G;
  if constexpr (kFused) {
    // Warp w norms and rotates query heads w and w + 8 (those < G) into s_q; warp G % 8 of the block that holds
    // the position also the new key, into the cache and s_new (which this block's warps then read instead of
    // the cache), and copies the new value likewise. Every load is issued before any arithmetic.
    __shared__ float s_new[2][D];
    const bool key_job = stores_new && warp == G % kDecodeWarps;
    const int64_t raw = static_cast<int64_t>(token) * kv_dim + static_cast<int64_t>(kv_head) * D;
    HeadPairs<kPairs> q_first{}, q_second{}, key{};
    float value[kPer];
    if (warp < G) q_first = LoadHeadPairs(a.q + (row0 + warp) * D, lane_rope);
    if (warp + kDecodeWarps < G) q_second = LoadHeadPairs(a.q + (row0 + warp + kDecodeWarps) * D, lane_rope);
    if (key_job) {
      key = LoadHeadPairs(a.fused.k + raw, lane_rope);
      LoadRow<kPer>(a.fused.v + raw + lane * kPer, value);
    }
    const QkRopeParams& p = a.fused.rope;
    if (warp < G) {
      StoreHeadPairs(NormRope(q_first, p.q_norm != nullptr, q_norm, p.eps, D, lane_rope), s_q + warp * D, lane_rope);
    }
    if (warp + kDecodeWarps < G) {
      StoreHeadPairs(NormRope(q_second, p.q_norm != nullptr, q_norm, p.eps, D, lane_rope),
                     s_q + (warp + kDecodeWarps) * D, lane_rope);
    }
    if (key_job) {
      const int64_t stored = (LayerFirstSlot(slot, a.place) + PositionSlot(slot, a.place, slot.pos)) * kv_dim +
                             static_cast<int64_t>(kv_head) * D;
      key = NormRope(key, p.k_norm != nullptr, k_norm, p.eps, D, lane_rope);
      StoreHeadPairs(key, slot.keys + stored, lane_rope);
      StoreHeadPairs(key, s_new[0], lane_rope);
#pragma unroll
      for (int c = 0; c < kPer; ++c) {
        slot.values[stored + lane * kPer + c] = value[c];
        s_new[1][lane * kPer + c] = value[c];
      }
    }
    __syncthreads();
    // The rows not read ahead: the token's own position from s_new; any other (first_new below pos, which the
    // caller may leave so: the token's sequence has no other new position) from the cache, written by earlier
    // steps.
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int j = warp + r * kDecodeWarps;
      if (begin + j == slot.pos) {
#pragma unroll
        for (int c = 0; c < kPer; ++c) {
          k0[r][c] = s_new[0][lane * kPer + c];
          v0[r][c] = s_new[1][lane * kPer + c];
        }
      } else if (j < n_pos && !written_before(j)) {
        LoadRow<kPer>(keys + row(j), k0[r]);
        LoadRow<kPer>(values + row(j), v0[r]);
      }
    }
  } else {
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int j = warp + r * kDecodeWarps;
      if (j < n_pos && !written_before(j)) {
        LoadRow<kPer>(keys + row(j), k0[r]);
        LoadRow<kPer>(values + row(j), v0[r]);
      }
    }
    for (int i = threadIdx.x; i < G * D / 4; i += kDecodeThreads) {
      reinterpret_cast<float4*>(s_q)[i] = __ldg(reinterpret_cast<const float4*>(a.q + row0 * D) + i);
    }
    __syncthreads();
  }

  // Scores, scaled, into s_p[g][j].
  for (int j0 = warp; j0 < n_pos; j0 += kRows * kDecodeWarps) {
    float k[kRows][kPer];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int j = j0 + r * kDecodeWarps;
      if (j0 == warp) {
#pragma unroll
        for (int c = 0; c < kPer; ++c) k[r][c] = k0[r][c];
      } else if (j < n_pos) {
        LoadRow<kPer>(keys + row(j), k[r]);
      }
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int j = j0 + r * kDecodeWarps;
      if (j >= n_pos) break;
      float dots[NG];
#pragma unroll
      for (int g = 0; g < NG; ++g) {
        dots[g] = 0.0f;
        if (g < G) {
#pragma unroll
          for (int c = 0; c < kPer; ++c) dots[g] = fmaf(s_q[g * D + lane * kPer + c], k[r][c], dots[g]);
        }
      }
      const float score = WarpReduceMany<NG>(dots, lane);
      const int g = lane >> kShift;
      if ((lane & ((1 << kShift) - 1)) == 0 && g < G) s_p[g * a.split_len + j] = score * a.scale;
    }
  }
  __syncthreads();

  // Probabilities of each head over the split: exp(s - m), with m and l = sum of them.
  for (int g = warp; g < G; g += kDecodeWarps) {
    float* const p = s_p + g * a.split_len;
    float m = -INFINITY;
    for (int j = lane; j < n_pos; j += 32) m = fmaxf(m, p[j]);
    m = WarpMax(m);
    float l = 0.0f;
    for (int j = lane; j < n_pos; j += 32) {
      p[j] = expf(p[j] - m);
      l += p[j];
    }
    l = WarpSum(l);
    if (lane == 0) {
      s_m[g] = m;
      s_l[g] = l;
    }
  }
  __syncthreads();

  // This warp's share of O = P V.
  float o[NG][kPer];
#pragma unroll
  for (int g = 0; g < NG; ++g) {
#pragma unroll
    for (int c = 0; c < kPer; ++c) o[g][c] = 0.0f;
  }
  for (int j0 = warp; j0 < n_pos; j0 += kRows * kDecodeWarps) {
    float v[kRows][kPer];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int j = j0 + r * kDecodeWarps;
      if (j0 == warp) {
#pragma unroll
        for (int c = 0; c < kPer; ++c) v[r][c] = v0[r][c];
      } else if (j < n_pos) {
        LoadRow<kPer>(values + row(j), v[r]);
      }
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int j = j0 + r * kDecodeWarps;
      if (j >= n_pos) break;
#pragma unroll
      for (int g = 0; g < NG; ++g) {
        if (g < G) {
          const float pj = s_p[g * a.split_len + j];
#pragma unroll
          for (int c = 0; c < kPer; ++c) o[g][c] = fmaf(pj, v[r][c], o[g][c]);
        }
      }
    }
  }
#pragma unroll
  for (int g = 0; g < NG; ++g) {
    if (g < G) {
#pragma unroll
      for (int c = 0; c < kPer; ++c) s_o[(warp * G + g) * D + lane * kPer + c] = o[g][c];
    }
  }
  __syncthreads();

  const int64_t rows = static_cast<int64_t>(a.n_tokens) * a.n_head;
  for (int i = threadIdx.x; i < G * D; i += kDecodeThreads) {
    const int g = i / D, d = i % D;
    float sum = 0.0f;
#pragma unroll
    for (int w = 0; w < kDecodeWarps; ++w) sum += s_o[(w * G + g) * D + d];
    const int64_t row = row0 + g;
    if (live_splits == 1) {
      // l >= 1: the max position contributes exp(0).
      a.out[row * D + d] =
          a.sinks == nullptr ? sum / s_l[g] : DivideWithSink(sum, s_m[g], s_l[g], a.sinks[row % a.n_head]);
    } else {
      const int64_t part = static_cast<int64_t>(split) * rows + row;
      a.part_o[part * D + d] = sum;
      if (d == 0) {
        a.part_m[part] = s_m[g];
        a.part_l[part] = s_l[g];
      }
    }
  }
  if (live_splits == 1) return;

  // Count this split in; the last one merges every live split of (token, kv head) in split order.
  unsigned* const counter = a.counters + static_cast<int64_t>(token) * a.n_head_kv + kv_head;
  if (!detail::CountInIsLast(counter, live_splits)) return;
  for (int i = threadIdx.x; i < G * D; i += kDecodeThreads) {
    const int g = i / D, d = i % D;
    const int64_t row = row0 + g;
    const int end_split = first_split + live_splits;
    float max_m = -INFINITY;
    for (int s = first_split; s < end_split; ++s) max_m = fmaxf(max_m, __ldcg(a.part_m + s * rows + row));
    float sum_l = 0.0f, sum_o = 0.0f;
    for (int s = first_split; s < end_split; ++s) {
      const int64_t part = s * rows + row;
      const float f = expf(__ldcg(a.part_m + part) - max_m);
      sum_l += __ldcg(a.part_l + part) * f;
      sum_o += __ldcg(a.part_o + part * D + d) * f;
    }
    a.out[row * D + d] =
        a.sinks == nullptr ? sum_o / sum_l : DivideWithSink(sum_o, max_m, sum_l, a.sinks[row % a.n_head]);
  }
  if (threadIdx.x == 0) *counter = 0;
}

template <int D, int NG, bool kFused>
absl::Status Launch(const DecodeAttentionArgs& a, cudaStream_t stream) {
  // Above 48 KiB a kernel must opt in; set once per process (host-side, enqueues nothing), to the most
  // any call can ask, so graph captures skip it.
  static const cudaError_t opt_in =
      cudaFuncSetAttribute(DecodeAttentionKernel<D, NG, kFused>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(DecodeSharedBytes(NG, D, kDecodeMaxSplit)));
  CUDA_RETURN_IF_ERROR(opt_in, "cudaFuncSetAttribute(DecodeAttentionKernel)");
  const dim3 grid(static_cast<unsigned>(a.n_tokens), static_cast<unsigned>(a.n_head_kv),
                  static_cast<unsigned>(a.n_splits));
  return LaunchKernel("DecodeAttentionKernel", DecodeAttentionKernel<D, NG, kFused>, grid, kDecodeThreads,
                      DecodeSharedBytes(a.group, D, a.split_len), stream, a);
}

template <int D, bool kFused>
absl::Status LaunchForGroup(const DecodeAttentionArgs& a, cudaStream_t stream) {
  if (a.group <= 4) return Launch<D, 4, kFused>(a, stream);
  if (a.group <= 8) return Launch<D, 8, kFused>(a, stream);
  return Launch<D, 16, kFused>(a, stream);
}

template <int D>
absl::Status LaunchForHeadDim(const DecodeAttentionArgs& a, cudaStream_t stream) {
  return a.fused.k != nullptr ? LaunchForGroup<D, true>(a, stream) : LaunchForGroup<D, false>(a, stream);
}

}  // namespace

bool UseDecodeAttention(int n_tokens, int group) { return n_tokens <= kDecodeMaxTokens && group <= 16; }

DecodeSplitPlan PlanDecodeSplits(int n_tokens, int n_head_kv, int max_positions) {
  const int64_t items = std::max<int64_t>(1, static_cast<int64_t>(n_tokens) * n_head_kv);
  const int64_t wanted = (kDecodeTargetBlocks + items - 1) / items;
  const int64_t most = (static_cast<int64_t>(max_positions) + kDecodeGranule - 1) / kDecodeGranule;
  const int64_t n = std::clamp<int64_t>(std::min(wanted, most), 1, kDecodeMaxSplits);
  int64_t len = (max_positions + n - 1) / n;
  len = std::min<int64_t>((len + kDecodeGranule - 1) / kDecodeGranule * kDecodeGranule, kDecodeMaxSplit);
  return DecodeSplitPlan{static_cast<int>((max_positions + len - 1) / len), static_cast<int>(len)};
}

absl::Status LaunchDecodeAttention(const DecodeAttentionArgs& a, int head_dim, cudaStream_t stream) {
  switch (head_dim) {
    case 32:
      return LaunchForHeadDim<32>(a, stream);
    case 64:
      return LaunchForHeadDim<64>(a, stream);
    default:
      return LaunchForHeadDim<128>(a, stream);
  }
}

}  // namespace strata::kernels::cuda::detail
