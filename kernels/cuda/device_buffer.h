#ifndef STRATA_KERNELS_CUDA_DEVICE_BUFFER_H_
#define STRATA_KERNELS_CUDA_DEVICE_BUFFER_H_

// Owning handles for device memory and page-locked host memory (cudaMalloc / cudaMallocHost). Move-only;
// the memory is freed when the handle is destroyed. Not thread-safe; the owner decides who may use it.

#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"

namespace strata::kernels::cuda {

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  // RESOURCE_EXHAUSTED (with the size) when the device has not that much free memory.
  static absl::StatusOr<DeviceBuffer> Allocate(size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return data_; }
  template <typename T>
  T* as() const { return static_cast<T*>(data_); }
  size_t bytes() const { return bytes_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  static absl::StatusOr<PinnedBuffer> Allocate(size_t bytes);
  ~PinnedBuffer();
  PinnedBuffer(PinnedBuffer&& other) noexcept;
  PinnedBuffer& operator=(PinnedBuffer&& other) noexcept;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  void* data() const { return data_; }
  template <typename T>
  T* as() const { return static_cast<T*>(data_); }
  size_t bytes() const { return bytes_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace strata::kernels::cuda

#endif  // STRATA_KERNELS_CUDA_DEVICE_BUFFER_H_
