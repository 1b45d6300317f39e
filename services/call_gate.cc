#include "services/call_gate.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace strata::services {

std::string PeerHost(std::string_view peer) {
  for (std::string_view scheme : {"ipv4:", "ipv6:"}) {
    if (peer.substr(0, scheme.size()) == scheme) {
      std::string_view address = peer.substr(scheme.size());
      const size_t colon = address.rfind(':');
      if (colon != std::string_view::npos) address = address.substr(0, colon);
      return std::string(address);
    }
  }
  return std::string(peer);
}

CallGate::Ticket& CallGate::Ticket::operator=(Ticket&& other) noexcept {
  if (this != &other) {
    Release();
    gate_ = std::exchange(other.gate_, nullptr);
    client_ = std::move(other.client_);
  }
  return *this;
}

void CallGate::Ticket::Release() {
  if (gate_ != nullptr) std::exchange(gate_, nullptr)->Release(client_);
}

absl::StatusOr<CallGate::Ticket> CallGate::Admit(const grpc::ServerContextBase& context) {
  std::string_view authorization;
  const auto& metadata = context.client_metadata();
  if (auto it = metadata.find("authorization"); it != metadata.end()) {
    authorization = std::string_view(it->second.data(), it->second.size());
  }
  return Admit(context.peer(), authorization);
}

absl::StatusOr<CallGate::Ticket> CallGate::Admit(std::string_view peer, std::string_view authorization) {
  // Outside the lock: Allows takes the tokens' own lock.
  const bool authenticated = options_.tokens == nullptr || options_.tokens->Allows(authorization);
  absl::MutexLock lock(&mu_);
  if (draining_) {
    return absl::UnavailableError("the server is draining (shutting down); retry on another replica");
  }
  if (!authenticated) {
    return absl::UnauthenticatedError(authorization.empty()
                                          ? "no bearer token: send 'authorization: Bearer <token>'"
                                          : "the bearer token is not accepted");
  }
  std::string client = options_.tokens != nullptr
                           ? absl::StrCat("token:", std::string(AuthTokens::BearerToken(authorization)))
                           : absl::StrCat("peer:", PeerHost(peer));
  int& calls = calls_by_client_[client];
  if (options_.max_calls_per_client > 0 && calls >= options_.max_calls_per_client) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "--max-calls-per-client: ", calls, " calls of this client (",
        options_.tokens != nullptr ? "its token" : PeerHost(peer), ") are running, the limit is ",
        options_.max_calls_per_client));
  }
  ++calls;
  ++in_flight_;
  return Ticket(this, std::move(client));
}

void CallGate::Release(const std::string& client) {
  absl::MutexLock lock(&mu_);
  --in_flight_;
  auto it = calls_by_client_.find(client);
  if (it != calls_by_client_.end() && --it->second <= 0) calls_by_client_.erase(it);
}

void CallGate::StartDraining() {
  absl::MutexLock lock(&mu_);
  draining_ = true;
}

bool CallGate::draining() const {
  absl::MutexLock lock(&mu_);
  return draining_;
}

int CallGate::in_flight() const {
  absl::MutexLock lock(&mu_);
  return in_flight_;
}

bool CallGate::WaitUntilIdle(absl::Time deadline) const {
  absl::MutexLock lock(&mu_);
  return mu_.AwaitWithDeadline(absl::Condition(this, &CallGate::IdleLocked), deadline);
}

}  // namespace strata::services
