#ifndef STRATA_KERNELS_CUDA_SMOKE_CUH_
#define STRATA_KERNELS_CUDA_SMOKE_CUH_

// Plain-C++ boundary between nvcc-compiled code and the rest (which uses Abseil); no CUDA types here.

#include <cstddef>
#include <string>

namespace strata::kernels::cuda::detail {

struct RawDeviceInfo {
  int device_count = 0;
  std::string name;
  int sm_major = 0;
  int sm_minor = 0;
  size_t total_memory = 0;
};

// Each returns an empty string on success, else what failed.
std::string QueryDevicesRaw(RawDeviceInfo* info);
std::string SmokeTestRaw();

}  // namespace strata::kernels::cuda::detail

#endif  // STRATA_KERNELS_CUDA_SMOKE_CUH_
