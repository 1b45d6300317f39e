// strata-expert-gemv-bench: CPU expert throughput (GB/s of expert weight bytes) for each scheme, token
// count and thread count, over a working set of distinct experts far larger than the last-level cache,
// printed beside the DRAM read bandwidth measured with the same thread count in the same run.

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_util.h"
#include "kernels/cpu/expert_forward.h"
#include "kernels/format/fp16.h"
#include "kernels/cpu/role_gemv.h"
#include "kernels/format/role_layout.h"
#include "engine/model/cpu_moe_dispatch.h"
#include "kernels/cpu/quantize.h"
#include "engine/exec/thread_pool.h"

namespace strata::bench {
namespace {

using kernels::ExpertJob;
using kernels::ExpertLayout;
using kernels::ExpertWork;
using kernels::QuantizedActivation;
using kernels::Scheme;
using exec::ThreadPool;

constexpr char kUsage[] =
    "usage: strata-expert-gemv-bench [--schemes=s2,s4,s8,f16] [--n-embd=2048] [--ff=768]\n"
    "  [--working-set-mb=1024] [--threads=<cores>] [--thread-list=1,2,...] [--tokens=1,4]\n"
    "  [--experts-per-call=8] [--seconds=0.4] [--dram-mb=4096] [--spin-us=50] [--barrier]\n"
    "--barrier: each line also runs with a barrier between the gate/up and down phases (the baseline of\n"
    "the pipelined schedule model::RunExpertJobs uses)";

void FillRandom(uint8_t* p, size_t bytes, uint64_t seed) {
  uint64_t s = seed | 1;
  size_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    std::memcpy(p + i, &s, 8);
  }
  for (; i < bytes; ++i) p[i] = static_cast<uint8_t>(i);
}

// Random codes are valid for every scheme; scales (and f16 weights) are made finite and moderate so the
// float work is ordinary.
void SanitizeRole(Scheme s, uint8_t* role, int64_t rows, int64_t cols) {
  if (s == Scheme::kF16) {
    for (int64_t i = 0; i < rows * cols; ++i) {
      const uint16_t h = kernels::LoadHalf(role + 2 * i);
      kernels::StoreHalf(static_cast<uint16_t>((h & 0x83FF) | 0x3000), role + 2 * i);
    }
    return;
  }
  const int64_t codes = kernels::layout::CodesBytes(s, rows, cols);
  const uint64_t bytes = kernels::RoleBytes(s, rows, cols);
  if (s == kernels::Scheme::kMxfp4) {  // exponent bytes: scales 2^-10 .. 2^9, none subnormal or huge
    for (uint64_t i = codes; i < bytes; ++i) role[i] = static_cast<uint8_t>(118 + role[i] % 20);
    return;
  }
  for (uint64_t i = codes; i + 2 <= bytes; i += 2) {
    const uint16_t h = kernels::LoadHalf(role + i);
    kernels::StoreHalf(static_cast<uint16_t>((h & 0x83FF) | 0x2000), role + i);
  }
}

struct Arena {
  MappedBuffer buffer;
  size_t bytes = 0;
};

struct Measurement {
  double gbps = 0;
  double seconds = 0;
  int64_t calls = 0;
};

// Runs model::RunExpertJobs over experts [0, n_experts) in order, experts_per_call at a time, until `seconds`
// have passed and every expert was visited at least once.
Measurement Run(const ExpertLayout& layout, const uint8_t* base, uint64_t stride, int64_t n_experts,
                int experts_per_call, const std::vector<const QuantizedActivation*>& xs,
                std::vector<std::vector<float>>& out_storage, ThreadPool* pool, double seconds,
                model::ExpertPhases phases = model::ExpertPhases::kPipelined) {
  const int tokens = static_cast<int>(xs.size());
  std::vector<std::vector<float*>> outs(experts_per_call);
  for (int j = 0; j < experts_per_call; ++j) {
    for (int t = 0; t < tokens; ++t) outs[j].push_back(out_storage[j * tokens + t].data());
  }
  std::vector<ExpertJob> jobs(experts_per_call);
  ExpertWork work;
  int64_t next = 0, visited = 0, calls = 0;
  const Timer timer;
  while (visited < n_experts || timer.Seconds() < seconds) {
    for (int j = 0; j < experts_per_call; ++j) {
      jobs[j] = ExpertJob{base + stride * static_cast<uint64_t>(next), xs.data(), tokens, outs[j].data()};
      next = next + 1 == n_experts ? 0 : next + 1;
    }
    model::RunExpertJobs(layout, jobs, pool, &work, kernels::ExpertActivation::kSwiGlu, phases);
    visited += experts_per_call;
    ++calls;
  }
  Measurement m;
  m.seconds = timer.Seconds();
  m.calls = calls;
  m.gbps = static_cast<double>(calls) * experts_per_call * layout.weight_bytes() / m.seconds / 1e9;
  return m;
}

int Main(int argc, char** argv) {
  Flags flags(argc, argv, kUsage);
  const std::vector<std::string> scheme_names = flags.StringList("schemes", {"s2", "s4", "s8", "f16"});
  const int64_t n_embd = flags.Int("n-embd", 2048);
  const int64_t ff = flags.Int("ff", 768);
  const int64_t working_set_mb = flags.Int("working-set-mb", 1024);
  const int max_threads = static_cast<int>(
      flags.Int("threads", std::max(1u, std::thread::hardware_concurrency())));
  std::vector<int64_t> thread_list = flags.IntList("thread-list", {});
  const std::vector<int64_t> token_list = flags.IntList("tokens", {1, 4});
  const int experts_per_call = static_cast<int>(flags.Int("experts-per-call", 8));
  const double seconds = flags.Double("seconds", 0.4);
  const int64_t dram_mb = flags.Int("dram-mb", 4096);
  const int spin_us = static_cast<int>(flags.Int("spin-us", 50));
  const bool barrier = flags.Bool("barrier", false);
  flags.CheckNoUnknown();

  if (max_threads < 1 || experts_per_call < 1 || working_set_mb < 1) {
    std::fprintf(stderr, "error: --threads, --experts-per-call and --working-set-mb must be positive\n%s\n",
                 kUsage);
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
  for (int64_t t : token_list) {
    if (t < 1 || t > 64) {
      std::fprintf(stderr, "error: --tokens items must be 1..64\n");
      return 2;
    }
  }
  if (thread_list.empty()) {
    for (int t = 1; t < max_threads; t *= 2) thread_list.push_back(t);
    thread_list.push_back(max_threads);
  }
  for (Scheme s : schemes) {
    if (absl::Status st = kernels::ComputeExpertLayout(s, n_embd, ff).status();
        !st.ok()) {
      std::fprintf(stderr, "error: --n-embd/--ff: %s\n", std::string(st.message()).c_str());
      return 2;
    }
  }

  std::printf("# %s\n", flags.command_line().c_str());
  std::printf("cpu path %s, %u hardware threads, LLC %.1f MiB reported, memory %.1f GiB, load average %.2f\n",
              std::string(kernels::CpuPathName(kernels::BestCpuPath())).c_str(),
              std::thread::hardware_concurrency(), LastLevelCacheBytes() / 1048576.0,
              PhysicalMemoryBytes() / 1073741824.0, LoadAverage());

  // The DRAM bound, per thread count.
  std::vector<double> dram(thread_list.size());
  {
    DramProbe probe(dram_mb, max_threads);
    std::printf("DRAM read probe over %.0f MiB%s%s\n", probe.buffer_bytes() / 1048576.0,
                probe.note().empty() ? "" : ": ", probe.note().c_str());
    for (size_t i = 0; i < thread_list.size(); ++i) {
      dram[i] = probe.ReadGBps(static_cast<int>(thread_list[i]));
      std::printf("  DRAM read, %2lld threads: %7.2f GB/s\n", static_cast<long long>(thread_list[i]), dram[i]);
    }
  }

  Arena arena;
  arena.bytes = static_cast<size_t>(working_set_mb) << 20;
  arena.buffer = AllocateTouched(arena.bytes, max_threads);
  FillRandom(arena.buffer.get(), arena.bytes, 0x9E3779B97F4A7C15ull);

  // Activations: the same tokens for every expert (what differs between experts is the weights).
  const int64_t max_tokens = *std::max_element(token_list.begin(), token_list.end());
  std::vector<QuantizedActivation> acts(max_tokens);
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (QuantizedActivation& a : acts) {
    std::vector<float> x(n_embd);
    for (float& v : x) v = dist(rng);
    kernels::QuantizeActivation(x.data(), n_embd, &a);
  }

  for (Scheme s : schemes) {
    const ExpertLayout layout = *kernels::ComputeExpertLayout(s, n_embd, ff);
    const uint64_t stride = layout.blob_bytes;
    const int64_t n_experts = static_cast<int64_t>(arena.bytes / stride);
    if (n_experts < 1) {
      std::fprintf(stderr, "error: --working-set-mb holds no %s expert\n", std::string(kernels::SchemeName(s)).c_str());
      return 2;
    }
    for (int64_t e = 0; e < n_experts; ++e) {
      uint8_t* blob = arena.buffer.get() + stride * e;
      SanitizeRole(s, blob + layout.role_offset[kernels::kGate], ff, n_embd);
      SanitizeRole(s, blob + layout.role_offset[kernels::kUp], ff, n_embd);
      SanitizeRole(s, blob + layout.role_offset[kernels::kDown], n_embd, ff);
    }
    std::printf("\n%s: expert %lldx%lld, %.3f MB of weights, %lld experts (%.0f MiB), %d experts a call\n",
                std::string(kernels::SchemeName(s)).c_str(), static_cast<long long>(n_embd),
                static_cast<long long>(ff), layout.weight_bytes() / 1e6,
                static_cast<long long>(n_experts), n_experts * stride / 1048576.0, experts_per_call);
    std::vector<std::vector<float>> out_storage(experts_per_call * max_tokens, std::vector<float>(n_embd));
    for (int64_t tokens : token_list) {
      std::vector<const QuantizedActivation*> xs;
      for (int64_t t = 0; t < tokens; ++t) xs.push_back(&acts[t]);
      for (size_t i = 0; i < thread_list.size(); ++i) {
        const int threads = static_cast<int>(thread_list[i]);
        std::unique_ptr<ThreadPool> pool = *ThreadPool::Create(threads, spin_us);
        const Measurement m = Run(layout, arena.buffer.get(), stride, n_experts, experts_per_call, xs,
                                  out_storage, pool.get(), seconds);
        char name[96];
        std::snprintf(name, sizeof name, "%s tokens=%lld threads=%d (%.1f us/call)",
                      std::string(kernels::SchemeName(s)).c_str(), static_cast<long long>(tokens), threads,
                      m.seconds / m.calls * 1e6);
        PrintResult(name, m.gbps, "GB/s", dram[i], "DRAM read");
        if (barrier) {
          const Measurement b = Run(layout, arena.buffer.get(), stride, n_experts, experts_per_call, xs, out_storage,
                                    pool.get(), seconds, model::ExpertPhases::kBarrier);
          std::snprintf(name, sizeof name, "  with a barrier between phases (%.1f us/call)", b.seconds / b.calls * 1e6);
          PrintResult(name, b.gbps, "GB/s", m.gbps, "pipelined");
        }
      }
      // The same few experts over and over: cache-resident, so this is the compute ceiling.
      std::unique_ptr<ThreadPool> pool = *ThreadPool::Create(max_threads, spin_us);
      const Measurement hot = Run(layout, arena.buffer.get(), stride, std::min<int64_t>(n_experts, experts_per_call),
                                  experts_per_call, xs, out_storage, pool.get(), seconds / 2);
      std::printf("%-44s %9.2f GB/s (cache-resident, %d threads)\n",
                  (std::string(kernels::SchemeName(s)) + " tokens=" + std::to_string(tokens) + " hot").c_str(),
                  hot.gbps, max_threads);
    }
  }
  std::printf("\nload average at the end %.2f\n", LoadAverage());
  return 0;
}

}  // namespace
}  // namespace strata::bench

int main(int argc, char** argv) { return strata::bench::Main(argc, argv); }
