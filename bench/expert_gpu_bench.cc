// strata-expert-gpu-bench: the CUDA routed-expert kernels (kernels/cuda/expert_kernels.h) per scheme, at
// n_embd x expert_ff 2560 x 640 and 2048 x 768, beside the HBM bandwidth measured in the same run:
//  - decode: 512 experts one token each, in one call: GB/s of expert weights read, and the fraction of the
//    copy bandwidth;
//  - batch 1: one seed layer (10 experts, one token) a call, many calls in a CUDA graph: microseconds a call;
//  - prefill: 512 and 4096 tokens, k 10 of 512 experts: time a call and tokens/s.
// Every call reads a layer of 512 distinct experts (0.7 to 5 GB), or for batch 1 rotates through them, so the
// weights come from HBM, not from L2. Times are medians of --repeats, with CUDA events, after a warm-up.

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/expert_kernels.h"
#include "kernels/format/expert_layout.h"
#include "kernels/format/fp16.h"
#include "kernels/format/role_layout.h"

namespace strata::bench {
namespace {

using kernels::ExpertLayout;
using kernels::Scheme;
using kernels::cuda::DeviceBuffer;

constexpr char kUsage[] = "usage: strata-expert-gpu-bench [--schemes=s2,s4,s8,f16] [--repeats=20]";

constexpr int kExperts = 512;           // a layer
constexpr int kSeedExperts = 10;        // k of the batch-1 and prefill calls
constexpr int kBatchOneCalls = 51;      // calls in the batch-1 graph: 510 distinct experts
constexpr int kDistinctHostBlobs = 8;   // random blobs made on the host, copied round the layer
constexpr size_t kCopyBytes = size_t{2} << 30;

void Check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "error: %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

void Check(const absl::Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "error: %s: %s\n", what, std::string(s.message()).c_str());
    std::exit(1);
  }
}

DeviceBuffer Allocate(size_t bytes) {
  absl::StatusOr<DeviceBuffer> b = DeviceBuffer::Allocate(bytes);
  Check(b.status(), "allocation");
  return *std::move(b);
}

template <typename T>
DeviceBuffer Upload(const std::vector<T>& v) {
  DeviceBuffer b = Allocate(v.size() * sizeof(T));
  Check(cudaMemcpy(b.data(), v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), "upload");
  return b;
}

// Median milliseconds of `enqueue` on `stream` over `repeats` timed runs, after two untimed ones.
template <typename F>
double MedianMs(int repeats, cudaStream_t stream, F&& enqueue) {
  enqueue();
  enqueue();
  cudaEvent_t start, stop;
  Check(cudaEventCreate(&start), "cudaEventCreate");
  Check(cudaEventCreate(&stop), "cudaEventCreate");
  std::vector<float> ms(repeats);
  for (float& m : ms) {
    Check(cudaEventRecord(start, stream), "cudaEventRecord");
    enqueue();
    Check(cudaEventRecord(stop, stream), "cudaEventRecord");
    Check(cudaEventSynchronize(stop), "cudaEventSynchronize");
    Check(cudaEventElapsedTime(&m, start, stop), "cudaEventElapsedTime");
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// Random codes; scales and f16 weights made finite and moderate so the float work is ordinary.
std::vector<uint8_t> RandomBlob(const ExpertLayout& l, uint64_t seed) {
  std::vector<uint8_t> blob(l.blob_bytes);
  std::mt19937_64 rng(seed);
  for (size_t i = 0; i + 8 <= blob.size(); i += 8) {
    const uint64_t v = rng();
    for (int j = 0; j < 8; ++j) blob[i + j] = static_cast<uint8_t>(v >> (8 * j));
  }
  for (int r = 0; r < 3; ++r) {
    uint8_t* role = blob.data() + l.role_offset[r];
    const uint64_t halves_from = l.scheme == Scheme::kF16 ? 0 : kernels::layout::CodesBytes(l.scheme, l.rows(r), l.cols(r));
    const uint16_t exponent = l.scheme == Scheme::kF16 ? 0x2C00 : 0x2000;  // about 2^-4 and 2^-7
    if (l.scheme == Scheme::kMxfp4) {  // exponent bytes: scales 2^-10 .. 2^9
      for (uint64_t i = halves_from; i < l.role_bytes[r]; ++i) role[i] = static_cast<uint8_t>(118 + role[i] % 20);
      continue;
    }
    for (uint64_t i = halves_from; i + 2 <= l.role_bytes[r]; i += 2) {
      const uint16_t h = kernels::LoadHalf(role + i);
      kernels::StoreHalf(static_cast<uint16_t>((h & 0x83FF) | exponent), role + i);
    }
  }
  return blob;
}

struct Row {
  std::string scheme, shape;
  double decode_gbps = 0, decode_fraction = 0, batch1_us = 0;
  double prefill_ms[2] = {0, 0}, prefill_tps[2] = {0, 0};
};

constexpr int kPrefillTokens[2] = {512, 4096};

Row BenchScheme(Scheme scheme, int64_t n_embd, int64_t ff, int repeats, double copy_gbps, cudaStream_t stream) {
  absl::StatusOr<ExpertLayout> status_or_layout = kernels::ComputeExpertLayout(scheme, n_embd, ff);
  Check(status_or_layout.status(), "ComputeExpertLayout");
  const ExpertLayout l = *status_or_layout;
  Row row;
  row.scheme = std::string(kernels::SchemeName(scheme));
  row.shape = std::to_string(n_embd) + "x" + std::to_string(ff);
  const double weight_bytes = static_cast<double>(l.weight_bytes());
  std::printf("\n%s %s: %.3f MB of weights an expert, layer of %d experts = %.0f MiB\n", row.scheme.c_str(),
              row.shape.c_str(), weight_bytes / 1e6, kExperts, kExperts * static_cast<double>(l.blob_bytes) / 1048576.0);

  // The layer: kExperts blobs in one allocation, filled round-robin from a few random host blobs.
  DeviceBuffer layer = Allocate(l.blob_bytes * kExperts);
  {
    std::vector<DeviceBuffer> sources;
    for (int i = 0; i < kDistinctHostBlobs; ++i) sources.push_back(Upload(RandomBlob(l, 1000 + i)));
    for (int e = 0; e < kExperts; ++e) {
      Check(cudaMemcpy(layer.as<uint8_t>() + l.blob_bytes * e, sources[e % kDistinctHostBlobs].data(), l.blob_bytes,
                       cudaMemcpyDeviceToDevice),
            "filling the layer");
    }
  }
  std::vector<const uint8_t*> table(kExperts);
  for (int e = 0; e < kExperts; ++e) table[e] = layer.as<const uint8_t>() + l.blob_bytes * e;
  DeviceBuffer d_table = Upload(table);
  const auto* blobs = d_table.as<const uint8_t* const>();

  const int max_tokens = kPrefillTokens[1];
  size_t ws_bytes = kernels::cuda::ExpertFfnWorkspaceBytes(l, max_tokens, kSeedExperts, kExperts);
  ws_bytes = std::max(ws_bytes, kernels::cuda::ExpertFfnWorkspaceBytes(l, kExperts, 1, kExperts));
  DeviceBuffer ws = Allocate(ws_bytes);
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(max_tokens) * n_embd);
  for (float& v : x) v = normal(rng);
  DeviceBuffer d_x = Upload(x);
  DeviceBuffer parts = Allocate(static_cast<size_t>(max_tokens) * kSeedExperts * n_embd * sizeof(float));

  auto call = [&](const int32_t* ids, int n_tokens, int k) {
    Check(kernels::cuda::ExpertFfn(l, blobs, kExperts, ids, n_tokens, k, d_x.as<float>(), parts.as<float>(),
                                   kernels::cuda::ExpertFfnExtras{}, ws.data(), ws_bytes, stream),
          "ExpertFfn");
  };

  // (a) Decode: token t routed to expert t.
  {
    std::vector<int32_t> ids(kExperts);
    for (int t = 0; t < kExperts; ++t) ids[t] = t;
    DeviceBuffer d_ids = Upload(ids);
    const double ms = MedianMs(repeats, stream, [&] { call(d_ids.as<int32_t>(), kExperts, 1); });
    row.decode_gbps = kExperts * weight_bytes / (ms * 1e-3) / 1e9;
    row.decode_fraction = row.decode_gbps / copy_gbps;
    char name[96];
    std::snprintf(name, sizeof name, "%s decode, 512 experts x 1 token (%.1f us)", row.scheme.c_str(), ms * 1e3);
    PrintResult(name, row.decode_gbps, "GB/s", copy_gbps, "HBM copy");
  }

  // (b) Batch 1: call i routes the token to experts 10i .. 10i+9, all calls in one graph.
  {
    std::vector<int32_t> ids(kBatchOneCalls * kSeedExperts);
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i % kExperts);
    DeviceBuffer d_ids = Upload(ids);
    cudaGraph_t graph;
    Check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
    for (int i = 0; i < kBatchOneCalls; ++i) call(d_ids.as<int32_t>() + i * kSeedExperts, 1, kSeedExperts);
    Check(cudaStreamEndCapture(stream, &graph), "cudaStreamEndCapture");
    cudaGraphExec_t exec;
    Check(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
    const double ms = MedianMs(repeats, stream, [&] { Check(cudaGraphLaunch(exec, stream), "cudaGraphLaunch"); });
    row.batch1_us = ms * 1e3 / kBatchOneCalls;
    char name[96];
    std::snprintf(name, sizeof name, "%s batch 1, 10 experts (%.1f us a call)", row.scheme.c_str(), row.batch1_us);
    PrintResult(name, kSeedExperts * weight_bytes / (row.batch1_us * 1e-6) / 1e9, "GB/s", copy_gbps, "HBM copy");
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }

  // (c) Prefill: each token routed to 10 distinct random experts.
  for (int i = 0; i < 2; ++i) {
    const int n_tokens = kPrefillTokens[i];
    std::vector<int32_t> ids(static_cast<size_t>(n_tokens) * kSeedExperts);
    std::vector<int32_t> experts(kExperts);
    for (int e = 0; e < kExperts; ++e) experts[e] = e;
    for (int t = 0; t < n_tokens; ++t) {
      for (int j = 0; j < kSeedExperts; ++j) {
        std::swap(experts[j], experts[j + rng() % (kExperts - j)]);
        ids[t * kSeedExperts + j] = experts[j];
      }
    }
    DeviceBuffer d_ids = Upload(ids);
    const double ms = MedianMs(repeats, stream, [&] { call(d_ids.as<int32_t>(), n_tokens, kSeedExperts); });
    row.prefill_ms[i] = ms;
    row.prefill_tps[i] = n_tokens / (ms * 1e-3);
    const double macs = static_cast<double>(n_tokens) * kSeedExperts * 3 * n_embd * ff;
    std::printf("%s prefill %4d tokens x 10: %8.3f ms, %9.0f tokens/s, %6.1f TOPS (2 x MAC), %6.0f GB/s of weights\n",
                row.scheme.c_str(), n_tokens, ms, row.prefill_tps[i], 2 * macs / (ms * 1e-3) / 1e12,
                kExperts * weight_bytes / (ms * 1e-3) / 1e9);
  }
  return row;
}

int Main(int argc, char** argv) {
  Flags flags(argc, argv, kUsage);
  const std::vector<std::string> scheme_names = flags.StringList("schemes", {"s2", "s4", "s8", "f16"});
  const int repeats = static_cast<int>(flags.Int("repeats", 20));
  flags.CheckNoUnknown();
  if (repeats < 1) {
    std::fprintf(stderr, "error: --repeats must be positive\n%s\n", kUsage);
    return 2;
  }
  std::vector<Scheme> schemes;
  for (const std::string& name : scheme_names) {
    absl::StatusOr<Scheme> s = kernels::ParseScheme(name);
    if (!s.ok()) {
      std::fprintf(stderr, "error: --schemes: %s\n", std::string(s.status().message()).c_str());
      return 2;
    }
    schemes.push_back(*s);
  }

  std::printf("# %s\n", flags.command_line().c_str());
  cudaDeviceProp prop{};
  Check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  std::printf("%s: %d SMs, L2 %.0f MiB, %.1f GiB\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize / 1048576.0,
              prop.totalGlobalMem / 1073741824.0);
  cudaStream_t stream;
  Check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");

  // HBM bandwidth: a device-to-device copy moves every byte twice (read + write).
  double copy_gbps = 0;
  {
    DeviceBuffer src = Allocate(kCopyBytes), dst = Allocate(kCopyBytes);
    Check(cudaMemset(src.data(), 1, kCopyBytes), "cudaMemset");
    const double ms = MedianMs(repeats, stream, [&] {
      Check(cudaMemcpyAsync(dst.data(), src.data(), kCopyBytes, cudaMemcpyDeviceToDevice, stream), "cudaMemcpyAsync");
    });
    copy_gbps = 2.0 * kCopyBytes / (ms * 1e-3) / 1e9;
    std::printf("HBM copy of %.0f MiB: %.0f GB/s read + written (%.0f GB/s of reads alongside as many writes); the\n"
                "bound below is the read + written rate, which a read-only stream can reach\n",
                kCopyBytes / 1048576.0, copy_gbps, copy_gbps / 2);
  }

  std::vector<Row> rows;
  for (const auto& [n_embd, ff] : {std::pair<int64_t, int64_t>{2560, 640}, {2048, 768}}) {
    for (Scheme s : schemes) rows.push_back(BenchScheme(s, n_embd, ff, repeats, copy_gbps, stream));
  }

  std::printf("\n%-6s %-9s | %-10s %-7s | %-9s | %-20s | %-20s\n", "scheme", "shape", "decode", "of HBM", "batch 1",
              "prefill 512", "prefill 4096");
  std::printf("%-6s %-9s | %-10s %-7s | %-9s | %-9s %-10s | %-9s %-10s\n", "", "", "GB/s", "copy", "us/call", "ms",
              "tokens/s", "ms", "tokens/s");
  for (const Row& r : rows) {
    std::printf("%-6s %-9s | %10.0f %7.3f | %9.1f | %9.3f %10.0f | %9.3f %10.0f\n", r.scheme.c_str(), r.shape.c_str(),
                r.decode_gbps, r.decode_fraction, r.batch1_us, r.prefill_ms[0], r.prefill_tps[0], r.prefill_ms[1],
                r.prefill_tps[1]);
  }
  cudaStreamDestroy(stream);
  return 0;
}

}  // namespace
}  // namespace strata::bench

int main(int argc, char** argv) { return strata::bench::Main(argc, argv); }
