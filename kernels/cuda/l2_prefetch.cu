#include "kernels/cuda/l2_prefetch.h"

#include <atomic>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/l2_prefetch.cuh"

namespace strata::kernels::cuda {
namespace {

std::atomic<bool> g_dense_weight_prefetch{true};

constexpr int kPrefetchBlocks = 8;
constexpr int kPrefetchThreads = 64;

struct PrefetchRanges {
  const uint8_t* data[kMaxPrefetchRanges];
  uint64_t pieces_before[kMaxPrefetchRanges + 1];  // pieces of the ranges before each; the last: all
  uint64_t bytes[kMaxPrefetchRanges];
  int n;
};

// Thread i of the grid asks for pieces i, i + threads, ... of the ranges laid end to end.
__global__ void __launch_bounds__(kPrefetchThreads) PrefetchKernel(const PrefetchRanges r) {
  const uint64_t threads = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  int range = 0;
  for (uint64_t piece = blockIdx.x * blockDim.x + threadIdx.x; piece < r.pieces_before[r.n]; piece += threads) {
    while (piece >= r.pieces_before[range + 1]) ++range;
    const uint64_t at = (piece - r.pieces_before[range]) * kPrefetchPiece;
    const uint64_t left = r.bytes[range] - at;
    PrefetchPieceToL2(r.data[range] + at, static_cast<uint32_t>(left < kPrefetchPiece ? left : kPrefetchPiece));
  }
}

}  // namespace

absl::Status PrefetchToL2(std::span<const ByteRange> ranges, cudaStream_t stream) {
  if (ranges.size() > static_cast<size_t>(kMaxPrefetchRanges)) {
    return absl::InvalidArgumentError(
        absl::StrCat("PrefetchToL2: ", ranges.size(), " ranges, at most ", kMaxPrefetchRanges));
  }
  PrefetchRanges r{};
  for (const ByteRange& range : ranges) {
    if (reinterpret_cast<uintptr_t>(range.data) % 16 != 0) {
      return absl::InvalidArgumentError("PrefetchToL2: a range's data is not 16-byte aligned");
    }
    const uint64_t bytes = range.bytes / 16 * 16;
    if (range.data == nullptr || bytes == 0) continue;
    r.data[r.n] = static_cast<const uint8_t*>(range.data);
    r.bytes[r.n] = bytes;
    r.pieces_before[r.n + 1] = r.pieces_before[r.n] + (bytes + kPrefetchPiece - 1) / kPrefetchPiece;
    ++r.n;
  }
  if (r.n == 0) return absl::OkStatus();
  // A plain launch (no programmatic dependency): see the header.
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(kPrefetchBlocks);
  config.blockDim = dim3(kPrefetchThreads);
  config.stream = stream;
  return CudaStatus(cudaLaunchKernelEx(&config, PrefetchKernel, r), "PrefetchToL2");
}

void SetDenseWeightPrefetch(bool on) { g_dense_weight_prefetch.store(on); }

bool DenseWeightPrefetchEnabled() { return g_dense_weight_prefetch.load(std::memory_order_relaxed); }

}  // namespace strata::kernels::cuda
