#ifndef STRATA_SERVICES_SERVER_ACCESS_H_
#define STRATA_SERVICES_SERVER_ACCESS_H_

// Who may call a Strata server, from its flags: the listening port's credentials (TLS, mutual TLS), the
// bearer tokens, and the CallGate every call passes (draining, tokens, per-client concurrency). The
// binaries build it once, before the server; the server and the services borrow from it, so it outlives
// them. The signal helpers let a binary reload the tokens on SIGHUP while it waits for SIGINT/SIGTERM.

#include <signal.h>

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "services/auth_tokens.h"
#include "services/call_gate.h"
#include "services/tls_credentials.h"

namespace strata::services {

struct ServerAccessFlags {
  ServerTlsFiles tls;             // --tls-cert, --tls-key, --tls-client-ca
  std::string auth_tokens_file;   // --auth-tokens-file; empty: no token asked
  int max_calls_per_client = 0;   // --max-calls-per-client; 0: no limit
};

struct ServerAccess {
  std::shared_ptr<grpc::ServerCredentials> credentials;
  std::unique_ptr<AuthTokens> tokens;  // null without --auth-tokens-file
  std::unique_ptr<CallGate> gate;      // borrows `tokens`
  std::string Describe() const;        // "TLS, mutual TLS, 2 bearer tokens", for the start-up log
  bool tls = false;
  bool mutual_tls = false;
};

// INVALID_ARGUMENT naming the flag and file for anything that cannot be used.
absl::StatusOr<ServerAccess> MakeServerAccess(const ServerAccessFlags& flags);

// Blocks SIGINT, SIGTERM and SIGHUP in the calling thread, which threads started later inherit: call
// first in main. Returns the set to wait on.
sigset_t BlockServerSignals();

// Waits for SIGINT or SIGTERM and returns its number. A SIGHUP in between rereads `tokens` (when not null)
// and logs the outcome; a bad file keeps the tokens in force.
int WaitForStopSignal(const sigset_t& signals, AuthTokens* tokens);

// The end of a server after a stop signal: grpc.health.v1 reports NOT_SERVING at once and the gate
// refuses new calls (UNAVAILABLE); admitted calls get `drain_time` to end on their own. Then
// `cancel_running(reason)` is asked to end the rest (may be empty), they get a few seconds for that, and the
// server shuts down (cancelling anything left) and is waited for. Returns how many calls the drain time cut.
int DrainAndShutdown(grpc::Server* server, CallGate* gate, absl::Duration drain_time,
                     const std::function<void(const std::string& reason)>& cancel_running);

}  // namespace strata::services

#endif  // STRATA_SERVICES_SERVER_ACCESS_H_
