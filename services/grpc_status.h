#ifndef STRATA_SERVICES_GRPC_STATUS_H_
#define STRATA_SERVICES_GRPC_STATUS_H_

// The one place where absl::Status and grpc::Status meet. Every handler returns ToGrpcStatus(...) of the
// library's status; clients turn what they receive back with FromGrpcStatus, or with FromGrpcStatusAt,
// which also says which server answered when it does not serve the called service. Thread-safe.

#include <memory>
#include "absl/strings/string_view.h"

#include "absl/status/status.h"
#include "grpcpp/channel.h"
#include "grpcpp/support/status.h"

namespace strata::services {

// Same code, same message. The canonical codes of both libraries are the same set; anything unknown
// becomes UNKNOWN.
grpc::Status ToGrpcStatus(const absl::Status& status);

// The inverse, for clients.
absl::Status FromGrpcStatus(const grpc::Status& status);

// FromGrpcStatus, except for an UNIMPLEMENTED without a message (gRPC's answer for a service or method the
// server does not have): then `channel` is probed, one cheap call per Strata service, and the status names
// the server that answered at `address` and the one expected, e.g. "the server at HOST:PORT is a
// strata-packd (strata.v1.PackTool), not a strata-server (strata.v1.Inference)". `expected_service` is the
// full name of the called service (v1::Inference::service_full_name()). Blocks for the probes, a few
// seconds at most.
absl::Status FromGrpcStatusAt(const grpc::Status& status, const std::shared_ptr<grpc::Channel>& channel,
                              absl::string_view address, absl::string_view expected_service);

}  // namespace strata::services

#endif  // STRATA_SERVICES_GRPC_STATUS_H_
