#ifndef STRATA_TESTS_TESTING_TEST_UTIL_H_
#define STRATA_TESTS_TESTING_TEST_UTIL_H_

// Helpers shared by the test binaries: scratch directories, file bytes, the shared test data.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"

namespace strata::testing {

// A fresh directory under $TEST_TMPDIR or /tmp, removed with its contents on destruction.
class ScratchDir {
 public:
  ScratchDir();
  ~ScratchDir();
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const std::string& path() const { return path_; }
  std::string Join(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// ../shared/testdata beside the source tree.
std::string TestDataDir();

std::vector<uint8_t> ReadFileBytes(const std::string& path);
void WriteFileBytes(const std::string& path, const std::vector<uint8_t>& bytes);

// Decompresses a .gz file from the test data into `dest` (uses the system's gzip).
void Gunzip(const std::string& gz_path, const std::string& dest);

}  // namespace strata::testing

// gMock matchers for absl::Status / StatusOr.
MATCHER(IsOk, "is OK") { return arg.ok(); }
MATCHER_P(StatusIs, code, "has status code " + std::to_string(static_cast<int>(code))) {
  return arg.code() == code;
}
MATCHER_P2(StatusIsWith, code, substring,
           "has status code " + std::to_string(static_cast<int>(code)) + " and a message containing '" +
               std::string(substring) + "'") {
  return arg.code() == code && std::string(arg.message()).find(substring) != std::string::npos;
}

#endif  // STRATA_TESTS_TESTING_TEST_UTIL_H_
