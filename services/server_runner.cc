#include "services/server_runner.h"

#include <thread>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "grpc/grpc.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"
#include "spdlog/spdlog.h"

namespace strata::services {

absl::Status CheckListenAddress(const std::string& address) {
  if (address.rfind("unix:", 0) == 0) return absl::OkStatus();
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    return absl::InvalidArgumentError(absl::StrCat("listen address '", address, "': expected host:port"));
  }
  const std::string port = address.substr(colon + 1);
  int value = 0;
  if (port.empty() || port.size() > 5 || !absl::SimpleAtoi(port, &value) ||
      port.find_first_not_of("0123456789") != std::string::npos || value > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("listen address '", address, "': port '", port, "' is not a number in 0..65535"));
  }
  return absl::OkStatus();
}

namespace {

absl::StatusOr<StartedServer> BuildAndStart(const ServerConfig& config, const std::vector<ServedService>& services) {
  // Both are process-wide switches that the builder reads when it is constructed.
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();

  grpc::ServerBuilder builder;
  // gRPC sets SO_REUSEPORT on Linux by default, which lets a second server bind a busy port and share its
  // connections; a busy port must be an error instead.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  StartedServer started;
  if (!config.listen_address.empty()) {
    builder.AddListeningPort(config.listen_address,
                             config.credentials != nullptr ? config.credentials : grpc::InsecureServerCredentials(),
                             &started.port);
  }
  builder.SetMaxReceiveMessageSize(config.max_message_bytes);
  builder.SetMaxSendMessageSize(config.max_message_bytes);
  for (const ServedService& served : services) builder.RegisterService(served.service);

  started.server = builder.BuildAndStart();
  if (started.server == nullptr || (!config.listen_address.empty() && started.port == 0)) {
    if (started.server != nullptr) started.server->Shutdown();
    return absl::UnavailableError(absl::StrCat(
        "cannot listen on '", config.listen_address, "': the address is in use or not this host's",
        config.credentials != nullptr ? ", or the TLS certificate and key do not belong together" : ""));
  }
  grpc::HealthCheckServiceInterface* health = started.server->GetHealthCheckService();
  if (health != nullptr) {
    health->SetServingStatus("", true);
    for (const ServedService& served : services) health->SetServingStatus(served.name, true);
  }
  return started;
}

}  // namespace

absl::StatusOr<StartedServer> StartServer(const ServerConfig& config, const std::vector<ServedService>& services) {
  if (!config.listen_address.empty()) {
    if (absl::Status s = CheckListenAddress(config.listen_address); !s.ok()) return s;
  }
  if (config.network_priority != NetworkPriority::kIdle) return BuildAndStart(config, services);
  // Built on a thread of its own under the priority: the threads gRPC starts inherit it, and the caller,
  // which may go on to start compute threads, keeps its own.
  absl::StatusOr<StartedServer> started;
  NetworkPriority applied = config.network_priority;
  std::thread builder([&] {
    if (absl::Status status = SetThisThreadNetworkPriority(config.network_priority); !status.ok()) {
      spdlog::warn("{}; the network threads run under the normal policy", std::string(status.message()));
      applied = NetworkPriority::kNormal;
    }
    started = BuildAndStart(config, services);
    // Started here, so that it runs under the priority too.
    if (started.ok() && applied == NetworkPriority::kIdle) {
      started->sweeper = std::make_unique<IdleThreadSweeper>(absl::Seconds(2));
    }
  });
  builder.join();
  if (started.ok()) started->network_priority = applied;
  return started;
}

}  // namespace strata::services
