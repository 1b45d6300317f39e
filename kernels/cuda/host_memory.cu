#include "kernels/cuda/host_memory.cuh"

#include <cuda_runtime.h>

namespace strata::kernels::cuda::detail {

std::string RegisterHostMemoryRaw(void* data, size_t bytes) {
  int devices = 0;
  cudaError_t e = cudaGetDeviceCount(&devices);
  if (e != cudaSuccess || devices == 0) {
    return std::string("no CUDA device: ") + (e != cudaSuccess ? cudaGetErrorString(e) : "none visible");
  }
  e = cudaHostRegister(data, bytes, cudaHostRegisterMapped | cudaHostRegisterPortable);
  if (e != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error so later calls are not affected
    return std::string("cudaHostRegister: ") + cudaGetErrorString(e);
  }
  return "";
}

void UnregisterHostMemoryRaw(void* data) {
  if (cudaHostUnregister(data) != cudaSuccess) cudaGetLastError();
}

}  // namespace strata::kernels::cuda::detail
