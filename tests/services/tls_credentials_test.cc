#include "services/tls_credentials.h"

#include <memory>
#include <string>

#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "services/inference_service.h"
#include "services/server_runner.h"
#include "tests/services/inference_test_util.h"
#include "tests/services/tls_test_util.h"
#include "tests/testing/test_util.h"

namespace strata::services {
namespace {

using ::testing::HasSubstr;
using testing::HealthStatus;
using testing::TestCertificates;

constexpr int kServing = 1;
constexpr int kCallFailed = -1;

class TlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto certs = testing::MakeTestCertificates(dir_.path());
    ASSERT_TRUE(certs.ok()) << certs.status();
    certs_ = *certs;
  }

  // A server with the health service (SERVING) on a free loopback port under `files`.
  void Start(const ServerTlsFiles& files) {
    auto credentials = MakeServerCredentials(files);
    ASSERT_TRUE(credentials.ok()) << credentials.status();
    ServerConfig config;
    config.listen_address = "127.0.0.1:0";
    config.credentials = *credentials;
    auto started = StartServer(config, {{&service_, v1::Inference::service_full_name()}});
    ASSERT_TRUE(started.ok()) << started.status();
    started_ = *std::move(started);
  }

  void TearDown() override {
    if (started_.server != nullptr) {
      started_.server->Shutdown();
      started_.server->Wait();
    }
  }

  // Health over a fresh channel to 127.0.0.1 with `tls` (plaintext when disabled).
  int Health(const ClientTlsOptions& tls) {
    auto channel = MakeClientChannel("127.0.0.1:" + std::to_string(started_.port), tls);
    EXPECT_TRUE(channel.ok()) << channel.status();
    return channel.ok() ? HealthStatus(*channel, "") : kCallFailed;
  }

  strata::testing::ScratchDir dir_;
  TestCertificates certs_;
  InferenceServiceImpl service_;
  StartedServer started_;
};

TEST_F(TlsTest, TlsClientsAreServedAndPlaintextClientsAreNot) {
  Start({.cert = certs_.server_cert, .key = certs_.server_key});
  EXPECT_EQ(Health({.enabled = true, .ca = certs_.ca}), kServing);
  EXPECT_EQ(Health({}), kCallFailed);                                      // plaintext
  EXPECT_EQ(Health({.enabled = true, .ca = certs_.other_ca}), kCallFailed);  // the server's CA is not trusted
}

TEST_F(TlsTest, TheServerNameOverrideIsWhatTheCertificateIsCheckedAgainst) {
  Start({.cert = certs_.server_cert, .key = certs_.server_key});
  EXPECT_EQ(Health({.ca = certs_.ca, .server_name = "localhost"}), kServing);
  EXPECT_EQ(Health({.ca = certs_.ca, .server_name = "elsewhere.example"}), kCallFailed);
}

TEST_F(TlsTest, MutualTlsRefusesClientsWithoutACertificate) {
  Start({.cert = certs_.server_cert, .key = certs_.server_key, .client_ca = certs_.ca});
  EXPECT_EQ(Health({.ca = certs_.ca}), kCallFailed);
  EXPECT_EQ(Health({}), kCallFailed);
  EXPECT_EQ(Health({.ca = certs_.ca, .cert = certs_.client_cert, .key = certs_.client_key}), kServing);
}

TEST_F(TlsTest, MutualTlsRefusesACertificateOfAnotherCa) {
  Start({.cert = certs_.server_cert, .key = certs_.server_key, .client_ca = certs_.other_ca});
  EXPECT_EQ(Health({.ca = certs_.ca, .cert = certs_.client_cert, .key = certs_.client_key}), kCallFailed);
}

TEST_F(TlsTest, BadServerFlagsAreNamed) {
  auto key_only = MakeServerCredentials({.key = certs_.server_key});
  EXPECT_EQ(key_only.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(key_only.status().message(), HasSubstr("--tls-key: needs --tls-cert"));
  auto ca_only = MakeServerCredentials({.client_ca = certs_.ca});
  EXPECT_THAT(ca_only.status().message(), HasSubstr("--tls-client-ca: needs --tls-cert and --tls-key"));
  auto missing = MakeServerCredentials({.cert = dir_.Join("absent.pem"), .key = certs_.server_key});
  EXPECT_THAT(missing.status().message(), HasSubstr("--tls-cert: cannot read '" + dir_.Join("absent.pem") + "'"));
  auto swapped = MakeServerCredentials({.cert = certs_.server_key, .key = certs_.server_cert});
  EXPECT_THAT(swapped.status().message(), HasSubstr("--tls-cert: '" + certs_.server_key + "' holds no PEM block"));
  EXPECT_TRUE(MakeServerCredentials({}).ok());  // plaintext
}

TEST_F(TlsTest, AMismatchedKeyIsACleanStartError) {
  auto credentials = MakeServerCredentials({.cert = certs_.server_cert, .key = certs_.client_key});
  ASSERT_TRUE(credentials.ok()) << credentials.status();
  ServerConfig config;
  config.listen_address = "127.0.0.1:0";
  config.credentials = *credentials;
  auto started = StartServer(config, {{&service_, v1::Inference::service_full_name()}});
  EXPECT_EQ(started.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(started.status().message(), HasSubstr("the TLS certificate and key do not belong together"));
}

TEST_F(TlsTest, BadClientFlagsAreNamed) {
  auto cert_only = MakeClientChannel("127.0.0.1:1", {.cert = certs_.client_cert});
  EXPECT_THAT(cert_only.status().message(), HasSubstr("--tls-cert: needs --tls-key"));
  auto bad_ca = MakeClientChannel("127.0.0.1:1", {.ca = certs_.client_key});
  EXPECT_THAT(bad_ca.status().message(), HasSubstr("--tls-ca: '" + certs_.client_key + "' holds no PEM block"));
}

}  // namespace
}  // namespace strata::services
