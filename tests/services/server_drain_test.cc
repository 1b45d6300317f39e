// The real strata-server and strata-packd binaries: draining on SIGTERM (health NOT_SERVING, new calls
// UNAVAILABLE, running streams finish or are cancelled with the reason after --drain-seconds, exit 0), a
// conversion cut by the drain leaving nothing behind, tokens reread on SIGHUP, and TLS through the strata
// client's flags.

#include <signal.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "strata/v1/inference.grpc.pb.h"
#include "strata/v1/packtool.grpc.pb.h"
#include "tests/services/inference_test_util.h"
#include "tests/services/server_process_util.h"
#include "tests/services/service_test_util.h"
#include "tests/services/tls_test_util.h"
#include "tests/testing/test_util.h"
#include "tests/testing/wait.h"

namespace strata::services {
namespace {

namespace fs = std::filesystem;
using testing::HealthStatus;
using testing::ServerProcess;
using ::testing::HasSubstr;

constexpr int kServing = 1;
constexpr int kNotServing = 2;
// The tiny pack decodes on the order of a thousand tokens a second on one thread here: a stream this long
// is still running when the signal arrives a moment after its first message.
constexpr int kLongStream = 2000;

std::vector<std::string> ServerArgs(const std::string& drain_seconds, std::vector<std::string> more = {}) {
  std::vector<std::string> args = {"--pack", testing::TinyPack(), "--listen", "127.0.0.1:0", "--threads", "1",
                                   "--max-seqs", "1", "--ctx", "2048", "--drain-seconds", drain_seconds};
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

std::shared_ptr<grpc::Channel> Plaintext(int port) {
  return grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials());
}

v1::GenerateRequest LongGreedy() {
  v1::GenerateRequest r;
  r.set_text("Once upon a time");
  r.mutable_sampling()->set_temperature(0);
  r.mutable_sampling()->set_ignore_eos(true);
  r.mutable_sampling()->set_max_tokens(kLongStream);
  return r;
}

class ServerDrainTest : public ::testing::Test {
 protected:
  // Starts strata-server and waits until it reports SERVING.
  void Start(const std::vector<std::string>& args) {
    server_ = std::make_unique<ServerProcess>(STRATA_SERVER_BINARY, args, dir_.Join("server.log"));
    ASSERT_TRUE(server_->started());
    port_ = server_->WaitForPort();
    ASSERT_NE(port_, 0) << server_->Log();
    channel_ = Plaintext(port_);
    ASSERT_TRUE(strata::testing::WaitUntil([&] { return HealthStatus(channel_, "") == kServing; }))
        << server_->Log();
    stub_ = v1::Inference::NewStub(channel_);
  }

  strata::testing::ScratchDir dir_;
  std::unique_ptr<ServerProcess> server_;
  int port_ = 0;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Inference::Stub> stub_;
};

TEST_F(ServerDrainTest, SigtermLetsARunningStreamFinishAndRefusesNewCalls) {
  Start(ServerArgs("60"));
  grpc::ClientContext context;
  auto stream = stub_->Generate(&context, LongGreedy());
  v1::GenerateResponse message;
  ASSERT_TRUE(stream->Read(&message));
  int tokens = message.tokens_size();

  server_->Signal(SIGTERM);
  EXPECT_TRUE(strata::testing::WaitUntil([&] { return HealthStatus(channel_, "") == kNotServing; }));
  EXPECT_EQ(HealthStatus(channel_, "strata.v1.Inference"), kNotServing);
  grpc::ClientContext late_context;
  v1::ModelInfo info;
  const grpc::Status late = stub_->GetModelInfo(&late_context, v1::GetModelInfoRequest(), &info);
  EXPECT_EQ(late.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(late.error_message(), HasSubstr("draining"));

  v1::FinishReason finish = v1::FINISH_REASON_UNSPECIFIED;
  while (stream->Read(&message)) {
    tokens += message.tokens_size();
    finish = message.finish_reason();
  }
  const grpc::Status status = stream->Finish();
  EXPECT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(tokens, kLongStream);
  EXPECT_EQ(finish, v1::FINISH_REASON_LENGTH);
  EXPECT_EQ(server_->WaitForExit(), 0) << server_->Log();
  EXPECT_THAT(server_->Log(), HasSubstr("draining: 1 calls running"));
}

TEST_F(ServerDrainTest, AStreamStillRunningAfterTheDrainTimeIsCancelledWithTheReason) {
  Start(ServerArgs("0.2"));
  grpc::ClientContext context;
  auto stream = stub_->Generate(&context, LongGreedy());
  v1::GenerateResponse message;
  ASSERT_TRUE(stream->Read(&message));
  int tokens = message.tokens_size();
  server_->Signal(SIGTERM);
  while (stream->Read(&message)) tokens += message.tokens_size();
  const grpc::Status status = stream->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(status.error_message(), HasSubstr("the server is shutting down: the drain time of 200ms has passed"));
  EXPECT_LT(tokens, kLongStream);
  EXPECT_EQ(server_->WaitForExit(), 0) << server_->Log();
  EXPECT_THAT(server_->Log(), HasSubstr("status=UNAVAILABLE"));
}

TEST_F(ServerDrainTest, SighupRereadsTheTokens) {
  const std::string tokens = dir_.Join("tokens");
  std::ofstream(tokens) << "first-token-0123456789\n";
  Start(ServerArgs("1", {"--auth-tokens-file", tokens}));
  const auto info_with = [&](const std::string& token) {
    grpc::ClientContext context;
    context.AddMetadata("authorization", "Bearer " + token);
    v1::ModelInfo info;
    return stub_->GetModelInfo(&context, v1::GetModelInfoRequest(), &info).error_code();
  };
  EXPECT_EQ(info_with("first-token-0123456789"), grpc::StatusCode::OK);
  EXPECT_EQ(info_with("second-token-0123456789"), grpc::StatusCode::UNAUTHENTICATED);

  std::ofstream(tokens, std::ios::trunc) << "# rotated\nsecond-token-0123456789\n";
  server_->Signal(SIGHUP);
  ASSERT_TRUE(strata::testing::WaitUntil([&] { return server_->Log().find("SIGHUP: reloaded 1") != std::string::npos; }))
      << server_->Log();
  EXPECT_EQ(info_with("first-token-0123456789"), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(info_with("second-token-0123456789"), grpc::StatusCode::OK);
  server_->Signal(SIGTERM);
  EXPECT_EQ(server_->WaitForExit(), 0) << server_->Log();
}

// Runs the strata client with `args`; its exit code, with stdout and stderr in *output.
int RunClient(const strata::testing::ScratchDir& dir, const std::string& args, std::string* output) {
  const std::string out = dir.Join("client.out");
  const int status = std::system(absl::StrCat(STRATA_CLIENT_BINARY, " ", args, " >", out, " 2>&1").c_str());
  std::ifstream in(out);
  std::ostringstream text;
  text << in.rdbuf();
  *output = text.str();
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST_F(ServerDrainTest, TheClientSpeaksMutualTlsWithABearerToken) {
  auto certs = testing::MakeTestCertificates(dir_.path());
  ASSERT_TRUE(certs.ok()) << certs.status();
  const std::string tokens = dir_.Join("tokens");
  std::ofstream(tokens) << "client-token-0123456789\n";
  server_ = std::make_unique<ServerProcess>(
      STRATA_SERVER_BINARY,
      ServerArgs("1", {"--tls-cert", certs->server_cert, "--tls-key", certs->server_key, "--tls-client-ca", certs->ca,
                       "--auth-tokens-file", tokens}),
      dir_.Join("server.log"));
  port_ = server_->WaitForPort();
  ASSERT_NE(port_, 0) << server_->Log();
  const std::string server = absl::StrCat("--server 127.0.0.1:", port_, " --timeout 30 ");
  const std::string mtls = absl::StrCat(" --tls-ca ", certs->ca, " --tls-cert ", certs->client_cert, " --tls-key ",
                                        certs->client_key);
  std::string output;
  // The pack loads in milliseconds; retry while it reports the model still loading.
  ASSERT_TRUE(strata::testing::WaitUntil([&] {
    return RunClient(dir_, server + "info --auth-token client-token-0123456789" + mtls, &output) == 0;
  })) << output;
  EXPECT_THAT(output, HasSubstr("qwen3moe"));

  EXPECT_EQ(RunClient(dir_, server + "info" + mtls, &output), 1);
  EXPECT_THAT(output, HasSubstr("UNAUTHENTICATED"));
  EXPECT_EQ(std::system(absl::StrCat("STRATA_AUTH_TOKEN=client-token-0123456789 ", STRATA_CLIENT_BINARY, " ", server,
                                     "info", mtls, " >/dev/null 2>&1")
                            .c_str()),
            0)
      << "the token from STRATA_AUTH_TOKEN";
  EXPECT_EQ(RunClient(dir_, server + "info --auth-token client-token-0123456789 --tls-ca " + certs->ca, &output), 1)
      << "mutual TLS without a client certificate";
  EXPECT_EQ(RunClient(dir_, server + "info --auth-token client-token-0123456789", &output), 1) << "plaintext";
  EXPECT_EQ(RunClient(dir_, server + "info --tls-cert " + certs->client_cert, &output), 2);
  EXPECT_THAT(output, HasSubstr("--tls-cert: needs --tls-key"));
  server_->Signal(SIGTERM);
  EXPECT_EQ(server_->WaitForExit(), 0) << server_->Log();
}

TEST(PackdDrainTest, AConversionCutByTheDrainLeavesNoPack) {
  strata::testing::ScratchDir root;
  fs::create_hard_link(testing::Models().big_gguf, root.Join("big.gguf"));
  strata::testing::ScratchDir logs;
  ServerProcess packd(STRATA_PACKD_BINARY,
                      {"--data-root", root.path(), "--listen", "127.0.0.1:0", "--threads", "1", "--drain-seconds", "0"},
                      logs.Join("packd.log"));
  const int port = packd.WaitForPort();
  ASSERT_NE(port, 0) << packd.Log();
  auto stub = v1::PackTool::NewStub(Plaintext(port));
  grpc::ClientContext context;
  v1::ConvertRequest request;
  request.set_input("big.gguf");
  request.set_output_dir("big-pack");
  request.set_scheme("s2");
  request.set_threads(1);
  auto stream = stub->Convert(&context, request);
  v1::ConvertProgress progress;
  ASSERT_TRUE(stream->Read(&progress)) << packd.Log();
  packd.Signal(SIGTERM);
  while (stream->Read(&progress)) {
  }
  EXPECT_FALSE(stream->Finish().ok());
  EXPECT_EQ(packd.WaitForExit(), 0) << packd.Log();
  EXPECT_FALSE(fs::exists(root.Join("big-pack")));
  EXPECT_FALSE(fs::exists(root.Join("big-pack.partial")));
}

struct BadFlags {
  const char* binary;
  std::vector<std::string> args;
  const char* message;
};

TEST(ServerFlagsTest, BadAccessAndLimitFlagsAreUsageErrorsNamingTheFlag) {
  strata::testing::ScratchDir dir;
  const std::string pack = testing::TinyPack();
  const BadFlags cases[] = {
      {STRATA_SERVER_BINARY, {"--pack", pack, "--tls-key", dir.Join("k.pem")}, "--tls-key: needs --tls-cert too"},
      {STRATA_SERVER_BINARY, {"--pack", pack, "--auth-tokens-file", dir.Join("none")}, "--auth-tokens-file: cannot read"},
      {STRATA_SERVER_BINARY, {"--pack", pack, "--max-tokens-limit", "0"}, "--max-tokens-limit: 0 is not in 1.."},
      {STRATA_SERVER_BINARY, {"--pack", pack, "--max-top-logprobs", "21"}, "--max-top-logprobs: 21 is not in 1..20"},
      {STRATA_SERVER_BINARY, {"--pack", pack, "--drain-seconds", "-1"}, "--drain-seconds: must be in 0..86400"},
      {STRATA_SERVER_BINARY, {"--pack", pack, "--max-calls-per-client", "-2"}, "--max-calls-per-client: -2 is negative"},
      {STRATA_SERVER_BINARY, {"--pack", pack, "--cache-policy", "fifo"},
       "--cache-policy: 'fifo' is not a cache policy (lru, lfu-decay, static)"},
      {STRATA_PACKD_BINARY, {"--data-root", dir.path(), "--tls-client-ca", dir.Join("ca.pem")},
       "--tls-client-ca: needs --tls-cert and --tls-key"},
      {STRATA_PACKD_BINARY, {"--data-root", dir.path(), "--drain-seconds", "nan"}, "--drain-seconds: must be in 0..86400"},
  };
  for (const BadFlags& c : cases) {
    ServerProcess process(c.binary, c.args, dir.Join("out.log"));
    EXPECT_EQ(process.WaitForExit(), 2) << c.message;
    EXPECT_THAT(process.Log(), HasSubstr(c.message));
  }
}

}  // namespace
}  // namespace strata::services
