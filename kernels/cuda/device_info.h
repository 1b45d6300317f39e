#ifndef STRATA_KERNELS_CUDA_DEVICE_INFO_H_
#define STRATA_KERNELS_CUDA_DEVICE_INFO_H_

// Only compiled and included when STRATA_HAVE_CUDA is defined; the header itself includes no CUDA header.

#include <string>

#include "absl/status/statusor.h"

namespace strata::kernels::cuda {

struct DeviceInfo {
  int device_count = 0;
  std::string name;            // of device 0
  int sm_major = 0;
  int sm_minor = 0;
  size_t total_memory = 0;     // bytes, device 0
};

// Describes the visible CUDA devices; UNAVAILABLE when the driver or a device is missing.
absl::StatusOr<DeviceInfo> QueryDevices();

// Runs a one-block kernel that adds two small vectors and checks the result; proves the toolchain, the
// driver and the device agree. UNAVAILABLE without a device, INTERNAL on a wrong answer.
absl::Status SmokeTest();

// Device memory bandwidth measured by `repeats` device-to-device copies of `bytes` (after a warm-up copy),
// in GB/s counting the bytes read plus the bytes written: the HBM bound benchmarks print their results
// beside. The median of the repeats.
absl::StatusOr<double> MeasureDeviceCopyGBps(size_t bytes = size_t{1} << 30, int repeats = 10);

// Host-to-device bandwidth over PCIe from page-locked memory, GB/s, the median of `repeats` copies.
absl::StatusOr<double> MeasureHostToDeviceGBps(size_t bytes = size_t{1} << 30, int repeats = 5);

// What one kernel adds to a chain of dependent kernels: a CUDA graph of `kernels` launches on one stream, made
// as the decode step's launchers make theirs (programmatic dependent launch when DependentLaunchEnabled), each
// of `blocks` blocks of 128 threads that wait for the kernel before, read a value it wrote (one L2 round trip)
// and write one for the next. Microseconds a kernel, the median of `repeats` replays after a warm-up: the floor
// under each kernel of a decode step, whatever its work. INVALID_ARGUMENT for kernels, blocks or repeats < 1.
absl::StatusOr<double> MeasureDependentKernelMicros(int kernels = 480, int blocks = 132, int repeats = 20);

// The same chain with kernels whose code is large (1,024 multiply-adds after the wait, about 16 KB of SASS):
// kernels_in_turn distinct such kernels launched in turn (1: the same one each time, its code stays in the SMs'
// instruction caches; 16: each one's code has been pushed out by the others' since it last ran, as a decode
// layer's kernels are). The difference between the two is what fetching a kernel's code from L2 costs it.
// Microseconds a kernel; INVALID_ARGUMENT for kernels_in_turn outside [1, 16] or the others < 1.
absl::StatusOr<double> MeasureCodeFetchMicros(int kernels_in_turn, int kernels = 480, int blocks = 132,
                                              int repeats = 20);

}  // namespace strata::kernels::cuda

#endif  // STRATA_KERNELS_CUDA_DEVICE_INFO_H_
