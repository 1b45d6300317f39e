// strata-decode-bench: prefill and decode tokens/s of the CPU engine at 1, 4 and 16 concurrent sequences,
// beside the DRAM-bandwidth bound measured in the same run.
//
// The bound for a batch of one: every decoded token reads its routed experts (k per layer) and the dense
// weights once, so t_token >= (expert bytes + dense bytes) / DRAM bandwidth. For larger batches the bench
// prints the bytes actually read per second against the same bandwidth.
//
//   strata-decode-bench [--pack DIR] [--scheme s4] [--threads N] [--tokens 64] [--prompt 128]
//                       [--concurrency 1,4,16] [--dram-mb 4096]

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "bench/bench_util.h"
#include "engine/runtime/engine.h"
#include "packtool/synth.h"

namespace {

namespace fs = std::filesystem;
using strata::runtime::Engine;
using strata::runtime::GenerateRequest;
using strata::runtime::GenerationResult;

struct RunResult {
  double seconds = 0;
  double prefill_tps = 0;
  double decode_tps = 0;  // aggregate over the sequences
  uint64_t expert_bytes = 0;
  uint64_t tokens = 0;
};

RunResult RunConcurrent(Engine& engine, int n, int prompt_len, int tokens) {
  std::vector<GenerationResult> results(n);
  std::vector<absl::Notification> done(n);
  const auto before = engine.stats();
  strata::bench::Timer timer;
  for (int i = 0; i < n; ++i) {
    GenerateRequest r;
    for (int p = 0; p < prompt_len; ++p) r.prompt_tokens.push_back((i * 131 + p * 7 + 3) % 250 + 1);
    r.sampling.temperature = 0;
    r.sampling.max_tokens = tokens;
    r.sampling.ignore_eos = true;
    strata::runtime::GenerateCallbacks cb;
    cb.on_done = [&results, &done, i](const GenerationResult& g) {
      results[i] = g;
      done[i].Notify();
    };
    if (!engine.Submit(r, cb).ok()) std::abort();
  }
  for (auto& d : done) d.WaitForNotification();
  RunResult out;
  out.seconds = timer.Seconds();
  double prefill = 0, decode = 0;
  for (const auto& g : results) {
    prefill += g.usage.prefill_tokens_per_second;
    decode += g.usage.decode_tokens_per_second;
    out.tokens += g.tokens.size();
  }
  out.prefill_tps = prefill / n;
  out.decode_tps = decode;
  out.expert_bytes = engine.stats().expert_bytes - before.expert_bytes;
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  strata::bench::Flags flags(argc, argv,
                             "usage: strata-decode-bench [--pack DIR] [--scheme s4] [--threads N] [--tokens 64] "
                             "[--prompt 128] [--concurrency 1,4,16] [--dram-mb 4096]");
  std::string pack = flags.String("pack", "");
  const std::string scheme_name = flags.String("scheme", "s4");
  const int threads = static_cast<int>(flags.Int("threads", std::thread::hardware_concurrency()));
  const int tokens = static_cast<int>(flags.Int("tokens", 64));
  const int prompt_len = static_cast<int>(flags.Int("prompt", 128));
  const std::vector<int64_t> concurrency = flags.IntList("concurrency", {1, 4, 16});
  const int64_t dram_mb = flags.Int("dram-mb", 4096);
  flags.CheckNoUnknown();

  if (pack.empty()) {
    pack = "/tmp/strata-decode-bench-small-" + scheme_name;
    if (!fs::exists(pack)) {
      strata::packtool::SynthOptions o;
      o.geometry = *strata::packtool::PresetGeometry("qwen3moe", "small");
      o.pack_scheme = *strata::kernels::ParseScheme(scheme_name);
      o.output = pack;
      o.threads = threads;
      std::printf("synthesizing the small preset as a %s pack in %s ...\n", scheme_name.c_str(), pack.c_str());
      auto m = strata::packtool::SynthesizePack(o, nullptr, nullptr);
      if (!m.ok()) {
        std::fprintf(stderr, "synth: %s\n", std::string(m.status().message()).c_str());
        return 1;
      }
    }
  }
  strata::runtime::EngineOptions eo;
  eo.pack_dir = pack;
  eo.threads = threads;
  eo.max_seqs = 16;
  eo.max_ctx = prompt_len + tokens + 64;
  auto engine = Engine::Create(eo);
  if (!engine.ok()) {
    std::fprintf(stderr, "engine: %s\n", std::string(engine.status().message()).c_str());
    return 1;
  }
  const auto& info = (*engine)->info();
  strata::bench::DramProbe probe(dram_mb, threads);
  const double dram = probe.ReadGBps(threads);
  const double bytes_per_token = static_cast<double>(info.expert_bytes_per_token + info.dense_bytes_per_token);
  std::printf("pack %s: %s, %lld layers, %lld experts top-%lld, n_embd %lld, scheme %s, %d threads, load avg %.1f\n",
              pack.c_str(), info.config.arch.c_str(), (long long)info.config.n_layer,
              (long long)info.config.n_expert, (long long)info.config.n_expert_used, (long long)info.config.n_embd,
              info.scheme.c_str(), threads, strata::bench::LoadAverage());
  std::printf("DRAM read bandwidth %.2f GB/s (%.0f MiB buffer%s%s)\n", dram, probe.buffer_bytes() / 1048576.0,
              probe.note().empty() ? "" : ", ", probe.note().c_str());
  std::printf("bytes per decoded token (batch 1): experts %.2f MB + dense %.2f MB = %.2f MB -> bound %.1f tokens/s\n",
              info.expert_bytes_per_token / 1e6, info.dense_bytes_per_token / 1e6, bytes_per_token / 1e6,
              dram * 1e9 / bytes_per_token);
  RunConcurrent(**engine, 1, 8, 4);  // warm up: page in the weights, spin up the pool
  for (int64_t n : concurrency) {
    const RunResult r = RunConcurrent(**engine, static_cast<int>(n), prompt_len, tokens);
    std::printf("concurrency %2lld: prefill %8.1f tokens/s per sequence, decode %8.1f tokens/s in all (%.1f per "
                "sequence), expert reads %.2f GB/s\n",
                (long long)n, r.prefill_tps, r.decode_tps, r.decode_tps / n, r.expert_bytes / r.seconds / 1e9);
    if (n == 1) {
      strata::bench::PrintResult("  decode, batch 1", r.decode_tps, "tokens/s", dram * 1e9 / bytes_per_token,
                                 "DRAM bound");
    }
  }
  return 0;
}
