// strata-grpc-stream-bench: what streaming through gRPC costs. Decode throughput (completion tokens per
// second over all streams) and time to first token, through strata.v1.Inference on a loopback TCP
// connection, beside the same engine called directly (Engine::Submit with callbacks), in one run, at each
// stream count. The same greedy requests run both ways, alternating, and the best of --repeats is kept.
//
//   strata-grpc-stream-bench [--pack=DIR | --dir=/tmp/strata-grpc-stream-bench] [--streams=1,16]
//                            [--tokens=64] [--prompt-tokens=16] [--threads=<cores>] [--repeats=2]
//
// Without --pack a `small`-like qwen3moe pack (s4) is synthesized into --dir once and reused.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "bench/bench_util.h"
#include "engine/runtime/engine.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "packtool/synth.h"
#include "services/inference_service.h"
#include "services/server_runner.h"
#include "strata/v1/inference.grpc.pb.h"

namespace strata::bench {
namespace {

constexpr char kUsage[] =
    "usage: strata-grpc-stream-bench [--pack=DIR | --dir=/tmp/strata-grpc-stream-bench] [--streams=1,16]\n"
    "  [--tokens=64] [--prompt-tokens=16] [--threads=<cores>] [--repeats=2]";

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

struct Result {
  double tokens_per_second = 0;  // completion tokens of all streams over the wall time of the batch
  double ttft_seconds = 0;       // mean over streams, from the request to its first tokens
  int64_t tokens = 0;
};

// Keeps the faster of two measurements of the same thing.
void KeepBest(const Result& r, Result* best) {
  if (r.tokens_per_second > best->tokens_per_second) *best = r;
}

std::vector<std::vector<int32_t>> Prompts(int streams, int length, int n_vocab) {
  std::vector<std::vector<int32_t>> prompts(streams);
  for (int s = 0; s < streams; ++s) {
    for (int j = 0; j < length; ++j) prompts[s].push_back((s * 97 + j * 31 + 1) % n_vocab);
  }
  return prompts;
}

Result RunDirect(runtime::Engine& engine, const std::vector<std::vector<int32_t>>& prompts, int tokens) {
  const int n = static_cast<int>(prompts.size());
  absl::Mutex mu;
  int done = 0;
  int64_t total = 0;
  std::vector<double> first(n, 0);
  const auto t0 = Clock::now();
  for (int i = 0; i < n; ++i) {
    runtime::GenerateRequest r;
    r.prompt_tokens = prompts[i];
    r.sampling.temperature = 0;
    r.sampling.max_tokens = tokens;
    r.sampling.ignore_eos = true;
    runtime::GenerateCallbacks cb;
    // Called on the scheduler thread, as the service's callbacks are.
    cb.on_tokens = [&, i, t0](const runtime::TokenEvent& e) {
      if (!e.tokens.empty() && first[i] == 0) first[i] = Since(t0);
    };
    cb.on_done = [&](const runtime::GenerationResult& result) {
      absl::MutexLock lock(&mu);
      total += static_cast<int64_t>(result.tokens.size());
      ++done;
    };
    auto handle = engine.Submit(std::move(r), std::move(cb));
    if (!handle.ok()) {
      std::fprintf(stderr, "error: %s\n", handle.status().ToString().c_str());
      std::exit(1);
    }
  }
  {
    absl::MutexLock lock(&mu);
    auto all_done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return done == n; };
    mu.Await(absl::Condition(&all_done));
  }
  Result r;
  const double wall = Since(t0);
  r.tokens = total;
  r.tokens_per_second = static_cast<double>(total) / wall;
  for (double f : first) r.ttft_seconds += f / n;
  return r;
}

Result RunGrpc(v1::Inference::Stub& stub, const std::vector<std::vector<int32_t>>& prompts, int tokens) {
  const int n = static_cast<int>(prompts.size());
  std::vector<double> first(n, 0);
  std::vector<int64_t> counts(n, 0);
  std::vector<std::thread> threads;
  absl::Notification go;
  Clock::time_point t0;
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      v1::GenerateRequest request;
      request.mutable_tokens()->mutable_ids()->Add(prompts[i].begin(), prompts[i].end());
      request.mutable_sampling()->set_temperature(0);
      request.mutable_sampling()->set_max_tokens(tokens);
      request.mutable_sampling()->set_ignore_eos(true);
      grpc::ClientContext context;
      go.WaitForNotification();
      auto reader = stub.Generate(&context, request);
      v1::GenerateResponse message;
      while (reader->Read(&message)) {
        if (message.tokens_size() > 0 && counts[i] == 0) first[i] = Since(t0);
        counts[i] += message.tokens_size();
      }
      const grpc::Status status = reader->Finish();
      if (!status.ok()) {
        std::fprintf(stderr, "error: stream %d: %s\n", i, status.error_message().c_str());
        std::exit(1);
      }
    });
  }
  t0 = Clock::now();
  go.Notify();
  for (auto& t : threads) t.join();
  Result r;
  const double wall = Since(t0);
  for (int i = 0; i < n; ++i) {
    r.tokens += counts[i];
    r.ttft_seconds += first[i] / n;
  }
  r.tokens_per_second = static_cast<double>(r.tokens) / wall;
  return r;
}

std::string MakeDefaultPack(const std::string& dir) {
  const std::string pack = dir + "/small-s4";
  if (std::filesystem::exists(pack + "/manifest.json")) return pack;
  std::filesystem::create_directories(dir);
  packtool::SynthOptions o;
  o.geometry = *packtool::PresetGeometry("qwen3moe", "small");
  o.output = pack;
  o.pack_scheme = kernels::Scheme::kS4;
  o.seed = 7;
  std::printf("synthesizing a small qwen3moe pack into %s ...\n", pack.c_str());
  std::fflush(stdout);
  auto manifest = packtool::SynthesizePack(o, nullptr, nullptr);
  if (!manifest.ok()) {
    std::fprintf(stderr, "error: %s\n", manifest.status().ToString().c_str());
    std::exit(1);
  }
  return pack;
}

int Main(int argc, char** argv) {
  Flags flags(argc, argv, kUsage);
  std::string pack = flags.String("pack", "");
  const std::string dir = flags.String("dir", "/tmp/strata-grpc-stream-bench");
  const std::vector<int64_t> stream_counts = flags.IntList("streams", {1, 16});
  const int tokens = static_cast<int>(flags.Int("tokens", 64));
  const int prompt_tokens = static_cast<int>(flags.Int("prompt-tokens", 16));
  const int threads = static_cast<int>(flags.Int("threads", 0));
  const int repeats = static_cast<int>(flags.Int("repeats", 2));
  flags.CheckNoUnknown();
  if (tokens < 2 || prompt_tokens < 1 || repeats < 1 || stream_counts.empty()) {
    std::fprintf(stderr, "error: --tokens >= 2, --prompt-tokens >= 1, --repeats >= 1 and --streams needed\n%s\n",
                 kUsage);
    return 2;
  }
  if (pack.empty()) pack = MakeDefaultPack(dir);

  runtime::EngineOptions options;
  options.pack_dir = pack;
  options.threads = threads;
  options.max_seqs = static_cast<int>(*std::max_element(stream_counts.begin(), stream_counts.end()));
  options.max_ctx = prompt_tokens + tokens + 8;
  auto engine = runtime::Engine::Create(options);
  if (!engine.ok()) {
    std::fprintf(stderr, "error: %s\n", engine.status().ToString().c_str());
    return 1;
  }
  const runtime::EngineInfo info = (*engine)->info();
  const int n_vocab = static_cast<int>(info.config.n_vocab);
  services::InferenceServiceImpl service;
  service.AttachEngine(*std::move(engine));
  runtime::Engine& direct = *service.engine();
  services::ServerConfig config;
  config.listen_address = "127.0.0.1:0";
  auto started = services::StartServer(config, {{&service, v1::Inference::service_full_name()}});
  if (!started.ok()) {
    std::fprintf(stderr, "error: %s\n", started.status().ToString().c_str());
    return 1;
  }
  auto channel = grpc::CreateChannel("127.0.0.1:" + std::to_string(started->port), grpc::InsecureChannelCredentials());
  auto stub = v1::Inference::NewStub(channel);

  std::printf("%s\n", flags.command_line().c_str());
  std::printf("pack %s: %s, %lld layers, %lld experts (top-%lld), n_embd %lld, scheme %s; %d threads\n", pack.c_str(),
              info.config.arch.c_str(), static_cast<long long>(info.config.n_layer),
              static_cast<long long>(info.config.n_expert), static_cast<long long>(info.config.n_expert_used),
              static_cast<long long>(info.config.n_embd), info.scheme.c_str(), info.threads);
  std::printf("%d prompt tokens, %d generated tokens per stream, greedy; gRPC over loopback TCP, best of %d\n",
              prompt_tokens, tokens, repeats);
  // Warm up both paths (page faults, thread start-up, the channel's connection).
  RunDirect(direct, Prompts(1, prompt_tokens, n_vocab), 4);
  RunGrpc(*stub, Prompts(1, prompt_tokens, n_vocab), 4);

  struct Row {
    int streams;
    Result direct, grpc;
  };
  std::vector<Row> rows;
  for (int64_t streams : stream_counts) {
    const auto prompts = Prompts(static_cast<int>(streams), prompt_tokens, n_vocab);
    Row row{static_cast<int>(streams), {}, {}};
    for (int r = 0; r < repeats; ++r) {
      KeepBest(RunDirect(direct, prompts, tokens), &row.direct);
      KeepBest(RunGrpc(*stub, prompts, tokens), &row.grpc);
    }
    if (row.direct.tokens != row.grpc.tokens) {
      std::fprintf(stderr, "error: direct generated %lld tokens, gRPC %lld\n", static_cast<long long>(row.direct.tokens),
                   static_cast<long long>(row.grpc.tokens));
      return 1;
    }
    const std::string name = "grpc decode, " + std::to_string(streams) + " stream" + (streams > 1 ? "s" : "");
    PrintResult(name, row.grpc.tokens_per_second, "tok/s", row.direct.tokens_per_second, "engine direct");
    rows.push_back(row);
  }
  std::printf("\n%-8s %14s %14s %9s %15s %15s %11s\n", "streams", "direct tok/s", "gRPC tok/s", "overhead",
              "direct TTFT ms", "gRPC TTFT ms", "TTFT added");
  for (const Row& row : rows) {
    std::printf("%-8d %14.1f %14.1f %8.1f%% %15.1f %15.1f %8.2f ms\n", row.streams, row.direct.tokens_per_second,
                row.grpc.tokens_per_second, (1 - row.grpc.tokens_per_second / row.direct.tokens_per_second) * 100,
                row.direct.ttft_seconds * 1e3, row.grpc.ttft_seconds * 1e3,
                (row.grpc.ttft_seconds - row.direct.ttft_seconds) * 1e3);
  }
  started->server->Shutdown();
  started->server->Wait();
  return 0;
}

}  // namespace
}  // namespace strata::bench

int main(int argc, char** argv) { return strata::bench::Main(argc, argv); }
