// Multi-head latent attention's kernels (latent_attention.h). The norm and RoPE follow engine/model/ops.cc as
// norm_rope.cu does (sums of squares in double, cos and sin in double rounded to float, products rounded
// apart); the projections and the attention's sums are float sums in their own order, so they agree with the
// CPU to rounding, not to the bit.
//
// LatentAttention, a block per (token, 16 heads, split of the positions): the 16 heads' query rows and a tile
// of 16 cached positions sit in shared memory; all heads read the same cache, so a tile loaded once serves
// sixteen of them (see the kernel for the work's layout).

#include "kernels/cuda/latent_attention.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/dense_device.cuh"
#include "kernels/cuda/dependent_launch.cuh"

namespace strata::kernels::cuda {
namespace {

using detail::BadArgument;
using detail::NullArgument;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxRank = 1024;  // LatentAttentionKernel keeps two 512-rank blocks of sums
constexpr int kMaxRopeDim = 256;
constexpr int kMaxTokens = 65535;

// --------------------------------------------------------------------------------------------------------
// LatentRopeStore: a warp a q head, and one more for the token's cache position.

constexpr int kRopeWarps = 4;

// dst's rotation pairs from src's (dst may be src): pairs i of NORMAL (2i, 2i + 1) or NEOX (i, i + half).
__device__ __forceinline__ void RotatePairs(float* dst, const float* src, int rope_dim, int pos, const double* freq,
                                            float magnitude, int neox) {
  const int half = rope_dim / 2;
  for (int i = threadIdx.x % 32; i < half; i += 32) {
    const int ia = neox ? i : 2 * i;
    const int ib = neox ? i + half : 2 * i + 1;
    const float a = src[ia], b = src[ib];
    double sin_d, cos_d;
    sincos(static_cast<double>(pos) * freq[i], &sin_d, &cos_d);
    const float c = __fmul_rn(static_cast<float>(cos_d), magnitude);
    const float s = __fmul_rn(static_cast<float>(sin_d), magnitude);
    dst[ia] = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
    dst[ib] = __fadd_rn(__fmul_rn(a, s), __fmul_rn(b, c));
  }
}

__global__ void __launch_bounds__(32 * kRopeWarps)
    LatentRopeStoreKernel(float* q, const float* kv, const TokenSlot* slots, int64_t layer, LatentShape shape,
                          const float* kv_norm, float eps, const double* freq, float magnitude, int neox) {
  WaitForPriorKernels();
  const int64_t t = blockIdx.y;
  const int head = blockIdx.x * kRopeWarps + threadIdx.x / 32;
  if (head > shape.n_head) return;
  const TokenSlot slot = slots[t];
  if (head < shape.n_head) {
    float* q_pe = q + (t * shape.n_head + head) * (shape.nope_dim + shape.rope_dim) + shape.nope_dim;
    RotatePairs(q_pe, q_pe, shape.rope_dim, slot.pos, freq, magnitude, neox);
    return;
  }
  const int64_t key_dim = (shape.rank + shape.rope_dim);
  const float* src = kv + t * key_dim;
  float* dst = slot.keys + (layer * slot.capacity + slot.pos) * key_dim;
  double squares = 0;
  for (int i = threadIdx.x % 32; i < shape.rank; i += 32) squares += static_cast<double>(src[i]) * src[i];
  const float scale = detail::RmsScale(detail::WarpSumDouble(squares), shape.rank, eps);
  for (int i = threadIdx.x % 32; i < shape.rank; i += 32) dst[i] = __fmul_rn(__fmul_rn(src[i], scale), kv_norm[i]);
  RotatePairs(dst + shape.rank, src + shape.rank, shape.rope_dim, slot.pos, freq, magnitude, neox);
}

// --------------------------------------------------------------------------------------------------------
// LatentQueryAbsorb: block (head, 8 tokens). Thread (chunk c, group g) sums W_UK rows d = g, g + groups, ...
// of columns [8c, 8c + 8) for the block's tokens; the groups' sums are then added in group order.

constexpr int kAbsorbTokens = 8;

template <DenseType kType>
__global__ void __launch_bounds__(kThreads)
    LatentQueryAbsorbKernel(const uint8_t* kv_b, int64_t row_bytes, const float* q, int n_tokens, LatentShape shape,
                            float* q_latent) {
  WaitForPriorKernels();
  extern __shared__ float4 absorb_shared[];
  const int head = blockIdx.x;
  const int t0 = blockIdx.y * kAbsorbTokens;
  const int tokens = min(kAbsorbTokens, n_tokens - t0);
  const int nope = shape.nope_dim, rope = shape.rope_dim, rank = shape.rank;
  const int64_t head_width = nope + rope, key_dim = (shape.rank + shape.rope_dim);
  float* s_q = reinterpret_cast<float*>(absorb_shared);  // [kAbsorbTokens][nope]
  float* s_sum = s_q + kAbsorbTokens * nope;             // [groups][rank]
  for (int i = threadIdx.x; i < tokens * nope; i += kThreads) {
    const int tt = i / nope, d = i % nope;
    s_q[i] = q[((t0 + tt) * int64_t{shape.n_head} + head) * head_width + d];
  }
  for (int i = threadIdx.x; i < tokens * rope; i += kThreads) {
    const int tt = i / rope, d = i % rope;
    const int64_t row = (t0 + tt) * int64_t{shape.n_head} + head;
    q_latent[row * key_dim + rank + d] = q[row * head_width + nope + d];
  }
  __syncthreads();
  const int chunks = rank / 8, groups = kThreads / chunks;
  const int chunk = threadIdx.x % chunks, group = threadIdx.x / chunks;
  float acc[kAbsorbTokens][8] = {};
  if (group < groups) {
    const uint8_t* rows = kv_b + static_cast<int64_t>(head) * (nope + shape.v_dim) * row_bytes;
#pragma unroll 8  // the loads of eight rows in flight at once
    for (int d = group; d < nope; d += groups) {
      float w[8];
      detail::WidenChunkExact<kType>(detail::LoadChunk<kType>(rows + d * row_bytes, chunk), w);
#pragma unroll
      for (int tt = 0; tt < kAbsorbTokens; ++tt) {
        if (tt >= tokens) break;
        const float qd = s_q[tt * nope + d];
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[tt][j] = fmaf(w[j], qd, acc[tt][j]);
      }
    }
  }
#pragma unroll
  for (int tt = 0; tt < kAbsorbTokens; ++tt) {
    if (tt >= tokens) break;  // the same for the whole block
    if (group < groups) {
#pragma unroll
      for (int j = 0; j < 8; ++j) s_sum[group * rank + 8 * chunk + j] = acc[tt][j];
    }
    __syncthreads();
    const int64_t row = (t0 + tt) * int64_t{shape.n_head} + head;
    for (int r = threadIdx.x; r < rank; r += kThreads) {
      float total = 0.0f;
      for (int g = 0; g < groups; ++g) total += s_sum[g * rank + r];
      q_latent[row * key_dim + r] = total;
    }
    __syncthreads();
  }
}

size_t AbsorbSharedBytes(const LatentShape& s) {
  return (static_cast<size_t>(kAbsorbTokens) * s.nope_dim + static_cast<size_t>(kThreads / (s.rank / 8)) * s.rank) *
         sizeof(float);
}

// --------------------------------------------------------------------------------------------------------
// LatentAttention. A block holds 16 query rows (16 heads of one token) and a tile of 16 cached positions in
// shared memory, rows padded to RowStride floats (4 mod 8, so rows four apart fall in the other half of the
// banks). Scores, a 16 x 16 product over the key width: each half-warp owns a 4 x 4 tile of them, its 16
// lanes taking every 16th column and meeting in a butterfly (lane s ends with score s of the tile). The
// online softmax is a half-warp a row. The latent sums: thread (row quad, chunk) keeps 4 rows x 8 ranks
// (ranks 4c.. and 256 + 4c.. of each 512) in registers; each position's probabilities and values come as float4s.

constexpr int kRows = 16;
constexpr int kTile = 16;
constexpr int kSlices = 16;                 // lanes that share a score's dot product
constexpr int kTargetBlocks = 512;          // fewer (token, row block) pairs than this split their positions
constexpr int kMinSplitPositions = 4 * kTile;  // but no split takes fewer positions than this
constexpr int kMaxSplits = 128;

__host__ __device__ __forceinline__ int RowStride(int width) { return (width + 7) / 8 * 8 + 4; }

int RowBlocks(const LatentShape& s) { return (s.n_head + kRows - 1) / kRows; }

// Splits of the positions for a step (before rounding the split's length to whole tiles).
int SplitBound(int n_tokens, const LatentShape& s, int max_positions) {
  const int64_t blocks = int64_t{n_tokens} * RowBlocks(s);
  int64_t splits = blocks >= kTargetBlocks ? 1 : (kTargetBlocks + blocks - 1) / blocks;
  splits = std::min<int64_t>({splits, std::max(1, max_positions / kMinSplitPositions), kMaxSplits});
  return static_cast<int>(splits);
}

struct PositionSplit {
  int splits;
  int positions;  // a split's positions, a multiple of kTile
};

PositionSplit SplitPositions(int n_tokens, const LatentShape& s, int max_positions) {
  const int bound = SplitBound(n_tokens, s, max_positions);
  const int per_split = (max_positions + bound - 1) / bound;
  const int positions = (per_split + kTile - 1) / kTile * kTile;
  return {(max_positions + positions - 1) / positions, positions};
}

size_t AttentionSharedBytes(const LatentShape& s) {
  return (static_cast<size_t>(kRows + kTile) * RowStride(s.key_dim()) + kTile * kRows + 3 * kRows) * sizeof(float);
}

// One step of SumOverSlices: lanes keep v[0, kHalf) or v[kHalf, 2 kHalf) by their kHalf bit (into v[0, kHalf))
// and add what the lane kHalf away sends of the other half.
template <int kHalf>
__device__ __forceinline__ void KeepHalf(float (&v)[16], int slice) {
  const bool upper = (slice & kHalf) != 0;
#pragma unroll
  for (int i = 0; i < kHalf; ++i) {
    const float send = upper ? v[i] : v[i + kHalf];
    const float keep = upper ? v[i + kHalf] : v[i];
    v[i] = keep + __shfl_xor_sync(detail::kFullMask, send, kHalf);
  }
}

// The 16 values of `v` summed over the 16 lanes of a half-warp (slice = lane % 16): lane s returns the total of
// v[s] (8 + 4 + 2 + 1 shuffles).
__device__ __forceinline__ float SumOverSlices(float (&v)[16], int slice) {
  KeepHalf<8>(v, slice);
  KeepHalf<4>(v, slice);
  KeepHalf<2>(v, slice);
  KeepHalf<1>(v, slice);
  return v[0];
}

__device__ __forceinline__ void Fma4(float (&acc)[4], float p, const float4& v) {
  acc[0] = fmaf(p, v.x, acc[0]);
  acc[1] = fmaf(p, v.y, acc[1]);
  acc[2] = fmaf(p, v.z, acc[2]);
  acc[3] = fmaf(p, v.w, acc[3]);
}

// Block (token, row block, split) over positions [split * split_positions, +split_positions) up to the token's
// own; kRankBlocks 512-rank blocks of latent sums a thread keeps. With one split it writes `latent`; with
// several, unnormalised sums and (max, sum of exps) to the partials.
template <int kRankBlocks>
__global__ void __launch_bounds__(kThreads, kRankBlocks == 1 ? 3 : 2)
    LatentAttentionKernel(const float* q_latent, const TokenSlot* slots, int64_t layer, LatentShape shape, float scale,
                          int split_positions, int n_splits, float* latent, float* partial_sums, float* partial_stats) {
  WaitForPriorKernels();
  extern __shared__ float4 attention_shared[];
  const int t = blockIdx.x, h0 = blockIdx.y * kRows, split = blockIdx.z;
  const int heads = min(kRows, shape.n_head - h0);
  const int width = shape.rank + shape.rope_dim, width4 = width / 4, rank = shape.rank;
  const int stride = RowStride(width);
  const TokenSlot slot = slots[t];
  const int first = split * split_positions;
  const int end = min(first + split_positions, slot.pos + 1);

  float* s_q = reinterpret_cast<float*>(attention_shared);  // [kRows][stride]
  float* s_k = s_q + kRows * stride;                        // [kTile][stride]
  float* s_p = s_k + kTile * stride;                        // [kTile][kRows]: scores, then their exps
  float* s_max = s_p + kTile * kRows;
  float* s_sum = s_max + kRows;
  float* s_alpha = s_sum + kRows;

  const float4* q4 = reinterpret_cast<const float4*>(q_latent + (static_cast<int64_t>(t) * shape.n_head + h0) * width);
  for (int i = threadIdx.x; i < kRows * width4; i += kThreads) {
    const int r = i / width4, c = i % width4;
    *reinterpret_cast<float4*>(s_q + r * stride + 4 * c) = r < heads ? q4[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
  if (threadIdx.x < kRows) {
    s_max[threadIdx.x] = -INFINITY;
    s_sum[threadIdx.x] = 0.0f;
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int slice = lane % kSlices, score_tile = 2 * warp + lane / kSlices;
  const int score_rows = 4 * (score_tile / 4), score_positions = 4 * (score_tile % 4);
  const int quad = threadIdx.x / 64, chunk = threadIdx.x % 64;
  float acc[kRankBlocks][2][4][4] = {};  // [512 block][which float4][row of the quad][rank]

  const float4* keys4 = reinterpret_cast<const float4*>(slot.keys + layer * slot.capacity * width);
  for (int p0 = first; p0 < end; p0 += kTile) {
    const int tile = min(kTile, end - p0);
    __syncthreads();  // the last tile's readers are done
    for (int i = threadIdx.x; i < tile * width4; i += kThreads) {
      const int p = i / width4, c = i % width4;
      *reinterpret_cast<float4*>(s_k + p * stride + 4 * c) = keys4[static_cast<int64_t>(p0) * width4 + i];
    }
    __syncthreads();
    float dot[16] = {};  // [row of the score tile][position of it]
    for (int k = slice; k < width; k += kSlices) {
      float qv[4], kv[4];
#pragma unroll
      for (int a = 0; a < 4; ++a) qv[a] = s_q[(score_rows + a) * stride + k];
#pragma unroll
      for (int b = 0; b < 4; ++b) kv[b] = s_k[(score_positions + b) * stride + k];
#pragma unroll
      for (int a = 0; a < 4; ++a) {
#pragma unroll
        for (int b = 0; b < 4; ++b) dot[4 * a + b] = fmaf(qv[a], kv[b], dot[4 * a + b]);
      }
    }
    {
      const float total = SumOverSlices(dot, slice);
      const int p = score_positions + slice % 4;
      s_p[p * kRows + score_rows + slice / 4] = p < tile ? total * scale : -INFINITY;
    }
    __syncthreads();
    {  // half-warp h of warp w: row 2w + h, lane position lane % 16
      const int r = 2 * warp + lane / 16, p = lane % 16;
      const float score = s_p[p * kRows + r];
      float tile_max = score;
#pragma unroll
      for (int offset = 8; offset >= 1; offset /= 2) {
        tile_max = fmaxf(tile_max, __shfl_xor_sync(detail::kFullMask, tile_max, offset));
      }
      const float old_max = s_max[r], new_max = fmaxf(old_max, tile_max);
      const float e = p < tile ? expf(score - new_max) : 0.0f;
      float sum = e;
#pragma unroll
      for (int offset = 8; offset >= 1; offset /= 2) sum += __shfl_xor_sync(detail::kFullMask, sum, offset);
      s_p[p * kRows + r] = e;
      __syncwarp();
      if (p == 0) {
        const float alpha = old_max == -INFINITY ? 0.0f : expf(old_max - new_max);
        s_sum[r] = s_sum[r] * alpha + sum;
        s_max[r] = new_max;
        s_alpha[r] = alpha;
      }
    }
    __syncthreads();
    const float4 alpha = *reinterpret_cast<const float4*>(s_alpha + 4 * quad);
    const float alphas[4] = {alpha.x, alpha.y, alpha.z, alpha.w};
#pragma unroll
    for (int m = 0; m < kRankBlocks; ++m) {
#pragma unroll
      for (int g = 0; g < 2; ++g) {
#pragma unroll
        for (int a = 0; a < 4; ++a) {
#pragma unroll
          for (int j = 0; j < 4; ++j) acc[m][g][a][j] *= alphas[a];
        }
      }
    }
#pragma unroll 4
    for (int p = 0; p < tile; ++p) {
      const float4 prob = *reinterpret_cast<const float4*>(s_p + p * kRows + 4 * quad);
      const float probs[4] = {prob.x, prob.y, prob.z, prob.w};
#pragma unroll
      for (int m = 0; m < kRankBlocks; ++m) {
#pragma unroll
        for (int g = 0; g < 2; ++g) {
          const int r0 = 512 * m + 256 * g + 4 * chunk;
          if (r0 >= rank) continue;
          const float4 v = *reinterpret_cast<const float4*>(s_k + p * stride + r0);
#pragma unroll
          for (int a = 0; a < 4; ++a) Fma4(acc[m][g][a], probs[a], v);
        }
      }
    }
  }
  __syncthreads();
#pragma unroll
  for (int a = 0; a < 4; ++a) {
    const int r = 4 * quad + a;
    if (r >= heads) break;
    const int64_t row = static_cast<int64_t>(t) * shape.n_head + h0 + r;
    const float inv = n_splits == 1 ? 1.0f / s_sum[r] : 1.0f;
    float* out = n_splits == 1 ? latent + row * rank : partial_sums + (row * n_splits + split) * rank;
#pragma unroll
    for (int m = 0; m < kRankBlocks; ++m) {
#pragma unroll
      for (int g = 0; g < 2; ++g) {
        const int r0 = 512 * m + 256 * g + 4 * chunk;
        if (r0 >= rank) continue;
        *reinterpret_cast<float4*>(out + r0) = make_float4(acc[m][g][a][0] * inv, acc[m][g][a][1] * inv,
                                                           acc[m][g][a][2] * inv, acc[m][g][a][3] * inv);
      }
    }
  }
  if (n_splits > 1 && threadIdx.x < heads) {
    const int64_t row = static_cast<int64_t>(t) * shape.n_head + h0 + threadIdx.x;
    partial_stats[2 * (row * n_splits + split)] = s_max[threadIdx.x];
    partial_stats[2 * (row * n_splits + split) + 1] = s_sum[threadIdx.x];
  }
}

// Above 48 KiB a kernel must opt in: once per process for each instantiation (host-side, enqueues nothing), to the
// most any shape of it asks (rank 512 * kRankBlocks, rope 256), so that graph captures skip it.
template <int kRankBlocks>
cudaError_t RaiseSharedLimit() {
  static const cudaError_t raised = cudaFuncSetAttribute(
      LatentAttentionKernel<kRankBlocks>, cudaFuncAttributeMaxDynamicSharedMemorySize,
      static_cast<int>(AttentionSharedBytes(LatentShape{1, 1, kMaxRopeDim, 1, 512 * kRankBlocks})));
  return raised;
}

// Block (token, head): the splits' sums weighted by exp(max_s - max), over the total of their exps; thread s
// reads split s's (max, sum). A split past the token's position has sum 0 and is left out.
__global__ void __launch_bounds__(kThreads)
    LatentMergeKernel(const float* partial_sums, const float* partial_stats, int n_splits, int rank, float* latent) {
  WaitForPriorKernels();
  static_assert(kThreads >= kMaxSplits);
  __shared__ float s_weight[kMaxSplits];
  __shared__ float s_warp[kWarps];
  const int64_t row = blockIdx.x;
  const int split = threadIdx.x, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const float* stats = partial_stats + 2 * row * n_splits;
  const float split_max = split < n_splits ? stats[2 * split] : -INFINITY;
  const float split_sum = split < n_splits ? stats[2 * split + 1] : 0.0f;
  float max_all = split_sum > 0.0f ? split_max : -INFINITY;
  max_all = detail::WarpMax(max_all);
  if (lane == 0) s_warp[warp] = max_all;
  __syncthreads();
  max_all = -INFINITY;
  for (int w = 0; w < kWarps; ++w) max_all = fmaxf(max_all, s_warp[w]);
  const float weight = split_sum > 0.0f ? expf(split_max - max_all) : 0.0f;
  if (split < kMaxSplits) s_weight[split] = weight;
  __syncthreads();  // every thread has read s_warp's maxima
  const float total = detail::WarpSum(weight * split_sum);
  if (lane == 0) s_warp[warp] = total;
  __syncthreads();
  float all = 0.0f;
  for (int w = 0; w < kWarps; ++w) all += s_warp[w];
  const float inv = 1.0f / all;
  const float* sums = partial_sums + row * n_splits * rank;
  for (int r = threadIdx.x; r < rank; r += kThreads) {
    float v = 0.0f;
    for (int s = 0; s < n_splits; ++s) {
      if (s_weight[s] != 0.0f) v = fmaf(sums[s * rank + r], s_weight[s], v);
    }
    latent[row * rank + r] = v * inv;
  }
}

// --------------------------------------------------------------------------------------------------------
// LatentValueProject: a warp 4 rows of one head's W_UV (their loads in flight together), each lane a run of
// 8-column chunks, for up to 8 tokens.

constexpr int kProjectTokens = 8;
constexpr int kProjectRows = 4;

int ProjectUnits(const LatentShape& s) { return s.n_head * ((s.v_dim + kProjectRows - 1) / kProjectRows); }

template <DenseType kType>
__global__ void __launch_bounds__(kThreads)
    LatentValueProjectKernel(const uint8_t* kv_b, int64_t row_bytes, const float* latent, int n_tokens,
                             LatentShape shape, float* out) {
  WaitForPriorKernels();
  const int groups = (shape.v_dim + kProjectRows - 1) / kProjectRows;
  const int unit = blockIdx.x * kWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (unit >= shape.n_head * groups) return;
  const int head = unit / groups, d0 = unit % groups * kProjectRows;
  const int rows = min(kProjectRows, shape.v_dim - d0);
  const uint8_t* w_rows =
      kv_b + (static_cast<int64_t>(head) * (shape.nope_dim + shape.v_dim) + shape.nope_dim + d0) * row_bytes;
  const int t0 = blockIdx.y * kProjectTokens;
  const int tokens = min(kProjectTokens, n_tokens - t0);
  float acc[kProjectRows][kProjectTokens] = {};
  for (int c = lane; c < shape.rank / 8; c += 32) {
    float w[kProjectRows][8];
#pragma unroll
    for (int i = 0; i < kProjectRows; ++i) {
      if (i < rows) {
        detail::WidenChunkExact<kType>(detail::LoadChunk<kType>(w_rows + i * row_bytes, c), w[i]);
      } else {
#pragma unroll
        for (int j = 0; j < 8; ++j) w[i][j] = 0.0f;
      }
    }
#pragma unroll
    for (int tt = 0; tt < kProjectTokens; ++tt) {
      if (tt >= tokens) break;
      const float4* l4 = reinterpret_cast<const float4*>(
          latent + (static_cast<int64_t>(t0 + tt) * shape.n_head + head) * shape.rank + 8 * c);
      const float4 a = l4[0], b = l4[1];
      const float x[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
      for (int i = 0; i < kProjectRows; ++i) {
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[i][tt] = fmaf(w[i][j], x[j], acc[i][tt]);
      }
    }
  }
  const int64_t out_width = static_cast<int64_t>(shape.n_head) * shape.v_dim;
#pragma unroll
  for (int i = 0; i < kProjectRows; ++i) {
#pragma unroll
    for (int tt = 0; tt < kProjectTokens; ++tt) {
      const float total = detail::WarpSum(acc[i][tt]);
      if (lane == 0 && i < rows && tt < tokens) {
        out[(t0 + tt) * out_width + static_cast<int64_t>(head) * shape.v_dim + d0 + i] = total;
      }
    }
  }
}

// --------------------------------------------------------------------------------------------------------
// Host side.

absl::Status CheckShape(absl::string_view fn, const LatentShape& s) {
  if (s.n_head < 1 || s.n_head > 1024) return BadArgument(fn, "shape.n_head", s.n_head, "it must be in [1, 1024]");
  if (s.nope_dim < 1 || s.nope_dim > 1024) {
    return BadArgument(fn, "shape.nope_dim", s.nope_dim, "it must be in [1, 1024]");
  }
  if (s.v_dim < 1 || s.v_dim > 1024) return BadArgument(fn, "shape.v_dim", s.v_dim, "it must be in [1, 1024]");
  if (s.rope_dim < 2 || s.rope_dim > kMaxRopeDim || s.rope_dim % 2 != 0) {
    return BadArgument(fn, "shape.rope_dim", s.rope_dim, "it must be even and in [2, 256]");
  }
  if (s.rank < 8 || s.rank > kMaxRank || s.rank % 8 != 0) {
    return BadArgument(fn, "shape.rank", s.rank, "it must be a multiple of 8 in [8, 1024]");
  }
  if (s.key_dim() % 4 != 0) {
    return BadArgument(fn, "shape.rank + shape.rope_dim", s.key_dim(), "it must be a multiple of 4");
  }
  return absl::OkStatus();
}

// The checks both kv_b products share.
absl::Status CheckProjection(absl::string_view fn, DenseType type, const uint8_t* kv_b, const LatentShape& s,
                             int n_tokens) {
  if (absl::Status status = CheckShape(fn, s); !status.ok()) return status;
  if (kv_b == nullptr) return NullArgument(fn, "kv_b");
  if (type == DenseType::kQ8_0) {
    if (absl::Status status = detail::CheckColumns(fn, "shape.rank (kv_b's columns)", type, s.rank); !status.ok()) {
      return status;
    }
  } else if (!detail::Aligned16(kv_b)) {
    return detail::Misaligned(fn, "kv_b", kv_b);
  }
  if (n_tokens < 0 || n_tokens > kMaxTokens) return BadArgument(fn, "n_tokens", n_tokens, "it must be in [0, 65535]");
  return absl::OkStatus();
}

// kernel<kType> for a runtime type.
template <template <DenseType> class Kernel>
auto ForType(DenseType type) {
  switch (type) {
    case DenseType::kF16: return Kernel<DenseType::kF16>::kFn;
    case DenseType::kBF16: return Kernel<DenseType::kBF16>::kFn;
    case DenseType::kQ8_0: return Kernel<DenseType::kQ8_0>::kFn;
    case DenseType::kF32: break;
  }
  return Kernel<DenseType::kF32>::kFn;
}
template <DenseType kType>
struct AbsorbKernel {
  static constexpr auto kFn = LatentQueryAbsorbKernel<kType>;
};
template <DenseType kType>
struct ProjectKernel {
  static constexpr auto kFn = LatentValueProjectKernel<kType>;
};

}  // namespace

absl::Status CheckLatentShape(const LatentShape& shape, DenseType type) {
  constexpr absl::string_view kFn = "CheckLatentShape";
  if (absl::Status s = CheckShape(kFn, shape); !s.ok()) return s;
  if (type == DenseType::kQ8_0) return detail::CheckColumns(kFn, "shape.rank (kv_b's columns)", type, shape.rank);
  return absl::OkStatus();
}

absl::Status LatentRopeStore(float* q, const float* kv, const TokenSlot* slots, int n_tokens, int64_t layer,
                             const LatentShape& shape, const float* kv_norm, float eps, const double* freq,
                             float rope_magnitude, int rope_style, cudaStream_t stream) {
  constexpr absl::string_view kFn = "LatentRopeStore";
  if (absl::Status s = CheckShape(kFn, shape); !s.ok()) return s;
  if (n_tokens < 0 || n_tokens > kMaxTokens) return BadArgument(kFn, "n_tokens", n_tokens, "it must be in [0, 65535]");
  if (layer < 0) return BadArgument(kFn, "layer", layer, "it must be >= 0");
  if (rope_style != 0 && rope_style != 1) return BadArgument(kFn, "rope_style", rope_style, "it must be 0 or 1");
  if (q == nullptr) return NullArgument(kFn, "q");
  if (kv == nullptr) return NullArgument(kFn, "kv");
  if (slots == nullptr) return NullArgument(kFn, "slots");
  if (kv_norm == nullptr) return NullArgument(kFn, "kv_norm");
  if (freq == nullptr) return NullArgument(kFn, "freq");
  if (!(rope_magnitude > 0.0f) || !std::isfinite(rope_magnitude)) {
    return absl::InvalidArgumentError(
        absl::StrCat("LatentRopeStore: rope_magnitude is ", rope_magnitude, ", not a finite positive number"));
  }
  if (n_tokens == 0) return absl::OkStatus();
  const dim3 grid((shape.n_head + 1 + kRopeWarps - 1) / kRopeWarps, n_tokens);
  return LaunchKernel("LatentRopeStoreKernel", LatentRopeStoreKernel, grid, 32 * kRopeWarps, 0, stream, q, kv, slots,
                      layer, shape, kv_norm, eps, freq, rope_magnitude, rope_style);
}

absl::Status LatentQueryAbsorb(DenseType type, const uint8_t* kv_b, const float* q, int n_tokens,
                               const LatentShape& shape, float* q_latent, cudaStream_t stream) {
  constexpr absl::string_view kFn = "LatentQueryAbsorb";
  if (absl::Status s = CheckProjection(kFn, type, kv_b, shape, n_tokens); !s.ok()) return s;
  if (q == nullptr) return NullArgument(kFn, "q");
  if (q_latent == nullptr) return NullArgument(kFn, "q_latent");
  if (n_tokens == 0) return absl::OkStatus();
  const dim3 grid(shape.n_head, (n_tokens + kAbsorbTokens - 1) / kAbsorbTokens);
  const int64_t row_bytes = static_cast<int64_t>(DenseRowBytes(type, shape.rank));
  return LaunchKernel("LatentQueryAbsorbKernel", ForType<AbsorbKernel>(type), grid, kThreads, AbsorbSharedBytes(shape),
                      stream, kv_b, row_bytes, q, n_tokens, shape, q_latent);
}

size_t LatentAttentionWorkspaceBytes(int n_tokens, const LatentShape& shape, int max_positions) {
  size_t bytes = 0;
  for (int n = 1; n <= n_tokens; ++n) {
    const int splits = SplitBound(n, shape, std::max(1, max_positions));
    if (splits == 1) continue;
    bytes = std::max(bytes, static_cast<size_t>(n) * shape.n_head * splits * (shape.rank + 2) * sizeof(float));
  }
  return bytes;
}

absl::Status LatentAttention(const float* q_latent, const TokenSlot* slots, int n_tokens, int64_t layer,
                             const LatentShape& shape, float scale, int max_positions, float* latent, void* workspace,
                             size_t workspace_bytes, cudaStream_t stream) {
  constexpr absl::string_view kFn = "LatentAttention";
  if (absl::Status s = CheckShape(kFn, shape); !s.ok()) return s;
  if (n_tokens < 0 || n_tokens > kMaxTokens) return BadArgument(kFn, "n_tokens", n_tokens, "it must be in [0, 65535]");
  if (max_positions < 1) return BadArgument(kFn, "max_positions", max_positions, "it must be >= 1");
  if (layer < 0) return BadArgument(kFn, "layer", layer, "it must be >= 0");
  if (q_latent == nullptr) return NullArgument(kFn, "q_latent");
  if (!detail::Aligned16(q_latent)) return detail::Misaligned(kFn, "q_latent", q_latent);
  if (slots == nullptr) return NullArgument(kFn, "slots");
  if (latent == nullptr) return NullArgument(kFn, "latent");
  if (!detail::Aligned16(latent)) return detail::Misaligned(kFn, "latent", latent);
  if (n_tokens == 0) return absl::OkStatus();
  const PositionSplit split = SplitPositions(n_tokens, shape, max_positions);
  float* partial_sums = nullptr;
  float* partial_stats = nullptr;
  if (split.splits > 1) {
    const size_t rows = static_cast<size_t>(n_tokens) * shape.n_head * split.splits;
    const size_t needed = rows * (shape.rank + 2) * sizeof(float);
    if (workspace_bytes < needed) {
      return BadArgument(kFn, "workspace_bytes", static_cast<int64_t>(workspace_bytes),
                         absl::StrCat("these sizes need ", needed));
    }
    if (workspace == nullptr) return NullArgument(kFn, "workspace");
    if (!detail::Aligned16(workspace)) return detail::Misaligned(kFn, "workspace", workspace);
    partial_sums = static_cast<float*>(workspace);
    partial_stats = partial_sums + rows * shape.rank;
  }
  const auto kernel = shape.rank <= 512 ? LatentAttentionKernel<1> : LatentAttentionKernel<2>;
  CUDA_RETURN_IF_ERROR(shape.rank <= 512 ? RaiseSharedLimit<1>() : RaiseSharedLimit<2>(),
                       "raising LatentAttentionKernel's shared memory");
  const size_t shared = AttentionSharedBytes(shape);
  const dim3 grid(n_tokens, RowBlocks(shape), split.splits);
  const absl::Status launched = LaunchKernel("LatentAttentionKernel", kernel, grid, kThreads, shared, stream, q_latent,
                                             slots, layer, shape, scale, split.positions, split.splits, latent,
                                             partial_sums, partial_stats);
  if (!launched.ok() || split.splits == 1) return launched;
  return LaunchKernel("LatentMergeKernel", LatentMergeKernel, dim3(n_tokens * shape.n_head), kThreads, 0, stream,
                      partial_sums, partial_stats, split.splits, shape.rank, latent);
}

absl::Status LatentValueProject(DenseType type, const uint8_t* kv_b, const float* latent, int n_tokens,
                                const LatentShape& shape, float* out, cudaStream_t stream) {
  constexpr absl::string_view kFn = "LatentValueProject";
  if (absl::Status s = CheckProjection(kFn, type, kv_b, shape, n_tokens); !s.ok()) return s;
  if (latent == nullptr) return NullArgument(kFn, "latent");
  if (!detail::Aligned16(latent)) return detail::Misaligned(kFn, "latent", latent);
  if (out == nullptr) return NullArgument(kFn, "out");
  if (n_tokens == 0) return absl::OkStatus();
  const dim3 grid((ProjectUnits(shape) + kWarps - 1) / kWarps, (n_tokens + kProjectTokens - 1) / kProjectTokens);
  const int64_t row_bytes = static_cast<int64_t>(DenseRowBytes(type, shape.rank));
  return LaunchKernel("LatentValueProjectKernel", ForType<ProjectKernel>(type), grid, kThreads, 0, stream, kv_b,
                      row_bytes, latent, n_tokens, shape, out);
}

}  // namespace strata::kernels::cuda
