#include "kernels/cuda/dependent_launch.h"

#include <cuda_runtime.h>

#include <atomic>

namespace strata::kernels::cuda {
namespace {

// -1: not decided yet (the first query looks at the device); 0 off; 1 on.
std::atomic<int> g_dependent_launch{-1};

bool DeviceSupportsIt() {
  if (STRATA_CUDA_MIN_ARCH < 90) return false;  // some kernels were compiled without their wait
  int device = 0, major = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return false;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) return false;
  return major >= 9;
}

}  // namespace

void SetDependentLaunch(bool on) { g_dependent_launch.store(on && DeviceSupportsIt() ? 1 : 0); }

bool DependentLaunchEnabled() {
  int v = g_dependent_launch.load(std::memory_order_relaxed);
  if (v < 0) {
    const int decided = DeviceSupportsIt() ? 1 : 0;
    g_dependent_launch.compare_exchange_strong(v, decided);
    v = g_dependent_launch.load();
  }
  return v == 1;
}

}  // namespace strata::kernels::cuda
