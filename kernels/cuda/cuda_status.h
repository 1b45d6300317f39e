#ifndef STRATA_KERNELS_CUDA_CUDA_STATUS_H_
#define STRATA_KERNELS_CUDA_CUDA_STATUS_H_

// The one conversion from CUDA runtime errors to absl::Status. Included only by CUDA-built code
// (kernels/cuda, engine/gpu); it includes the CUDA runtime header.
//
// Codes: no device, no driver or a driver too old -> UNAVAILABLE; out of device or pinned memory ->
// RESOURCE_EXHAUSTED; an invalid argument -> INVALID_ARGUMENT; everything else (a failed launch, an
// illegal address) -> INTERNAL. The message names `what` and CUDA's own text.

#include <cuda_runtime.h>

#include <string_view>

#include "absl/status/status.h"

namespace strata::kernels::cuda {

absl::Status CudaStatus(cudaError_t error, std::string_view what);

// The launch error of the kernel just enqueued (cudaGetLastError), named `kernel`.
absl::Status LaunchStatus(std::string_view kernel);

}  // namespace strata::kernels::cuda

// Evaluates a CUDA runtime call and returns its error, as a Status naming `what`, from the enclosing
// function.
#define CUDA_RETURN_IF_ERROR(call, what)                                                        \
  do {                                                                                          \
    const cudaError_t strata_cuda_error_ = (call);                                              \
    if (strata_cuda_error_ != cudaSuccess) return ::strata::kernels::cuda::CudaStatus(strata_cuda_error_, what); \
  } while (false)

#endif  // STRATA_KERNELS_CUDA_CUDA_STATUS_H_
