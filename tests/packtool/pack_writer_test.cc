#include "packtool/pack_writer.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/test_util.h"

namespace strata::packtool {
namespace {

using ::strata::testing::ScratchDir;
using ::strata::testing::WriteFileBytes;

// A read-only private mapping of a whole file, unmapped on destruction.
class MappedFile {
 public:
  explicit MappedFile(const std::string& path) {
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    EXPECT_GE(fd, 0) << path;
    size_ = static_cast<size_t>(lseek(fd, 0, SEEK_END));
    void* map = mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    EXPECT_NE(map, MAP_FAILED) << path;
    data_ = static_cast<const uint8_t*>(map);
  }
  ~MappedFile() { munmap(const_cast<uint8_t*>(data_), size_); }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  std::span<const uint8_t> bytes() const { return {data_, size_}; }

 private:
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

std::vector<uint8_t> RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> bytes(n);
  for (uint8_t& b : bytes) b = static_cast<uint8_t>(rng());
  return bytes;
}

// HashMapped gives HashFile's size and hash for a file of several MiB and an odd tail, and leaves the mapping
// reading the file's bytes after dropping the hashed pages from the resident set.
TEST(HashMappedTest, GivesHashFilesResultForTheMappedFile) {
  ScratchDir dir;
  const std::string path = dir.Join("source.bin");
  const std::vector<uint8_t> bytes = RandomBytes((7 << 19) + 17, 3);
  WriteFileBytes(path, bytes);
  MappedFile mapped(path);
  auto by_read = HashFile(path);
  auto by_map = HashMapped(mapped.bytes(), path);
  ASSERT_TRUE(by_read.ok()) << by_read.status();
  ASSERT_TRUE(by_map.ok()) << by_map.status();
  EXPECT_EQ(by_map->first, bytes.size());
  EXPECT_EQ(*by_map, *by_read);
  EXPECT_EQ(0, std::memcmp(mapped.bytes().data(), bytes.data(), bytes.size()));
  // A different byte gives a different hash.
  std::vector<uint8_t> changed = bytes;
  changed[(3 << 20) + 5] ^= 1;
  const std::string changed_path = dir.Join("changed.bin");
  WriteFileBytes(changed_path, changed);
  MappedFile mapped_changed(changed_path);
  auto changed_hash = HashMapped(mapped_changed.bytes(), changed_path);
  ASSERT_TRUE(changed_hash.ok()) << changed_hash.status();
  EXPECT_NE(changed_hash->second, by_map->second);
}

TEST(HashMappedTest, NoBytesHashAsAnEmptyFile) {
  ScratchDir dir;
  const std::string path = dir.Join("empty.bin");
  WriteFileBytes(path, {});
  auto by_read = HashFile(path);
  auto by_map = HashMapped({}, path);
  ASSERT_TRUE(by_read.ok()) << by_read.status();
  ASSERT_TRUE(by_map.ok()) << by_map.status();
  EXPECT_EQ(by_map->first, 0u);
  EXPECT_EQ(*by_map, *by_read);
}

TEST(HashMappedTest, CancelledNamesTheFile) {
  ScratchDir dir;
  const std::string path = dir.Join("source.bin");
  WriteFileBytes(path, RandomBytes(3 << 20, 4));
  MappedFile mapped(path);
  const std::atomic<bool> cancel{true};
  EXPECT_THAT(HashMapped(mapped.bytes(), path, &cancel).status(),
              StatusIsWith(absl::StatusCode::kCancelled, path + ": cancelled while hashing"));
}

}  // namespace
}  // namespace strata::packtool
