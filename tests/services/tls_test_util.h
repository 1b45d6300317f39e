#ifndef STRATA_TESTS_SERVICES_TLS_TEST_UTIL_H_
#define STRATA_TESTS_SERVICES_TLS_TEST_UTIL_H_

// Certificates for the TLS tests, made at test time with the openssl command (scripts/setup installs it)
// into a directory the caller owns and removes: a CA, a server certificate for localhost and 127.0.0.1, a
// client certificate, all signed by the CA, and a second CA that signed nothing. Header-only.

#include <cstdlib>
#include <fstream>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace strata::services::testing {

struct TestCertificates {
  std::string ca;        // PEM certificate of the CA
  std::string other_ca;  // a CA that signed nothing here
  std::string server_cert, server_key;
  std::string client_cert, client_key;
};

inline absl::StatusOr<TestCertificates> MakeTestCertificates(const std::string& dir) {
  {
    std::ofstream(dir + "/server.ext") << "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n";
    std::ofstream(dir + "/client.ext") << "extendedKeyUsage=clientAuth\n";
  }
  const std::string ec = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
  const std::string steps[] = {
      absl::StrCat("openssl req -x509 ", ec, " -days 2 -subj /CN=strata-test-ca -keyout ca.key -out ca.pem"),
      absl::StrCat("openssl req -x509 ", ec, " -days 2 -subj /CN=strata-other-ca -keyout other.key -out other.pem"),
      absl::StrCat("openssl req ", ec, " -subj /CN=localhost -keyout server.key -out server.csr"),
      "openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 -extfile server.ext "
      "-out server.pem",
      absl::StrCat("openssl req ", ec, " -subj /CN=strata-test-client -keyout client.key -out client.csr"),
      "openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 -extfile client.ext "
      "-out client.pem",
  };
  for (const std::string& step : steps) {
    const std::string command = absl::StrCat("cd '", dir, "' && ", step, " >>openssl.log 2>&1");
    if (std::system(command.c_str()) != 0) {
      return absl::InternalError(absl::StrCat("'", step, "' failed; see ", dir, "/openssl.log"));
    }
  }
  return TestCertificates{.ca = dir + "/ca.pem",
                          .other_ca = dir + "/other.pem",
                          .server_cert = dir + "/server.pem",
                          .server_key = dir + "/server.key",
                          .client_cert = dir + "/client.pem",
                          .client_key = dir + "/client.key"};
}

}  // namespace strata::services::testing

#endif  // STRATA_TESTS_SERVICES_TLS_TEST_UTIL_H_
