#ifndef STRATA_KERNELS_CUDA_HOST_MEMORY_H_
#define STRATA_KERNELS_CUDA_HOST_MEMORY_H_

// Page-locking host memory for direct DMA (cudaHostRegister). Only built when STRATA_HAVE_CUDA is defined.

#include <cstddef>

#include "absl/status/status.h"

namespace strata::kernels::cuda {

// Registers [data, data + bytes) with CUDA as page-locked, mapped memory. UNAVAILABLE (with the driver's
// reason) when there is no device or the machine refuses to lock that much memory.
absl::Status RegisterHostMemory(void* data, size_t bytes);
// Undoes RegisterHostMemory; safe to call on memory that was not registered.
void UnregisterHostMemory(void* data);

}  // namespace strata::kernels::cuda

#endif  // STRATA_KERNELS_CUDA_HOST_MEMORY_H_
