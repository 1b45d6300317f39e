#include "services/server_runner.h"

#include <thread>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"
#include "spdlog/spdlog.h"

namespace strata::services {

namespace {

absl::StatusOr<StartedServer> BuildAndStart(const ServerConfig& config, const std::vector<ServedService>& services) {
  // Both are process-wide switches that the builder reads when it is constructed.
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();

  grpc::ServerBuilder builder;
  StartedServer started;
  if (!config.listen_address.empty()) {
    builder.AddListeningPort(config.listen_address, grpc::InsecureServerCredentials(), &started.port);
  }
  builder.SetMaxReceiveMessageSize(config.max_message_bytes);
  builder.SetMaxSendMessageSize(config.max_message_bytes);
  for (const ServedService& served : services) builder.RegisterService(served.service);

  started.server = builder.BuildAndStart();
  if (started.server == nullptr || (!config.listen_address.empty() && started.port == 0)) {
    if (started.server != nullptr) started.server->Shutdown();
    return absl::UnavailableError(
        absl::StrCat("cannot listen on '", config.listen_address, "' (address in use or malformed?)"));
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
