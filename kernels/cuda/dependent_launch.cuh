#ifndef STRATA_KERNELS_CUDA_DEPENDENT_LAUNCH_CUH_
#define STRATA_KERNELS_CUDA_DEPENDENT_LAUNCH_CUH_

// The device side of programmatic dependent launch (dependent_launch.h) and the one launch helper of
// kernels/cuda (included by .cu files only).
//
// The rule every kernel launched through LaunchKernel follows: each block calls WaitForPriorKernels()
// unconditionally (no early return before it), before it reads anything an earlier kernel wrote and before
// it writes anything at all. Before the wait it may only read what no kernel of the step writes (weights).
// WaitForPriorKernels also lets the next kernel start launching: its blocks then wait in turn, so at most
// two kernels of a stream overlap.

#include <cuda_runtime.h>

#include <string_view>
#include <utility>

#include "absl/status/status.h"
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

}  // namespace strata::kernels::cuda

#endif  // STRATA_KERNELS_CUDA_DEPENDENT_LAUNCH_CUH_
