// strata-offload-gpu-bench: the two measurements the offload tier's design rests on, as ratios within one run.
//
// 1. CPU/PCIe contention: the DRAM read rate of the host's threads alone, the page-locked host-to-device
//    copy rate alone, and both at once (the copies run on their own thread while the threads read); the
//    offload tier's bound assumes the two add up.
// 2. Copy/compute overlap: a long prompt's experts streamed to VRAM in chunks and computed there
//    (kernels/cuda ExpertFfn), serially (copy a chunk, compute it, the next) and double-buffered (the copy of
//    chunk i+1 on its own stream during the compute of chunk i), beside the bound max(copy, compute).
//
//   strata-offload-gpu-bench [--threads N] [--scheme s2] [--n-embd 2560] [--ff 640] [--experts 256]
//                            [--chunk 32] [--tokens 512] [--k 10]

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <thread>
#include <vector>

#include "bench/bench_util.h"
#include "bench/gpu_bench_util.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/expert_kernels.h"
#include "kernels/format/expert_layout.h"

namespace {

using strata::kernels::cuda::DeviceBuffer;
using strata::kernels::cuda::PinnedBuffer;

void Check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

template <typename T>
T Unwrap(absl::StatusOr<T> v, const char* what) {
  if (!v.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, std::string(v.status().message()).c_str());
    std::exit(1);
  }
  return *std::move(v);
}

void Contention(int threads) {
  strata::bench::DramProbe probe(4096, threads);
  const strata::bench::HostDeviceRates r = Unwrap(strata::bench::MeasureHostDeviceRates(probe, threads, 1.0),
                                                  "CPU/PCIe contention");
  std::printf("CPU/PCIe contention (%d threads reading a %.0f MiB buffer; 256 MiB page-locked copies):\n", threads,
              probe.buffer_bytes() / 1048576.0);
  std::printf("  DRAM read alone       %7.1f GB/s\n", r.dram_alone);
  std::printf("  host-to-device alone  %7.1f GB/s\n", r.pcie_alone);
  std::printf("  both at once          %7.1f + %.1f = %.1f GB/s  (%.2f and %.2f of alone; sum %.2f of the sums)\n",
              r.dram_both, r.pcie_both, r.both(), r.dram_both / r.dram_alone, r.pcie_both / r.pcie_alone,
              r.both() / (r.dram_alone + r.pcie_alone));
}

void Overlap(strata::kernels::Scheme scheme, int64_t n_embd, int64_t ff, int n_experts, int chunk, int n_tokens,
             int k) {
  const strata::kernels::ExpertLayout layout =
      Unwrap(strata::kernels::ComputeExpertLayout(scheme, n_embd, ff), "expert layout");
  const uint64_t blob = layout.blob_bytes;
  n_experts = n_experts / chunk * chunk;
  PinnedBuffer host = Unwrap(PinnedBuffer::Allocate(blob * n_experts), "pinned experts");
  // Codes 0x11 and scales 0x1111 (a small half): finite arithmetic, the timing of real weights.
  std::fill_n(host.as<uint8_t>(), host.bytes(), uint8_t{0x11});
  DeviceBuffer staging = Unwrap(DeviceBuffer::Allocate(2 * chunk * blob), "staging");
  std::vector<const uint8_t*> tables[2];
  DeviceBuffer table[2];
  for (int b = 0; b < 2; ++b) {
    for (int j = 0; j < chunk; ++j) tables[b].push_back(staging.as<uint8_t>() + (b * chunk + j) * blob);
    table[b] = Unwrap(DeviceBuffer::Allocate(chunk * sizeof(void*)), "table");
    Check(cudaMemcpy(table[b].data(), tables[b].data(), chunk * sizeof(void*), cudaMemcpyHostToDevice), "table");
  }
  // Each token picks k distinct experts of the chunk.
  std::mt19937 rng(7);
  std::vector<int32_t> ids;
  std::vector<int32_t> pick(chunk);
  for (int t = 0; t < n_tokens; ++t) {
    for (int j = 0; j < chunk; ++j) pick[j] = j;
    std::shuffle(pick.begin(), pick.end(), rng);
    for (int j = 0; j < std::min(k, chunk); ++j) ids.push_back(pick[j]);
  }
  k = std::min(k, chunk);
  DeviceBuffer d_ids = Unwrap(DeviceBuffer::Allocate(ids.size() * 4), "ids");
  Check(cudaMemcpy(d_ids.data(), ids.data(), ids.size() * 4, cudaMemcpyHostToDevice), "ids");
  DeviceBuffer x = Unwrap(DeviceBuffer::Allocate(static_cast<size_t>(n_tokens) * n_embd * 4), "x");
  Check(cudaMemset(x.data(), 0, x.bytes()), "x");
  DeviceBuffer parts = Unwrap(DeviceBuffer::Allocate(static_cast<size_t>(n_tokens) * k * n_embd * 4), "parts");
  const size_t ws_bytes = strata::kernels::cuda::ExpertFfnWorkspaceBytes(layout, n_tokens, k, chunk);
  DeviceBuffer ws = Unwrap(DeviceBuffer::Allocate(ws_bytes), "workspace");
  Check(cudaDeviceSynchronize(), "setup");
  cudaStream_t compute = nullptr, copy = nullptr;
  Check(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking), "stream");
  Check(cudaStreamCreateWithFlags(&copy, cudaStreamNonBlocking), "stream");
  cudaEvent_t copied[2], freed[2];
  for (int b = 0; b < 2; ++b) {
    Check(cudaEventCreateWithFlags(&copied[b], cudaEventDisableTiming), "event");
    Check(cudaEventCreateWithFlags(&freed[b], cudaEventDisableTiming), "event");
  }
  const int n_chunks = n_experts / chunk;
  auto copy_chunk = [&](int c, int b, cudaStream_t s) {
    Check(cudaMemcpyAsync(staging.as<uint8_t>() + b * chunk * blob, host.as<uint8_t>() + c * chunk * blob,
                          chunk * blob, cudaMemcpyHostToDevice, s),
          "copy");
  };
  auto compute_chunk = [&](int b, cudaStream_t s) {
    const absl::Status st = strata::kernels::cuda::ExpertFfn(
        layout, table[b].as<const uint8_t* const>(), chunk, d_ids.as<int32_t>(), n_tokens, k, x.as<float>(),
        parts.as<float>(), strata::kernels::cuda::ExpertFfnExtras{}, ws.data(), ws_bytes, s);
    if (!st.ok()) {
      std::fprintf(stderr, "ExpertFfn: %s\n", std::string(st.message()).c_str());
      std::exit(1);
    }
  };
  auto timed = [&](auto&& body) {
    body();  // warm-up
    Check(cudaDeviceSynchronize(), "warm-up");
    strata::bench::Timer t;
    body();
    Check(cudaDeviceSynchronize(), "run");
    return t.Seconds();
  };
  const double copy_only = timed([&] {
    for (int c = 0; c < n_chunks; ++c) copy_chunk(c, c % 2, copy);
  });
  const double compute_only = timed([&] {
    for (int c = 0; c < n_chunks; ++c) compute_chunk(c % 2, compute);
  });
  const double serial = timed([&] {
    for (int c = 0; c < n_chunks; ++c) {
      copy_chunk(c, 0, compute);
      compute_chunk(0, compute);
    }
  });
  const double overlapped = timed([&] {
    for (int c = 0; c < n_chunks; ++c) {
      const int b = c % 2;
      Check(cudaStreamWaitEvent(copy, freed[b], 0), "wait");
      copy_chunk(c, b, copy);
      Check(cudaEventRecord(copied[b], copy), "record");
      Check(cudaStreamWaitEvent(compute, copied[b], 0), "wait");
      compute_chunk(b, compute);
      Check(cudaEventRecord(freed[b], compute), "record");
    }
  });
  const double bound = std::max(copy_only, compute_only);
  std::printf("\ncopy/compute overlap: %d %s experts (%.2f MB each) in chunks of %d, %d tokens x top-%d a chunk:\n",
              n_experts, std::string(strata::kernels::SchemeName(scheme)).c_str(), blob / 1e6, chunk, n_tokens, k);
  std::printf("  copy only      %8.2f ms (%.1f GB/s)\n", copy_only * 1e3, n_experts * blob / copy_only / 1e9);
  std::printf("  compute only   %8.2f ms\n", compute_only * 1e3);
  std::printf("  serial         %8.2f ms\n", serial * 1e3);
  std::printf("  double-buffered%8.2f ms  (%.2fx faster than serial; %.2f of the bound max(copy, compute))\n",
              overlapped * 1e3, serial / overlapped, bound / overlapped);
  for (int b = 0; b < 2; ++b) {
    cudaEventDestroy(copied[b]);
    cudaEventDestroy(freed[b]);
  }
  cudaStreamDestroy(compute);
  cudaStreamDestroy(copy);
}

}  // namespace

int main(int argc, char** argv) {
  strata::bench::Flags flags(argc, argv,
                             "usage: strata-offload-gpu-bench [--threads N] [--scheme s2] [--n-embd 2560] [--ff 640] "
                             "[--experts 256] [--chunk 32] [--tokens 512] [--k 10]");
  const int threads =
      static_cast<int>(flags.Int("threads", std::max(1u, std::thread::hardware_concurrency())));
  const std::string scheme_name = flags.String("scheme", "s2");
  const int64_t n_embd = flags.Int("n-embd", 2560);
  const int64_t ff = flags.Int("ff", 640);
  const int experts = static_cast<int>(flags.Int("experts", 256));
  const int chunk = static_cast<int>(flags.Int("chunk", 32));
  const int tokens = static_cast<int>(flags.Int("tokens", 512));
  const int k = static_cast<int>(flags.Int("k", 10));
  flags.CheckNoUnknown();
  const absl::StatusOr<strata::kernels::Scheme> scheme = strata::kernels::ParseScheme(scheme_name);
  if (!scheme.ok() || threads < 1 || chunk < 1 || experts < chunk || tokens < 1 || k < 1) {
    std::fprintf(stderr, "bad flags: a scheme (f16, s8, s4, s2), threads >= 1, 1 <= chunk <= experts, tokens and k >= 1\n");
    return 2;
  }
  Contention(threads);
  Overlap(*scheme, n_embd, ff, experts, chunk, tokens, k);
  return 0;
}
