// Scaling out is replicas behind one name: two real strata-server processes behind one gRPC target that
// resolves to both addresses (as a headless Service's dns:/// name does), reached through MakeClientChannel
// (the channel the strata client uses), both receive calls. With gRPC's default pick_first policy every call
// would go to the first address.

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "grpcpp/client_context.h"
#include "services/tls_credentials.h"
#include "strata/v1/inference.grpc.pb.h"
#include "tests/services/inference_test_util.h"
#include "tests/services/server_process_util.h"
#include "tests/testing/test_util.h"
#include "tests/testing/wait.h"

namespace strata::services {
namespace {

using testing::ServerProcess;

constexpr int kServing = 1;

// The number of request log lines (one per Generate) in a server's log.
int RequestsLogged(const ServerProcess& server) {
  const std::string log = server.Log();
  int count = 0;
  for (size_t at = log.find("request id="); at != std::string::npos; at = log.find("request id=", at + 1)) ++count;
  return count;
}

class ClientChannelRoundRobinTest : public ::testing::Test {
 protected:
  // Starts strata-server on a free loopback port; returns the port, 0 on failure (the log says why).
  int StartReplica(const std::string& name) {
    replicas_.push_back(std::make_unique<ServerProcess>(
        STRATA_SERVER_BINARY,
        std::vector<std::string>{"--pack", testing::TinyPack(), "--listen", "127.0.0.1:0", "--threads", "1",
                                 "--max-seqs", "1", "--ctx", "256", "--log-level", "info"},
        dir_.Join(name + ".log")));
    if (!replicas_.back()->started()) return 0;
    return replicas_.back()->WaitForPort();
  }

  strata::testing::ScratchDir dir_;
  std::vector<std::unique_ptr<ServerProcess>> replicas_;
};

TEST_F(ClientChannelRoundRobinTest, CallsToOneTargetReachBothReplicas) {
  const int first = StartReplica("first");
  ASSERT_NE(first, 0) << replicas_[0]->Log();
  const int second = StartReplica("second");
  ASSERT_NE(second, 0) << replicas_[1]->Log();
  // One target, two addresses: gRPC's static resolver, which hands the policy what DNS would for a name
  // with two A records.
  const std::string target = absl::StrCat("ipv4:127.0.0.1:", first, ",127.0.0.1:", second);
  const int ports[] = {first, second};
  for (int i = 0; i < 2; ++i) {
    auto direct = MakeClientChannel(absl::StrCat("127.0.0.1:", ports[i]), ClientTlsOptions{});
    ASSERT_TRUE(direct.ok()) << direct.status();
    ASSERT_TRUE(strata::testing::WaitUntil([&] { return testing::HealthStatus(*direct, "") == kServing; }))
        << replicas_[i]->Log();
  }

  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = MakeClientChannel(target, ClientTlsOptions{});
  ASSERT_TRUE(channel.ok()) << channel.status();
  std::unique_ptr<v1::Inference::Stub> stub = v1::Inference::NewStub(*channel);
  // round_robin sends calls only to connected replicas: call until both have logged one (or 40 calls).
  int calls = 0;
  while (calls < 40 && (RequestsLogged(*replicas_[0]) == 0 || RequestsLogged(*replicas_[1]) == 0)) {
    grpc::ClientContext context;
    v1::GenerateRequest request;
    request.set_text("Once upon a time");
    request.mutable_sampling()->set_temperature(0);
    request.mutable_sampling()->set_max_tokens(2);
    auto stream = stub->Generate(&context, request);
    v1::GenerateResponse message;
    while (stream->Read(&message)) {
    }
    const grpc::Status status = stream->Finish();
    ASSERT_TRUE(status.ok()) << status.error_message();
    ++calls;
    // The log line is written when the call ends, possibly just after the client saw the end.
    strata::testing::WaitUntil(
        [&] { return RequestsLogged(*replicas_[0]) + RequestsLogged(*replicas_[1]) >= calls; });
  }
  EXPECT_GE(RequestsLogged(*replicas_[0]), 1) << "after " << calls << " calls\n" << replicas_[0]->Log();
  EXPECT_GE(RequestsLogged(*replicas_[1]), 1) << "after " << calls << " calls\n" << replicas_[1]->Log();
  EXPECT_EQ(RequestsLogged(*replicas_[0]) + RequestsLogged(*replicas_[1]), calls);

  // The strata client takes the same target (its --server goes to MakeClientChannel as it is).
  EXPECT_EQ(std::system(absl::StrCat(STRATA_CLIENT_BINARY, " info --server ", target, " >/dev/null 2>&1").c_str()),
            0);
}

}  // namespace
}  // namespace strata::services
