// Attention of each query head over its sequence's KV cache (f32), decode and causal prefill alike.
//
// Decode batches (few tokens, each over its own cache) take attention_decode.cu's kernel instead; this is
// the prefill kernel. A block takes a tile of query rows — tile_tokens consecutive batch tokens times the G query heads of one
// kv head — and one split of the positions. It streams that kv head's keys and values through shared
// memory (cp.async) and keeps, per row, the running max m, the running sum l of exp(s - m) and the
// unnormalized output O (online softmax). Tokens of the tile that share a cache are processed together, so
// one K/V load serves all of them; tokens of other sequences in the same tile get their own pass.
//
// Inside a block each warp computes 16 rows x 32 positions of every K/V tile: lane = 8 * rg + pg owns rows
// rg + 4a and positions pg + 8b (a, b < 4) for the scores, and rows rg + 4a times dims 4 pg + 32 c of O.
// The 4 warps split rows (prefill, 64 rows) or positions (decode, few rows); at the end their (m, l, O)
// are merged through shared memory. With more than one split, partial (m, l, O) go to the workspace and a
// second kernel merges them. A sliding window (AttentionSinkWindow) masks each row's positions before it
// and skips the tiles before every member's window; a sink joins the denominator where O is divided.

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/attention_internal.cuh"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/dense_device.cuh"
#include "kernels/cuda/dense_kernels.h"
#include "kernels/cuda/dependent_launch.cuh"

namespace strata::kernels::cuda {
namespace {

using detail::BadArgument;
using detail::kDecodeMaxTokens;
using detail::kFullMask;
using detail::NullArgument;

constexpr int kAttnWarps = 4;
constexpr int kAttnThreads = 32 * kAttnWarps;
constexpr int kWarpRows = 16;
constexpr int kWarpPositions = 32;
constexpr int kMaxBlockRows = kAttnWarps * kWarpRows;  // also the most tokens in a tile
constexpr int kMaxGroup = kMaxBlockRows;               // n_head / n_head_kv
// Splits are multiples of this many positions (a multiple of every tile's positions, 32 to 128).
constexpr int kSplitGranule = 128;
// Enough (token, head, split) work items to fill the GPU several times over.
constexpr int64_t kTargetHeadSplits = 2048;
constexpr int kMaxSplits = 1024;
constexpr int kMergeWarps = 4;

struct SplitPlan {
  int n_splits;
  int split_len;
};

// Splits wanted for these sizes before rounding the split length (at least the final count, and
// non-decreasing in max_positions). Depends only on what AttentionWorkspaceBytes is given.
int64_t WantedSplits(int n_tokens, int n_head, int max_positions) {
  const int64_t heads = std::max<int64_t>(1, static_cast<int64_t>(n_tokens) * n_head);
  const int64_t wanted = (kTargetHeadSplits + heads - 1) / heads;
  const int64_t most = (static_cast<int64_t>(max_positions) + kSplitGranule - 1) / kSplitGranule;
  return std::clamp<int64_t>(std::min(wanted, most), 1, kMaxSplits);
}

SplitPlan PlanSplits(int n_tokens, int n_head, int max_positions) {
  const int64_t n = WantedSplits(n_tokens, n_head, max_positions);
  int64_t len = (max_positions + n - 1) / n;
  len = (len + kSplitGranule - 1) / kSplitGranule * kSplitGranule;
  return SplitPlan{static_cast<int>((max_positions + len - 1) / len), static_cast<int>(len)};
}

// Workspace of one call: partial (m, l, O) of every (split, token, head).
size_t SplitBytes(int64_t n_splits, int n_tokens, int n_head, int head_dim) {
  if (n_splits <= 1) return 0;
  return static_cast<size_t>(n_splits) * n_tokens * n_head * (head_dim + 2) * sizeof(float);
}

struct AttnParams {
  const float* q;
  const TokenSlot* slots;
  float* out;
  float* part_o;  // [split][n_tokens * n_head][D], with n_splits > 1
  float* part_m;  // [split][n_tokens * n_head]
  float* part_l;
  KvPlace place;
  int n_tokens;
  int n_head;
  int n_head_kv;
  int group;        // query heads per kv head
  int tile_tokens;  // tokens per block
  int block_rows;   // tile_tokens * group
  int row_warps;    // warps that split the rows (1, 2 or 4)
  int pos_warps;    // 4 / row_warps: warps that split each K/V tile's positions
  int split_len;
  int n_splits;
  float scale;
  const float* sinks;  // AttentionSinkWindow
  int window;
};

__device__ __forceinline__ void CopyAsync16(float* shared, const float* global, bool valid) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(shared));
  const int src_bytes = valid ? 16 : 0;  // 0: fill the 16 bytes with zeros, read nothing
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(global), "r"(src_bytes) : "memory");
}

__device__ __forceinline__ void CopyAsyncWaitAll() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

__device__ __forceinline__ void Fma4(float4& acc, float p, const float4& v) {
  acc.x = fmaf(p, v.x, acc.x);
  acc.y = fmaf(p, v.y, acc.y);
  acc.z = fmaf(p, v.z, acc.z);
  acc.w = fmaf(p, v.w, acc.w);
}

__device__ __forceinline__ void Scale4(float4& acc, float f) {
  acc.x *= f;
  acc.y *= f;
  acc.z *= f;
  acc.w *= f;
}

// Grid: (tiles, n_head_kv, n_splits). Dynamic shared memory: q tile [row_warps*16][D+4], K tile
// [pos_warps*32][D+4], V tile [pos_warps*32][D] (rows of q and K padded so column reads hit distinct banks).
// Three blocks an SM, as many as D = 128's shared memory allows (unbounded, the registers would allow two).
template <int D>
__global__ void __launch_bounds__(kAttnThreads, 3) AttentionKernel(const AttnParams p) {
  WaitForPriorKernels();
  constexpr int kStride = D + 4;
  constexpr int kChunks = D / 32;  // float4s of O per lane and row
  extern __shared__ float4 shared_raw[];
  float* const smem = reinterpret_cast<float*>(shared_raw);
  __shared__ const float* s_keys[kMaxBlockRows];  // the tile tokens' caches at (layer, position 0, kv head)
  __shared__ const float* s_values[kMaxBlockRows];
  __shared__ int s_pos[kMaxBlockRows];
  __shared__ int s_ring[kMaxBlockRows];  // the caches' ring lengths (KvPlace)

  const int kv_head = blockIdx.y, split = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row_warp = warp / p.pos_warps, pos_warp = warp % p.pos_warps;
  const int rg = lane / 8, pg = lane % 8;
  const int token0 = blockIdx.x * p.tile_tokens;
  const int tile_tokens = min(p.tile_tokens, p.n_tokens - token0);
  const int tile_positions = p.pos_warps * kWarpPositions;
  const int q_rows = p.row_warps * kWarpRows;
  const int64_t kv_dim = static_cast<int64_t>(p.n_head_kv) * D;

  float* const s_q = smem;
  float* const s_k = s_q + q_rows * kStride;
  float* const s_v = s_k + tile_positions * kStride;

  for (int i = threadIdx.x; i < tile_tokens; i += kAttnThreads) {
    const TokenSlot slot = p.slots[token0 + i];
    const int64_t offset = detail::LayerFirstSlot(slot, p.place) * kv_dim + static_cast<int64_t>(kv_head) * D;
    s_keys[i] = slot.keys + offset;
    s_values[i] = slot.values + offset;
    s_pos[i] = slot.pos;
    s_ring[i] = static_cast<int>(slot.ring_slots);
  }
  // Row r of the tile is token r / group, head kv_head * group + r % group; rows past the tile are zero.
  for (int i = threadIdx.x; i < q_rows * (D / 4); i += kAttnThreads) {
    const int r = i / (D / 4), d4 = i % (D / 4);
    const int tt = r / p.group;
    float4 value = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (r < p.block_rows && tt < tile_tokens) {
      const int64_t head = static_cast<int64_t>(kv_head) * p.group + r % p.group;
      value =
          __ldg(reinterpret_cast<const float4*>(p.q + (static_cast<int64_t>(token0 + tt) * p.n_head + head) * D) + d4);
    }
    *reinterpret_cast<float4*>(s_q + r * kStride + 4 * d4) = value;
  }
  __syncthreads();

  int row_local[4];  // this lane's rows in the tile
  float m[4], l[4];
  float4 o[4][kChunks];
#pragma unroll
  for (int a = 0; a < 4; ++a) {
    row_local[a] = row_warp * kWarpRows + rg + 4 * a;
    m[a] = -INFINITY;
    l[a] = 0.0f;
#pragma unroll
    for (int c = 0; c < kChunks; ++c) o[a][c] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }

  const int split_begin = split * p.split_len;
  // One pass per distinct cache among the tile's tokens (every thread computes the same groups).
  uint64_t done = tile_tokens == 64 ? 0 : ~0ull << tile_tokens;
  while (done != ~0ull) {
    const int leader = __ffsll(static_cast<long long>(~done)) - 1;
    const float* const keys = s_keys[leader];
    const float* const values = s_values[leader];
    const int ring = p.place.windowed ? s_ring[leader] : 0;  // the members share the leader's cache
    uint64_t members = 0;
    int max_pos = -1;
    int min_first = INT_MAX;  // the earliest position any member attends to
    for (int i = leader; i < tile_tokens; ++i) {
      if (((done >> i) & 1) == 0 && s_keys[i] == keys && s_values[i] == values) {
        members |= 1ull << i;
        max_pos = max(max_pos, s_pos[i]);
        min_first = min(min_first, p.window > 0 ? max(0, s_pos[i] - p.window + 1) : 0);
      }
    }
    done |= members;
    int row_pos[4];    // the row's position if its token is in this pass, else -1 (every position masked)
    int row_first[4];  // the row's first position (its sliding window's start, or 0)
#pragma unroll
    for (int a = 0; a < 4; ++a) {
      const int r = row_local[a], tt = r / p.group;
      row_pos[a] = r < p.block_rows && tt < tile_tokens && ((members >> tt) & 1) ? s_pos[tt] : -1;
      row_first[a] = p.window > 0 ? row_pos[a] - p.window + 1 : 0;
    }
    const int end = min(split_begin + p.split_len, max_pos + 1);

    for (int start = max(split_begin, min_first); start < end; start += tile_positions) {
      for (int i = threadIdx.x; i < tile_positions * (D / 4); i += kAttnThreads) {
        const int pp = i / (D / 4), d4 = i % (D / 4);
        const bool valid = start + pp < end;
        const int position = ring > 0 ? (start + pp) % ring : start + pp;
        const int64_t offset = valid ? static_cast<int64_t>(position) * kv_dim + 4 * d4 : 0;
        CopyAsync16(s_k + pp * kStride + 4 * d4, keys + offset, valid);
        CopyAsync16(s_v + pp * D + 4 * d4, values + offset, valid);
      }
      CopyAsyncWaitAll();
      __syncthreads();

      // Scores of rows rg + 4a and positions pg + 8b of this warp's slice.
      const float* const q_base = s_q + (row_warp * kWarpRows + rg) * kStride;
      const float* const k_base = s_k + (pos_warp * kWarpPositions + pg) * kStride;
      float s[4][4];
#pragma unroll
      for (int a = 0; a < 4; ++a) {
#pragma unroll
        for (int b = 0; b < 4; ++b) s[a][b] = 0.0f;
      }
      // Loops over d and j are unrolled only in part: fully unrolled, the kernel's code outgrew the
      // instruction cache and its warps stalled on instruction fetch.
#pragma unroll 4
      for (int d = 0; d < D; d += 4) {
        float4 qa[4], kb[4];
#pragma unroll
        for (int a = 0; a < 4; ++a) qa[a] = *reinterpret_cast<const float4*>(q_base + 4 * a * kStride + d);
#pragma unroll
        for (int b = 0; b < 4; ++b) kb[b] = *reinterpret_cast<const float4*>(k_base + 8 * b * kStride + d);
#pragma unroll
        for (int a = 0; a < 4; ++a) {
#pragma unroll
          for (int b = 0; b < 4; ++b) {
            s[a][b] = fmaf(qa[a].x, kb[b].x, s[a][b]);
            s[a][b] = fmaf(qa[a].y, kb[b].y, s[a][b]);
            s[a][b] = fmaf(qa[a].z, kb[b].z, s[a][b]);
            s[a][b] = fmaf(qa[a].w, kb[b].w, s[a][b]);
          }
        }
      }

      // Online softmax; s becomes exp(s - m). The 8 lanes of a row group share rows.
      const int pos0 = start + pos_warp * kWarpPositions + pg;
#pragma unroll
      for (int a = 0; a < 4; ++a) {
        float tile_max = -INFINITY;
#pragma unroll
        for (int b = 0; b < 4; ++b) {
          const int pos = pos0 + 8 * b;
          s[a][b] = pos < end && pos <= row_pos[a] && pos >= row_first[a] ? s[a][b] * p.scale : -INFINITY;
          tile_max = fmaxf(tile_max, s[a][b]);
        }
        tile_max = fmaxf(tile_max, __shfl_xor_sync(kFullMask, tile_max, 1));
        tile_max = fmaxf(tile_max, __shfl_xor_sync(kFullMask, tile_max, 2));
        tile_max = fmaxf(tile_max, __shfl_xor_sync(kFullMask, tile_max, 4));
        const float m_new = fmaxf(m[a], tile_max);
        if (m_new == -INFINITY) {  // nothing seen yet for this row
#pragma unroll
          for (int b = 0; b < 4; ++b) s[a][b] = 0.0f;
          continue;
        }
        const float alpha = expf(m[a] - m_new);  // 0 for the first positions, 1 when the max holds
        float sum = 0.0f;
#pragma unroll
        for (int b = 0; b < 4; ++b) {
          s[a][b] = expf(s[a][b] - m_new);
          sum += s[a][b];
        }
        l[a] = l[a] * alpha + sum;
#pragma unroll
        for (int c = 0; c < kChunks; ++c) Scale4(o[a][c], alpha);
        m[a] = m_new;
      }

      // O += P V over the warp's 32 positions; position j's weights come from lane (rg, j % 8).
      const float* const v_base = s_v + pos_warp * kWarpPositions * D + 4 * pg;
#pragma unroll
      for (int jb = 0; jb < kWarpPositions / 8; ++jb) {  // s[a][jb]: registers, so jb is unrolled
#pragma unroll 1
        for (int jj = 0; jj < 8; ++jj) {
          const int j = 8 * jb + jj;
          float pj[4];
#pragma unroll
          for (int a = 0; a < 4; ++a) pj[a] = __shfl_sync(kFullMask, s[a][jb], (lane & ~7) | jj);
#pragma unroll
          for (int c = 0; c < kChunks; ++c) {
            const float4 v = *reinterpret_cast<const float4*>(v_base + j * D + 32 * c);
#pragma unroll
            for (int a = 0; a < 4; ++a) Fma4(o[a][c], pj[a], v);
          }
        }
      }
      __syncthreads();  // before the next tile overwrites K and V
    }
  }

  // Merge the warps that split positions, through shared memory (the K/V area, >= 64 * D + 128 floats).
#pragma unroll
  for (int a = 0; a < 4; ++a) {
    l[a] += __shfl_xor_sync(kFullMask, l[a], 1);
    l[a] += __shfl_xor_sync(kFullMask, l[a], 2);
    l[a] += __shfl_xor_sync(kFullMask, l[a], 4);
  }
  __syncthreads();
  float* const s_o = s_k;                                // [warp][16][D]
  float* const s_ml = s_o + kAttnWarps * kWarpRows * D;  // [warp][16][2]: m, l
#pragma unroll
  for (int a = 0; a < 4; ++a) {
    const int r = warp * kWarpRows + rg + 4 * a;
#pragma unroll
    for (int c = 0; c < kChunks; ++c) *reinterpret_cast<float4*>(s_o + r * D + 4 * pg + 32 * c) = o[a][c];
    if (pg == 0) {
      s_ml[2 * r] = m[a];
      s_ml[2 * r + 1] = l[a];
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < p.block_rows * D; i += kAttnThreads) {
    const int r = i / D, d = i % D;
    const int tt = r / p.group;
    if (tt >= tile_tokens) continue;
    const int first_warp = (r / kWarpRows) * p.pos_warps, rl = r % kWarpRows;
    float max_m = -INFINITY;
    for (int pw = 0; pw < p.pos_warps; ++pw) max_m = fmaxf(max_m, s_ml[2 * ((first_warp + pw) * kWarpRows + rl)]);
    float sum_l = 0.0f, sum_o = 0.0f;
    if (max_m != -INFINITY) {
      for (int pw = 0; pw < p.pos_warps; ++pw) {
        const int wr = (first_warp + pw) * kWarpRows + rl;
        const float f = expf(s_ml[2 * wr] - max_m);
        sum_l += s_ml[2 * wr + 1] * f;
        sum_o += s_o[wr * D + d] * f;
      }
    }
    const int64_t row =
        static_cast<int64_t>(token0 + tt) * p.n_head + static_cast<int64_t>(kv_head) * p.group + r % p.group;
    if (p.n_splits == 1) {
      // sum_l >= 1: the row's own position is in this (only) split.
      p.out[row * D + d] =
          p.sinks == nullptr ? sum_o / sum_l : detail::DivideWithSink(sum_o, max_m, sum_l, p.sinks[row % p.n_head]);
    } else {
      const int64_t part = static_cast<int64_t>(split) * p.n_tokens * p.n_head + row;
      p.part_o[part * D + d] = sum_o;
      if (d == 0) {
        p.part_m[part] = max_m;
        p.part_l[part] = sum_l;
      }
    }
  }
}

// A warp per (token, head) row: out = sum_s O_s exp(m_s - M) / sum_s l_s exp(m_s - M).
template <int D>
__global__ void __launch_bounds__(32 * kMergeWarps)
    AttentionMergeKernel(const float* part_o, const float* part_m, const float* part_l, int n_splits, int64_t n_rows,
                         const float* sinks, int n_head, float* out) {
  WaitForPriorKernels();
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kMergeWarps + threadIdx.x / 32;
  if (row >= n_rows) return;
  const int lane = threadIdx.x % 32;
  float max_m = -INFINITY;
  for (int s = 0; s < n_splits; ++s) max_m = fmaxf(max_m, part_m[s * n_rows + row]);
  float sum_l = 0.0f;
  float acc[D / 32];
#pragma unroll
  for (int c = 0; c < D / 32; ++c) acc[c] = 0.0f;
  for (int s = 0; s < n_splits; ++s) {
    const float m_s = part_m[s * n_rows + row];
    if (m_s == -INFINITY) continue;  // a split past this token's position
    const float f = expf(m_s - max_m);
    sum_l += part_l[s * n_rows + row] * f;
    const float* o_s = part_o + (s * n_rows + row) * D;
#pragma unroll
    for (int c = 0; c < D / 32; ++c) acc[c] += o_s[lane + 32 * c] * f;
  }
  if (sinks != nullptr) {
    const float sink = sinks[row % n_head];
#pragma unroll
    for (int c = 0; c < D / 32; ++c) out[row * D + lane + 32 * c] = detail::DivideWithSink(acc[c], max_m, sum_l, sink);
    return;
  }
#pragma unroll
  for (int c = 0; c < D / 32; ++c) out[row * D + lane + 32 * c] = acc[c] / sum_l;
}

// Dynamic shared memory of AttentionKernel<D> with row_warps warps splitting the rows.
constexpr size_t AttentionSharedBytes(int d, int row_warps) {
  const int pos_warps = kAttnWarps / row_warps;
  return (static_cast<size_t>(row_warps) * kWarpRows * (d + 4) +
          static_cast<size_t>(pos_warps) * kWarpPositions * (2 * d + 4)) *
         sizeof(float);
}

template <int D>
absl::Status LaunchAttention(const AttnParams& p, int tiles, cudaStream_t stream) {
  // Above 48 KiB a kernel must opt in. The attribute is set once per process (a host-side setting that
  // enqueues nothing), to the most any row split needs, so later calls, and graph captures, skip it.
  static const cudaError_t opt_in = cudaFuncSetAttribute(
      AttentionKernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
      static_cast<int>(std::max({AttentionSharedBytes(D, 1), AttentionSharedBytes(D, 2), AttentionSharedBytes(D, 4)})));
  CUDA_RETURN_IF_ERROR(opt_in, "cudaFuncSetAttribute(AttentionKernel)");
  const size_t smem_bytes = AttentionSharedBytes(D, p.row_warps);
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(p.n_head_kv), static_cast<unsigned>(p.n_splits));
  const absl::Status launched =
      LaunchKernel("AttentionKernel", AttentionKernel<D>, grid, kAttnThreads, smem_bytes, stream, p);
  if (!launched.ok()) return launched;

  if (p.n_splits == 1) return absl::OkStatus();
  const int64_t n_rows = static_cast<int64_t>(p.n_tokens) * p.n_head;
  const unsigned blocks = static_cast<unsigned>((n_rows + kMergeWarps - 1) / kMergeWarps);
  return LaunchKernel("AttentionMergeKernel", AttentionMergeKernel<D>, blocks, 32 * kMergeWarps, 0, stream, p.part_o,
                      p.part_m, p.part_l, p.n_splits, n_rows, p.sinks, p.n_head, p.out);
}

}  // namespace

namespace {

// The decode kernel's counters lead the workspace, sized for the largest decode batch so that the parts
// of no call ever overlap them.
size_t CounterBytes(int n_head_kv) {
  const size_t bytes = static_cast<size_t>(kDecodeMaxTokens) * n_head_kv * sizeof(unsigned);
  return (bytes + 255) / 256 * 256;
}

// Splits of a call: the decode kernel's or the tiled kernel's.
int64_t CallSplits(int n_tokens, int n_head, int n_head_kv, int max_positions) {
  if (detail::UseDecodeAttention(n_tokens, n_head / n_head_kv)) {
    return detail::PlanDecodeSplits(n_tokens, n_head_kv, max_positions).n_splits;
  }
  return WantedSplits(n_tokens, n_head, max_positions);
}

}  // namespace

size_t AttentionWorkspaceBytes(int n_tokens, int n_head, int n_head_kv, int head_dim, int max_positions) {
  if (n_tokens <= 0 || n_head <= 0 || n_head_kv <= 0 || head_dim <= 0 || max_positions <= 0) return 0;
  // Fewer tokens may split into more pieces: the largest need over every smaller batch.
  size_t bytes = 0;
  for (int n = 1; n <= n_tokens; ++n) {
    bytes = std::max(bytes, SplitBytes(CallSplits(n, n_head, n_head_kv, max_positions), n, n_head, head_dim));
  }
  return CounterBytes(n_head_kv) + bytes;
}

namespace {

// Attention, or with `fused` the decode kernel fused with QkNormRopeStore (QkNormRopeAttention, which
// has checked that the decode kernel serves the batch). Errors name kFn.
absl::Status Attend(absl::string_view kFn, const float* q, const TokenSlot* slots, int n_tokens, const KvPlace& place,
                    int n_head, int n_head_kv, int head_dim, float scale, const AttentionSinkWindow& sink_window,
                    int max_positions, float* out, void* workspace, size_t workspace_bytes,
                    const detail::FusedQkRope& fused, cudaStream_t stream) {
  if (n_tokens < 0 || n_tokens > 65535) return BadArgument(kFn, "n_tokens", n_tokens, "it must be in [0, 65535]");
  if (n_head_kv < 1 || n_head_kv > 65535) return BadArgument(kFn, "n_head_kv", n_head_kv, "it must be in [1, 65535]");
  if (n_head < n_head_kv || n_head % n_head_kv != 0) {
    return BadArgument(kFn, "n_head", n_head, absl::StrCat("it must be a multiple of n_head_kv (", n_head_kv, ")"));
  }
  if (n_head / n_head_kv > kMaxGroup) {
    return BadArgument(kFn, "n_head / n_head_kv", n_head / n_head_kv, "it must be <= 64");
  }
  if (head_dim != 32 && head_dim != 64 && head_dim != 128) {
    return BadArgument(kFn, "head_dim", head_dim, "it must be 32, 64 or 128");
  }
  if (max_positions < 1) return BadArgument(kFn, "max_positions", max_positions, "it must be >= 1");
  if (place.full_before < 0) return BadArgument(kFn, "place.full_before", place.full_before, "it must be >= 0");
  if (place.windowed_before < 0) {
    return BadArgument(kFn, "place.windowed_before", place.windowed_before, "it must be >= 0");
  }
  if (q == nullptr) return NullArgument(kFn, "q");
  if (!detail::Aligned16(q)) return detail::Misaligned(kFn, "q", q);
  if (slots == nullptr) return NullArgument(kFn, "slots");
  if (out == nullptr) return NullArgument(kFn, "out");
  if (sink_window.window < 0) {
    return BadArgument(kFn, "sink_window.window", sink_window.window, "it must be >= 0 (0: no window)");
  }
  const int group = n_head / n_head_kv;
  const bool decode = detail::UseDecodeAttention(n_tokens, group);
  const detail::DecodeSplitPlan decode_plan = detail::PlanDecodeSplits(n_tokens, n_head_kv, max_positions);
  const SplitPlan plan = decode ? SplitPlan{decode_plan.n_splits, decode_plan.split_len}
                                : PlanSplits(n_tokens, n_head, max_positions);
  const size_t needed = CounterBytes(n_head_kv) + SplitBytes(plan.n_splits, n_tokens, n_head, head_dim);
  if (workspace_bytes < needed) {
    return BadArgument(kFn, "workspace_bytes", static_cast<int64_t>(workspace_bytes),
                       absl::StrCat("these sizes need ", needed));
  }
  if (workspace == nullptr) return NullArgument(kFn, "workspace");
  if (!detail::Aligned16(workspace)) return detail::Misaligned(kFn, "workspace", workspace);
  if (n_tokens == 0) return absl::OkStatus();

  const size_t rows = static_cast<size_t>(n_tokens) * n_head;
  float* const part_o = reinterpret_cast<float*>(static_cast<char*>(workspace) + CounterBytes(n_head_kv));
  float* const part_m = part_o + static_cast<size_t>(plan.n_splits) * rows * head_dim;
  float* const part_l = part_m + static_cast<size_t>(plan.n_splits) * rows;
  if (decode) {
    const detail::DecodeAttentionArgs args{q,          slots,     out,     part_o, part_m, part_l,
                                           static_cast<unsigned*>(workspace), place, n_tokens, n_head,
                                           n_head_kv, group,    plan.split_len, plan.n_splits, scale,
                                           sink_window.sinks, sink_window.window, fused};
    return detail::LaunchDecodeAttention(args, head_dim, stream);
  }

  AttnParams p{};
  p.q = q;
  p.slots = slots;
  p.out = out;
  p.place = place;
  p.n_tokens = n_tokens;
  p.n_head = n_head;
  p.n_head_kv = n_head_kv;
  p.group = group;
  p.tile_tokens = n_tokens <= kDecodeMaxTokens ? 1 : std::max(1, kMaxBlockRows / p.group);
  p.block_rows = p.tile_tokens * p.group;
  p.row_warps = p.block_rows <= kWarpRows ? 1 : (p.block_rows <= 2 * kWarpRows ? 2 : 4);
  p.pos_warps = kAttnWarps / p.row_warps;
  p.split_len = plan.split_len;
  p.n_splits = plan.n_splits;
  p.scale = scale;
  p.sinks = sink_window.sinks;
  p.window = sink_window.window;
  p.part_o = part_o;
  p.part_m = part_m;
  p.part_l = part_l;
  const int tiles = (n_tokens + p.tile_tokens - 1) / p.tile_tokens;
  switch (head_dim) {
    case 32:
      return LaunchAttention<32>(p, tiles, stream);
    case 64:
      return LaunchAttention<64>(p, tiles, stream);
    default:
      return LaunchAttention<128>(p, tiles, stream);
  }
}

}  // namespace

absl::Status Attention(const float* q, const TokenSlot* slots, int n_tokens, const KvPlace& place, int n_head,
                       int n_head_kv, int head_dim, float scale, const AttentionSinkWindow& sink_window,
                       int max_positions, float* out, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  return Attend("Attention", q, slots, n_tokens, place, n_head, n_head_kv, head_dim, scale, sink_window,
                max_positions, out, workspace, workspace_bytes, detail::FusedQkRope{}, stream);
}

absl::Status QkNormRopeAttention(const QkRopeInputs& rope, bool one_token_each, const TokenSlot* slots, int n_tokens,
                                 const KvPlace& place, int n_head, int n_head_kv, int head_dim, float scale,
                                 const AttentionSinkWindow& sink_window, int max_positions, float* out,
                                 void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  // The fused kernel reads a value row as float4s (D = 128) or float2s (D = 64).
  const bool fuse = one_token_each && n_head_kv > 0 && n_head % n_head_kv == 0 && detail::Aligned16(rope.v) &&
                    detail::UseDecodeAttention(n_tokens, n_head / n_head_kv);
  if (!fuse) {
    const absl::Status stored =
        QkNormRopeStore(rope.q, rope.k, rope.v, slots, n_tokens, place, n_head, n_head_kv, head_dim, rope.rope_dim,
                        rope.q_norm, rope.k_norm, rope.eps, rope.freq, rope.rope_magnitude, rope.rope_style, stream);
    if (!stored.ok()) return stored;
    return Attention(rope.q, slots, n_tokens, place, n_head, n_head_kv, head_dim, scale, sink_window, max_positions,
                     out, workspace, workspace_bytes, stream);
  }
  constexpr absl::string_view kFn = "QkNormRopeAttention";
  const absl::Status checked =
      detail::CheckQkNormRope(kFn, rope, slots, n_tokens, place, n_head, n_head_kv, head_dim);
  if (!checked.ok()) return checked;
  const detail::FusedQkRope fused{rope.k, rope.v, detail::ParamsOf(rope)};
  return Attend(kFn, rope.q, slots, n_tokens, place, n_head, n_head_kv, head_dim, scale, sink_window, max_positions,
                out, workspace, workspace_bytes, fused, stream);
}

}  // namespace strata::kernels::cuda
