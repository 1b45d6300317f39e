// strata-packd: the packtool gRPC service (strata.v1.PackTool), with health checking and reflection.
// Runs until SIGINT or SIGTERM, then drains (services/server_access.h): running calls get --drain-seconds,
// then conversions are cancelled (and remove their partial output); exits 0. SIGHUP rereads the tokens.

#include <signal.h>

#include <chrono>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/string_view.h"
#include "engine/log.h"
#include "absl/strings/str_cat.h"
#include "services/cli_flags.h"
#include "services/http_listener.h"
#include "services/metrics_endpoint.h"
#include "services/packtool_metrics.h"
#include "services/packtool_service.h"
#include "services/server_access.h"
#include "services/server_runner.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:50052", "address to listen on, host:port");
ABSL_FLAG(std::string, data_root, "", "required: the directory every request path must lie in");
ABSL_FLAG(int, threads, 0, "default worker threads of a conversion or validation; 0: all cores");
ABSL_FLAG(std::string, log_level, "info", "debug, info, warn, error or off");
ABSL_FLAG(std::string, metrics_listen, "", "serve Prometheus metrics at http://HOST:PORT/metrics; empty: off");
ABSL_FLAG(std::string, tls_cert, "", "TLS: the server's certificate chain (PEM); with --tls-key");
ABSL_FLAG(std::string, tls_key, "", "TLS: the server's private key (PEM)");
ABSL_FLAG(std::string, tls_client_ca, "", "mutual TLS: the CA that signs the client certificates (PEM)");
ABSL_FLAG(std::string, auth_tokens_file, "", "bearer tokens, one per line; reread on SIGHUP");
ABSL_FLAG(int, max_calls_per_client, 0, "calls one client may have running; 0: no limit");
ABSL_FLAG(double, drain_seconds, 30, "on SIGTERM: time running calls get to end before they are cancelled");

namespace {

constexpr char kUsage[] =
    R"(usage: strata-packd --data-root DIR [--listen HOST:PORT] [--threads N] [--log-level L]
                    [--metrics-listen HOST:PORT]

Serves strata.v1.PackTool (Convert, Validate, Inspect), grpc.health.v1 and server reflection.
Stops on SIGINT or SIGTERM: health turns NOT_SERVING and new calls get UNAVAILABLE at once; running calls
get --drain-seconds, then conversions are cancelled and leave no output; exits 0.
)";
constexpr char kExitCodes[] = "exit codes: 0 stopped by SIGINT or SIGTERM, 1 cannot listen, 2 usage error";
constexpr int kExitFailure = 1;
constexpr int kExitUsage = 2;

int UsageError(absl::string_view message) {
  std::cerr << "strata-packd: error: " << message << " (see strata-packd --help)\n";
  return kExitUsage;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("strata-packd --data-root DIR [--listen HOST:PORT] [--threads N]");
  std::vector<std::string> args(argv, argv + argc);
  if (strata::services::WantsHelp(args)) {
    std::cout << strata::services::HelpText(kUsage, {"strata_packd_main.cc"}, kExitCodes);
    return 0;
  }
  absl::StatusOr<std::vector<std::string>> parsed = strata::services::ParseFlags(std::move(args));
  if (!parsed.ok()) {
    return UsageError(parsed.status().message());
  }
  const std::vector<std::string>& positional = *parsed;
  if (positional.size() > 1) return UsageError(std::string("unexpected argument '") + positional[1] + "'");
  if (absl::GetFlag(FLAGS_data_root).empty()) return UsageError("--data-root is required");
  if (absl::Status status = strata::services::CheckLogLevel(absl::GetFlag(FLAGS_log_level)); !status.ok()) {
    return UsageError(status.message());
  }
  const std::string metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  if (!metrics_listen.empty()) {
    if (absl::Status status = strata::services::CheckListenAddress(metrics_listen); !status.ok()) {
      return UsageError(absl::StrCat("--metrics-listen: ", status.message()));
    }
  }
  const double drain_seconds = absl::GetFlag(FLAGS_drain_seconds);
  if (!(drain_seconds >= 0 && drain_seconds <= 86400)) return UsageError("--drain-seconds: must be in 0..86400");
  // Signals are taken by sigwait below; block them before gRPC (whose credentials start its threads) starts
  // threads, which inherit the mask.
  const sigset_t stop_signals = strata::services::BlockServerSignals();
  absl::StatusOr<strata::services::ServerAccess> access = strata::services::MakeServerAccess(
      {.tls = {absl::GetFlag(FLAGS_tls_cert), absl::GetFlag(FLAGS_tls_key), absl::GetFlag(FLAGS_tls_client_ca)},
       .auth_tokens_file = absl::GetFlag(FLAGS_auth_tokens_file),
       .max_calls_per_client = absl::GetFlag(FLAGS_max_calls_per_client)});
  if (!access.ok()) return UsageError(access.status().message());
  strata::InitLogging(absl::GetFlag(FLAGS_log_level));


  strata::services::MetricsRegistry metrics_registry;
  strata::services::PackToolMetrics metrics(&metrics_registry);
  strata::services::PackToolServiceOptions service_options;
  service_options.metrics = &metrics;
  service_options.data_root = absl::GetFlag(FLAGS_data_root);
  service_options.default_threads = absl::GetFlag(FLAGS_threads);
  service_options.gate = access->gate.get();
  absl::StatusOr<std::unique_ptr<strata::services::PackToolServiceImpl>> service =
      strata::services::PackToolServiceImpl::Create(service_options);
  if (!service.ok()) {
    std::cerr << "strata-packd: error: " << service.status().message() << '\n';
    return kExitFailure;
  }
  strata::services::ServerConfig config;
  config.listen_address = absl::GetFlag(FLAGS_listen);
  config.credentials = access->credentials;
  absl::StatusOr<strata::services::StartedServer> started =
      strata::services::StartServer(config, {{service->get(), strata::v1::PackTool::service_full_name()}});
  if (!started.ok()) {
    std::cerr << "strata-packd: error: " << started.status().message() << '\n';
    return kExitFailure;
  }
  spdlog::info("strata-packd listening on {} (port {}), data root {}", config.listen_address, started->port,
               (*service)->data_root().path());
  std::unique_ptr<strata::services::HttpListener> metrics_listener;
  if (!metrics_listen.empty()) {
    absl::StatusOr<std::unique_ptr<strata::services::HttpListener>> listener = strata::services::HttpListener::Start(
        strata::services::MakeMetricsHttpServer(&metrics_registry), metrics_listen, "--metrics-listen");
    if (!listener.ok()) {
      std::cerr << "strata-packd: error: " << listener.status().message() << '\n';
      started->server->Shutdown();
      return kExitFailure;
    }
    metrics_listener = *std::move(listener);
    spdlog::info("metrics at http://{}/metrics (port {})", metrics_listen, metrics_listener->port());
  }
  spdlog::info("access: {}", access->Describe());

  const int signal_number = strata::services::WaitForStopSignal(stop_signals, access->tokens.get());
  spdlog::info("signal {}: draining", signal_number);
  grpc::Server* server = started->server.get();
  // A cut conversion is cancelled by the server's shutdown; it removes its .partial directory.
  strata::services::DrainAndShutdown(server, access->gate.get(), absl::Seconds(drain_seconds),
                                     [server](const std::string&) { server->Shutdown(std::chrono::system_clock::now()); });
  started->server.reset();
  if (metrics_listener != nullptr) metrics_listener->Stop();
  service->reset();
  spdlog::info("stopped");
  return 0;
}
