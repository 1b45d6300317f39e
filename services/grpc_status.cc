#include "services/grpc_status.h"

#include <chrono>
#include <string>

#include "absl/strings/str_cat.h"
#include "grpcpp/client_context.h"
#include "strata/v1/inference.grpc.pb.h"
#include "strata/v1/packtool.grpc.pb.h"

namespace strata::services {
namespace {

grpc::StatusCode ToGrpcCode(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk: return grpc::StatusCode::OK;
    case absl::StatusCode::kCancelled: return grpc::StatusCode::CANCELLED;
    case absl::StatusCode::kUnknown: return grpc::StatusCode::UNKNOWN;
    case absl::StatusCode::kInvalidArgument: return grpc::StatusCode::INVALID_ARGUMENT;
    case absl::StatusCode::kDeadlineExceeded: return grpc::StatusCode::DEADLINE_EXCEEDED;
    case absl::StatusCode::kNotFound: return grpc::StatusCode::NOT_FOUND;
    case absl::StatusCode::kAlreadyExists: return grpc::StatusCode::ALREADY_EXISTS;
    case absl::StatusCode::kPermissionDenied: return grpc::StatusCode::PERMISSION_DENIED;
    case absl::StatusCode::kResourceExhausted: return grpc::StatusCode::RESOURCE_EXHAUSTED;
    case absl::StatusCode::kFailedPrecondition: return grpc::StatusCode::FAILED_PRECONDITION;
    case absl::StatusCode::kAborted: return grpc::StatusCode::ABORTED;
    case absl::StatusCode::kOutOfRange: return grpc::StatusCode::OUT_OF_RANGE;
    case absl::StatusCode::kUnimplemented: return grpc::StatusCode::UNIMPLEMENTED;
    case absl::StatusCode::kInternal: return grpc::StatusCode::INTERNAL;
    case absl::StatusCode::kUnavailable: return grpc::StatusCode::UNAVAILABLE;
    case absl::StatusCode::kDataLoss: return grpc::StatusCode::DATA_LOSS;
    case absl::StatusCode::kUnauthenticated: return grpc::StatusCode::UNAUTHENTICATED;
    default: return grpc::StatusCode::UNKNOWN;
  }
}

absl::StatusCode FromGrpcCode(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK: return absl::StatusCode::kOk;
    case grpc::StatusCode::CANCELLED: return absl::StatusCode::kCancelled;
    case grpc::StatusCode::UNKNOWN: return absl::StatusCode::kUnknown;
    case grpc::StatusCode::INVALID_ARGUMENT: return absl::StatusCode::kInvalidArgument;
    case grpc::StatusCode::DEADLINE_EXCEEDED: return absl::StatusCode::kDeadlineExceeded;
    case grpc::StatusCode::NOT_FOUND: return absl::StatusCode::kNotFound;
    case grpc::StatusCode::ALREADY_EXISTS: return absl::StatusCode::kAlreadyExists;
    case grpc::StatusCode::PERMISSION_DENIED: return absl::StatusCode::kPermissionDenied;
    case grpc::StatusCode::RESOURCE_EXHAUSTED: return absl::StatusCode::kResourceExhausted;
    case grpc::StatusCode::FAILED_PRECONDITION: return absl::StatusCode::kFailedPrecondition;
    case grpc::StatusCode::ABORTED: return absl::StatusCode::kAborted;
    case grpc::StatusCode::OUT_OF_RANGE: return absl::StatusCode::kOutOfRange;
    case grpc::StatusCode::UNIMPLEMENTED: return absl::StatusCode::kUnimplemented;
    case grpc::StatusCode::INTERNAL: return absl::StatusCode::kInternal;
    case grpc::StatusCode::UNAVAILABLE: return absl::StatusCode::kUnavailable;
    case grpc::StatusCode::DATA_LOSS: return absl::StatusCode::kDataLoss;
    case grpc::StatusCode::UNAUTHENTICATED: return absl::StatusCode::kUnauthenticated;
    default: return absl::StatusCode::kUnknown;
  }
}

constexpr std::chrono::seconds kProbeDeadline{3};

// A Strata service, the binary that serves it, and a cheap call that any server serving it answers with
// something other than UNIMPLEMENTED (an empty Inspect is refused by name; GetModelInfo only reads).
struct KnownService {
  const char* name;
  const char* binary;
  grpc::StatusCode (*probe)(const std::shared_ptr<grpc::Channel>& channel);
};

grpc::StatusCode ProbeInference(const std::shared_ptr<grpc::Channel>& channel) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + kProbeDeadline);
  v1::ModelInfo info;
  return v1::Inference::NewStub(channel)->GetModelInfo(&context, v1::GetModelInfoRequest(), &info).error_code();
}

grpc::StatusCode ProbePackTool(const std::shared_ptr<grpc::Channel>& channel) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + kProbeDeadline);
  v1::InspectReport report;
  return v1::PackTool::NewStub(channel)->Inspect(&context, v1::InspectRequest(), &report).error_code();
}

const KnownService kKnownServices[] = {
    {v1::Inference::service_full_name(), "strata-server", &ProbeInference},
    {v1::PackTool::service_full_name(), "strata-packd", &ProbePackTool},
};

std::string Describe(absl::string_view service) {
  for (const KnownService& known : kKnownServices) {
    if (service == known.name) return absl::StrCat("a ", known.binary, " (", service, ")");
  }
  return std::string(service);
}

}  // namespace

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(ToGrpcCode(status.code()), std::string(status.message()));
}

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(FromGrpcCode(status.error_code()), status.error_message());
}

absl::Status FromGrpcStatusAt(const grpc::Status& status, const std::shared_ptr<grpc::Channel>& channel,
                              absl::string_view address, absl::string_view expected_service) {
  // gRPC answers a service or method the server lacks with UNIMPLEMENTED and no message; an UNIMPLEMENTED
  // with a message is the service's own refusal (a model Strata cannot run) and passes through.
  if (status.error_code() != grpc::StatusCode::UNIMPLEMENTED || !status.error_message().empty() ||
      channel == nullptr) {
    return FromGrpcStatus(status);
  }
  for (const KnownService& known : kKnownServices) {
    // The server answered the call, so any answer but these means the service is there (a strata-server
    // still loading its pack answers UNAVAILABLE).
    const grpc::StatusCode answer = known.probe(channel);
    if (answer == grpc::StatusCode::UNIMPLEMENTED || answer == grpc::StatusCode::DEADLINE_EXCEEDED) continue;
    if (expected_service == known.name) {  // the service is there but not this method
      return absl::UnimplementedError(
          absl::StrCat(known.binary, " at ", address, " does not implement this call (an older version?)"));
    }
    return absl::UnimplementedError(absl::StrCat("the server at ", address, " is a ", known.binary, " (", known.name,
                                                 "), not ", Describe(expected_service)));
  }
  return absl::UnimplementedError(
      absl::StrCat("the server at ", address, " does not serve ", Describe(expected_service)));
}

}  // namespace strata::services
