#include "bench/gpu_bench_util.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/cuda/device_buffer.h"

namespace strata::bench {
namespace {

using kernels::cuda::DeviceBuffer;
using kernels::cuda::PinnedBuffer;

// Copies `src` to `dst` again and again until `stop`, counting the bytes that landed; the first error stops it.
void CopyUntil(const PinnedBuffer& src, const DeviceBuffer& dst, const std::atomic<bool>& stop,
               std::atomic<uint64_t>* copied, cudaError_t* error) {
  cudaStream_t stream = nullptr;
  *error = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  while (*error == cudaSuccess && !stop.load()) {
    *error = cudaMemcpyAsync(dst.data(), src.data(), src.bytes(), cudaMemcpyHostToDevice, stream);
    if (*error == cudaSuccess) *error = cudaStreamSynchronize(stream);
    if (*error == cudaSuccess) copied->fetch_add(src.bytes());
  }
  if (stream != nullptr) cudaStreamDestroy(stream);
}

// Copies on a thread of their own while `during` runs; the copy rate over that time (which starts 100 ms after
// the copies do).
template <typename Fn>
absl::StatusOr<double> CopyGBpsDuring(const PinnedBuffer& src, const DeviceBuffer& dst, Fn during) {
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> copied{0};
  cudaError_t error = cudaSuccess;
  std::thread copier(CopyUntil, std::cref(src), std::cref(dst), std::cref(stop), &copied, &error);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const uint64_t before = copied.load();
  Timer window;
  during();
  const double gbps = static_cast<double>(copied.load() - before) / window.Seconds() / 1e9;
  stop = true;
  copier.join();
  if (error != cudaSuccess) {
    return absl::InternalError(absl::StrCat("host-to-device copies: ", cudaGetErrorString(error)));
  }
  return gbps;
}

}  // namespace

absl::StatusOr<HostDeviceRates> MeasureHostDeviceRates(DramProbe& probe, int threads, double seconds) {
  if (threads < 1 || !(seconds > 0)) {
    return absl::InvalidArgumentError(absl::StrCat("MeasureHostDeviceRates: threads ", threads, " must be at least 1 "
                                                   "and seconds ", seconds, " positive"));
  }
  absl::StatusOr<PinnedBuffer> src = PinnedBuffer::Allocate(size_t{256} << 20);
  if (!src.ok()) return src.status();
  std::fill_n(src->as<uint8_t>(), src->bytes(), uint8_t{1});
  absl::StatusOr<DeviceBuffer> dst = DeviceBuffer::Allocate(src->bytes());
  if (!dst.ok()) return dst.status();
  HostDeviceRates r;
  r.dram_alone = probe.ReadGBps(threads, seconds);
  absl::StatusOr<double> pcie_alone = CopyGBpsDuring(*src, *dst, [seconds] {
    std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  });
  if (!pcie_alone.ok()) return pcie_alone.status();
  r.pcie_alone = *pcie_alone;
  absl::StatusOr<double> pcie_both =
      CopyGBpsDuring(*src, *dst, [&] { r.dram_both = probe.ReadGBps(threads, seconds); });
  if (!pcie_both.ok()) return pcie_both.status();
  r.pcie_both = *pcie_both;
  return r;
}

}  // namespace strata::bench
