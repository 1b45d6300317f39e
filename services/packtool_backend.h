#ifndef STRATA_SERVICES_PACKTOOL_BACKEND_H_
#define STRATA_SERVICES_PACKTOOL_BACKEND_H_

// What strata-pack asks for, done either in this process (paths relative to the working directory) or by
// a strata-packd (paths relative to its data root). Both answer with the service's messages, so the CLI
// prints the same in both modes. One caller at a time.

#include <atomic>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/channel.h"
#include "strata/v1/packtool.pb.h"

namespace strata::services {

class PackToolBackend {
 public:
  using ProgressFn = std::function<void(const v1::ConvertProgress&)>;

  virtual ~PackToolBackend() = default;

  // Calls `progress` for each progress message and returns the last one, which carries the manifest.
  // Stops with CANCELLED soon after `cancel` (may be null) becomes true.
  virtual absl::StatusOr<v1::ConvertProgress> Convert(const v1::ConvertRequest& request, const ProgressFn& progress,
                                                      const std::atomic<bool>* cancel) = 0;
  // Stops with CANCELLED soon after `cancel` (may be null) becomes true.
  virtual absl::StatusOr<v1::ValidateReport> Validate(const v1::ValidateRequest& request,
                                                      const std::atomic<bool>* cancel) = 0;
  // Reads headers only; a server that does not answer within a minute is DEADLINE_EXCEEDED. Stops with
  // CANCELLED soon after `cancel` (may be null) becomes true.
  virtual absl::StatusOr<v1::InspectReport> Inspect(const v1::InspectRequest& request,
                                                    const std::atomic<bool>* cancel) = 0;
};

std::unique_ptr<PackToolBackend> NewLocalBackend();

// `address` only names the server in error messages.
std::unique_ptr<PackToolBackend> NewRemoteBackend(std::shared_ptr<grpc::Channel> channel, std::string address);

// An insecure channel to a strata-packd at `address`, accepting messages as large as the server sends.
std::shared_ptr<grpc::Channel> NewPackToolChannel(const std::string& address);

}  // namespace strata::services

#endif  // STRATA_SERVICES_PACKTOOL_BACKEND_H_
