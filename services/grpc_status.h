#ifndef STRATA_SERVICES_GRPC_STATUS_H_
#define STRATA_SERVICES_GRPC_STATUS_H_

// The one place where absl::Status and grpc::Status meet. Every handler returns ToGrpcStatus(...) of the
// library's status; clients turn what they receive back with FromGrpcStatus. Pure functions.

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace strata::services {

// Same code, same message. The canonical codes of both libraries are the same set; anything unknown
// becomes UNKNOWN.
grpc::Status ToGrpcStatus(const absl::Status& status);

// The inverse, for clients.
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace strata::services

#endif  // STRATA_SERVICES_GRPC_STATUS_H_
