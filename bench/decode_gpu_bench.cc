// strata-decode-gpu-bench: decode and prefill tokens/s of the engine on a CUDA device, beside the HBM bound
// measured in the same run (a device-to-device copy).
//
// Decode at batch 1 reads, per token, the routed experts (k per layer) and the dense weights once, so
// t_token >= (expert bytes + dense bytes) / HBM bandwidth (read-only traffic: the copy's read+write rate is
// the bound used). Larger batches print the aggregate tokens/s. Prefill prints tokens/s per prompt length.
//
//   strata-decode-gpu-bench --pack DIR [--concurrency 1,8,32] [--tokens 128] [--prompt 32]
//                           [--prefill 512,4096] [--prefill-chunk 512] [--vram-gib 0]

#include <cstdio>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "bench/bench_util.h"
#include "engine/runtime/engine.h"
#include "kernels/cuda/device_info.h"

namespace {

using strata::runtime::Engine;
using strata::runtime::GenerateRequest;
using strata::runtime::GenerationResult;

struct RunResult {
  double seconds = 0;
  double prefill_tps = 0;  // mean over the sequences
  double decode_tps = 0;   // aggregate over the sequences
  double hit_rate = 0;
};

RunResult RunConcurrent(Engine& engine, int n, int prompt_len, int tokens) {
  std::vector<GenerationResult> results(n);
  std::vector<absl::Notification> done(n);
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
    if (absl::Status s = engine.Submit(r, cb).status(); !s.ok()) {
      std::fprintf(stderr, "submit: %s\n", std::string(s.message()).c_str());
      std::exit(1);
    }
  }
  for (auto& d : done) d.WaitForNotification();
  RunResult out;
  out.seconds = timer.Seconds();
  for (const auto& g : results) {
    if (!g.status.ok()) {
      std::fprintf(stderr, "generation failed: %s\n", std::string(g.status.message()).c_str());
      std::exit(1);
    }
    out.prefill_tps += g.usage.prefill_tokens_per_second / n;
    out.decode_tps += g.usage.decode_tokens_per_second;
    out.hit_rate += g.usage.expert_hit_rate / n;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  strata::bench::Flags flags(argc, argv,
                             "strata-decode-gpu-bench --pack DIR [--concurrency 1,8,32] [--tokens 128] [--prompt 32] "
                             "[--prefill 512,4096] [--prefill-chunk 512] [--vram-gib 0] [--threads N]");
  const std::string pack = flags.String("pack", "");
  const std::vector<int64_t> concurrency = flags.IntList("concurrency", {1, 8, 32});
  const int tokens = static_cast<int>(flags.Int("tokens", 128));
  const int prompt_len = static_cast<int>(flags.Int("prompt", 32));
  const std::vector<int64_t> prefill = flags.IntList("prefill", {512, 4096});
  const int prefill_chunk = static_cast<int>(flags.Int("prefill-chunk", 512));
  const double vram_gib = flags.Double("vram-gib", 0);
  const int threads = static_cast<int>(flags.Int("threads", 0));
  flags.CheckNoUnknown();
  if (pack.empty()) {
    std::fprintf(stderr, "--pack is required (make one with strata-pack synth --pack-only)\n");
    return 2;
  }

  absl::StatusOr<double> hbm = strata::kernels::cuda::MeasureDeviceCopyGBps();
  if (!hbm.ok()) {
    std::fprintf(stderr, "bandwidth probe: %s\n", std::string(hbm.status().message()).c_str());
    return 1;
  }
  int64_t max_seqs = 1;
  for (int64_t n : concurrency) max_seqs = std::max(max_seqs, n);
  int64_t longest = 0;
  for (int64_t p : prefill) longest = std::max(longest, p);
  strata::runtime::EngineOptions eo;
  eo.pack_dir = pack;
  eo.threads = threads;
  eo.max_seqs = static_cast<int>(max_seqs);
  eo.max_ctx = std::max<int64_t>(prompt_len + tokens, longest + 2) + 64;
  eo.prefill_chunk = prefill_chunk;
  eo.device.device = "cuda";
  eo.device.vram_gib = vram_gib;
  strata::bench::Timer load;
  auto engine = Engine::Create(eo);
  if (!engine.ok()) {
    std::fprintf(stderr, "engine: %s\n", std::string(engine.status().message()).c_str());
    return 1;
  }
  const auto& info = (*engine)->info();
  const double bytes_per_token = static_cast<double>(info.expert_bytes_per_token + info.dense_bytes_per_token);
  std::printf("pack %s: %s, %lld layers, %lld experts top-%lld, n_embd %lld, scheme %s; loaded in %.1f s\n",
              pack.c_str(), info.config.arch.c_str(), (long long)info.config.n_layer,
              (long long)info.config.n_expert, (long long)info.config.n_expert_used, (long long)info.config.n_embd,
              info.scheme.c_str(), load.Seconds());
  std::printf("device %s (%s), %.2f GiB in use; HBM copy bandwidth %.0f GB/s (read + write)\n",
              info.backend.name.c_str(), info.backend.isa.c_str(), info.backend.memory_used / 1073741824.0, *hbm);
  std::printf("bytes per decoded token (batch 1): experts %.1f MB + dense %.1f MB = %.1f MB -> bound %.0f tokens/s\n",
              info.expert_bytes_per_token / 1e6, info.dense_bytes_per_token / 1e6, bytes_per_token / 1e6,
              *hbm * 1e9 / bytes_per_token);
  RunConcurrent(**engine, 1, 8, 8);  // warm up: graphs captured, buffers touched
  for (int64_t n : concurrency) {
    RunConcurrent(**engine, static_cast<int>(n), prompt_len, 4);  // capture this batch size's graphs
    const RunResult r = RunConcurrent(**engine, static_cast<int>(n), prompt_len, tokens);
    std::printf("decode batch %2lld: %8.1f tokens/s in all (%.1f per sequence), hit rate %.2f\n", (long long)n,
                r.decode_tps, r.decode_tps / n, r.hit_rate);
    if (n == 1) {
      strata::bench::PrintResult("  decode, batch 1", r.decode_tps, "tokens/s", *hbm * 1e9 / bytes_per_token,
                                 "HBM bound");
    }
  }
  for (int64_t p : prefill) {
    RunConcurrent(**engine, 1, static_cast<int>(p), 1);  // warm up this prompt length
    const RunResult r = RunConcurrent(**engine, 1, static_cast<int>(p), 1);
    std::printf("prefill %5lld tokens: %9.1f tokens/s (chunks of %d)\n", (long long)p, r.prefill_tps, prefill_chunk);
  }
  return 0;
}
