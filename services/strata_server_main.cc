// strata-server: the inference gRPC service (strata.v1.Inference), with health checking and reflection.
//
//   strata-server --pack DIR [--listen ADDR] [--threads N] [--max-seqs N] [--ctx N] [--max-queue N]
//                 [--expert-source arena|mmap] [--verify] [--device auto|cpu|cuda] [--vram-gib X]
//                 [--network-priority auto|idle|normal] [--http-listen ADDR] [--metrics-listen ADDR]
//                 [--served-model-name NAME]
//
// The server starts first and reports NOT_SERVING (calls are UNAVAILABLE) while the pack loads, then
// SERVING. A pack that cannot be loaded ends the process with exit code 1 and the reason. SIGINT or
// SIGTERM drains (services/server_access.h: NOT_SERVING, new calls UNAVAILABLE, running streams get
// --drain-seconds, then are cancelled with the reason) and exits 0; a signal while the pack is still
// loading exits at once. SIGHUP rereads --auth-tokens-file.

#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <filesystem>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/synchronization/notification.h"
#include "engine/log.h"
#include "engine/model/expert_cache_policy.h"
#include "engine/model/miss_path.h"
#include "engine/runtime/model_factory.h"
#include "engine/runtime/engine.h"
#include "engine/exec/thread_pool.h"
#include "services/cli_flags.h"
#include "services/count_progress.h"
#include "services/gguf_pack_cache.h"
#include "services/progress_printer.h"
#include "services/http_listener.h"
#include "services/inference_metrics.h"
#include "services/inference_service.h"
#include "services/metrics_endpoint.h"
#include "services/openai_server.h"
#include "services/pack_cli.h"
#include "services/server_access.h"
#include "services/server_runner.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(std::string, pack, "", "the pack directory to serve (or --model)");
ABSL_FLAG(std::string, model, "",
          "a GGUF model to serve instead of --pack: converted (s4) into a pack cache beside it, FILE.strata-pack, "
          "validated, and reused while the file is unchanged");
ABSL_FLAG(std::string, listen, "127.0.0.1:50051", "address to listen on, host:port (port 0: any free port)");
ABSL_FLAG(int, threads, 0, "compute threads; 0: all cores");
ABSL_FLAG(int, max_seqs, 16, "sequences decoded together");
ABSL_FLAG(int64_t, ctx, 0, "positions per sequence; 0: the model's training context, at most 8192");
ABSL_FLAG(int, max_queue, 64, "requests waiting beyond --max-seqs; more are refused (RESOURCE_EXHAUSTED)");
ABSL_FLAG(std::string, expert_source, "arena", "where experts are read from: arena or mmap");
ABSL_FLAG(bool, verify, false, "check every expert blob's checksum while loading");
ABSL_FLAG(std::string, device, "auto", "where the model runs: auto (cuda when a CUDA device is present), cpu or cuda");
ABSL_FLAG(double, vram_gib, 0, "device memory the model may use, GiB; 0: what is free less a margin");
ABSL_FLAG(int64_t, vram_experts, -1,
          "experts kept in VRAM; -1: all of them when they fit, else as many as fit (the rest are read from the "
          "page-locked arena over PCIe)");
ABSL_FLAG(std::string, cache_policy, "lfu-decay", "VRAM expert cache policy: lru, lfu-decay or static");
ABSL_FLAG(std::string, miss_path, "both",
          "where experts not in VRAM are computed: gpu (read over PCIe), cpu (host threads) or both at once");
ABSL_FLAG(int, prefetch_experts, strata::runtime::DeviceOptions().prefetch_experts,
          "decode: experts not in VRAM copied ahead per layer, from a guess of its routing made one layer early "
          "(0 = none; copies stop while the guesses are mostly wrong)");
ABSL_FLAG(std::string, prompt_math, strata::runtime::DeviceOptions().prompt_math,
          "CUDA prompt steps' F16/BF16 dense products: fp32 (cuBLAS SGEMM, the CPU's numbers) or split-tf32 (TF32 "
          "tensor cores, about 11-16% faster prefill on an H200, logits a little further from the CPU's)");
ABSL_FLAG(bool, pin_arena, true, "page-lock the expert arena for the GPU (--nopin-arena: as if locking were refused)");
ABSL_FLAG(std::string, log_level, "info", "debug, info, warn, error or off");
ABSL_FLAG(std::string, chat_template_file, "",
          "a Jinja chat template used by Chat instead of the model's tokenizer.chat_template");
ABSL_FLAG(std::string, network_priority, "auto",
          "scheduling of gRPC's threads: idle (SCHED_IDLE: they run when a compute thread leaves its core and "
          "never preempt one), normal, or auto: idle when the compute threads take every core, else normal "
          "(cores left free take the network work; on a machine shared with busy programs, use normal)");
ABSL_FLAG(std::string, tls_cert, "", "TLS: the server's certificate chain (PEM); with --tls-key. Default: plaintext");
ABSL_FLAG(std::string, tls_key, "", "TLS: the server's private key (PEM)");
ABSL_FLAG(std::string, tls_client_ca, "", "mutual TLS: clients must present a certificate signed by this CA (PEM)");
ABSL_FLAG(std::string, auth_tokens_file, "",
          "bearer tokens, one per line ('#' comments); calls without one get UNAUTHENTICATED (health and "
          "reflection stay open); reread on SIGHUP. Default: no token asked");
ABSL_FLAG(int, max_calls_per_client, 0,
          "calls one client (its token, else its address) may have running; more get RESOURCE_EXHAUSTED; 0: no limit");
ABSL_FLAG(double, drain_seconds, 30,
          "on SIGTERM: health NOT_SERVING and new calls UNAVAILABLE at once; running streams get this long to "
          "end, then are cancelled with the reason");
ABSL_FLAG(int64_t, max_prompt_bytes, 1 << 20, "largest text prompt (and Tokenize text), bytes");
ABSL_FLAG(int64_t, max_prompt_tokens, 32768, "largest token-id prompt (and Detokenize list), tokens");
ABSL_FLAG(int, max_tokens_limit, 4096, "largest sampling.max_tokens a request may ask for");
ABSL_FLAG(int, max_stop_strings, 16, "most stop strings in a request (at most 16)");
ABSL_FLAG(int, max_stop_bytes, 512, "longest stop string, bytes (at most 512)");
ABSL_FLAG(int, max_top_logprobs, 20, "most top_logprobs alternatives (at most 20)");
ABSL_FLAG(int, max_message_bytes, 16 << 20, "largest gRPC message either way, bytes (RESOURCE_EXHAUSTED beyond)");

ABSL_FLAG(std::string, http_listen, "",
          "also serve OpenAI's HTTP API (/v1/models, /v1/completions, /v1/chat/completions, /health) on "
          "host:port; empty: off");
ABSL_FLAG(std::string, metrics_listen, "", "serve Prometheus metrics at http://HOST:PORT/metrics; empty: off");
ABSL_FLAG(std::string, served_model_name, "",
          "the model's name in the HTTP API (/v1/models, the `model` field); empty: the pack directory's name");

namespace {

using strata::services::kExitFailure;
using strata::services::kExitOk;
using strata::services::kExitUsage;

constexpr char kUsage[] =
    R"(usage: strata-server (--pack DIR | --model FILE.gguf) [--listen HOST:PORT] [flags]

Serves strata.v1.Inference, grpc.health.v1 and server reflection (and, with --http-listen, an OpenAI-compatible
HTTP API). The server reports NOT_SERVING while the pack loads, then SERVING. SIGINT or SIGTERM: health turns
NOT_SERVING and new calls get UNAVAILABLE at once, HTTP streams end, running gRPC generations get
--drain-seconds to finish and are then cancelled with the reason; exits 0. SIGHUP rereads --auth-tokens-file.
)";
constexpr char kExitCodes[] =
    "exit codes: 0 stopped by SIGINT or SIGTERM, 1 cannot listen or load the pack, 2 usage error";

std::atomic<bool> g_loaded{false};
absl::Notification g_stop;
strata::services::AuthTokens* g_tokens = nullptr;  // set before the signal thread starts

int UsageError(const std::string& message) {
  std::cerr << "strata-server: error: " << message << " (see strata-server --help)\n";
  return kExitUsage;
}

// Waits for SIGINT/SIGTERM (blocked in every thread) and asks main to stop; before the pack has loaded
// there is nothing to drain, so the process ends at once.
void WaitForStopSignal(sigset_t signals) {
  const int signal_number = strata::services::WaitForStopSignal(signals, g_tokens);
  if (!g_loaded.load()) {
    spdlog::warn("signal {} while loading the pack: exiting", signal_number);
    std::_Exit(kExitOk);
  }
  spdlog::info("signal {}: shutting down", signal_number);
  g_stop.Notify();
}

void LogEngineInfo(const strata::runtime::EngineInfo& info, const strata::runtime::EngineOptions& options) {
  const strata::model::ModelConfig& c = info.config;
  spdlog::info("loaded {} in {:.2f} s: {}, {} layers, {} experts (top-{}), n_embd {}, expert ff {}, {} heads "
               "({} kv), vocab {}, context {} (trained {})",
               options.pack_dir, info.load_seconds, c.arch, c.n_layer, c.n_expert, c.n_expert_used, c.n_embd,
               c.expert_ff, c.n_head, c.n_head_kv, c.n_vocab, info.max_ctx, c.n_ctx_train);
  spdlog::info("experts: {:.3f} GB, scheme {}, source {}, loaded at {:.2f} GB/s{}{}; {:.2f} MB of experts per token",
               static_cast<double>(info.experts_bytes) / 1e9, info.scheme, info.source_kind,
               info.source.gb_per_second, info.source.huge_pages ? ", huge pages" : "",
               info.source.pinned ? ", pinned" : "", static_cast<double>(info.expert_bytes_per_token) / 1e6);
  spdlog::info("{} threads, up to {} sequences together, {} more queued", info.threads, options.max_seqs,
               options.max_queue);
  spdlog::info("KV cache: {:.2f} MB per sequence of {} positions{}",
               static_cast<double>(info.kv_bytes_per_sequence) / 1e6, info.max_ctx,
               c.sliding_window > 0 ? " (the sliding-window blocks keep only their window)" : "");
  spdlog::info("chat: {}", info.has_chat_template ? (options.chat_template.empty() ? "the model's chat template"
                                                                                    : "--chat-template-file")
                                                   : "unavailable (the model has no tokenizer.chat_template)");
  spdlog::info("device {} ({}), kernels {}, {:.2f} GiB of device memory in use", info.backend.device,
               info.backend.name, info.backend.isa, static_cast<double>(info.backend.memory_used) / (1ull << 30));
}

// Starts the listeners --http-listen and --metrics-listen ask for (their addresses are checked already).
absl::Status StartHttp(const strata::runtime::EngineOptions& options, strata::services::InferenceServiceImpl& service,
                       strata::services::InferenceMetrics* metrics, strata::services::MetricsRegistry* registry,
                       const strata::services::AuthTokens* tokens, strata::services::CallGate* gate,
                       const strata::services::RequestLimits& limits,
                       std::unique_ptr<strata::services::OpenAiServer>* http_api,
                       std::unique_ptr<strata::services::HttpListener>* http_listener,
                       std::unique_ptr<strata::services::HttpListener>* metrics_listener) {
  const std::string http_listen = absl::GetFlag(FLAGS_http_listen);
  if (!http_listen.empty()) {
    strata::services::OpenAiServerOptions http_options;
    http_options.model_id = absl::GetFlag(FLAGS_served_model_name);
    if (http_options.model_id.empty()) {
      std::filesystem::path pack = std::filesystem::path(options.pack_dir).lexically_normal();
      if (!pack.has_filename()) pack = pack.parent_path();  // "dir/"
      http_options.model_id = pack.filename().string();
    }
    http_options.max_body_bytes = strata::services::ServerConfig().max_message_bytes;  // as for gRPC
    http_options.worker_threads = options.max_seqs + options.max_queue + 8;  // every admitted request, and a few
    // The same bearer tokens as the gRPC API (none asked without --auth-tokens-file).
    if (tokens != nullptr) {
      http_options.authorize = [tokens](absl::string_view authorization) {
        return tokens->Allows(std::string_view(authorization.data(), authorization.size()))
                   ? absl::OkStatus()
                   : absl::UnauthenticatedError("a valid bearer token is required (Authorization: Bearer ...)");
      };
    }
    // The gRPC API's gate: draining, tokens and the per-client limit count HTTP generations too.
    if (gate != nullptr) {
      http_options.admit = [gate](std::string_view peer,
                                  std::string_view authorization) -> absl::StatusOr<std::shared_ptr<void>> {
        absl::StatusOr<strata::services::CallGate::Ticket> ticket = gate->Admit(peer, authorization);
        if (!ticket.ok()) return ticket.status();
        return std::shared_ptr<void>(std::make_shared<strata::services::CallGate::Ticket>(*std::move(ticket)));
      };
    }
    // The same request limits as the gRPC API.
    http_options.check_limits = [limits](const strata::runtime::GenerateRequest& request) {
      return strata::services::CheckHttpRequest(request, limits);
    };
    // The model's chat template, as the gRPC Chat method renders it.
    http_options.render_chat = [&service](const std::vector<strata::services::ChatMessage>& messages)
        -> absl::StatusOr<strata::services::RenderedChat> {
      const strata::runtime::Engine* engine = service.engine();
      if (engine == nullptr) return absl::UnavailableError("the model is still loading");
      strata::runtime::ChatRequest request;
      for (const strata::services::ChatMessage& m : messages) request.messages.push_back({m.role, m.content});
      absl::StatusOr<strata::runtime::GenerateRequest> prepared = engine->PrepareChat(request);
      if (!prepared.ok()) return prepared.status();
      return strata::services::RenderedChat{std::move(prepared->prompt), prepared->add_special};
    };
    *http_api = std::make_unique<strata::services::OpenAiServer>(
        std::move(http_options), [&service] { return service.engine(); }, metrics);
    absl::StatusOr<std::unique_ptr<strata::services::HttpListener>> listener =
        strata::services::HttpListener::Start((*http_api)->MakeHttpServer(), http_listen, "--http-listen");
    if (!listener.ok()) return listener.status();
    *http_listener = *std::move(listener);
    spdlog::info("OpenAI-compatible HTTP API on http://{} (port {})", http_listen, (*http_listener)->port());
  }
  const std::string metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  if (!metrics_listen.empty()) {
    absl::StatusOr<std::unique_ptr<strata::services::HttpListener>> listener = strata::services::HttpListener::Start(
        strata::services::MakeMetricsHttpServer(registry), metrics_listen, "--metrics-listen");
    if (!listener.ok()) return listener.status();
    *metrics_listener = *std::move(listener);
    spdlog::info("metrics at http://{}/metrics (port {})", metrics_listen, (*metrics_listener)->port());
  }
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "strata-server --pack DIR [--listen HOST:PORT] [--threads N] [--max-seqs N] [--ctx N] [--max-queue N] "
      "[--expert-source arena|mmap] [--verify] [--device auto|cpu|cuda] [--vram-gib X] [--vram-experts N] "
      "[--cache-policy lru|lfu-decay|static] [--miss-path gpu|cpu|both] [--prompt-math fp32|split-tf32] "
      "[--nopin-arena] "
      "[--chat-template-file FILE] "
      "[--network-priority auto|idle|normal] [--http-listen HOST:PORT] [--metrics-listen HOST:PORT] "
      "[--served-model-name NAME] [--tls-cert F --tls-key F [--tls-client-ca F]] "
      "[--auth-tokens-file F] [--max-calls-per-client N] [--drain-seconds S] [--max-prompt-bytes N] "
      "[--max-prompt-tokens N] [--max-tokens-limit N] [--max-stop-strings N] [--max-stop-bytes N] "
      "[--max-top-logprobs N] [--max-message-bytes N]");
  std::vector<std::string> args(argv, argv + argc);
  if (strata::services::WantsHelp(args)) {
    std::cout << strata::services::HelpText(kUsage, {"strata_server_main.cc"}, kExitCodes);
    return kExitOk;
  }
  absl::StatusOr<std::vector<std::string>> parsed = strata::services::ParseFlags(std::move(args));
  if (!parsed.ok()) {
    return UsageError(std::string(parsed.status().message()));
  }
  const std::vector<std::string>& positional = *parsed;
  if (positional.size() > 1) return UsageError(std::string("unexpected argument '") + positional[1] + "'");

  strata::runtime::EngineOptions options;
  options.pack_dir = absl::GetFlag(FLAGS_pack);
  options.threads = absl::GetFlag(FLAGS_threads);
  options.max_seqs = absl::GetFlag(FLAGS_max_seqs);
  options.max_ctx = absl::GetFlag(FLAGS_ctx);
  options.max_queue = absl::GetFlag(FLAGS_max_queue);
  options.experts.kind = absl::GetFlag(FLAGS_expert_source);
  options.experts.verify = absl::GetFlag(FLAGS_verify);
  options.device.device = absl::GetFlag(FLAGS_device);
  options.device.vram_gib = absl::GetFlag(FLAGS_vram_gib);
  options.device.vram_experts = absl::GetFlag(FLAGS_vram_experts);
  options.device.cache_policy = absl::GetFlag(FLAGS_cache_policy);
  options.device.miss_path = absl::GetFlag(FLAGS_miss_path);
  options.device.pin_arena = absl::GetFlag(FLAGS_pin_arena);
  options.device.prefetch_experts = absl::GetFlag(FLAGS_prefetch_experts);
  options.device.prompt_math = absl::GetFlag(FLAGS_prompt_math);
  // Loading a large pack shows in the log (nothing for one loaded within a second).
  options.experts.on_load_progress = [progress = std::make_shared<strata::services::CountProgress>(
                                          "loading experts", strata::services::CountProgress::Unit::kBytes,
                                          [](const std::string& line) { spdlog::info("{}", line); })](
                                         uint64_t done, uint64_t total) { progress->Update(done, total); };
  const std::string model = absl::GetFlag(FLAGS_model);
  if (options.pack_dir.empty() == model.empty()) return UsageError("give either --pack DIR or --model FILE.gguf");
  if (const std::string path = absl::GetFlag(FLAGS_chat_template_file); !path.empty()) {
    std::ifstream in(path, std::ios::binary);
    std::ostringstream text;
    text << in.rdbuf();
    if (!in.good() && !in.eof()) return UsageError("--chat-template-file: cannot read " + path);
    options.chat_template = text.str();
    if (options.chat_template.empty()) return UsageError("--chat-template-file: " + path + " is empty or unreadable");
  }
  if (options.device.device != "auto" && options.device.device != "cpu" && options.device.device != "cuda") {
    return UsageError("--device: '" + options.device.device + "' is not auto, cpu or cuda");
  }
  if (!(options.device.vram_gib >= 0)) return UsageError("--vram-gib: must be a number >= 0");
  if (options.device.vram_experts < -1) return UsageError("--vram-experts: must be -1 (auto) or a count");
  if (absl::StatusOr<strata::runtime::PromptMath> math = strata::runtime::ParsePromptMath(options.device.prompt_math);
      !math.ok()) {
    return UsageError("--prompt-math: " + std::string(math.status().message()));
  }
  if (options.device.prefetch_experts < 0 || options.device.prefetch_experts > strata::runtime::kMaxPrefetchExperts) {
    return UsageError("--prefetch-experts: must be a count from 0 to " +
                      std::to_string(strata::runtime::kMaxPrefetchExperts));
  }
  if (absl::StatusOr<strata::model::CachePolicy> policy = strata::model::ParseCachePolicy(options.device.cache_policy);
      !policy.ok()) {
    return UsageError("--cache-policy: " + std::string(policy.status().message()));
  }
  if (absl::StatusOr<strata::model::MissPath> path = strata::model::ParseMissPath(options.device.miss_path);
      !path.ok()) {
    return UsageError("--miss-path: " + std::string(path.status().message()));
  }
  if (options.experts.kind != "arena" && options.experts.kind != "mmap") {
    return UsageError("--expert-source: '" + options.experts.kind + "' is not arena or mmap");
  }
  if (options.threads < 0) return UsageError("--threads: must not be negative");
  if (options.max_seqs < 1) return UsageError("--max-seqs: must be at least 1");
  if (options.max_queue < 0) return UsageError("--max-queue: must not be negative");
  if (options.max_ctx < 0) return UsageError("--ctx: must not be negative");
  if (absl::Status status = strata::services::CheckLogLevel(absl::GetFlag(FLAGS_log_level)); !status.ok()) {
    return UsageError(std::string(status.message()));
  }
  absl::StatusOr<strata::services::NetworkPriority> network_priority =
      strata::services::ParseNetworkPriority(absl::GetFlag(FLAGS_network_priority), "--network-priority");
  if (!network_priority.ok()) return UsageError(std::string(network_priority.status().message()));
  for (const auto& [flag, address] :
       {std::pair<std::string, std::string>{"--http-listen", absl::GetFlag(FLAGS_http_listen)},
        {"--metrics-listen", absl::GetFlag(FLAGS_metrics_listen)}}) {
    if (address.empty()) continue;
    if (absl::Status status = strata::services::CheckListenAddress(address); !status.ok()) {
      return UsageError(flag + ": " + std::string(status.message()));
    }
  }
  strata::services::InferenceServiceOptions service_options;
  service_options.limits = {.max_prompt_bytes = absl::GetFlag(FLAGS_max_prompt_bytes),
                            .max_prompt_tokens = absl::GetFlag(FLAGS_max_prompt_tokens),
                            .max_tokens = absl::GetFlag(FLAGS_max_tokens_limit),
                            .max_stop_strings = absl::GetFlag(FLAGS_max_stop_strings),
                            .max_stop_bytes = absl::GetFlag(FLAGS_max_stop_bytes),
                            .max_top_logprobs = absl::GetFlag(FLAGS_max_top_logprobs)};
  if (absl::Status status = strata::services::CheckRequestLimits(service_options.limits); !status.ok()) {
    return UsageError(std::string(status.message()));
  }
  const double drain_seconds = absl::GetFlag(FLAGS_drain_seconds);
  if (!(drain_seconds >= 0 && drain_seconds <= 86400)) return UsageError("--drain-seconds: must be in 0..86400");
  if (absl::GetFlag(FLAGS_max_message_bytes) < 1024) return UsageError("--max-message-bytes: must be at least 1024");
  // Signals are taken by sigwait; block them before gRPC (whose credentials start its threads) and the engine
  // start threads, which inherit the mask.
  const sigset_t stop_signals = strata::services::BlockServerSignals();
  absl::StatusOr<strata::services::ServerAccess> access = strata::services::MakeServerAccess(
      {.tls = {absl::GetFlag(FLAGS_tls_cert), absl::GetFlag(FLAGS_tls_key), absl::GetFlag(FLAGS_tls_client_ca)},
       .auth_tokens_file = absl::GetFlag(FLAGS_auth_tokens_file),
       .max_calls_per_client = absl::GetFlag(FLAGS_max_calls_per_client)});
  if (!access.ok()) return UsageError(std::string(access.status().message()));
  service_options.gate = access->gate.get();
  g_tokens = access->tokens.get();
  strata::InitLogging(absl::GetFlag(FLAGS_log_level));

  std::thread(WaitForStopSignal, stop_signals).detach();

  auto service = std::make_unique<strata::services::InferenceServiceImpl>(service_options);
  strata::services::ServerConfig config;
  config.listen_address = absl::GetFlag(FLAGS_listen);
  config.credentials = access->credentials;
  config.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  config.network_priority = strata::services::ResolveNetworkPriority(
      *network_priority, options.threads, strata::exec::AvailableCores());
  absl::StatusOr<strata::services::StartedServer> started = strata::services::StartServer(
      config, {{service.get(), strata::v1::Inference::service_full_name()}});
  if (!started.ok()) {
    spdlog::error("{}", std::string(started.status().message()));
    return kExitFailure;
  }
  grpc::Server* server = started->server.get();
  // The HTTP API and /metrics, before the pack loads (they answer 503 and report the model not loaded).
  // Declared after the service, so they stop before its engine goes.
  strata::services::MetricsRegistry metrics_registry;
  strata::services::InferenceMetrics metrics(&metrics_registry, [&service] { return service->engine(); });
  service->SetMetrics(&metrics);
  std::unique_ptr<strata::services::OpenAiServer> http_api;
  std::unique_ptr<strata::services::HttpListener> http_listener, metrics_listener;
  if (absl::Status status = StartHttp(options, *service, &metrics, &metrics_registry, access->tokens.get(),
                                      access->gate.get(), service_options.limits, &http_api, &http_listener, &metrics_listener);
      !status.ok()) {
    spdlog::error("{}", std::string(status.message()));
    server->Shutdown();
    return kExitFailure;
  }
  strata::services::SetInferenceServing(server, false);
  spdlog::info("strata-server listening on {} (port {}); loading {}", config.listen_address, started->port,
               model.empty() ? options.pack_dir : model);
  spdlog::info("access: {}", access->Describe());
  spdlog::info("network threads scheduled {} (--network-priority {})",
               strata::services::NetworkPriorityName(started->network_priority), absl::GetFlag(FLAGS_network_priority));

  if (!model.empty()) {
    strata::services::ProgressPrinter printer(&std::cerr, /*terminal=*/false);
    absl::StatusOr<strata::services::PackCacheResult> cache = strata::services::PackForGguf(
        model, [&printer](const strata::packtool::ConvertProgress& p) { printer.Update(p); }, nullptr);
    printer.Finish();
    if (!cache.ok()) {
      spdlog::error("cannot serve {}: {}", model, cache.status().ToString());
      server->Shutdown();
      server->Wait();
      return kExitFailure;
    }
    options.pack_dir = cache->pack_dir;
    spdlog::info("{} the pack cache {} of {}", cache->reused ? "reusing" : "converted and validated", cache->pack_dir,
                 model);
  }
  absl::StatusOr<std::unique_ptr<strata::runtime::Engine>> engine = strata::runtime::Engine::Create(options);
  if (!engine.ok()) {
    spdlog::error("cannot serve {}: {}", options.pack_dir, engine.status().ToString());
    server->Shutdown();
    server->Wait();
    return kExitFailure;
  }
  LogEngineInfo((*engine)->info(), options);
  service->AttachEngine(*std::move(engine));
  g_loaded.store(true);
  strata::services::SetInferenceServing(server, true);
  spdlog::info("serving strata.v1.Inference on {} (port {})", config.listen_address, started->port);

  g_stop.WaitForNotification();
  // HTTP generations pass the same gate, so the drain waits for them too; past the drain time both kinds end.
  strata::services::DrainAndShutdown(server, access->gate.get(), absl::Seconds(drain_seconds),
                                     [&](const std::string& reason) {
                                       service->CancelGenerations(reason);
                                       if (http_api != nullptr) http_api->Shutdown();
                                     });
  if (http_api != nullptr) http_api->Shutdown();
  if (http_listener != nullptr) http_listener->Stop();
  started->server.reset();
  if (metrics_listener != nullptr) metrics_listener->Stop();
  service.reset();
  spdlog::info("stopped");
  return kExitOk;
}
