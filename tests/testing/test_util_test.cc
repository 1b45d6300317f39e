// The test data lies in the repository and says where it came from; the test helpers keep what they make
// inside scratch directories of their own.

#include "tests/testing/test_util.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>

#include "gtest/gtest.h"

namespace strata::testing {
namespace {

namespace fs = std::filesystem;

std::string ReadText(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// True when `path` is `dir` or lies under it, after symlinks.
bool IsUnder(const fs::path& path, const fs::path& dir) {
  const fs::path p = fs::weakly_canonical(path);
  const fs::path d = fs::weakly_canonical(dir);
  auto [d_end, p_it] = std::mismatch(d.begin(), d.end(), p.begin(), p.end());
  return d_end == d.end();
}

TEST(TestDataTest, LiesInTheRepository) {
  const fs::path source(STRATA_SOURCE_DIR);
  ASSERT_TRUE(fs::is_regular_file(source / "CMakeLists.txt")) << source;
  EXPECT_TRUE(fs::is_directory(TestDataDir())) << TestDataDir();
  EXPECT_TRUE(IsUnder(TestDataDir(), source / "tests" / "data")) << TestDataDir();
}

// Every file of the test data is named in its folder's SOURCE.txt, which says where it came from and under
// which licence (a licence file is named there too).
TEST(TestDataTest, EveryFileIsNamedInItsFoldersSource) {
  int files = 0;
  for (const fs::directory_entry& entry : fs::recursive_directory_iterator(TestDataDir())) {
    if (!entry.is_regular_file() || entry.path().filename() == "SOURCE.txt") continue;
    ++files;
    const fs::path source = entry.path().parent_path() / "SOURCE.txt";
    ASSERT_TRUE(fs::is_regular_file(source)) << entry.path() << " has no SOURCE.txt beside it";
    EXPECT_NE(ReadText(source).find(entry.path().filename().string()), std::string::npos)
        << source << " does not name " << entry.path().filename();
  }
  EXPECT_GT(files, 0);
}

// The tests, the test helpers and the scripts name no test data outside the repository (the folder the
// test data once came from sits beside the checkout; a clone elsewhere has no such folder).
TEST(TestDataTest, NoTestNamesDataOutsideTheRepository) {
  const fs::path source(STRATA_SOURCE_DIR);
  const std::string beside = std::string("..") + "/shared";  // spelt in two parts so that this file passes
  int scanned = 0;
  for (const char* folder : {"tests", "scripts", "services/clients"}) {
    for (const fs::directory_entry& entry : fs::recursive_directory_iterator(source / folder)) {
      if (!entry.is_regular_file()) continue;
      const std::string rel = fs::relative(entry.path(), source).string();
      if (rel.starts_with("tests/data/") || rel.starts_with("tests/fuzz/corpus/")) continue;
      ++scanned;
      EXPECT_EQ(ReadText(entry.path()).find(beside), std::string::npos) << rel << " names " << beside;
    }
  }
  EXPECT_GT(scanned, 10);
}

TEST(TestDataFileTest, ReturnsAFileOfTheTestDataAndUnpacksAGzOnce) {
  const std::string out = TestDataFile("vocab/ggml-vocab-gpt-2.gguf.out");
  EXPECT_EQ(out, TestDataDir() + "/vocab/ggml-vocab-gpt-2.gguf.out");

  const std::string gguf = TestDataFile("vocab/ggml-vocab-gpt-2.gguf.gz");
  EXPECT_TRUE(IsUnder(gguf, SharedScratchDir().path())) << gguf;
  EXPECT_EQ(fs::path(gguf).filename(), "ggml-vocab-gpt-2.gguf");
  EXPECT_EQ(ReadText(gguf).substr(0, 4), "GGUF");
  const fs::file_time_type written = fs::last_write_time(gguf);
  EXPECT_EQ(TestDataFile("vocab/ggml-vocab-gpt-2.gguf.gz"), gguf);
  EXPECT_EQ(fs::last_write_time(gguf), written);

  // A copy removed behind its back (as the shared directory is between rounds of a repeated run) comes back.
  fs::remove(gguf);
  EXPECT_EQ(TestDataFile("vocab/ggml-vocab-gpt-2.gguf.gz"), gguf);
  EXPECT_TRUE(fs::is_regular_file(gguf));
}

TEST(TestDataFileTest, RefusesPathsOutsideTheTestDataAndMissingFiles) {
  EXPECT_THROW(TestDataFile("../CMakeLists.txt"), std::invalid_argument);
  EXPECT_THROW(TestDataFile("vocab/../../CMakeLists.txt"), std::invalid_argument);
  EXPECT_THROW(TestDataFile(std::string(STRATA_SOURCE_DIR) + "/CMakeLists.txt"), std::invalid_argument);
  EXPECT_THROW(TestDataFile(""), std::invalid_argument);
  EXPECT_THROW(TestDataFile("vocab/no-such-file"), std::runtime_error);
  EXPECT_THROW(TestDataFile("vocab"), std::runtime_error);
}

TEST(ScratchDirTest, IsRemovedWithItsContents) {
  std::string path;
  {
    ScratchDir dir;
    path = dir.path();
    EXPECT_TRUE(fs::is_directory(path));
    fs::create_directories(dir.Join("a/b"));
    WriteFileBytes(dir.Join("a/b/c"), {1, 2, 3});
  }
  EXPECT_FALSE(fs::exists(path));
}

TEST(SharedScratchDirTest, IsOneDirectoryForTheWholeProgram) {
  const std::string path = SharedScratchDir().path();
  EXPECT_TRUE(fs::is_directory(path));
  EXPECT_EQ(SharedScratchDir().path(), path);
}

// Runs two tests of this binary that use the shared directory in a child process whose scratch directories
// go to a folder of their own, which must be empty once the child has ended: once, and in two rounds with
// the environments torn down after each (the shared directory is removed and made afresh).
TEST(SharedScratchDirTest, IsRemovedWhenTheTestsEnd) {
  const std::string exe = fs::read_symlink("/proc/self/exe").string();
  for (const char* repeat : {"1", "2 --gtest_recreate_environments_when_repeating"}) {
    ScratchDir tmp, log;
    const std::string cmd = "TEST_TMPDIR='" + tmp.path() + "' '" + exe +
                            "' --gtest_filter='SharedScratchDirTest.IsOneDirectoryForTheWholeProgram:"
                            "TestDataFileTest.ReturnsAFileOfTheTestDataAndUnpacksAGzOnce' --gtest_repeat=" +
                            repeat + " >'" + log.Join("out") + "' 2>&1";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd << "\n" << ReadText(log.Join("out"));
    EXPECT_NE(ReadText(log.Join("out")).find("[  PASSED  ] 2 tests"), std::string::npos) << ReadText(log.Join("out"));
    std::string left;
    for (const fs::directory_entry& entry : fs::recursive_directory_iterator(tmp.path())) {
      left += entry.path().string() + "\n";
    }
    EXPECT_EQ(left, "") << "--gtest_repeat=" << repeat;
  }
}

}  // namespace
}  // namespace strata::testing
