#include "kernels/cuda/device_info.h"

#include "kernels/cuda/smoke.cuh"

namespace strata::kernels::cuda {

absl::StatusOr<DeviceInfo> QueryDevices() {
  detail::RawDeviceInfo raw;
  if (std::string err = detail::QueryDevicesRaw(&raw); !err.empty()) return absl::UnavailableError(err);
  return DeviceInfo{raw.device_count, raw.name, raw.sm_major, raw.sm_minor, raw.total_memory};
}

absl::Status SmokeTest() {
  std::string err = detail::SmokeTestRaw();
  if (err.empty()) return absl::OkStatus();
  if (err.rfind("smoke kernel: c[", 0) == 0) return absl::InternalError(err);
  return absl::UnavailableError(err);
}

}  // namespace strata::kernels::cuda
