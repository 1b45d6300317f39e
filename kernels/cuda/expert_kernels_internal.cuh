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
  WorkItem* items;
  int32_t* n_items;  // written by the prepare kernel
  int32_t* list;     // grouped pair indices t * k + j
  // Few-pair calls (few_pairs: at most kMaxFewPairs pairs, at most kNarrowTile tokens) launch no prepare
  // kernel: each block of the gate/up kernel groups the pairs itself (FindFewPairsItem), quantizes x into its
  // shared memory, and the blocks of strip 0 write items, n_items and list for the down kernel.
  bool few_pairs;
  const uint8_t* const* blobs;
  int n_pairs;
  int n_expert;
  int n_tokens;
  const float* x_rows;  // the caller's x (n_tokens x n_embd f32)
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
};

// Loads an activation value from global memory through the read-only path, or (kShared) from shared memory.
template <bool kShared, typename V>
__device__ __forceinline__ V LoadActivation(const V* p) {
  if constexpr (kShared) {
    return *p;
  } else {
    return __ldg(p);
  }
}

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

// The grouping of a call of at most 32 pairs by expert, seen from one lane of a full warp (lane p holds pair
// p): the lanes of one expert find each other (match.any), its run of list positions follows the runs of the
// experts whose lowest lanes are lower, and the run is cut into work items of up to `tile` pairs. The prepare
// kernel writes this grouping out; few-pair weight kernels compute it in every block (FindFewPairsItem), so
// both see the same items, list positions and slots.
struct FewPairsLane {
  int expert;      // the pair's expert, or -1 (no pair, or an id outside [0, n_expert))
  unsigned peers;  // the lanes whose pairs share that expert
  bool leader;     // the lowest lane of a valid expert
  int count;       // pairs of the lane's expert
  int run_start;   // valid lanes: the list position of their expert's first pair
  int first_item;  // leaders: their expert's first work item
  int list_pos;    // valid lanes: the pair's list position
  int n_items;     // every lane: the work items of the call
};

__device__ __forceinline__ FewPairsLane GroupFewPairs(const int32_t* ids, int n_pairs, int n_expert, int tile) {
  const int lane = threadIdx.x % 32;
  const unsigned lower_lanes = (1u << lane) - 1u;
  FewPairsLane g;
  g.expert = lane < n_pairs ? ids[lane] : -1;
  const bool valid = g.expert >= 0 && g.expert < n_expert;
  if (!valid) g.expert = -1;
  g.peers = __match_any_sync(kFullMask, g.expert);
  g.leader = valid && (g.peers & lower_lanes) == 0;
  g.count = __popc(g.peers);
  const int my_pairs = g.leader ? g.count : 0, my_items = g.leader ? (g.count + tile - 1) / tile : 0;
  int scan_pairs = my_pairs, scan_items = my_items;
  WarpInclusiveScan(&scan_pairs, &scan_items);
  g.run_start = __shfl_sync(kFullMask, scan_pairs - my_pairs, __ffs(g.peers) - 1);
  g.first_item = scan_items - my_items;
  g.list_pos = g.run_start + __popc(g.peers & lower_lanes);
  g.n_items = __shfl_sync(kFullMask, scan_items, 31);
  return g;
}

// Calls of at most this many pairs may group them in every block (FfnArgs::few_pairs).
inline constexpr int kMaxFewPairs = 32;

// Shared memory of a few-pair gate/up block for x quantized (integer schemes): n_tokens rows of n_embd codes,
// then their block scales and code sums. Calls above kMaxFewPairsSharedBytes take the prepare kernel.
inline constexpr int64_t kMaxFewPairsSharedBytes = int64_t{32} << 10;
inline int64_t FewPairsSharedBytes(Scheme scheme, int64_t n_tokens, int64_t n_embd) {
  return scheme == Scheme::kF16 ? 0 : n_tokens * (n_embd + n_embd / 32 * 8);
}

// A work item of a few-pair call and its pairs (t * k + j) in list order: the block's view of the list.
struct FewPairsItem {
  WorkItem item;  // count 0: the call has no such item
  int32_t pairs[kNarrowTile];
  int32_t n_items;  // of the call
};

// Work item `index` of a few-pair call, by one full warp, into `out` (shared memory; the caller's barrier
// publishes it): the item GroupFewPairs's grouping numbers `index`, or a count of 0.
__device__ __forceinline__ void FindFewPairsItem(const FfnArgs& a, int index, FewPairsItem* out) {
  const int lane = threadIdx.x % 32;
  const FewPairsLane g = GroupFewPairs(a.ids, a.n_pairs, a.n_expert, kNarrowTile);
  const bool owner = g.leader && index >= g.first_item && index < g.first_item + (g.count + kNarrowTile - 1) / kNarrowTile;
  const unsigned owners = __ballot_sync(kFullMask, owner);
  if (owners == 0) {
    if (lane == 0) *out = FewPairsItem{WorkItem{nullptr, 0, 0}, {}, g.n_items};
    return;
  }
  if (lane == 0) out->n_items = g.n_items;
  const int owner_lane = __ffs(owners) - 1;
  const int start = __shfl_sync(kFullMask, g.run_start + (index - g.first_item) * kNarrowTile, owner_lane);
  const int end = __shfl_sync(kFullMask, g.run_start + g.count, owner_lane);
  const int count = min(kNarrowTile, end - start);
  if (owner) out->item = WorkItem{a.blobs[g.expert], start, count};
  if (g.expert >= 0 && g.list_pos >= start && g.list_pos < start + count) out->pairs[g.list_pos - start] = lane;
}

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

// Enqueues the gate/up kernel and the down kernel for `scheme` with tiles of up to tile_max (kNarrowTile
// or kWideTile) tokens over a grid of max_items work items.
absl::Status LaunchWeightKernels(Scheme scheme, const FfnArgs& args, int tile_max, int64_t max_items,
                                 cudaStream_t stream);

}  // namespace strata::kernels::cuda::expert_internal

#endif  // STRATA_KERNELS_CUDA_EXPERT_KERNELS_INTERNAL_CUH_
