#include "kernels/cuda/device_buffer.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_status.h"

namespace strata::kernels::cuda {

absl::StatusOr<DeviceBuffer> DeviceBuffer::Allocate(size_t bytes) {
  DeviceBuffer b;
  if (bytes == 0) return b;
  const cudaError_t e = cudaMalloc(&b.data_, bytes);
  if (e != cudaSuccess) {
    cudaGetLastError();  // an allocation failure is not sticky; clear it for later calls
    return CudaStatus(e, absl::StrCat("cudaMalloc of ", bytes, " bytes"));
  }
  b.bytes_ = bytes;
  return b;
}

DeviceBuffer::~DeviceBuffer() {
  if (data_ != nullptr) cudaFree(data_);
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) cudaFree(data_);
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

absl::StatusOr<PinnedBuffer> PinnedBuffer::Allocate(size_t bytes) {
  PinnedBuffer b;
  if (bytes == 0) return b;
  const cudaError_t e = cudaMallocHost(&b.data_, bytes);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return CudaStatus(e, absl::StrCat("cudaMallocHost of ", bytes, " bytes"));
  }
  b.bytes_ = bytes;
  return b;
}

PinnedBuffer::~PinnedBuffer() {
  if (data_ != nullptr) cudaFreeHost(data_);
}

PinnedBuffer::PinnedBuffer(PinnedBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) cudaFreeHost(data_);
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

}  // namespace strata::kernels::cuda
