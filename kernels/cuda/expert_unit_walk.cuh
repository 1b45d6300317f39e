#ifndef STRATA_KERNELS_CUDA_EXPERT_UNIT_WALK_CUH_
#define STRATA_KERNELS_CUDA_EXPERT_UNIT_WALK_CUH_

// The walking launch form of the expert weight kernels (ExpertFfnExtras::mostly_skipped): a grid of the
// blocks the GPU holds at once (ResidentBlocks), each block walking units (work item, part of the rows)
// numbered item first, unit u being item u % n_items of part u / n_items. Not part of the API; nvcc only.

#include <cstdint>

#include "kernels/cuda/expert_kernels_internal.cuh"

namespace strata::kernels::cuda::expert_internal {

// A walking block's walk over its units (b, b + gridDim.x, ... in item-first order) by additions, not a
// division a unit, with the next unit's item loaded while the block computes this one (units are small: 8
// tokens of 32 rows). Even so, on a call with most pairs routed the walk measured 20-30% slower than the
// 2-D grid on an H200, which is why only mostly_skipped calls walk.
struct UnitWalk {
  __device__ UnitWalk(const FfnArgs& a, int parts_per_item)
      : items(a.items), n_items(*a.n_items), parts(parts_per_item) {
    if (n_items <= 0) {
      part = parts;
      return;
    }
    index = static_cast<int>(blockIdx.x % static_cast<unsigned>(n_items));
    part = static_cast<int>(blockIdx.x / static_cast<unsigned>(n_items));
    step_index = static_cast<int>(gridDim.x % static_cast<unsigned>(n_items));
    step_part = static_cast<int>(gridDim.x / static_cast<unsigned>(n_items));
    if (valid()) item = items[index];
    Advance();
  }
  __device__ bool valid() const { return part < parts; }
  __device__ void Next() {
    part = next_part;
    item = next_item;
    if (valid()) Advance();
  }

  WorkItem item{};
  int part = 0;

 private:
  // Finds the unit after this one and starts the load of its item.
  __device__ void Advance() {
    int next_index = index + step_index;
    next_part = part + step_part;
    if (next_index >= n_items) {
      next_index -= n_items;
      ++next_part;
    }
    index = next_index;
    if (next_part < parts) next_item = items[index];
  }

  const WorkItem* items;
  int n_items, parts;
  int index = 0, step_index = 0, step_part = 0, next_part = 0;
  WorkItem next_item{};
};

}  // namespace strata::kernels::cuda::expert_internal

#endif  // STRATA_KERNELS_CUDA_EXPERT_UNIT_WALK_CUH_
