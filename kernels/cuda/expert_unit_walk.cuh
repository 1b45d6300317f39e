#ifndef STRATA_KERNELS_CUDA_EXPERT_UNIT_WALK_CUH_
#define STRATA_KERNELS_CUDA_EXPERT_UNIT_WALK_CUH_

// The walking launch form of the expert weight kernels (ExpertFfnExtras::mostly_skipped): a grid of the
// blocks the GPU holds at once, each block walking units (work item, part of the rows) numbered item first,
// unit u being item u % n_items of part u / n_items. Not part of the API; nvcc only.

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/cuda_status.h"
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

// Blocks of kKernel (kFfnThreads threads, no dynamic shared memory) that the current device runs at once:
// its occupancy times the SMs. Blocks an SM holds depend on the kernel and the architecture (one per process:
// Strata's GPUs are of one kind), so the answer is kept once known; a failed query is cleared (not left for
// the next launch's check to report) and counts one block an SM: fewer blocks, the same units.
template <void (*kKernel)(FfnArgs)>
absl::Status ResidentBlocks(int64_t* blocks) {
  static std::atomic<int> known_blocks_per_sm{0};
  int blocks_per_sm = known_blocks_per_sm.load(std::memory_order_relaxed);
  if (blocks_per_sm == 0) {
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks_per_sm, kKernel, kFfnThreads, 0) == cudaSuccess &&
        blocks_per_sm > 0) {
      known_blocks_per_sm.store(blocks_per_sm, std::memory_order_relaxed);
    } else {
      cudaGetLastError();
      blocks_per_sm = 1;
    }
  }
  int device = 0, sms = 0;
  CUDA_RETURN_IF_ERROR(cudaGetDevice(&device), "cudaGetDevice");
  CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "SM count");
  *blocks = int64_t{blocks_per_sm} * sms;
  return absl::OkStatus();
}

}  // namespace strata::kernels::cuda::expert_internal

#endif  // STRATA_KERNELS_CUDA_EXPERT_UNIT_WALK_CUH_
