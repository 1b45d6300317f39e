#ifndef STRATA_KERNELS_CUDA_HOST_MEMORY_CUH_
#define STRATA_KERNELS_CUDA_HOST_MEMORY_CUH_

#include <cstddef>
#include <string>

namespace strata::kernels::cuda::detail {

// Empty string on success, else the reason.
std::string RegisterHostMemoryRaw(void* data, size_t bytes);
void UnregisterHostMemoryRaw(void* data);

}  // namespace strata::kernels::cuda::detail

#endif  // STRATA_KERNELS_CUDA_HOST_MEMORY_CUH_
