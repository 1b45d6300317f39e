#include "kernels/cuda/host_memory.h"

#include "kernels/cuda/host_memory.cuh"

namespace strata::kernels::cuda {

absl::Status RegisterHostMemory(void* data, size_t bytes) {
  const std::string err = detail::RegisterHostMemoryRaw(data, bytes);
  if (err.empty()) return absl::OkStatus();
  return absl::UnavailableError(err);
}

void UnregisterHostMemory(void* data) { detail::UnregisterHostMemoryRaw(data); }

}  // namespace strata::kernels::cuda
