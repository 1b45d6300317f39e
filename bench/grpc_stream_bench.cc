// strata-grpc-stream-bench: what streaming through gRPC costs. Decode speed and time to first token
// through strata.v1.Inference on a loopback connection (TCP, or a Unix socket with --transport=unix; the
// client in this process, reading with the callback API), beside the same engine called directly
// (Engine::Submit with callbacks), in one run, at each stream count.
//
// Decode speed is the rate at which tokens arrive (as the client sees them) while every stream is
// decoding: after the last stream's first token, up to the first stream's last. Requests sent over the
// network reach the engine a little apart, so a late one is still prefilled while the others decode; that
// step is not a cost of streaming and falls outside the window. The same figure over each stream's own
// window (which counts those steps) and the rate of all tokens over the wall time, prefill included, are
// reported beside it.
//
// The same greedy requests run both ways in a chain D G D G ... D of --rounds gRPC runs, each between two
// direct runs: a round's overhead is 1 - G / mean(D before, D after), which cancels drift of the machine's
// speed, and the median over rounds is reported with its quartiles. The chain also gives a control: the
// change between consecutive direct runs (D after / D before - 1), i.e. what the measurement reads when
// nothing differs, so an overhead can be told from noise. Per token it also reports the time the engine's
// callbacks took and, per thread name, CPU time, time spent waiting for a core and preemptions.
//
//   strata-grpc-stream-bench [--pack=DIR | --dir=/tmp/strata-grpc-stream-bench] [--streams=1,16]
//                            [--tokens=128] [--prompt-tokens=16] [--threads=<cores>] [--rounds=9]
//                            [--server-threads=<--threads>] [--network-priority=auto|idle|normal]
//                            [--transport=tcp|unix]
//
// --server-threads gives the engine behind the server its own thread count (a second engine), to compare a
// server that leaves cores to its network threads with the engine called directly on every core.
// --network-priority is strata-server's option of the same name (default auto, as there).
//
// Without --pack a `small`-like qwen3moe pack (s4) is synthesized into --dir once and reused.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/blocking_counter.h"
#include "bench/bench_util.h"
#include "engine/runtime/engine.h"
#include "grpcpp/client_context.h"
#include "engine/exec/thread_pool.h"
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
    "  [--tokens=128] [--prompt-tokens=16] [--threads=<cores>] [--rounds=9] [--server-threads=<--threads>]\n"
    "  [--network-priority=auto|idle|normal] [--transport=tcp|unix]";

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// When one stream's tokens arrived, in seconds from the start of the run.
struct StreamTimes {
  double first = 0, last = 0;
  double engine_ttft = 0;  // the engine's own submission-to-first-token time, when known
  int64_t tokens = 0;
  std::vector<std::pair<double, int64_t>> arrivals;  // (time, tokens) of each delivery

  void Add(int64_t n, double now) {
    if (n == 0) return;
    if (tokens == 0) first = now;
    last = now;
    tokens += n;
    arrivals.emplace_back(now, n);
  }
};

struct Result {
  double tokens_per_second = 0;   // completion tokens of all streams over the wall time of the run
  // Tokens that arrived while every stream was decoding (after the last stream's first token, up to the
  // first stream's last), over that window: the step rate of the batch with all streams in it, which is
  // what streaming could slow down. When the requests arrive a step apart (as through the network), the
  // steps that still prefill a late request fall outside it.
  double decode_per_second = 0;
  // Sum over streams of (tokens - 1) / (last token - first token): each stream's own window, which also
  // counts the steps that prefilled requests admitted after it.
  double stream_decode_per_second = 0;
  double ttft_seconds = 0;        // mean over streams, from the start of the run to its first tokens
  double engine_ttft_seconds = 0;  // mean over streams of the engine's submission-to-first-token time
  int64_t tokens = 0;
  uint64_t steps = 0;  // engine steps the run took
};

Result Summarize(const std::vector<StreamTimes>& streams, double wall) {
  Result r;
  const double n = static_cast<double>(streams.size());
  double window_start = 0, window_end = wall;
  for (const StreamTimes& s : streams) {
    r.tokens += s.tokens;
    r.ttft_seconds += s.first / n;
    r.engine_ttft_seconds += s.engine_ttft / n;
    if (s.tokens > 1 && s.last > s.first) {
      r.stream_decode_per_second += static_cast<double>(s.tokens - 1) / (s.last - s.first);
    }
    window_start = std::max(window_start, s.first);
    window_end = std::min(window_end, s.last);
  }
  if (window_end > window_start) {
    int64_t in_window = 0;
    for (const StreamTimes& s : streams) {
      for (const auto& [t, count] : s.arrivals) {
        if (t > window_start && t <= window_end) in_window += count;
      }
    }
    r.decode_per_second = static_cast<double>(in_window) / (window_end - window_start);
  }
  r.tokens_per_second = static_cast<double>(r.tokens) / wall;
  return r;
}

// Median and quartiles of a sample (linear interpolation between order statistics).
struct Spread {
  double q1 = 0, median = 0, q3 = 0;
};

Spread SpreadOf(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  auto at = [&](double q) {
    const double x = q * static_cast<double>(v.size() - 1);
    const size_t i = static_cast<size_t>(x);
    const double f = x - static_cast<double>(i);
    return i + 1 < v.size() ? v[i] * (1 - f) + v[i + 1] * f : v[i];
  };
  return {at(0.25), at(0.5), at(0.75)};
}

// What each thread name used over runs of one kind, to see where a gRPC run spends CPU that a direct run
// does not, and whether the compute threads were preempted for it.
struct ThreadUse {
  std::map<std::string, ThreadUsage> by_name;
  int64_t tokens = 0;
  uint64_t callbacks = 0;       // engine callbacks run, and the time spent in them
  double callback_seconds = 0;

  void AddCallbacks(const runtime::EngineStats& before, const runtime::EngineStats& after) {
    callbacks += after.callbacks_run - before.callbacks_run;
    callback_seconds += after.callback_seconds - before.callback_seconds;
  }

  void Add(const std::map<std::string, ThreadUsage>& run, int64_t run_tokens) {
    for (const auto& [name, u] : run) by_name[name] += u;
    tokens += run_tokens;
  }
};

void PrintThreadUse(const ThreadUse& direct, const ThreadUse& grpc) {
  std::map<std::string, std::pair<ThreadUsage, ThreadUsage>> rows;
  for (const auto& [name, u] : direct.by_name) rows[name].first = u;
  for (const auto& [name, u] : grpc.by_name) rows[name].second = u;
  auto per_token = [](double seconds, int64_t tokens) { return tokens > 0 ? seconds * 1e6 / tokens : 0.0; };
  std::printf("  engine callbacks per generated token: %.2f | %.2f, taking %.1f | %.1f us (direct | gRPC)\n",
              direct.tokens > 0 ? static_cast<double>(direct.callbacks) / direct.tokens : 0.0,
              grpc.tokens > 0 ? static_cast<double>(grpc.callbacks) / grpc.tokens : 0.0,
              per_token(direct.callback_seconds, direct.tokens), per_token(grpc.callback_seconds, grpc.tokens));
  std::printf("  per generated token, by thread name: CPU us, us waiting for a core, preemptions per 1000 tokens "
              "(direct | gRPC)\n");
  for (const auto& [name, pair] : rows) {
    const ThreadUsage& d = pair.first;
    const ThreadUsage& g = pair.second;
    if (d.cpu_seconds + g.cpu_seconds < 1e-4) continue;
    std::printf("    %-16s cpu %8.1f | %8.1f   wait %7.1f | %7.1f   preempted %7.1f | %7.1f\n", name.c_str(),
                per_token(d.cpu_seconds, direct.tokens), per_token(g.cpu_seconds, grpc.tokens),
                per_token(d.wait_seconds, direct.tokens), per_token(g.wait_seconds, grpc.tokens),
                direct.tokens > 0 ? 1e3 * d.preempted / direct.tokens : 0.0,
                grpc.tokens > 0 ? 1e3 * g.preempted / grpc.tokens : 0.0);
  }
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
  // Element i is written by request i's callbacks, which the engine runs one at a time; read after the last
  // on_done.
  std::vector<StreamTimes> times(n);
  const auto t0 = Clock::now();
  for (int i = 0; i < n; ++i) {
    runtime::GenerateRequest r;
    r.prompt_tokens = prompts[i];
    r.sampling.temperature = 0;
    r.sampling.max_tokens = tokens;
    r.sampling.ignore_eos = true;
    runtime::GenerateCallbacks cb;
    // Called where the service's callbacks are: on an engine thread between parallel jobs.
    cb.on_tokens = [&, i, t0](const runtime::TokenEvent& e) {
      times[i].Add(static_cast<int64_t>(e.tokens.size()), Since(t0));
    };
    cb.on_done = [&, i](const runtime::GenerationResult& result) {
      times[i].engine_ttft = result.usage.time_to_first_token;
      absl::MutexLock lock(&mu);
      ++done;
    };
    auto handle = engine.Submit(std::move(r), std::move(cb));
    if (!handle.ok()) {
      std::fprintf(stderr, "error: %s\n", handle.status().ToString().c_str());
      std::exit(1);
    }
  }
  absl::MutexLock lock(&mu);
  auto all_done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return done == n; };
  mu.Await(absl::Condition(&all_done));
  return Summarize(times, Since(t0));
}

// One streamed Generate call read with the callback API, the way a client that serves many streams reads:
// each message is handled on the gRPC thread that received it, with no extra thread to wake per message.
class StreamReader final : public grpc::ClientReadReactor<v1::GenerateResponse> {
 public:
  StreamReader(v1::GenerateRequest request, Clock::time_point t0, StreamTimes* times, absl::BlockingCounter* done)
      : request_(std::move(request)), t0_(t0), times_(times), done_(done) {}

  void Start(v1::Inference::Stub& stub) {
    stub.async()->Generate(&context_, &request_, this);
    StartRead(&message_);
    StartCall();
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // the stream ended; OnDone follows
    times_->Add(message_.tokens_size(), Since(t0_));
    if (message_.has_usage()) times_->engine_ttft = message_.usage().time_to_first_token();
    StartRead(&message_);
  }

  void OnDone(const grpc::Status& status) override {
    status_ = status;
    done_->DecrementCount();
  }

  const grpc::Status& status() const { return status_; }

 private:
  const v1::GenerateRequest request_;
  const Clock::time_point t0_;
  StreamTimes* const times_;  // written by this stream's reactions only, which gRPC runs one at a time
  absl::BlockingCounter* const done_;
  grpc::ClientContext context_;
  v1::GenerateResponse message_;
  grpc::Status status_;
};

Result RunGrpc(v1::Inference::Stub& stub, const std::vector<std::vector<int32_t>>& prompts, int tokens) {
  const int n = static_cast<int>(prompts.size());
  std::vector<StreamTimes> times(n);
  absl::BlockingCounter done(n);
  std::vector<std::unique_ptr<StreamReader>> readers;
  const Clock::time_point t0 = Clock::now();
  for (int i = 0; i < n; ++i) {
    v1::GenerateRequest request;
    request.mutable_tokens()->mutable_ids()->Add(prompts[i].begin(), prompts[i].end());
    request.mutable_sampling()->set_temperature(0);
    request.mutable_sampling()->set_max_tokens(tokens);
    request.mutable_sampling()->set_ignore_eos(true);
    readers.push_back(std::make_unique<StreamReader>(std::move(request), t0, &times[i], &done));
    readers.back()->Start(stub);
  }
  done.Wait();
  const double wall = Since(t0);
  for (int i = 0; i < n; ++i) {
    if (!readers[i]->status().ok()) {
      std::fprintf(stderr, "error: stream %d: %s\n", i, readers[i]->status().error_message().c_str());
      std::exit(1);
    }
  }
  return Summarize(times, wall);
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
  const int tokens = static_cast<int>(flags.Int("tokens", 128));
  const int prompt_tokens = static_cast<int>(flags.Int("prompt-tokens", 16));
  const int threads = static_cast<int>(flags.Int("threads", 0));
  const int server_threads = static_cast<int>(flags.Int("server-threads", threads));
  const int rounds = static_cast<int>(flags.Int("rounds", 9));
  const auto network_priority =
      services::ParseNetworkPriority(flags.String("network-priority", "auto"), "--network-priority");
  const std::string transport = flags.String("transport", "tcp");
  flags.CheckNoUnknown();
  const bool streams_ok = !stream_counts.empty() && std::all_of(stream_counts.begin(), stream_counts.end(),
                                                                  [](int64_t n) { return n >= 1 && n <= 4096; });
  if (tokens < 2 || prompt_tokens < 1 || rounds < 1 || !streams_ok) {
    std::fprintf(stderr,
                 "error: expected --tokens >= 2, --prompt-tokens >= 1, --rounds >= 1 and --streams of counts in "
                 "1..4096\n%s\n",
                 kUsage);
    return 2;
  }
  if (transport != "tcp" && transport != "unix") {
    std::fprintf(stderr, "error: --transport: '%s' is not tcp or unix\n%s\n", transport.c_str(), kUsage);
    return 2;
  }
  if (!network_priority.ok()) {
    std::fprintf(stderr, "error: %s\n%s\n", std::string(network_priority.status().message()).c_str(), kUsage);
    return 2;
  }
  if (pack.empty()) pack = MakeDefaultPack(dir);

  runtime::EngineOptions options;
  options.pack_dir = pack;
  options.threads = threads;
  options.max_seqs = static_cast<int>(*std::max_element(stream_counts.begin(), stream_counts.end()));
  options.max_ctx = prompt_tokens + tokens + 8;
  auto direct_engine = runtime::Engine::Create(options);
  if (!direct_engine.ok()) {
    std::fprintf(stderr, "error: %s\n", direct_engine.status().ToString().c_str());
    return 1;
  }
  runtime::Engine& direct = **direct_engine;
  const runtime::EngineInfo info = direct.info();
  const int n_vocab = static_cast<int>(info.config.n_vocab);
  // The service gets the same engine unless it is to run with another thread count; a second engine has
  // its own pool and arena (the idle one's workers sleep).
  services::InferenceServiceImpl service;
  if (server_threads != threads) {
    options.threads = server_threads;
    auto created = runtime::Engine::Create(options);
    if (!created.ok()) {
      std::fprintf(stderr, "error: %s\n", created.status().ToString().c_str());
      return 1;
    }
    service.AttachEngine(*std::move(created));
  } else {
    service.AttachEngine(*std::move(direct_engine));
  }
  const runtime::Engine& served = *service.engine();
  services::ServerConfig config;
  const std::string socket_path = dir + "/grpc.sock";
  if (transport == "unix") {
    std::filesystem::create_directories(dir);
    std::filesystem::remove(socket_path);
    config.listen_address = "unix:" + socket_path;
  } else {
    config.listen_address = "127.0.0.1:0";
  }
  config.network_priority = services::ResolveNetworkPriority(
      *network_priority, server_threads, exec::AvailableCores());
  auto started = services::StartServer(config, {{&service, v1::Inference::service_full_name()}});
  if (!started.ok()) {
    std::fprintf(stderr, "error: %s\n", started.status().ToString().c_str());
    return 1;
  }
  auto channel = grpc::CreateChannel(
      transport == "unix" ? config.listen_address : "127.0.0.1:" + std::to_string(started->port),
      grpc::InsecureChannelCredentials());
  auto stub = v1::Inference::NewStub(channel);

  std::printf("%s\n", flags.command_line().c_str());
  std::printf("pack %s: %s, %lld layers, %lld experts (top-%lld), n_embd %lld, scheme %s\n", pack.c_str(),
              info.config.arch.c_str(), static_cast<long long>(info.config.n_layer),
              static_cast<long long>(info.config.n_expert), static_cast<long long>(info.config.n_expert_used),
              static_cast<long long>(info.config.n_embd), info.scheme.c_str());
  std::printf("compute threads: %d direct, %d behind the server (of %d cores)\n", info.threads,
              service.engine()->info().threads, exec::AvailableCores());
  std::printf("%d prompt tokens, %d generated tokens per stream, greedy; gRPC over %s, network threads %s; "
              "%d rounds D G D G ... D\n",
              prompt_tokens, tokens, transport == "unix" ? "a Unix socket" : "loopback TCP",
              std::string(services::NetworkPriorityName(started->network_priority)).c_str(), rounds);
  // Warm up both paths (page faults, thread start-up, the channel's connection).
  RunDirect(direct, Prompts(1, prompt_tokens, n_vocab), 4);
  RunGrpc(*stub, Prompts(1, prompt_tokens, n_vocab), 4);
  RunDirect(direct, Prompts(1, prompt_tokens, n_vocab), 4);

  struct Row {
    int streams;
    Spread decode_overhead, decode_control, overall_overhead, direct_decode, grpc_decode, direct_ttft, grpc_ttft,
        grpc_engine_ttft, stream_overhead, direct_steps, grpc_steps;
  };
  std::vector<Row> rows;
  for (int64_t streams : stream_counts) {
    const auto prompts = Prompts(static_cast<int>(streams), prompt_tokens, n_vocab);
    std::vector<double> decode_overhead, decode_control, overall_overhead, direct_decode, grpc_decode, direct_ttft,
        grpc_ttft, grpc_engine_ttft, stream_overhead, direct_steps, grpc_steps;
    Result before = RunDirect(direct, prompts, tokens);
    ThreadUse direct_use, grpc_use;
    for (int r = 0; r < rounds; ++r) {
      const auto t0 = SnapshotThreads();
      const runtime::EngineStats s0 = served.stats();
      Result via_grpc = RunGrpc(*stub, prompts, tokens);
      const auto t1 = SnapshotThreads();
      const runtime::EngineStats s1 = served.stats(), s2 = direct.stats();
      Result after = RunDirect(direct, prompts, tokens);
      const runtime::EngineStats s3 = direct.stats();
      direct_use.Add(UsageByName(t1, SnapshotThreads()), after.tokens);
      direct_use.AddCallbacks(s2, s3);
      grpc_use.Add(UsageByName(t0, t1), via_grpc.tokens);
      grpc_use.AddCallbacks(s0, s1);
      via_grpc.steps = s1.steps - s0.steps;
      after.steps = s3.steps - s2.steps;
      if (!(via_grpc.decode_per_second > 0 && after.decode_per_second > 0)) {
        std::fprintf(stderr, "error: no window in which all %lld streams decoded; use more --tokens\n",
                     static_cast<long long>(streams));
        return 1;
      }
      if (via_grpc.tokens != after.tokens) {
        std::fprintf(stderr, "error: direct generated %lld tokens, gRPC %lld\n", static_cast<long long>(after.tokens),
                     static_cast<long long>(via_grpc.tokens));
        return 1;
      }
      const double decode_reference = (before.decode_per_second + after.decode_per_second) / 2;
      const double overall_reference = (before.tokens_per_second + after.tokens_per_second) / 2;
      const double stream_reference = (before.stream_decode_per_second + after.stream_decode_per_second) / 2;
      stream_overhead.push_back(1 - via_grpc.stream_decode_per_second / stream_reference);
      direct_steps.push_back(static_cast<double>(after.steps));
      grpc_steps.push_back(static_cast<double>(via_grpc.steps));
      decode_overhead.push_back(1 - via_grpc.decode_per_second / decode_reference);
      decode_control.push_back(after.decode_per_second / before.decode_per_second - 1);
      overall_overhead.push_back(1 - via_grpc.tokens_per_second / overall_reference);
      direct_decode.push_back(decode_reference);
      grpc_decode.push_back(via_grpc.decode_per_second);
      direct_ttft.push_back((before.ttft_seconds + after.ttft_seconds) / 2);
      grpc_ttft.push_back(via_grpc.ttft_seconds);
      grpc_engine_ttft.push_back(via_grpc.engine_ttft_seconds);
      std::printf("  %2lld stream%s round %2d: decode direct %.1f, gRPC %.1f, direct %.1f tok/s: overhead %+.2f%%; "
                  "with prefill %+.2f%%\n",
                  static_cast<long long>(streams), streams > 1 ? "s" : " ", r + 1, before.decode_per_second,
                  via_grpc.decode_per_second, after.decode_per_second, decode_overhead.back() * 100,
                  overall_overhead.back() * 100);
      std::fflush(stdout);
      before = after;
    }
    Row row{static_cast<int>(streams), SpreadOf(decode_overhead), SpreadOf(decode_control),
            SpreadOf(overall_overhead), SpreadOf(direct_decode), SpreadOf(grpc_decode), SpreadOf(direct_ttft),
            SpreadOf(grpc_ttft), SpreadOf(grpc_engine_ttft), SpreadOf(stream_overhead), SpreadOf(direct_steps),
            SpreadOf(grpc_steps)};
    std::printf("gRPC decode, %lld stream%s: %.4f of the engine called directly (median of %d paired rounds; "
                "direct vs direct %.4f)\n",
                static_cast<long long>(streams), streams > 1 ? "s" : "", 1 - row.decode_overhead.median, rounds,
                1 + row.decode_control.median);
    rows.push_back(row);
    PrintThreadUse(direct_use, grpc_use);
    if (started->sweeper != nullptr) {
      std::printf("  gRPC threads started under the normal policy and moved under SCHED_IDLE so far: %d\n",
                  started->sweeper->moved());
    }
  }
  std::printf(
      "\nmedians over rounds [quartiles]. decode: tokens that arrived while every stream was decoding, over that\n"
      "window; control: its change between consecutive direct runs; each stream's window: tokens after a stream's\n"
      "first over the time to its last, summed over streams (counts the steps that prefill requests admitted\n"
      "later); with prefill: all tokens over the wall time. Steps: engine steps per run, direct and gRPC.\n"
      "TTFT in ms: direct; through gRPC as the client sees it; through gRPC as the engine measured it (from\n"
      "Submit to the token's sampling: what is left of the client's figure is transport)\n");
  std::printf("%-7s %9s %9s %24s %24s %24s %24s %5s %5s %7s %7s %7s\n", "streams", "direct", "gRPC",
              "decode overhead", "control", "each stream's window", "with prefill", "steps", "gRPC", "TTFT", "gRPC",
              "engine");
  auto spread = [](const Spread& s) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%+6.2f%% [%+5.2f, %+5.2f]", s.median * 100, s.q1 * 100, s.q3 * 100);
    return std::string(buf);
  };
  for (const Row& row : rows) {
    std::printf("%-7d %9.1f %9.1f %24s %24s %24s %24s %5.0f %5.0f %7.2f %7.2f %7.2f\n", row.streams,
                row.direct_decode.median, row.grpc_decode.median, spread(row.decode_overhead).c_str(),
                spread(row.decode_control).c_str(), spread(row.stream_overhead).c_str(),
                spread(row.overall_overhead).c_str(), row.direct_steps.median, row.grpc_steps.median,
                row.direct_ttft.median * 1e3, row.grpc_ttft.median * 1e3, row.grpc_engine_ttft.median * 1e3);
  }
  started->server->Shutdown();
  started->server->Wait();
  return 0;
}

}  // namespace
}  // namespace strata::bench

int main(int argc, char** argv) { return strata::bench::Main(argc, argv); }
