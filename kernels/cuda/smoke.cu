#include "kernels/cuda/smoke.cuh"

#include <cuda_runtime.h>

#include <vector>

namespace strata::kernels::cuda::detail {
namespace {

std::string Describe(cudaError_t e, const char* what) {
  return std::string(what) + ": " + cudaGetErrorString(e);
}

__global__ void AddKernel(const float* a, const float* b, float* c, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) c[i] = a[i] + b[i];
}

}  // namespace

std::string QueryDevicesRaw(RawDeviceInfo* info) {
  cudaError_t e = cudaGetDeviceCount(&info->device_count);
  if (e != cudaSuccess) return Describe(e, "cudaGetDeviceCount");
  if (info->device_count == 0) return "no CUDA device is visible";
  cudaDeviceProp prop{};
  e = cudaGetDeviceProperties(&prop, 0);
  if (e != cudaSuccess) return Describe(e, "cudaGetDeviceProperties");
  info->name = prop.name;
  info->sm_major = prop.major;
  info->sm_minor = prop.minor;
  info->total_memory = prop.totalGlobalMem;
  return "";
}

std::string SmokeTestRaw() {
  constexpr int kN = 256;
  std::vector<float> a(kN), b(kN), c(kN, 0.0f);
  for (int i = 0; i < kN; ++i) {
    a[i] = static_cast<float>(i);
    b[i] = 0.5f * static_cast<float>(i);
  }
  float *da = nullptr, *db = nullptr, *dc = nullptr;
  const size_t bytes = kN * sizeof(float);
  cudaError_t e = cudaMalloc(&da, bytes);
  if (e == cudaSuccess) e = cudaMalloc(&db, bytes);
  if (e == cudaSuccess) e = cudaMalloc(&dc, bytes);
  if (e == cudaSuccess) e = cudaMemcpy(da, a.data(), bytes, cudaMemcpyHostToDevice);
  if (e == cudaSuccess) e = cudaMemcpy(db, b.data(), bytes, cudaMemcpyHostToDevice);
  if (e == cudaSuccess) {
    AddKernel<<<1, kN>>>(da, db, dc, kN);
    e = cudaGetLastError();
  }
  if (e == cudaSuccess) e = cudaMemcpy(c.data(), dc, bytes, cudaMemcpyDeviceToHost);
  cudaFree(da);
  cudaFree(db);
  cudaFree(dc);
  if (e != cudaSuccess) return Describe(e, "smoke kernel");
  for (int i = 0; i < kN; ++i) {
    if (c[i] != 1.5f * static_cast<float>(i)) {
      return "smoke kernel: c[" + std::to_string(i) + "] = " + std::to_string(c[i]) + ", expected " +
             std::to_string(1.5f * static_cast<float>(i));
    }
  }
  return "";
}

}  // namespace strata::kernels::cuda::detail
