#include "services/auth_tokens.h"

#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace strata::services {
namespace {

// Debian's Abseil has its own string_view.
absl::string_view Absl(std::string_view s) { return absl::string_view(s.data(), s.size()); }
std::string_view Std(absl::string_view s) { return std::string_view(s.data(), s.size()); }

constexpr size_t kMinTokenLength = 16;
constexpr size_t kMaxTokenLength = 512;

// Constant time in the contents: every byte of the longer string is looked at whatever differs.
bool SameToken(std::string_view a, std::string_view b) {
  const size_t n = std::max(a.size(), b.size());
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= x ^ y;
  }
  return diff == 0;
}

absl::StatusOr<std::vector<std::string>> ReadTokensFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(absl::StrCat("--auth-tokens-file: cannot read '", path, "'"));
  std::ostringstream text;
  text << in.rdbuf();
  return ParseAuthTokens(text.str(), path);
}

}  // namespace

absl::StatusOr<std::vector<std::string>> ParseAuthTokens(std::string_view text, std::string_view path) {
  std::vector<std::string> tokens;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(Absl(text), '\n')) {
    ++line_number;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    const auto where = [&] { return absl::StrCat("--auth-tokens-file ", Absl(path), ":", line_number, ": "); };
    for (char c : line) {
      if (c <= ' ' || c > '~') {
        return absl::InvalidArgumentError(
            absl::StrCat(where(), "a token is printable ASCII without spaces (one token per line)"));
      }
    }
    if (line.size() < kMinTokenLength || line.size() > kMaxTokenLength) {
      return absl::InvalidArgumentError(absl::StrCat(where(), "a token of ", line.size(), " characters; expected ",
                                                     kMinTokenLength, " to ", kMaxTokenLength));
    }
    tokens.emplace_back(line);
  }
  if (tokens.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--auth-tokens-file ", Absl(path), ": holds no token (one per line; '#' starts a comment)"));
  }
  return tokens;
}

absl::StatusOr<std::unique_ptr<AuthTokens>> AuthTokens::Load(std::string path) {
  auto tokens = std::unique_ptr<AuthTokens>(new AuthTokens(std::move(path)));
  if (absl::Status status = tokens->Reload(); !status.ok()) return status;
  return tokens;
}

absl::Status AuthTokens::Reload() {
  absl::StatusOr<std::vector<std::string>> tokens = ReadTokensFile(path_);
  if (!tokens.ok()) return tokens.status();
  absl::MutexLock lock(&mu_);
  tokens_ = *std::move(tokens);
  return absl::OkStatus();
}

std::string_view AuthTokens::BearerToken(std::string_view authorization_header) {
  constexpr std::string_view kScheme = "bearer ";
  if (authorization_header.size() <= kScheme.size() ||
      !absl::EqualsIgnoreCase(Absl(authorization_header.substr(0, kScheme.size())), Absl(kScheme))) {
    return {};
  }
  return Std(absl::StripAsciiWhitespace(Absl(authorization_header.substr(kScheme.size()))));
}

bool AuthTokens::Allows(std::string_view authorization_header) const {
  const std::string_view token = BearerToken(authorization_header);
  if (token.empty()) return false;
  absl::MutexLock lock(&mu_);
  bool allowed = false;
  for (const std::string& known : tokens_) allowed |= SameToken(token, known);  // no early exit
  return allowed;
}

size_t AuthTokens::size() const {
  absl::MutexLock lock(&mu_);
  return tokens_.size();
}

}  // namespace strata::services
