#include "services/server_access.h"

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "grpcpp/health_check_service_interface.h"
#include "spdlog/spdlog.h"

namespace strata::services {
namespace {

// What cancelled calls get to end (and report their reason) before the server cancels what is left.
constexpr absl::Duration kCancelGrace = absl::Seconds(5);

}  // namespace

std::string ServerAccess::Describe() const {
  std::string out = mutual_tls ? "mutual TLS" : tls ? "TLS" : "plaintext";
  absl::StrAppend(&out, tokens != nullptr ? absl::StrCat(", ", tokens->size(), " bearer tokens from ", tokens->path())
                                          : ", no bearer token asked");
  return out;
}

absl::StatusOr<ServerAccess> MakeServerAccess(const ServerAccessFlags& flags) {
  if (flags.max_calls_per_client < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max-calls-per-client: ", flags.max_calls_per_client, " is negative (0: no limit)"));
  }
  ServerAccess access;
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials = MakeServerCredentials(flags.tls);
  if (!credentials.ok()) return credentials.status();
  access.credentials = *std::move(credentials);
  access.tls = !flags.tls.cert.empty();
  access.mutual_tls = !flags.tls.client_ca.empty();
  if (!flags.auth_tokens_file.empty()) {
    absl::StatusOr<std::unique_ptr<AuthTokens>> tokens = AuthTokens::Load(flags.auth_tokens_file);
    if (!tokens.ok()) return tokens.status();
    access.tokens = *std::move(tokens);
  }
  access.gate = std::make_unique<CallGate>(
      CallGateOptions{.tokens = access.tokens.get(), .max_calls_per_client = flags.max_calls_per_client});
  return access;
}

sigset_t BlockServerSignals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  return signals;
}

int WaitForStopSignal(const sigset_t& signals, AuthTokens* tokens) {
  for (;;) {
    int signal_number = 0;
    if (sigwait(&signals, &signal_number) != 0) continue;
    if (signal_number != SIGHUP) return signal_number;
    if (tokens == nullptr) {
      spdlog::info("SIGHUP: no --auth-tokens-file to reload");
    } else if (absl::Status status = tokens->Reload(); status.ok()) {
      spdlog::info("SIGHUP: reloaded {} bearer tokens from {}", tokens->size(), tokens->path());
    } else {
      spdlog::error("SIGHUP: {}; the {} tokens loaded before stay in force", std::string(status.message()),
                    tokens->size());
    }
  }
}

int DrainAndShutdown(grpc::Server* server, CallGate* gate, absl::Duration drain_time,
                     const std::function<void(const std::string& reason)>& cancel_running) {
  if (grpc::HealthCheckServiceInterface* health = server->GetHealthCheckService(); health != nullptr) {
    health->SetServingStatus(false);  // every service, and the whole server
  }
  gate->StartDraining();
  int cut = 0;
  if (const int running = gate->in_flight(); running > 0) {
    spdlog::info("draining: {} calls running, waiting up to {}", running, absl::FormatDuration(drain_time));
  }
  if (!gate->WaitUntilIdle(absl::Now() + drain_time)) {
    cut = gate->in_flight();
    const std::string reason = absl::StrCat("the server is shutting down: the drain time of ",
                                            absl::FormatDuration(drain_time), " has passed");
    spdlog::warn("{}; cancelling {} calls", reason, cut);
    if (cancel_running) cancel_running(reason);
    gate->WaitUntilIdle(absl::Now() + kCancelGrace);
  }
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  server->Wait();
  return cut;
}

}  // namespace strata::services
