#include <algorithm>
#include <vector>

#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/device_info.h"

namespace strata::kernels::cuda {

absl::StatusOr<double> MeasureDeviceCopyGBps(size_t bytes, int repeats) {
  absl::StatusOr<DeviceBuffer> src = DeviceBuffer::Allocate(bytes);
  if (!src.ok()) return src.status();
  absl::StatusOr<DeviceBuffer> dst = DeviceBuffer::Allocate(bytes);
  if (!dst.ok()) return dst.status();
  CUDA_RETURN_IF_ERROR(cudaMemset(src->data(), 1, bytes), "bandwidth probe");
  cudaEvent_t start = nullptr, stop = nullptr;
  CUDA_RETURN_IF_ERROR(cudaEventCreate(&start), "bandwidth probe");
  CUDA_RETURN_IF_ERROR(cudaEventCreate(&stop), "bandwidth probe");
  std::vector<double> gbps;
  absl::Status status = CudaStatus(cudaMemcpy(dst->data(), src->data(), bytes, cudaMemcpyDeviceToDevice), "warm-up");
  for (int i = 0; status.ok() && i < std::max(1, repeats); ++i) {
    cudaEventRecord(start);
    cudaMemcpyAsync(dst->data(), src->data(), bytes, cudaMemcpyDeviceToDevice);
    cudaEventRecord(stop);
    status = CudaStatus(cudaEventSynchronize(stop), "bandwidth probe");
    float ms = 0;
    if (status.ok()) status = CudaStatus(cudaEventElapsedTime(&ms, start, stop), "bandwidth probe");
    if (status.ok()) gbps.push_back(2.0 * static_cast<double>(bytes) / (ms * 1e-3) / 1e9);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  if (!status.ok()) return status;
  std::sort(gbps.begin(), gbps.end());
  return gbps[gbps.size() / 2];
}

absl::StatusOr<double> MeasureHostToDeviceGBps(size_t bytes, int repeats) {
  absl::StatusOr<PinnedBuffer> src = PinnedBuffer::Allocate(bytes);
  if (!src.ok()) return src.status();
  absl::StatusOr<DeviceBuffer> dst = DeviceBuffer::Allocate(bytes);
  if (!dst.ok()) return dst.status();
  std::fill_n(src->as<uint8_t>(), bytes, uint8_t{1});
  cudaEvent_t start = nullptr, stop = nullptr;
  CUDA_RETURN_IF_ERROR(cudaEventCreate(&start), "PCIe probe");
  CUDA_RETURN_IF_ERROR(cudaEventCreate(&stop), "PCIe probe");
  std::vector<double> gbps;
  absl::Status status = absl::OkStatus();
  for (int i = 0; status.ok() && i < std::max(1, repeats); ++i) {
    cudaEventRecord(start);
    cudaMemcpyAsync(dst->data(), src->data(), bytes, cudaMemcpyHostToDevice);
    cudaEventRecord(stop);
    status = CudaStatus(cudaEventSynchronize(stop), "PCIe probe");
    float ms = 0;
    if (status.ok()) status = CudaStatus(cudaEventElapsedTime(&ms, start, stop), "PCIe probe");
    if (status.ok()) gbps.push_back(static_cast<double>(bytes) / (ms * 1e-3) / 1e9);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  if (!status.ok()) return status;
  std::sort(gbps.begin(), gbps.end());
  return gbps[gbps.size() / 2];
}

}  // namespace strata::kernels::cuda
