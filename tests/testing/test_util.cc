#include "tests/testing/test_util.h"

#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>

#include "gtest/gtest.h"

namespace strata::testing {

ScratchDir::ScratchDir() {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string templ = std::string(base != nullptr ? base : "/tmp") + "/strata-test-XXXXXX";
  if (mkdtemp(templ.data()) == nullptr) throw std::runtime_error("mkdtemp failed for " + templ);
  path_ = templ;
}

ScratchDir::~ScratchDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

namespace {

// The shared scratch directory of this process and the test data unpacked into it.
struct Shared {
  std::mutex mu;
  std::unique_ptr<ScratchDir> dir;
  pid_t owner = 0;                              // the process that made `dir`: only it removes it
  std::map<std::string, std::string> unpacked;  // relative path of a .gz -> its unpacked copy in `dir`

  void Remove() {
    std::lock_guard<std::mutex> lock(mu);
    if (dir != nullptr && owner != getpid()) (void)dir.release();  // a forked child leaves it to its parent
    dir.reset();
    unpacked.clear();
  }
  ~Shared() { Remove(); }
};

Shared& GetShared() {
  static Shared shared;  // destroyed at exit, which removes a directory the environment did not
  return shared;
}

const ScratchDir& SharedDirLocked(Shared& shared) {
  if (shared.dir == nullptr) {
    shared.dir = std::make_unique<ScratchDir>();
    shared.owner = getpid();
  }
  return *shared.dir;
}

// Removes the shared scratch directory when the tests of the program end.
class SharedScratchEnvironment : public ::testing::Environment {
 public:
  void TearDown() override { GetShared().Remove(); }
};

[[maybe_unused]] ::testing::Environment* const shared_scratch_environment =
    ::testing::AddGlobalTestEnvironment(new SharedScratchEnvironment);

}  // namespace

const ScratchDir& SharedScratchDir() {
  Shared& shared = GetShared();
  std::lock_guard<std::mutex> lock(shared.mu);
  return SharedDirLocked(shared);
}

std::string TestDataDir() { return std::string(STRATA_SOURCE_DIR) + "/tests/data"; }

std::string TestDataFile(const std::string& relative) {
  const std::filesystem::path rel(relative);
  bool escapes = rel.empty() || rel.is_absolute();
  for (const std::filesystem::path& part : rel) escapes = escapes || part == "..";
  if (escapes) throw std::invalid_argument("not a path inside the test data: '" + relative + "'");
  const std::string path = TestDataDir() + "/" + relative;
  if (!std::filesystem::is_regular_file(path)) throw std::runtime_error("no test data file " + path);
  if (rel.extension() != ".gz") return path;

  Shared& shared = GetShared();
  std::lock_guard<std::mutex> lock(shared.mu);
  auto it = shared.unpacked.find(relative);
  if (it == shared.unpacked.end() || !std::filesystem::exists(it->second)) {
    const ScratchDir& dir = SharedDirLocked(shared);
    // vocab/x.gguf.gz -> <shared>/testdata/vocab/x.gguf
    const std::filesystem::path dest = std::filesystem::path(dir.Join("testdata")) / rel.parent_path() / rel.stem();
    std::filesystem::create_directories(dest.parent_path());
    Gunzip(path, dest.string());
    it = shared.unpacked.insert_or_assign(relative, dest.string()).first;
  }
  return it->second;
}

std::vector<uint8_t> ReadFileBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void WriteFileBytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + path);
}

void Gunzip(const std::string& gz_path, const std::string& dest) {
  const std::string cmd = "gzip -dc '" + gz_path + "' > '" + dest + "'";
  if (std::system(cmd.c_str()) != 0) throw std::runtime_error("gunzip failed: " + cmd);
}

}  // namespace strata::testing
