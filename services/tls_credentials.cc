#include "services/tls_credentials.h"

#include <fstream>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/support/channel_arguments.h"

namespace strata::services {
namespace {

// The file's text when it holds a PEM block of `kind` ("CERTIFICATE", "PRIVATE KEY"); a key's header may
// say "RSA PRIVATE KEY" or "EC PRIVATE KEY", hence the suffix match.
absl::StatusOr<std::string> ReadPem(const std::string& path, const char* flag, const char* kind) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(absl::StrCat(flag, ": cannot read '", path, "'"));
  std::ostringstream text;
  text << in.rdbuf();
  const std::string pem = text.str();
  if (!absl::StrContains(pem, absl::StrCat(kind, "-----")) || !absl::StrContains(pem, "-----BEGIN ")) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": '", path, "' holds no PEM block '-----BEGIN ", kind, "-----'"));
  }
  return pem;
}

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(const ServerTlsFiles& files) {
  if (files.cert.empty() && files.key.empty()) {
    if (!files.client_ca.empty()) {
      return absl::InvalidArgumentError("--tls-client-ca: needs --tls-cert and --tls-key (mutual TLS is TLS)");
    }
    return grpc::InsecureServerCredentials();
  }
  if (files.cert.empty() || files.key.empty()) {
    return absl::InvalidArgumentError(files.cert.empty() ? "--tls-key: needs --tls-cert too"
                                                         : "--tls-cert: needs --tls-key too");
  }
  absl::StatusOr<std::string> cert = ReadPem(files.cert, "--tls-cert", "CERTIFICATE");
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = ReadPem(files.key, "--tls-key", "PRIVATE KEY");
  if (!key.ok()) return key.status();
  grpc::SslServerCredentialsOptions options;
  options.pem_key_cert_pairs.push_back({*key, *cert});
  if (!files.client_ca.empty()) {
    absl::StatusOr<std::string> ca = ReadPem(files.client_ca, "--tls-client-ca", "CERTIFICATE");
    if (!ca.ok()) return ca.status();
    options.pem_root_certs = *ca;
    options.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(options);
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeClientChannel(const std::string& target,
                                                                const ClientTlsOptions& tls) {
  grpc::ChannelArguments args;
  // A dns:/// target resolves to every replica; spread the calls over them instead of pinning to the first.
  args.SetLoadBalancingPolicyName("round_robin");
  const bool use_tls = tls.enabled || !tls.ca.empty() || !tls.cert.empty() || !tls.key.empty() ||
                       !tls.server_name.empty();
  if (!use_tls) return grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
  if (tls.cert.empty() != tls.key.empty()) {
    return absl::InvalidArgumentError(tls.cert.empty() ? "--tls-key: needs --tls-cert too"
                                                       : "--tls-cert: needs --tls-key too");
  }
  grpc::SslCredentialsOptions options;
  if (!tls.ca.empty()) {
    absl::StatusOr<std::string> ca = ReadPem(tls.ca, "--tls-ca", "CERTIFICATE");
    if (!ca.ok()) return ca.status();
    options.pem_root_certs = *ca;
  }
  if (!tls.cert.empty()) {
    absl::StatusOr<std::string> cert = ReadPem(tls.cert, "--tls-cert", "CERTIFICATE");
    if (!cert.ok()) return cert.status();
    absl::StatusOr<std::string> key = ReadPem(tls.key, "--tls-key", "PRIVATE KEY");
    if (!key.ok()) return key.status();
    options.pem_cert_chain = *cert;
    options.pem_private_key = *key;
  }
  if (!tls.server_name.empty()) args.SetSslTargetNameOverride(tls.server_name);
  return grpc::CreateCustomChannel(target, grpc::SslCredentials(options), args);
}

}  // namespace strata::services
