#ifndef STRATA_KERNELS_CUDA_GRID_COUNT_CUH_
#define STRATA_KERNELS_CUDA_GRID_COUNT_CUH_

// The last block of a group finishes the group's work: each block counts itself in once its results are
// stored, and the block that counts in last reads every other block's results (included by .cu files only).

#include <cuda_runtime.h>

namespace strata::kernels::cuda::detail {

// Called by every thread of the block, after the block's stores that the last block will read. Returns, to
// every thread, whether this block is the last of `blocks` to count in on *counter; the last block then
// reads the others' results with ld.cg (__ldcg) loads and resets *counter for the next call.
//
// After a block barrier one thread counts in with a release and acquire at gpu scope: the barrier orders the
// block's stores before the release, the acquire orders the last block's reads after every release (the
// pattern of CUDA's grid sync). A fence by every thread, before the count and again in the last block, gave
// the same results and a slower step.
__device__ __forceinline__ bool CountInIsLast(unsigned* counter, unsigned blocks) {
  __shared__ bool s_is_last;
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned before;
    asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;" : "=r"(before) : "l"(counter) : "memory");
    s_is_last = before == blocks - 1;
  }
  __syncthreads();
  return s_is_last;
}

}  // namespace strata::kernels::cuda::detail

#endif  // STRATA_KERNELS_CUDA_GRID_COUNT_CUH_
