#ifndef STRATA_SERVICES_CALL_GATE_H_
#define STRATA_SERVICES_CALL_GATE_H_

// The admission every call of a Strata service passes first, before any work: refused with UNAVAILABLE
// while the server drains, UNAUTHENTICATED without an accepted bearer token (when tokens are asked for),
// RESOURCE_EXHAUSTED when its client already has --max-calls-per-client calls running. A client is its
// token when tokens are asked for, else its address (without the port). grpc.health.v1 and reflection
// are other services and never pass the gate, so probes stay open.
//
// An admitted call holds a Ticket until it ends; the gate counts them for draining. Thread-safe; the gate
// must outlive its tickets and the AuthTokens it is given.

#include <string>
#include <string_view>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/server_context.h"
#include "services/auth_tokens.h"

namespace strata::services {

struct CallGateOptions {
  const AuthTokens* tokens = nullptr;  // null: no token asked
  int max_calls_per_client = 0;        // 0: no limit
};

class CallGate {
 public:
  // Moving leaves the source empty; destroying a non-empty ticket ends the call's admission.
  class Ticket {
   public:
    Ticket() = default;
    Ticket(Ticket&& other) noexcept { *this = std::move(other); }
    Ticket& operator=(Ticket&& other) noexcept;
    ~Ticket() { Release(); }
    void Release();

   private:
    friend class CallGate;
    Ticket(CallGate* gate, std::string client) : gate_(gate), client_(std::move(client)) {}
    CallGate* gate_ = nullptr;
    std::string client_;
  };

  explicit CallGate(CallGateOptions options = {}) : options_(options) {}
  CallGate(const CallGate&) = delete;
  CallGate& operator=(const CallGate&) = delete;

  absl::StatusOr<Ticket> Admit(const grpc::ServerContextBase& context) ABSL_LOCKS_EXCLUDED(mu_);
  // The same with the call's peer ("ipv4:10.0.0.7:41234") and authorization header (empty when absent).
  absl::StatusOr<Ticket> Admit(std::string_view peer, std::string_view authorization) ABSL_LOCKS_EXCLUDED(mu_);

  // From now on every call is refused with UNAVAILABLE; admitted calls go on.
  void StartDraining() ABSL_LOCKS_EXCLUDED(mu_);
  bool draining() const ABSL_LOCKS_EXCLUDED(mu_);
  int in_flight() const ABSL_LOCKS_EXCLUDED(mu_);
  // Waits until no admitted call is running or `deadline` passes; true when none is.
  bool WaitUntilIdle(absl::Time deadline) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Release(const std::string& client) ABSL_LOCKS_EXCLUDED(mu_);
  bool IdleLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_) { return in_flight_ == 0; }

  const CallGateOptions options_;
  mutable absl::Mutex mu_;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<std::string, int> calls_by_client_ ABSL_GUARDED_BY(mu_);
};

// "10.0.0.7" of "ipv4:10.0.0.7:41234", "[::1]" of "ipv6:[::1]:41234"; other forms as they are.
std::string PeerHost(std::string_view peer);

}  // namespace strata::services

#endif  // STRATA_SERVICES_CALL_GATE_H_
