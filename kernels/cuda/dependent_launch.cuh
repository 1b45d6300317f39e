#ifndef STRATA_KERNELS_CUDA_DEPENDENT_LAUNCH_CUH_
#define STRATA_KERNELS_CUDA_DEPENDENT_LAUNCH_CUH_

// The device side of programmatic dependent launch (dependent_launch.h), the one launch helper of
// kernels/cuda and the one count of a kernel's resident blocks (included by .cu files only).
//
// The rule every kernel launched through LaunchKernel follows: each block calls WaitForPriorKernels()
// unconditionally (no early return before it), before it reads anything the kernel just before it wrote and
// before it writes anything at all. Before the wait it may only read what no kernel of the step writes
// (weights, the step's inputs uploaded before its first kernel) or, through L2 (ld.cg), what kernels at least
// two launches back wrote: WaitForPriorKernels also lets the next kernel start launching, so a kernel's blocks
// start only once every block of the kernel before has passed its own wait, by when every kernel before that
// one has finished and its writes are visible. At most two kernels of a stream overlap.

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/dependent_launch.h"

namespace strata::kernels::cuda {

// Waits until the kernels before this one on the stream have finished and their writes are visible (a
// no-op for a plain launch), then lets the next kernel begin to launch.
__device__ __forceinline__ void WaitForPriorKernels() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Enqueues kernel<<<grid, block, shared_bytes, stream>>>(args...), with programmatic dependent launch when
// it is enabled; the status names `what`.
template <typename... Params, typename... Args>
absl::Status LaunchKernel(std::string_view what, void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes,
                          cudaStream_t stream, Args&&... args) {
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  config.attrs = attribute;
  config.numAttrs = DependentLaunchEnabled() ? 1 : 0;
  return CudaStatus(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...), what);
}

// Blocks of `kernel` (block_threads threads a block, no dynamic shared memory) that the current device runs
// at once: its occupancy of one SM times the SMs, at least 1. The grid of a kernel whose blocks take work in
// turn (a persistent GEMV, a walking expert kernel).
template <typename... Params>
absl::StatusOr<int64_t> ResidentBlocks(void (*kernel)(Params...), int block_threads) {
  int device = 0, sms = 0, per_sm = 0;
  CUDA_RETURN_IF_ERROR(cudaGetDevice(&device), "cudaGetDevice");
  CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device),
                       "reading the device's multiprocessor count");
  CUDA_RETURN_IF_ERROR(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, block_threads, 0),
                       "reading a kernel's occupancy");
  return std::max<int64_t>(1, int64_t{sms} * per_sm);
}

}  // namespace strata::kernels::cuda

#endif  // STRATA_KERNELS_CUDA_DEPENDENT_LAUNCH_CUH_
