#include "services/grpc_status.h"

#include "gmock/gmock.h"
#include "grpcpp/client_context.h"
#include "gtest/gtest.h"
#include "services/server_runner.h"
#include "strata/v1/inference.grpc.pb.h"
#include "strata/v1/packtool.grpc.pb.h"
#include "tests/services/inference_test_util.h"
#include "tests/services/service_test_util.h"
#include "tests/testing/test_util.h"

namespace strata::services {
namespace {

TEST(GrpcStatusTest, OkMapsToOk) {
  EXPECT_TRUE(ToGrpcStatus(absl::OkStatus()).ok());
  EXPECT_TRUE(FromGrpcStatus(grpc::Status::OK).ok());
}

TEST(GrpcStatusTest, EveryCanonicalCodeKeepsItsNumberAndMessage) {
  for (int code = 1; code <= 16; ++code) {
    const absl::Status status(static_cast<absl::StatusCode>(code), "input: something is wrong");
    const grpc::Status converted = ToGrpcStatus(status);
    EXPECT_EQ(static_cast<int>(converted.error_code()), code);
    EXPECT_EQ(converted.error_message(), "input: something is wrong");
    EXPECT_EQ(FromGrpcStatus(converted), status);
  }
}

TEST(GrpcStatusTest, NamedCodesMatch) {
  EXPECT_EQ(ToGrpcStatus(absl::PermissionDeniedError("x")).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(ToGrpcStatus(absl::CancelledError("x")).error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_EQ(ToGrpcStatus(absl::AbortedError("x")).error_code(), grpc::StatusCode::ABORTED);
  EXPECT_EQ(FromGrpcStatus(grpc::Status(grpc::StatusCode::UNAVAILABLE, "down")).code(), absl::StatusCode::kUnavailable);
}

TEST(GrpcStatusTest, UnknownCodeBecomesUnknown) {
  const absl::Status odd(static_cast<absl::StatusCode>(99), "odd");
  EXPECT_EQ(ToGrpcStatus(odd).error_code(), grpc::StatusCode::UNKNOWN);
}

// The wrong server for a client: each Strata server, called for the other's service, is named along with
// the one the client expected; a call to a service that is there passes its status through unchanged.
TEST(GrpcStatusTest, AnUnimplementedServiceNamesTheServerThatAnsweredAndTheOneExpected) {
  strata::testing::ScratchDir root;
  testing::TestServer packd(root.path());
  testing::InferenceTestServer server(testing::TinyEngineOptions());

  grpc::ClientContext at_packd;
  v1::ModelInfo info;
  const grpc::Status inference_call =
      v1::Inference::NewStub(packd.channel())->GetModelInfo(&at_packd, v1::GetModelInfoRequest(), &info);
  ASSERT_EQ(inference_call.error_code(), grpc::StatusCode::UNIMPLEMENTED);
  const absl::Status named =
      FromGrpcStatusAt(inference_call, packd.channel(), "host:1", v1::Inference::service_full_name());
  EXPECT_EQ(named.code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(named.message(),
            "the server at host:1 is a strata-packd (strata.v1.PackTool), not a strata-server (strata.v1.Inference)");

  grpc::ClientContext at_server;
  v1::ValidateReport report;
  const grpc::Status packtool_call =
      v1::PackTool::NewStub(server.channel())->Validate(&at_server, v1::ValidateRequest(), &report);
  ASSERT_EQ(packtool_call.error_code(), grpc::StatusCode::UNIMPLEMENTED);
  EXPECT_EQ(FromGrpcStatusAt(packtool_call, server.channel(), "host:2", v1::PackTool::service_full_name()).message(),
            "the server at host:2 is a strata-server (strata.v1.Inference), not a strata-packd (strata.v1.PackTool)");

  const grpc::Status refused(grpc::StatusCode::INVALID_ARGUMENT, "pack_dir: empty");
  EXPECT_EQ(FromGrpcStatusAt(refused, packd.channel(), "host:1", v1::PackTool::service_full_name()),
            FromGrpcStatus(refused));
  // The service's own UNIMPLEMENTED (a model Strata cannot run) has a message and passes through.
  const grpc::Status own(grpc::StatusCode::UNIMPLEMENTED, "m.gguf: general.architecture 'x' is not supported");
  EXPECT_EQ(FromGrpcStatusAt(own, packd.channel(), "host:1", v1::PackTool::service_full_name()),
            FromGrpcStatus(own));
}

// A server with no Strata service at all (here: only health and reflection) is said not to serve the
// expected one.
TEST(GrpcStatusTest, AServerWithNoStrataServiceIsSaidNotToServeTheExpectedOne) {
  auto started = StartServer(ServerConfig(), {});
  ASSERT_TRUE(started.ok()) << started.status();
  const std::shared_ptr<grpc::Channel> channel = started->server->InProcessChannel(grpc::ChannelArguments());
  grpc::ClientContext context;
  v1::ModelInfo info;
  const grpc::Status call = v1::Inference::NewStub(channel)->GetModelInfo(&context, v1::GetModelInfoRequest(), &info);
  ASSERT_EQ(call.error_code(), grpc::StatusCode::UNIMPLEMENTED);
  const absl::Status named = FromGrpcStatusAt(call, channel, "host:3", v1::Inference::service_full_name());
  EXPECT_EQ(named.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(std::string(named.message()),
              ::testing::StartsWith("the server at host:3 does not serve a strata-server (strata.v1.Inference)"));
  started->server->Shutdown();
  started->server->Wait();
}

}  // namespace
}  // namespace strata::services
