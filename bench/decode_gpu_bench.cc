// strata-decode-gpu-bench: decode and prefill tokens/s of the engine on a CUDA device, beside the HBM bound
// measured in the same run (a device-to-device copy).
//
// Decode at batch 1 reads, per token, the routed experts (k per layer) and the dense weights once, so
// t_token >= (expert bytes + dense bytes) / HBM bandwidth (read-only traffic: the copy's read+write rate is
// the bound used). Larger batches print the aggregate tokens/s. Prefill prints tokens/s per prompt length.
//
//   strata-decode-gpu-bench --pack DIR [--concurrency 1,8,32] [--tokens 128] [--prompt 32]
//                           [--prefill 512,4096] [--prefill-chunk 512] [--vram-gib 0]
//                           [--vram-experts -1,0,6144] [--cache-policy lru,lfu-decay,static] [--miss-path both]
//                           [--router-skew S] [--arch A --preset P --layers N --experts N --scheme S]
// With --vram-experts below the expert count the experts not in VRAM (misses) are computed by the host's
// threads from the arena and/or read over PCIe by the GPU (--miss-path cpu, gpu or both). The decode bound
// printed is the slower of the HBM time (dense + hits) and the miss time: miss bytes over the bandwidth of
// the paths used, each measured in the run (PCIe: a page-locked host-to-device copy; CPU: a DRAM read over
// the engine's threads); with both paths, over what the two give at once (a DRAM read while page-locked
// copies run: the copies read the same DRAM, so this is less than the sum of the two measured apart, which
// the bound used before the sixteenth session of bench/RESULTS.md). Prefill is bound by copying every expert
// once a prompt over PCIe.
//
// --cache-policy takes a list: each cache size runs once per policy, and a table at the end gives each one's
// hit rate and tokens/s. static starts from the pack's routing profile: when the list names static and the
// pack has none, the bench first profiles the pack on the CPU over its own decode prompts (those of batch 1
// and 8, each followed by --tokens greedy tokens, as strata-pack profile counts) and says so. A missing --pack is
// synthesized: the --arch's --preset geometry (qwen3moe's seed by default), with --layers or --experts in place
// of the preset's where given (DeepSeek-V3's shapes in 6 layers, say), and with --router-skew S expert popularity
// skewed by a Zipf law of exponent S (strata-pack synth --router-skew); the header prints the skew the pack was
// made with.

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/notification.h"
#include "bench/bench_util.h"
#include "bench/gpu_bench_util.h"
#include "engine/gguf/gguf_file.h"
#include "engine/model/expert_cache_policy.h"
#include "engine/pack/routing_profile.h"
#include "engine/runtime/engine.h"
#include "kernels/cuda/dependent_launch.h"
#include "kernels/cuda/device_info.h"
#include "packtool/routing_profiler.h"
#include "packtool/synth.h"
#include "packtool/synth_router_skew.h"

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

// Sequence i's prompt of `prompt_len` tokens.
std::vector<int32_t> BenchPrompt(int i, int prompt_len) {
  std::vector<int32_t> prompt;
  for (int p = 0; p < prompt_len; ++p) prompt.push_back((i * 131 + p * 7 + 3) % 250 + 1);
  return prompt;
}

RunResult RunConcurrent(Engine& engine, int n, int prompt_len, int tokens) {
  std::vector<GenerationResult> results(n);
  std::vector<absl::Notification> done(n);
  strata::bench::Timer timer;
  for (int i = 0; i < n; ++i) {
    GenerateRequest r;
    r.prompt_tokens = BenchPrompt(i, prompt_len);
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

// Profiles `pack` on the CPU into its routing_profile.bin (the static policy's warm start) over the decode
// runs' own prompts (sequences 0 .. sequences-1, then `tokens` greedy tokens each, as the runs generate);
// exits on error.
void ProfileForStatic(const std::string& pack, int sequences, int prompt_len, int tokens, int threads) {
  std::printf("the static policy starts from the pack's routing profile and %s has none: profiling it on the CPU "
              "first over the decode runs' %d prompts of %d tokens, %d tokens generated after each (as strata-pack "
              "profile does) ...\n",
              pack.c_str(), sequences, prompt_len, tokens);
  std::fflush(stdout);
  strata::packtool::ProfileOptions o;
  o.pack_dir = pack;
  for (int i = 0; i < sequences; ++i) o.prompt_tokens.push_back(BenchPrompt(i, prompt_len));
  o.decode_tokens = tokens;
  o.threads = threads;
  absl::StatusOr<strata::packtool::ProfileResult> r = strata::packtool::ProfilePack(o, nullptr);
  if (!r.ok()) {
    std::fprintf(stderr, "profile: %s\n", std::string(r.status().message()).c_str());
    std::exit(1);
  }
  const strata::packtool::ProfileSkew skew = strata::packtool::MeasureSkew(r->profile);
  std::printf("profiled %llu tokens in %.1f s: the hottest expert %.2fx its layer's mean, %llu of %zu never picked\n",
              (unsigned long long)r->profile.tokens, r->seconds, skew.hottest_over_mean,
              (unsigned long long)skew.never_picked, r->profile.counts.size());
}

// One run's decode result, for the summary table.
struct SummaryRow {
  int64_t slots;
  std::string reads, policy, launches, prompt_math;
  int prefetch;
  int64_t batch;
  double hit_rate, tokens_per_second, bound;
};

}  // namespace

int main(int argc, char** argv) {
  strata::bench::Flags flags(argc, argv,
                             "usage: strata-decode-gpu-bench --pack DIR [--concurrency 1,8,32] [--tokens 128] "
                             "[--prompt 32] [--prefill 512,4096] [--prefill-chunk 512] [--vram-gib 0] [--threads N] "
                             "[--vram-experts -1] [--cache-policy lru,lfu-decay,static] [--miss-path both] "
                             "[--gpu-miss-reads staged,in-place] [--dependent-launch on,off] [--fuse-qk-rope on,off] "
                             "[--prompt-math fp32,split-tf32] [--prefetch-experts 0,4] "
                             "[--prefetch-start after-layer|with-guess] "
                             "[--arch qwen3moe --preset seed --layers N --experts N --scheme s2 --router-skew S "
                             "(to make --pack when it does not exist)]");
  const std::string pack = flags.String("pack", "");
  const std::vector<int64_t> concurrency = flags.IntList("concurrency", {1, 8, 32});
  const int tokens = static_cast<int>(flags.Int("tokens", 128));
  const int prompt_len = static_cast<int>(flags.Int("prompt", 32));
  const std::vector<int64_t> prefill = flags.IntList("prefill", {512, 4096});
  const int prefill_chunk = static_cast<int>(flags.Int("prefill-chunk", 512));
  const double vram_gib = flags.Double("vram-gib", 0);
  const int threads = static_cast<int>(flags.Int("threads", 0));
  const std::vector<int64_t> vram_experts = flags.IntList("vram-experts", {-1});
  // Each cache size runs once per policy.
  const std::vector<std::string> policies = flags.StringList("cache-policy", {"lfu-decay"});
  const std::string miss_path = flags.String("miss-path", "both");
  // How the GPU reads its decode misses: copied into VRAM first (staged) or inside the expert kernel (in-place);
  // each cache size with misses runs once per item.
  const std::vector<std::string> miss_reads = flags.StringList("gpu-miss-reads", {"staged"});
  // Kernels launched with programmatic dependent launch (on) or plainly (off); every configuration runs
  // once per item.
  const std::vector<std::string> dependent_launch = flags.StringList("dependent-launch", {"on"});
  // Decode attention fused with the q/k norm and RoPE (on) or after it (off): runtime::DeviceOptions::fuse_qk_rope.
  const std::vector<std::string> fuse_qk_rope = flags.StringList("fuse-qk-rope", {"on"});
  // How prompt steps multiply the dense weights (runtime::DeviceOptions::prompt_math); every configuration runs once
  // per item.
  const std::vector<std::string> prompt_maths = flags.StringList("prompt-math", {"fp32"});
  // Decode experts copied ahead per layer from a guess of its routing (runtime::DeviceOptions::prefetch_experts);
  // each cache size with misses runs once per item.
  const std::vector<int64_t> prefetch_experts =
      flags.IntList("prefetch-experts", {strata::runtime::DeviceOptions().prefetch_experts});
  const std::string prefetch_start = flags.String("prefetch-start", "after-layer");
  if (prefetch_start != "after-layer" && prefetch_start != "with-guess") {
    std::fprintf(stderr, "--prefetch-start: '%s' is not after-layer or with-guess\n", prefetch_start.c_str());
    return 2;
  }
  const std::string flags_arch = flags.String("arch", "qwen3moe");
  const std::string flags_preset = flags.String("preset", "seed");
  // 0: the preset's. A preset's geometry with fewer layers or experts fits a flagship's shapes on one machine.
  const int64_t flags_layers = flags.Int("layers", 0);
  const int64_t flags_experts = flags.Int("experts", 0);
  const std::string flags_scheme = flags.String("scheme", "s2");
  // -1: not given (a missing pack is made uniform; an existing one is taken as it is).
  const double router_skew = flags.Double("router-skew", -1);
  flags.CheckNoUnknown();
  if (pack.empty()) {
    std::fprintf(stderr, "--pack is required\n");
    return 2;
  }
  for (const std::string& policy : policies) {
    if (absl::Status s = strata::model::ParseCachePolicy(policy).status(); !s.ok()) {
      std::fprintf(stderr, "--cache-policy: %s\n", std::string(s.message()).c_str());
      return 2;
    }
  }
  if (flags_layers < 0 || flags_experts < 0) {
    std::fprintf(stderr, "--layers %lld, --experts %lld: expected a count, or 0 for the preset's\n",
                 static_cast<long long>(flags_layers), static_cast<long long>(flags_experts));
    return 2;
  }
  // The pack synth makes when --pack does not exist: the preset's geometry with random codes (strata-pack synth
  // --arch A --preset P [--layers N --experts N] --pack-only), with the router skew asked for.
  absl::StatusOr<strata::packtool::SynthGeometry> geometry = strata::packtool::PresetGeometry(flags_arch, flags_preset);
  if (geometry.ok() && flags_layers > 0) geometry->n_layer = flags_layers;
  if (geometry.ok() && flags_experts > 0) geometry->n_expert = flags_experts;
  if (geometry.ok()) {
    if (absl::Status s = strata::packtool::CheckSynthGeometry(*geometry); !s.ok()) geometry = s;
  }
  absl::StatusOr<strata::kernels::Scheme> scheme = strata::kernels::ParseScheme(flags_scheme);
  if (!geometry.ok() || !scheme.ok()) {
    std::fprintf(stderr, "--arch/--preset/--layers/--experts/--scheme: %s\n",
                 std::string((geometry.ok() ? scheme.status() : geometry.status()).message()).c_str());
    return 2;
  }
  if (router_skew != -1) {
    if (absl::Status s = strata::packtool::CheckRouterSkew(geometry->arch, geometry->n_expert,
                                                           geometry->n_expert_used, router_skew);
        !s.ok()) {
      std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
      return 2;
    }
  }
  for (const std::string& reads : miss_reads) {
    if (reads != "staged" && reads != "in-place") {
      std::fprintf(stderr, "--gpu-miss-reads: %s is neither staged nor in-place\n", reads.c_str());
      return 2;
    }
  }
  for (const std::string& d : dependent_launch) {
    if (d != "on" && d != "off") {
      std::fprintf(stderr, "--dependent-launch: %s is neither on nor off\n", d.c_str());
      return 2;
    }
  }
  for (const std::string& f : fuse_qk_rope) {
    if (f != "on" && f != "off") {
      std::fprintf(stderr, "--fuse-qk-rope: %s is neither on nor off\n", f.c_str());
      return 2;
    }
  }
  for (const std::string& m : prompt_maths) {
    if (m != "split-tf32" && m != "fp32") {
      std::fprintf(stderr, "--prompt-math: %s is neither split-tf32 nor fp32\n", m.c_str());
      return 2;
    }
  }
  if (!std::filesystem::exists(pack)) {
    strata::packtool::SynthOptions o;
    o.geometry = *geometry;
    o.pack_scheme = *scheme;
    o.exact_quantize = false;
    o.router_skew = std::max(router_skew, 0.0);
    o.output = pack;
    strata::bench::Timer synth;
    auto m = strata::packtool::SynthesizePack(o, nullptr, nullptr);
    if (!m.ok()) {
      std::fprintf(stderr, "synth: %s\n", std::string(m.status().message()).c_str());
      return 1;
    }
    std::printf("synthesized %s's %s preset (%lld layers, %lld experts) as a %s pack in %s in %.1f s (%.1f GB of "
                "experts), router skew %g\n",
                flags_arch.c_str(), flags_preset.c_str(), static_cast<long long>(o.geometry.n_layer),
                static_cast<long long>(o.geometry.n_expert), flags_scheme.c_str(), pack.c_str(), synth.Seconds(),
                m->experts_bytes() / 1e9, o.router_skew);
  }
  // The skew the pack was synthesized with (dense.gguf records it), which an existing pack must match.
  absl::StatusOr<std::unique_ptr<strata::gguf::GgufFile>> dense =
      strata::gguf::GgufFile::Open((std::filesystem::path(pack) / "dense.gguf").string());
  if (!dense.ok()) {
    std::fprintf(stderr, "%s\n", std::string(dense.status().message()).c_str());
    return 1;
  }
  const double pack_skew = strata::packtool::RecordedRouterSkew((*dense)->metadata());
  dense->reset();
  if (router_skew != -1 && std::abs(router_skew - pack_skew) > 1e-6) {
    std::fprintf(stderr,
                 "--router-skew %g: %s exists and was synthesized with router skew %g; drop the flag, or remove the "
                 "pack (or name another --pack) to synthesize it anew\n",
                 router_skew, pack.c_str(), pack_skew);
    return 2;
  }
  int64_t max_seqs = 1;
  for (int64_t n : concurrency) max_seqs = std::max(max_seqs, n);
  // A policy decides something only where not every expert is in VRAM (--vram-experts >= 0).
  const bool runs_static = std::find(policies.begin(), policies.end(), "static") != policies.end() &&
                           std::any_of(vram_experts.begin(), vram_experts.end(), [](int64_t s) { return s >= 0; });
  if (runs_static && !std::filesystem::exists(std::filesystem::path(pack) / strata::pack::kRoutingProfileFile)) {
    // The prompts of batch 1 and 8 (decode on the CPU is slow: a larger batch's other prompts are left out).
    ProfileForStatic(pack, static_cast<int>(std::min<int64_t>(8, max_seqs)), prompt_len, tokens, threads);
  }

  absl::StatusOr<double> hbm = strata::kernels::cuda::MeasureDeviceCopyGBps();
  absl::StatusOr<double> pcie = strata::kernels::cuda::MeasureHostToDeviceGBps();
  if (!hbm.ok() || !pcie.ok()) {
    std::fprintf(stderr, "bandwidth probe: %s\n", std::string((hbm.ok() ? pcie : hbm).status().message()).c_str());
    return 1;
  }
  const int host_threads = threads > 0 ? threads : static_cast<int>(std::thread::hardware_concurrency());
  double dram = 0;
  // The miss paths run at once and read the same DRAM: what they get together is measured, not summed.
  absl::StatusOr<strata::bench::HostDeviceRates> both = absl::UnknownError("not measured");
  {
    strata::bench::DramProbe probe(2048, host_threads);
    const bool misses = std::any_of(vram_experts.begin(), vram_experts.end(), [](int64_t s) { return s >= 0; });
    if (miss_path == "both" && misses) {
      both = strata::bench::MeasureHostDeviceRates(probe, host_threads, 0.5);
      if (!both.ok()) {
        std::fprintf(stderr, "DRAM and PCIe at once: %s\n", std::string(both.status().message()).c_str());
        return 1;
      }
      dram = both->dram_alone;
    } else {
      dram = probe.ReadGBps(host_threads);
    }
  }
  std::printf("HBM copy bandwidth %.0f GB/s (read + write); PCIe host-to-device %.1f GB/s (page-locked); DRAM read "
              "%.1f GB/s (%d threads)\n",
              *hbm, *pcie, dram, host_threads);
  if (both.ok()) {
    std::printf("DRAM read and host-to-device copies at once: %.1f + %.1f = %.1f GB/s (%.2f of the %.1f GB/s they "
                "give apart): the miss bound below\n",
                both->dram_both, both->pcie_both, both->both(), both->both() / (both->dram_alone + both->pcie_alone),
                both->dram_alone + both->pcie_alone);
  }
  // The floor under each kernel of a decode step: a decode layer is a chain of about ten dependent kernels.
  const absl::StatusOr<double> link = strata::kernels::cuda::MeasureDependentKernelMicros();
  if (link.ok()) {
    std::printf("a kernel in a chain of dependent kernels (480 in a graph, 132 blocks, one L2 read each, dependent "
                "launch %s): %.2f us\n",
                strata::kernels::cuda::DependentLaunchEnabled() ? "on" : "off", *link);
  } else {
    std::printf("chain probe: %s\n", std::string(link.status().message()).c_str());
  }
  // What fetching a kernel's code costs it: ~16 KB kernels, the same one repeated against 16 in turn.
  const absl::StatusOr<double> hot = strata::kernels::cuda::MeasureCodeFetchMicros(1);
  const absl::StatusOr<double> cold = strata::kernels::cuda::MeasureCodeFetchMicros(16);
  if (hot.ok() && cold.ok()) {
    std::printf("a kernel of 1024 instructions in such a chain: %.2f us repeated, %.2f us with 16 kernels in turn "
                "(its code fetched from L2)\n",
                *hot, *cold);
  } else {
    std::printf("code fetch probe: %s\n", std::string((hot.ok() ? cold : hot).status().message()).c_str());
  }
  const double miss_gbps = miss_path == "gpu"   ? *pcie
                           : miss_path == "cpu" ? dram
                           : both.ok()          ? both->both()
                                                : *pcie + dram;
  int64_t longest = 0;
  for (int64_t p : prefill) longest = std::max(longest, p);
  struct Config {
    int64_t slots;
    std::string reads;
    std::string dependent;
    std::string fuse;
    int prefetch;
    std::string prompt_math;
  };
  std::vector<Config> configs;
  for (int64_t slots : vram_experts) {
    for (const std::string& dependent : dependent_launch) {
      for (const std::string& fuse : fuse_qk_rope) {
        for (const std::string& math : prompt_maths) {
          if (slots < 0) {
            configs.push_back({slots, "staged", dependent, fuse, 0, math});
            continue;
          }
          for (const std::string& reads : miss_reads) {
            for (int64_t prefetch : prefetch_experts) {
              configs.push_back({slots, reads, dependent, fuse, static_cast<int>(prefetch), math});
            }
          }
        }
      }
    }
  }
  std::vector<SummaryRow> summary;
  for (const auto& [slots, reads, dependent, fuse, prefetch, prompt_math] : configs) {
    strata::kernels::cuda::SetDependentLaunch(dependent == "on");
    // With every expert in VRAM the policy decides nothing: that size runs with the first policy only.
    for (size_t policy_index = 0; policy_index < (slots < 0 ? 1 : policies.size()); ++policy_index) {
      const std::string& cache_policy = policies[policy_index];
      strata::runtime::EngineOptions eo;
      eo.pack_dir = pack;
      eo.threads = threads;
      eo.max_seqs = static_cast<int>(max_seqs);
      eo.max_ctx = std::max<int64_t>(prompt_len + tokens, longest + 2) + 64;
      eo.prefill_chunk = prefill_chunk;
      eo.device.device = "cuda";
      eo.device.vram_gib = vram_gib;
      eo.device.vram_experts = slots;
      eo.device.cache_policy = cache_policy;
      eo.device.miss_path = miss_path;
      eo.device.stage_gpu_misses = reads == "staged";
      eo.device.prefetch_experts = prefetch;
      eo.device.prefetch_after_layer = prefetch_start == "after-layer";
      eo.device.prompt_math = prompt_math;
      eo.device.fuse_qk_rope = fuse == "on";
      strata::bench::Timer load;
      auto engine = Engine::Create(eo);
      if (!engine.ok()) {
        std::fprintf(stderr, "engine: %s\n", std::string(engine.status().message()).c_str());
        return 1;
      }
      const auto& info = (*engine)->info();
      const uint64_t n_blobs = static_cast<uint64_t>(info.config.n_layer) * info.config.n_expert;
      const double bytes_per_token = static_cast<double>(info.expert_bytes_per_token + info.dense_bytes_per_token);
      std::printf("\npack %s: %s, %lld layers, %lld experts top-%lld, n_embd %lld, scheme %s, router skew %g; loaded in "
                  "%.1f s\n",
                  pack.c_str(), info.config.arch.c_str(), (long long)info.config.n_layer,
                  (long long)info.config.n_expert, (long long)info.config.n_expert_used, (long long)info.config.n_embd,
                  info.scheme.c_str(), pack_skew, load.Seconds());
      std::printf("device %s (%s), %.2f GiB in use, experts from %s%s, VRAM experts %s of %llu (%s)%s, dependent "
                  "launch %s, prompt math %s, q/k rope fused %s\n",
                  info.backend.name.c_str(), info.backend.isa.c_str(), info.backend.memory_used / 1073741824.0,
                  info.source_kind.c_str(), info.source.pinned ? " (pinned)" : "",
                  slots < 0 ? "all that fit" : std::to_string(slots).c_str(), (unsigned long long)n_blobs,
                  cache_policy.c_str(),
                  slots < 0 ? "" : absl::StrCat(", GPU misses ", reads, ", prefetch ", prefetch, " a layer (", prefetch_start, ")").c_str(),
                  strata::kernels::cuda::DependentLaunchEnabled() ? "on" : "off", prompt_math.c_str(), fuse.c_str());
      if (!info.device_note.empty()) std::printf("note: %s\n", info.device_note.c_str());
      // Batch 1: hits from HBM, misses by the miss paths; at a hit rate h the bound is
      // 1 / max(dense/HBM + h*experts/HBM, (1-h)*experts/miss bandwidth) (both run at once).
      std::printf("bytes per decoded token (batch 1): experts %.1f MB + dense %.1f MB = %.1f MB -> HBM bound %.0f "
                  "tokens/s\n",
                  info.expert_bytes_per_token / 1e6, info.dense_bytes_per_token / 1e6, bytes_per_token / 1e6,
                  *hbm * 1e9 / bytes_per_token);
      RunConcurrent(**engine, 1, 8, 8);  // warm up: graphs captured, buffers touched
      for (int64_t n : concurrency) {
        RunConcurrent(**engine, static_cast<int>(n), prompt_len, 4);  // capture this batch size's graphs
        const strata::model::CacheReport before = (*engine)->stats().cache;
        const RunResult r = RunConcurrent(**engine, static_cast<int>(n), prompt_len, tokens);
        const strata::model::CacheReport after = (*engine)->stats().cache;
        if (after.host_requests > before.host_requests) {
          const double requests = static_cast<double>(after.host_requests - before.host_requests);
          const double busy = after.host_busy_seconds - before.host_busy_seconds;
          const double experts = static_cast<double>(after.host_experts - before.host_experts);
          const double waited = static_cast<double>(after.gpu_waited_for_host - before.gpu_waited_for_host);
          std::printf("  host: %.0f layer shares, %.1f experts and %.1f us each, %.1f GB/s of expert weights; the GPU "
                      "had finished its part first in %.0f%% of them\n",
                      requests, experts / requests, busy / requests * 1e6,
                      experts * static_cast<double>(info.expert_bytes_per_token) /
                          (info.config.n_layer * info.config.n_expert_used) / busy / 1e9,
                      100.0 * waited / requests);
        }
        if (after.guessed > before.guessed) {
          const double guessed = static_cast<double>(after.guessed - before.guessed);
          const double copied = static_cast<double>(after.prefetched - before.prefetched);
          std::printf("  guesses: %.0f missed experts named, %.1f%% routed; %.0f copied ahead, %.1f%% of them used\n",
                      guessed, 100.0 * static_cast<double>(after.guessed_right - before.guessed_right) / guessed,
                      copied,
                      copied > 0 ? 100.0 * static_cast<double>(after.prefetch_used - before.prefetch_used) / copied : 0.0);
        }
        const double h = r.hit_rate;
        const double t_hbm = (info.dense_bytes_per_token + h * info.expert_bytes_per_token) / (*hbm * 1e9);
        const double t_miss = (1 - h) * info.expert_bytes_per_token / (miss_gbps * 1e9);
        const double bound = 1.0 / std::max(t_hbm, t_miss);
        const strata::model::CacheReport cache = (*engine)->stats().cache;
        std::printf("decode batch %2lld: %8.1f tokens/s in all (%.1f per sequence), hit rate %.3f, host share of "
                    "misses %.2f\n",
                    (long long)n, r.decode_tps, r.decode_tps / n, h, cache.host_share);
        if (n == 1) strata::bench::PrintResult("  decode, batch 1", r.decode_tps, "tokens/s", bound, "HBM+miss bound");
        summary.push_back({slots, reads, cache_policy,
                           strata::kernels::cuda::DependentLaunchEnabled() ? "dependent" : "plain", prompt_math,
                           prefetch, n, h, r.decode_tps, bound});
      }
      for (int64_t p : prefill) {
        RunConcurrent(**engine, 1, static_cast<int>(p), 1);  // warm up this prompt length
        const RunResult r = RunConcurrent(**engine, 1, static_cast<int>(p), 1);
        // Every expert not in VRAM crosses PCIe once per prefill step of up to prefill_chunk tokens.
        const double chunk = static_cast<double>(std::min<int64_t>(p, prefill_chunk));
        const double in_vram = slots < 0 ? 1.0 : static_cast<double>(slots) / static_cast<double>(n_blobs);
        const double copy_seconds = (1 - in_vram) * static_cast<double>(info.experts_bytes) / (*pcie * 1e9);
        std::printf("prefill %5lld tokens: %9.1f tokens/s (chunks of %d", (long long)p, r.prefill_tps, prefill_chunk);
        if (copy_seconds > 0) std::printf("; PCIe bound %.0f tokens/s", chunk / copy_seconds);
        std::printf(")\n");
      }
    }
  }
  std::printf("\ndecode by cache size and policy (router skew %g):\n", pack_skew);
  std::printf("  %12s %-8s %-10s %-9s %-10s %8s %5s %8s %10s %10s\n", "vram experts", "misses", "policy",
              "launches", "prompts", "prefetch", "batch", "hit rate", "tokens/s", "bound");
  for (const SummaryRow& row : summary) {
    // The bound is batch 1's (HBM + miss paths at that hit rate).
    std::printf("  %12s %-8s %-10s %-9s %-10s %8d %5lld %8.3f %10.1f %10s\n",
                row.slots < 0 ? "all" : std::to_string(row.slots).c_str(), row.slots < 0 ? "-" : row.reads.c_str(),
                row.policy.c_str(), row.launches.c_str(), row.prompt_math.c_str(), row.prefetch, (long long)row.batch,
                row.hit_rate, row.tokens_per_second, row.batch == 1 ? absl::StrFormat("%.0f", row.bound).c_str() : "-");
  }
  return 0;
}
