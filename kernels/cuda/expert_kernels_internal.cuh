#ifndef STRATA_KERNELS_CUDA_EXPERT_KERNELS_INTERNAL_CUH_
#define STRATA_KERNELS_CUDA_EXPERT_KERNELS_INTERNAL_CUH_

// Shared between expert_kernels.cu (argument checks, workspace, grouping, quantization) and
// expert_weight_kernels.cu (the gate/up and down kernels). Not part of the API; nvcc only.

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/expert_kernels.h"
#include "kernels/format/scheme.h"

namespace strata::kernels::cuda::expert_internal {

inline constexpr unsigned kFullMask = 0xFFFFFFFFu;
inline constexpr int kFfnWarps = 4;  // warps per block of the weight kernels
inline constexpr int kFfnThreads = 32 * kFfnWarps;
// Tokens per work item: decode-like calls use narrow tiles (a lean kernel for weight streaming); calls with
// many tokens per expert use wide tiles, which share each weight load among 8 tokens.
inline constexpr int kNarrowTile = 2;
inline constexpr int kWideTile = 8;
// Consecutive 16-row tiles of down one warp streams (at most), so that a warp has enough bytes to read
// when expert_ff is small; 1 for wide tiles, whose shared memory goes to the tokens.
inline constexpr int kMaxDownTilesPerWarp = 4;

// Up to `tile` consecutive positions [start, start + count) of the grouped pair list, all routed to the
// expert whose blob is `blob`.
struct WorkItem {
  const uint8_t* blob;
  int32_t start;
  int32_t count;
};

// Activation rows for the weight kernels. Row r starts at block first_block = r * cols / 32: its codes at
// q + 32 * first_block, its block scales and code sums at scale / sum + first_block (integer schemes), or
// its values at f32 + 32 * first_block (f16).
struct ActBase {
  const int8_t* q;
  const float* scale;
  const int32_t* sum;
  const float* f32;
};

struct FfnArgs {
  const WorkItem* items;
  const int32_t* n_items;  // written by the prepare kernel
  const int32_t* list;     // grouped pair indices t * k + j
  int k;
  int64_t n_embd;
  int64_t ff;
  uint64_t role_offset[3];
  ActBase x;     // integer schemes: x quantized in the workspace; f16: the caller's x
  int8_t* hq;    // integer schemes: h quantized, one row of ff per list position (slot)
  float* hscale;
  int32_t* hsum;
  float* hf;     // f16: h in f32, per slot
  float* parts;
  int down_tiles_per_warp;  // 1 .. kMaxDownTilesPerWarp (1 for wide tiles)
  // gpt-oss's biases and activation, read in the kernels' epilogues only (outside the dot-product loops):
  // a work item's expert is ids[list[start]].
  const int32_t* ids;
  ExpertFfnExtras extras;
  bool has_extras;  // !extras.plain()
  // The grouping's inputs besides ids: with at most kFewPairs pairs (a decode step) a gate/up block finds its own
  // work item before its wait (FewPairsItem), as the prepare kernel finds them.
  const uint8_t* const* blobs;
  int n_pairs;
  int n_expert;
  int tile;
};

struct BlockCode {
  int q;        // this lane's code
  float scale;  // the block's scale, in every lane
  int sum;      // the block's sum of codes, in every lane
};

// Quantizes a 32-element block held one element a lane, with the operations of kernels/cpu/activation.cc:
// fmaxf returns the non-NaN operand (as maxps/minps return their second), so amax skips NaN and a NaN
// quotient clamps to -127; __fdiv_rn is IEEE division; __float2int_rn rounds half to even. All 32 lanes
// must call it.
__device__ __forceinline__ BlockCode QuantizeBlock32(float v) {
  float amax = fmaxf(fabsf(v), 0.0f);
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) amax = fmaxf(amax, __shfl_xor_sync(kFullMask, amax, offset));
  const float scale = __fdiv_rn(amax, 127.0f);
  int q = 0;
  if (scale != 0.0f) q = __float2int_rn(fminf(fmaxf(__fdiv_rn(v, scale), -127.0f), 127.0f));
  return {q, scale, __reduce_add_sync(kFullMask, q)};
}

// ---------------------------------------------------------------------------------------------------
// The work items of a call of at most kFewPairs pairs, grouped by one warp with no shared memory and no
// barrier: lane p holds pair p, the lanes of one expert find each other (match.any), and the runs follow each
// other in the order of their lowest lanes, not of their experts (nothing downstream depends on the order of
// the runs). The prepare kernel writes every item from it; a gate/up block of a decode step computes its own
// before its wait, since the routing it reads was written at least two kernels before it ("Read before the
// wait" in expert_weight_kernels.cu).
inline constexpr int kFewPairs = 32;

// Inclusive sums of two counts over the lanes of a full warp (lane L gets the sums of lanes 0 .. L).
__device__ __forceinline__ void WarpInclusiveScan(int* a, int* b) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int offset = 1; offset < 32; offset <<= 1) {
    const int up_a = __shfl_up_sync(kFullMask, *a, offset);
    const int up_b = __shfl_up_sync(kFullMask, *b, offset);
    if (lane >= offset) {
      *a += up_a;
      *b += up_b;
    }
  }
}

// A lane's view of the grouping.
struct FewPairsRun {
  int expert;      // the lane's pair's expert; -1 past n_pairs or out of [0, n_expert)
  unsigned peers;  // the lanes of that expert
  int count;       // how many
  int run_start;   // the run's first list position (every lane of the run)
  int item_begin;  // the run's first work item (the run's leader, its lowest lane)
  int items;       // the run's work items (the leader; 0 in other lanes)
  int n_items;     // every run's (every lane)
};

// All 32 lanes must call it; ids are read through L2.
__device__ __forceinline__ FewPairsRun GroupFewPairs(const int32_t* ids, int n_pairs, int n_expert, int tile) {
  const int lane = threadIdx.x % 32;
  const unsigned lower_lanes = (1u << lane) - 1u;
  FewPairsRun r;
  r.expert = lane < n_pairs ? __ldcg(ids + lane) : -1;
  const bool valid = r.expert >= 0 && r.expert < n_expert;
  if (!valid) r.expert = -1;
  r.peers = __match_any_sync(kFullMask, r.expert);
  const bool leader = valid && (r.peers & lower_lanes) == 0;
  r.count = __popc(r.peers);
  const int my_pairs = leader ? r.count : 0;
  r.items = leader ? (r.count + tile - 1) / tile : 0;
  int scan_pairs = my_pairs, scan_items = r.items;  // inclusive over the lanes
  WarpInclusiveScan(&scan_pairs, &scan_items);
  r.run_start = __shfl_sync(kFullMask, scan_pairs - my_pairs, __ffs(r.peers) - 1);
  r.item_begin = scan_items - r.items;
  r.n_items = __shfl_sync(kFullMask, scan_items, 31);
  return r;
}

// Work item `index` (< n_items) of the grouping, in every lane; blobs are read through L2.
__device__ __forceinline__ WorkItem FewPairsItem(const FewPairsRun& r, const uint8_t* const* blobs, int tile,
                                                 int index) {
  const bool holds = r.items > 0 && index >= r.item_begin && index < r.item_begin + r.items;
  const unsigned holder = __ballot_sync(kFullMask, holds);
  WorkItem item{nullptr, 0, 0};
  if (holder == 0) return item;
  const int src = __ffs(holder) - 1;
  const int expert = __shfl_sync(kFullMask, r.expert, src), count = __shfl_sync(kFullMask, r.count, src);
  const int s = (index - __shfl_sync(kFullMask, r.item_begin, src)) * tile;
  item.blob = reinterpret_cast<const uint8_t*>(__ldcg(reinterpret_cast<const unsigned long long*>(blobs) + expert));
  item.start = __shfl_sync(kFullMask, r.run_start, src) + s;
  item.count = min(tile, count - s);
  return item;
}

// Enqueues the gate/up kernel and the down kernel for `scheme` with tiles of up to tile_max (kNarrowTile
// or kWideTile) tokens over a grid of max_items work items.
absl::Status LaunchWeightKernels(Scheme scheme, const FfnArgs& args, int tile_max, int64_t max_items,
                                 cudaStream_t stream);

}  // namespace strata::kernels::cuda::expert_internal

#endif  // STRATA_KERNELS_CUDA_EXPERT_KERNELS_INTERNAL_CUH_
