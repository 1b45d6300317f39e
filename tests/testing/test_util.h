#ifndef STRATA_TESTS_TESTING_TEST_UTIL_H_
#define STRATA_TESTS_TESTING_TEST_UTIL_H_

// Helpers shared by the test binaries: scratch directories, file bytes, the test data (tests/data).

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

// A scratch directory shared by the tests of one test program, for what is made once and reused (unpacked
// test data, synthesized models). Made on first use; removed when the program's tests end (by a global test
// environment, or at exit), and with --gtest_recreate_environments_when_repeating after every round, then
// made afresh. Keep no reference to it past a test; check that a path kept in it still exists before reuse.
const ScratchDir& SharedScratchDir();

// The repository's test data: tests/data in the source tree. Each folder's SOURCE.txt says where its files
// came from and under which licence; nothing a test reads lies outside the repository.
std::string TestDataDir();

// The path of `relative` (e.g. "vocab/ggml-vocab-gpt-2.gguf.gz") in the test data. A .gz file is unpacked
// into SharedScratchDir(), once per test program, and the unpacked copy's path returned. Throws when
// `relative` leaves the test data (absolute, or with a ".." part) or names no file.
std::string TestDataFile(const std::string& relative);

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
