// ExpertFfn and QuantizeActivations (contracts in expert_kernels.h; byte layouts in kernels/format/scheme.h).
//
// ExpertFfn is three launches on the caller's stream:
//  1. PrepareKernel: block 0 groups the (token, j) pairs by expert (a counting sort in shared memory into
//     `list`, the pairs of an expert at consecutive positions, "slots"; a decode step's few pairs by one
//     warp's match.any instead) and cuts each expert's run into work items of up to tile_max slots; the other
//     blocks quantize x (integer schemes).
//  2. GateUpKernel (expert_weight_kernels.cu), grid (work item, 32-row strip of ff): gate and up rows of the
//     strip for every token of the item, then h = silu(g) * u for the strip (or gpt-oss's biased, clamped
//     form: ExpertFfnExtras), which is one 32-block of h, quantized in the same kernel (f16 keeps it in
//     f32), stored per slot.
//  3. DownKernel, grid (work item, group of 16-row tiles of n_embd): down rows (plus a bias) into parts.
// The grids come from n_tokens, k and n_expert alone (the bound on work items); blocks past the item count
// the prepare kernel wrote exit at once. A mostly_skipped call (ExpertFfnExtras) of an integer scheme in wide
// items instead runs at most as many blocks as the GPU holds at once, each walking (item, strip) or (item,
// group) units in turn, so that the blocks of a bound far above the items are never launched.

#include <algorithm>
#include <cstdint>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/dependent_launch.cuh"
#include "kernels/cuda/expert_kernels.h"
#include "kernels/cuda/expert_kernels_internal.cuh"
#include "kernels/format/role_layout.h"

namespace strata::kernels::cuda {
namespace {

namespace lay = ::strata::kernels::layout;
using expert_internal::ActBase;
using expert_internal::BlockCode;
using expert_internal::FfnArgs;
using expert_internal::kNarrowTile;
using expert_internal::kWideTile;
using expert_internal::QuantizeBlock32;
using expert_internal::WarpInclusiveScan;
using expert_internal::WorkItem;

constexpr int kPrepThreads = 256;
constexpr int kPrepWarps = kPrepThreads / 32;
constexpr int kQuantBlocksPerWarp = 4;  // 32-element blocks a warp quantizes (grid-stride)
// Calls with at least this many pairs per expert on average use wide tiles.
constexpr int64_t kWideTokensPerExpert = 4;
constexpr int64_t kMaxPairs = int64_t{1} << 24;
// The prepare kernel counts pairs per expert in shared memory (4 bytes an expert, below the 48 KiB that
// needs no opt-in).
constexpr int kMaxExperts = 8192;
// Activation offsets inside the kernels are int32 (elements of x and of h: pairs * ff).
constexpr int64_t kMaxActivationElements = (int64_t{1} << 31) - 1;
constexpr size_t kWorkspaceAlignment = 256;

// ---------------------------------------------------------------------------------------------------
// Workspace

struct WorkspacePlan {
  size_t n_items = 0, list = 0, items = 0;
  size_t xq = 0, xscale = 0, xsum = 0;  // integer schemes: quantized x, per token
  size_t hq = 0, hscale = 0, hsum = 0;  // integer schemes: quantized h, per slot
  size_t hf = 0;                        // f16: h in f32, per slot
  size_t total = 0;
};

// Bound on the work items of `pairs` pairs: sum over experts of ceil(c_e / tile) <= pairs / tile + (number
// of experts with a pair).
int64_t MaxWorkItems(int64_t pairs, int n_expert, int tile) { return pairs / tile + std::min<int64_t>(n_expert, pairs); }

WorkspacePlan PlanWorkspace(const ExpertLayout& l, int64_t n_tokens, int k, int n_expert) {
  const int64_t pairs = n_tokens * k;
  WorkspacePlan w;
  size_t at = 0;
  auto take = [&at](int64_t bytes) {
    const size_t start = at;
    at = (at + static_cast<size_t>(bytes) + kWorkspaceAlignment - 1) / kWorkspaceAlignment * kWorkspaceAlignment;
    return start;
  };
  w.n_items = take(sizeof(int32_t));
  w.list = take(pairs * 4);
  // The narrow tile gives the larger bound, so one plan serves both tile sizes.
  w.items = take(MaxWorkItems(pairs, n_expert, kNarrowTile) * static_cast<int64_t>(sizeof(WorkItem)));
  if (l.scheme != Scheme::kF16) {
    w.xq = take(n_tokens * l.n_embd);
    w.xscale = take(n_tokens * (l.n_embd / 32) * 4);
    w.xsum = take(n_tokens * (l.n_embd / 32) * 4);
    w.hq = take(pairs * l.expert_ff);
    w.hscale = take(pairs * (l.expert_ff / 32) * 4);
    w.hsum = take(pairs * (l.expert_ff / 32) * 4);
  } else {
    w.hf = take(pairs * l.expert_ff * 4);
  }
  w.total = at;
  return w;
}

uint64_t ExpectedRoleBytes(Scheme s, int64_t rows, int64_t cols) {
  if (s == Scheme::kF16) return static_cast<uint64_t>(2 * rows * cols);
  return static_cast<uint64_t>(lay::CodesBytes(s, rows, cols) + rows / kRowTile * lay::TileScaleBytes(s, cols));
}

// The shape rules of kernels/format for all three roles, and role sizes and offsets the kernels can trust.
absl::Status CheckLayout(const ExpertLayout& l) {
  const int scheme = static_cast<int>(l.scheme);
  if (scheme < 0 || scheme > static_cast<int>(Scheme::kMxfp4)) {
    return absl::InvalidArgumentError(absl::StrCat("ExpertFfn: layout.scheme ", scheme, " is not a scheme"));
  }
  const int64_t multiple = l.scheme == Scheme::kS2 ? 64 : 32;
  for (const auto& [name, value] : {std::pair<const char*, int64_t>{"n_embd", l.n_embd}, {"expert_ff", l.expert_ff}}) {
    if (value <= 0 || value % multiple != 0 || value > kMaxRoleDim) {
      return absl::InvalidArgumentError(absl::StrCat("ExpertFfn: layout.", name, " ", value,
                                                     " must be a positive multiple of ", multiple, " at most ",
                                                     kMaxRoleDim));
    }
  }
  for (int r = 0; r < 3; ++r) {
    const uint64_t expected = ExpectedRoleBytes(l.scheme, l.rows(r), l.cols(r));
    if (l.role_bytes[r] != expected) {
      return absl::InvalidArgumentError(absl::StrCat("ExpertFfn: layout.role_bytes of ", kRoleNames[r], " is ",
                                                     l.role_bytes[r], ", expected ", expected));
    }
    if (l.role_offset[r] % 16 != 0 || l.role_offset[r] + l.role_bytes[r] > l.blob_bytes) {
      return absl::InvalidArgumentError(absl::StrCat("ExpertFfn: layout.role_offset of ", kRoleNames[r], " (",
                                                     l.role_offset[r], ") must be 16-byte aligned with the role "
                                                     "inside blob_bytes ", l.blob_bytes));
    }
  }
  return absl::OkStatus();
}

// Everything ExpertFfn checks before it looks at pointers.
absl::Status CheckFfnSizes(const ExpertLayout& layout, int n_expert, int n_tokens, int k) {
  if (absl::Status s = CheckLayout(layout); !s.ok()) return s;
  if (n_expert < 1 || n_expert > kMaxExperts) {
    return absl::InvalidArgumentError(
        absl::StrCat("ExpertFfn: n_expert ", n_expert, " must be in [1, ", kMaxExperts, "]"));
  }
  if (k < 1 || k > n_expert) {
    return absl::InvalidArgumentError(absl::StrCat("ExpertFfn: k ", k, " must be in [1, n_expert = ", n_expert, "]"));
  }
  if (n_tokens < 0) {
    return absl::InvalidArgumentError(absl::StrCat("ExpertFfn: n_tokens ", n_tokens, " must not be negative"));
  }
  const int64_t pairs = int64_t{n_tokens} * k;
  if (pairs > kMaxPairs) {
    return absl::InvalidArgumentError(
        absl::StrCat("ExpertFfn: n_tokens * k = ", pairs, " exceeds the limit of ", kMaxPairs, " pairs"));
  }
  if (int64_t{n_tokens} * layout.n_embd > kMaxActivationElements ||
      pairs * layout.expert_ff > kMaxActivationElements) {
    return absl::InvalidArgumentError(absl::StrCat("ExpertFfn: n_tokens ", n_tokens, " x k ", k,
                                                   " is too large for n_embd ", layout.n_embd, " and expert_ff ",
                                                   layout.expert_ff, " (activations above 2^31 elements)"));
  }
  return absl::OkStatus();
}

bool Aligned(const void* p, uintptr_t alignment) { return reinterpret_cast<uintptr_t>(p) % alignment == 0; }

// ---------------------------------------------------------------------------------------------------
// Kernels

// Quantizes 32-element blocks [0, n_blocks) of x (block b = x[32b .. 32b+31]), a warp per block, the
// warps of `n_ctas` blocks striding over them.
__device__ __forceinline__ void QuantizeBlocks(const float* __restrict__ x, int64_t n_blocks, int8_t* __restrict__ q,
                                               float* __restrict__ scale, int32_t* __restrict__ sum, int64_t cta,
                                               int64_t n_ctas) {
  const int lane = threadIdx.x % 32;
  const int64_t stride = n_ctas * kPrepWarps;
  for (int64_t b = cta * kPrepWarps + threadIdx.x / 32; b < n_blocks; b += stride) {
    const BlockCode c = QuantizeBlock32(__ldg(x + 32 * b + lane));
    q[32 * b + lane] = static_cast<int8_t>(c.q);
    if (lane == 0) {
      scale[b] = c.scale;
      sum[b] = c.sum;
    }
  }
}

__global__ void __launch_bounds__(kPrepThreads)
    QuantizeKernel(const float* x, int64_t n_blocks, int8_t* q, float* scale, int32_t* sum) {
  WaitForPriorKernels();
  QuantizeBlocks(x, n_blocks, q, scale, sum, blockIdx.x, gridDim.x);
}

struct GroupArgs {
  const uint8_t* const* blobs;
  const int32_t* ids;
  int n_pairs;
  int n_expert;
  int tile;              // tokens per work item at most
  int32_t* list;         // n_pairs: pair indices t * k + j grouped by expert
  WorkItem* items;
  int32_t* n_items;
};

// A counting sort of the valid pairs by expert, run by one block of kPrepThreads threads, with counts[e]
// (n_expert ints of shared memory) first expert e's pair count, then its next free list position. The
// order of pairs inside an expert's run depends on atomics; nothing downstream depends on it.
__device__ void GroupPairsByExpert(const GroupArgs& a, int32_t* counts) {
  __shared__ int2 warp_totals[kPrepWarps];  // (pairs, items) of each warp's experts, then their exclusive scan
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  for (int e = tid; e < a.n_expert; e += kPrepThreads) counts[e] = 0;
  __syncthreads();
  for (int p = tid; p < a.n_pairs; p += kPrepThreads) {
    const int e = a.ids[p];
    if (e >= 0 && e < a.n_expert) atomicAdd(&counts[e], 1);
  }
  __syncthreads();
  // Each thread owns a contiguous range of experts; an exclusive scan over threads (within each warp by
  // shuffles, then over the warps' totals) places their runs.
  const int per_thread = (a.n_expert + kPrepThreads - 1) / kPrepThreads;
  const int e_begin = min(tid * per_thread, a.n_expert);
  const int e_end = min(e_begin + per_thread, a.n_expert);
  int my_pairs = 0, my_items = 0;
  for (int e = e_begin; e < e_end; ++e) {
    my_pairs += counts[e];
    my_items += (counts[e] + a.tile - 1) / a.tile;
  }
  int scan_pairs = my_pairs, scan_items = my_items;  // inclusive, within the warp
  WarpInclusiveScan(&scan_pairs, &scan_items);
  if (lane == 31) warp_totals[warp] = make_int2(scan_pairs, scan_items);
  __syncthreads();
  if (tid == 0) {
    int2 running = make_int2(0, 0);
    for (int w = 0; w < kPrepWarps; ++w) {
      const int2 total = warp_totals[w];
      warp_totals[w] = running;
      running.x += total.x;
      running.y += total.y;
    }
    *a.n_items = running.y;
  }
  __syncthreads();
  int pair_at = warp_totals[warp].x + scan_pairs - my_pairs;
  int item_at = warp_totals[warp].y + scan_items - my_items;
  for (int e = e_begin; e < e_end; ++e) {
    const int c = counts[e];
    const uint8_t* blob = c > 0 ? a.blobs[e] : nullptr;  // blobs of experts without pairs may be null
    for (int s = 0; s < c; s += a.tile) a.items[item_at++] = WorkItem{blob, pair_at + s, min(a.tile, c - s)};
    counts[e] = pair_at;
    pair_at += c;
  }
  __syncthreads();
  for (int p = tid; p < a.n_pairs; p += kPrepThreads) {
    const int e = a.ids[p];
    if (e >= 0 && e < a.n_expert) a.list[atomicAdd(&counts[e], 1)] = p;
  }
}

// GroupPairsByExpert for at most kFewPairs pairs (a decode step of up to 32 / k tokens) by warp 0 alone:
// expert_internal::GroupFewPairs, whose items a gate/up block of such a call also finds by itself.
__device__ void GroupFewPairsByExpert(const GroupArgs& a) {
  const int lane = threadIdx.x % 32;
  const expert_internal::FewPairsRun r = expert_internal::GroupFewPairs(a.ids, a.n_pairs, a.n_expert, a.tile);
  if (r.expert >= 0) a.list[r.run_start + __popc(r.peers & ((1u << lane) - 1u))] = lane;
  if (r.items > 0) {
    const uint8_t* blob = a.blobs[r.expert];
    for (int i = 0; i < r.items; ++i) {
      a.items[r.item_begin + i] = WorkItem{blob, r.run_start + i * a.tile, min(a.tile, r.count - i * a.tile)};
    }
  }
  if (lane == 31) *a.n_items = r.n_items;
}

__global__ void __launch_bounds__(kPrepThreads)
    PrepareKernel(GroupArgs group, const float* x, int64_t x_blocks, int8_t* xq, float* xscale, int32_t* xsum) {
  WaitForPriorKernels();
  extern __shared__ int32_t expert_counts[];  // group.n_expert ints (block 0, more than 32 pairs)
  if (blockIdx.x == 0) {
    if (group.n_pairs > expert_internal::kFewPairs) {
      GroupPairsByExpert(group, expert_counts);
    } else if (threadIdx.x < 32) {
      GroupFewPairsByExpert(group);
    }
    return;
  }
  QuantizeBlocks(x, x_blocks, xq, xscale, xsum, blockIdx.x - 1, gridDim.x - 1);
}

}  // namespace

size_t ExpertFfnWorkspaceBytes(const ExpertLayout& layout, int max_tokens, int k, int n_expert) {
  if (!CheckFfnSizes(layout, n_expert, max_tokens, k).ok()) return 0;
  return PlanWorkspace(layout, max_tokens, k, n_expert).total;
}

absl::Status ExpertFfn(const ExpertLayout& layout, const uint8_t* const* blobs, int n_expert, const int32_t* ids,
                       int n_tokens, int k, const float* x, float* parts, const ExpertFfnExtras& extras,
                       void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  if (absl::Status s = CheckFfnSizes(layout, n_expert, n_tokens, k); !s.ok()) return s;
  for (const auto& [name, table] : {std::pair<const char*, const float*>{"extras.gate_bias", extras.gate_bias},
                                    {"extras.up_bias", extras.up_bias},
                                    {"extras.down_bias", extras.down_bias}}) {
    if (!Aligned(table, alignof(float))) {
      return absl::InvalidArgumentError(absl::StrCat("ExpertFfn: ", name, " must be aligned to 4 bytes"));
    }
  }
  if (n_tokens == 0) return absl::OkStatus();
  const struct {
    const char* name;
    const void* pointer;
    uintptr_t alignment;
  } pointers[] = {{"blobs", blobs, alignof(const uint8_t*)},
                  {"ids", ids, 4},
                  {"x", x, 16},
                  {"parts", parts, 16},
                  {"workspace", workspace, 16}};
  for (const auto& p : pointers) {
    if (p.pointer == nullptr || !Aligned(p.pointer, p.alignment)) {
      return absl::InvalidArgumentError(
          absl::StrCat("ExpertFfn: ", p.name, " must be a non-null device pointer aligned to ", p.alignment, " bytes"));
    }
  }
  const WorkspacePlan plan = PlanWorkspace(layout, n_tokens, k, n_expert);
  if (workspace_bytes < plan.total) {
    return absl::InvalidArgumentError(absl::StrCat("ExpertFfn: workspace_bytes ", workspace_bytes, " is less than the ",
                                                   plan.total, " bytes needed for n_tokens ", n_tokens, ", k ", k,
                                                   ", n_expert ", n_expert));
  }
  uint8_t* ws = static_cast<uint8_t*>(workspace);
  const bool quantized = layout.scheme != Scheme::kF16;
  const int64_t pairs = int64_t{n_tokens} * k;
  const int tile = pairs >= kWideTokensPerExpert * n_expert ? kWideTile : kNarrowTile;
  const int64_t max_items = MaxWorkItems(pairs, n_expert, tile);

  GroupArgs group;
  group.blobs = blobs;
  group.ids = ids;
  group.n_pairs = static_cast<int>(pairs);
  group.n_expert = n_expert;
  group.tile = tile;
  group.list = reinterpret_cast<int32_t*>(ws + plan.list);
  group.items = reinterpret_cast<WorkItem*>(ws + plan.items);
  group.n_items = reinterpret_cast<int32_t*>(ws + plan.n_items);
  int8_t* xq = quantized ? reinterpret_cast<int8_t*>(ws + plan.xq) : nullptr;
  float* xscale = quantized ? reinterpret_cast<float*>(ws + plan.xscale) : nullptr;
  int32_t* xsum = quantized ? reinterpret_cast<int32_t*>(ws + plan.xsum) : nullptr;
  const int64_t x_blocks = quantized ? int64_t{n_tokens} * (layout.n_embd / 32) : 0;
  const int64_t quant_ctas = (x_blocks + kPrepWarps * kQuantBlocksPerWarp - 1) / (kPrepWarps * kQuantBlocksPerWarp);
  const size_t counts_bytes = pairs > expert_internal::kFewPairs ? static_cast<size_t>(n_expert) * sizeof(int32_t) : 0;
  const absl::Status prepared =
      LaunchKernel("ExpertFfn prepare kernel", PrepareKernel, static_cast<unsigned>(1 + quant_ctas), kPrepThreads,
                   counts_bytes, stream, group, x, x_blocks, xq, xscale, xsum);
  if (!prepared.ok()) return prepared;

  FfnArgs a;
  a.items = group.items;
  a.n_items = group.n_items;
  a.list = group.list;
  a.k = k;
  a.n_embd = layout.n_embd;
  a.ff = layout.expert_ff;
  for (int r = 0; r < 3; ++r) a.role_offset[r] = layout.role_offset[r];
  a.x = quantized ? ActBase{xq, xscale, xsum, nullptr} : ActBase{nullptr, nullptr, nullptr, x};
  a.hq = quantized ? reinterpret_cast<int8_t*>(ws + plan.hq) : nullptr;
  a.hscale = quantized ? reinterpret_cast<float*>(ws + plan.hscale) : nullptr;
  a.hsum = quantized ? reinterpret_cast<int32_t*>(ws + plan.hsum) : nullptr;
  a.hf = quantized ? nullptr : reinterpret_cast<float*>(ws + plan.hf);
  a.parts = parts;
  a.down_tiles_per_warp = 1;  // LaunchWeightKernels picks it
  a.ids = ids;
  a.extras = extras;
  a.has_extras = !extras.plain();
  a.blobs = blobs;
  a.n_pairs = group.n_pairs;
  a.n_expert = n_expert;
  a.tile = tile;
  return expert_internal::LaunchWeightKernels(layout.scheme, a, tile, max_items, stream);
}

absl::Status QuantizeActivations(const float* x, int64_t n, int n_tokens, int8_t* q, float* scale, int32_t* sum,
                                 cudaStream_t stream) {
  if (n <= 0 || n % kActBlock != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("QuantizeActivations: n ", n, " must be a positive multiple of ", kActBlock));
  }
  if (n_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("QuantizeActivations: n_tokens ", n_tokens, " must not be negative"));
  }
  if (n_tokens == 0) return absl::OkStatus();
  if (x == nullptr || q == nullptr || scale == nullptr || sum == nullptr) {
    return absl::InvalidArgumentError("QuantizeActivations: x, q, scale and sum must be non-null device pointers");
  }
  const int64_t blocks = int64_t{n_tokens} * (n / kActBlock);
  const int64_t per_cta = kPrepWarps * kQuantBlocksPerWarp;
  const int64_t ctas = std::min<int64_t>((blocks + per_cta - 1) / per_cta, int64_t{1} << 20);
  return LaunchKernel("QuantizeActivations kernel", QuantizeKernel, static_cast<unsigned>(ctas), kPrepThreads, 0,
                      stream, x, blocks, q, scale, sum);
}

}  // namespace strata::kernels::cuda
