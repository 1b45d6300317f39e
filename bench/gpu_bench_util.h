#ifndef STRATA_BENCH_GPU_BENCH_UTIL_H_
#define STRATA_BENCH_GPU_BENCH_UTIL_H_

// Host-side measurements that the GPU benches share (built into the *_gpu_bench binaries only).

#include "absl/status/statusor.h"
#include "bench/bench_util.h"

namespace strata::bench {

// The host's DRAM read rate (`probe` with `threads` threads) and the page-locked host-to-device copy rate (256 MiB
// copies on a thread of their own), each alone for `seconds` and then both at once. The offload tier's two miss
// paths draw on the same DRAM, so what they get together is both_*, not the sum of the rates alone.
// INVALID_ARGUMENT for threads < 1 or seconds not positive; a copy's CUDA error as INTERNAL.
struct HostDeviceRates {
  double dram_alone = 0, pcie_alone = 0;
  double dram_both = 0, pcie_both = 0;
  double both() const { return dram_both + pcie_both; }
};
absl::StatusOr<HostDeviceRates> MeasureHostDeviceRates(DramProbe& probe, int threads, double seconds);

}  // namespace strata::bench

#endif  // STRATA_BENCH_GPU_BENCH_UTIL_H_
