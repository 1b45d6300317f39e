#ifndef STRATA_SERVICES_TLS_CREDENTIALS_H_
#define STRATA_SERVICES_TLS_CREDENTIALS_H_

// TLS for the servers and the clients, from PEM files named by flags. Pure functions of the files; errors
// are INVALID_ARGUMENT naming the flag and the file.
//
// Server: --tls-cert and --tls-key (both or neither); --tls-client-ca turns on mutual TLS (a client must
// present a certificate signed by that CA, or the handshake fails).
// Client: --tls (system roots) or --tls-ca; --tls-cert/--tls-key for mutual TLS; --tls-server-name when
// the certificate names a host other than the one dialled.

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"

namespace strata::services {

struct ServerTlsFiles {
  std::string cert;       // --tls-cert: the server's certificate chain
  std::string key;        // --tls-key: its private key
  std::string client_ca;  // --tls-client-ca: CA of the client certificates; empty: no client certificate asked
};

// Plaintext (InsecureServerCredentials) when every field is empty.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(const ServerTlsFiles& files);

struct ClientTlsOptions {
  bool enabled = false;     // --tls; implied by any field below
  std::string ca;           // --tls-ca: roots that sign the server's certificate; empty: the system's
  std::string cert;         // --tls-cert: the client's certificate (mutual TLS)
  std::string key;          // --tls-key: its private key
  std::string server_name;  // --tls-server-name: the name to check the server's certificate against
};

// A channel to `target` (host:port, or dns:///name:port balanced round-robin), TLS as `tls` asks.
absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeClientChannel(const std::string& target,
                                                                const ClientTlsOptions& tls);

}  // namespace strata::services

#endif  // STRATA_SERVICES_TLS_CREDENTIALS_H_
