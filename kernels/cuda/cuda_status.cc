#include "kernels/cuda/cuda_status.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace strata::kernels::cuda {

absl::Status CudaStatus(cudaError_t error, std::string_view what) {
  if (error == cudaSuccess) return absl::OkStatus();
  const std::string message = absl::StrCat(std::string(what), ": ", cudaGetErrorString(error));
  switch (error) {
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInitializationError:
    case cudaErrorDevicesUnavailable:
    case cudaErrorSystemDriverMismatch:
    case cudaErrorCompatNotSupportedOnDevice:
      return absl::UnavailableError(message);
    case cudaErrorMemoryAllocation:
      return absl::ResourceExhaustedError(message);
    case cudaErrorInvalidValue:
    case cudaErrorInvalidConfiguration:
    case cudaErrorInvalidPitchValue:
    case cudaErrorInvalidDevicePointer:
      return absl::InvalidArgumentError(message);
    default:
      return absl::InternalError(message);
  }
}

absl::Status LaunchStatus(std::string_view kernel) { return CudaStatus(cudaGetLastError(), kernel); }

}  // namespace strata::kernels::cuda
