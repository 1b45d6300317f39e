#ifndef STRATA_SERVICES_AUTH_TOKENS_H_
#define STRATA_SERVICES_AUTH_TOKENS_H_

// The bearer tokens a server accepts, read from a file (--auth-tokens-file): one token per line; blank
// lines and lines starting with '#' are ignored, surrounding spaces are trimmed. A token is 16 to 512
// printable ASCII characters without spaces. Reload() rereads the file (on SIGHUP) and keeps the old tokens
// when the new file is bad, so a typo never locks every client out.
//
// The one check of a request's credentials for every transport (gRPC metadata, an HTTP header):
// Allows("Bearer <token>"). Thread-safe: any thread may call Allows while another reloads.

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace strata::services {

class AuthTokens {
 public:
  // INVALID_ARGUMENT naming the file (and line) when it cannot be read, holds a malformed token or none.
  static absl::StatusOr<std::unique_ptr<AuthTokens>> Load(std::string path);

  // Rereads the file; on error the tokens held so far stay in force and the error is returned.
  absl::Status Reload() ABSL_LOCKS_EXCLUDED(mu_);

  // True when `authorization_header` is "Bearer <token>" (scheme case-insensitive) with a token of the
  // file. Compares in time independent of where a wrong token differs.
  bool Allows(std::string_view authorization_header) const ABSL_LOCKS_EXCLUDED(mu_);

  // The token of "Bearer <token>", or empty when the header is not of that form.
  static std::string_view BearerToken(std::string_view authorization_header);

  const std::string& path() const { return path_; }
  size_t size() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  explicit AuthTokens(std::string path) : path_(std::move(path)) {}

  const std::string path_;
  mutable absl::Mutex mu_;
  std::vector<std::string> tokens_ ABSL_GUARDED_BY(mu_);
};

// Parses the text of a tokens file; `path` names it in errors.
absl::StatusOr<std::vector<std::string>> ParseAuthTokens(std::string_view text, std::string_view path);

}  // namespace strata::services

#endif  // STRATA_SERVICES_AUTH_TOKENS_H_
