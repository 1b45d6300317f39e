#ifndef STRATA_SERVICES_SERVER_RUNNER_H_
#define STRATA_SERVICES_SERVER_RUNNER_H_

// Builds and starts a grpc::Server with the services every Strata server has: grpc.health.v1 (each given
// service and the whole server reported SERVING once started) and server reflection. The caller owns the
// services, which must outlive the returned server; call Shutdown() and then destroy the server first. The
// port is never shared (SO_REUSEPORT off): a second server on a busy port fails with UNAVAILABLE.

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "services/network_priority.h"

namespace strata::services {

struct ServedService {
  grpc::Service* service = nullptr;
  std::string name;  // full name for the health service, e.g. "strata.v1.PackTool"
};

struct ServerConfig {
  std::string listen_address;         // "host:port" (port 0: any free port); empty: in-process channels only
  std::shared_ptr<grpc::ServerCredentials> credentials;  // of the listening port; null: plaintext
  int max_message_bytes = 256 << 20;  // both directions; a manifest has one checksum per expert
  // Applied to the threads gRPC starts while the server is built (the process's first server also starts
  // gRPC's shared pollers and executors then); the calling thread keeps its own. Threads gRPC starts later
  // from other threads escape it and are moved by the server's IdleThreadSweeper. Where the system refuses it, a warning is logged
  // and the threads run under the normal policy. kAuto counts as kNormal here; the binaries resolve it
  // against their thread count.
  NetworkPriority network_priority = NetworkPriority::kNormal;
};

// OK for "host:port" with a port in 0..65535 ("[v6]:port" too) and for "unix:PATH"; otherwise
// INVALID_ARGUMENT naming the address and what is wrong with it.
absl::Status CheckListenAddress(const std::string& address);

struct StartedServer {
  std::unique_ptr<grpc::Server> server;
  int port = 0;  // the bound port, 0 without a listening address
  NetworkPriority network_priority = NetworkPriority::kNormal;  // as applied (kNormal where idle was refused)
  std::unique_ptr<IdleThreadSweeper> sweeper;  // for an idle server: threads gRPC starts later, every 2 s
};

// UNAVAILABLE naming the address when it cannot be bound.
absl::StatusOr<StartedServer> StartServer(const ServerConfig& config, const std::vector<ServedService>& services);

}  // namespace strata::services

#endif  // STRATA_SERVICES_SERVER_RUNNER_H_
