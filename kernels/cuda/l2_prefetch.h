#ifndef STRATA_KERNELS_CUDA_L2_PREFETCH_H_
#define STRATA_KERNELS_CUDA_L2_PREFETCH_H_

// Reading weights into the GPU's L2 ahead of the kernels that use them. A decode step's kernels are chains of
// dependent round trips that leave HBM idle most of the time; bytes read into L2 during such a stretch are
// then read by the next kernels at L2's latency and rate. Only a hint: the hardware may drop it, and no
// result depends on it.
//
// Promises: enqueue-only (capturable in a CUDA graph); INVALID_ARGUMENT for more than kMaxPrefetchRanges
// ranges or a misaligned one, otherwise the launch's status. Any thread may call these.

#include <cuda_runtime.h>

#include <cstdint>
#include <span>

#include "absl/status/status.h"

namespace strata::kernels::cuda {

// Device (or mapped host) memory: data 16-byte aligned; bytes rounded down to a multiple of 16.
struct ByteRange {
  const void* data = nullptr;
  uint64_t bytes = 0;
};

inline constexpr int kMaxPrefetchRanges = 8;

// Enqueues one small kernel that starts reading `ranges` into L2 and ends without waiting for them. It does
// not wait for the kernels before it on `stream` either (it reads nothing they write), so it belongs on a side
// stream forked from the step's, joined later.
absl::Status PrefetchToL2(std::span<const ByteRange> ranges, cudaStream_t stream);

// Whether the CUDA backend prefetches the next kernels' dense weights into L2 during a decode step (on by
// default). Process-wide, for benches that compare the two; a CUDA graph keeps what it was captured with.
void SetDenseWeightPrefetch(bool on);
bool DenseWeightPrefetchEnabled();

}  // namespace strata::kernels::cuda

#endif  // STRATA_KERNELS_CUDA_L2_PREFETCH_H_
