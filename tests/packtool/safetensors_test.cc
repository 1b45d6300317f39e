#include "packtool/safetensors.h"

#include <cstring>
#include <random>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/safetensors_writer.h"
#include "tests/testing/test_util.h"

namespace strata::packtool {
namespace {

using ::strata::testing::SafetensorsEntry;
using ::strata::testing::ScratchDir;
using ::strata::testing::WriteFileBytes;
using ::strata::testing::WriteSafetensors;
using ::strata::testing::WriteSafetensorsRaw;
using ::testing::HasSubstr;

std::vector<uint8_t> Bytes(size_t n, uint8_t seed) {
  std::vector<uint8_t> b(n);
  for (size_t i = 0; i < n; ++i) b[i] = static_cast<uint8_t>(seed + 7 * i);
  return b;
}

TEST(SafetensorsTest, RoundTripsEveryDtype) {
  ScratchDir dir;
  const std::vector<SafetensorsEntry> entries = {
      {"a.weight", "F16", {3, 4}, Bytes(24, 1)},
      {"b.weight", "BF16", {2, 2, 2}, Bytes(16, 2)},
      {"c.weight", "F32", {5}, Bytes(20, 3)},
      {"d.weight", "F8_E4M3", {2, 3}, Bytes(6, 4)},
      {"e.blocks", "U8", {2, 2, 4}, Bytes(16, 5)},
      {"empty", "F32", {0, 4}, {}},
  };
  ASSERT_TRUE(WriteSafetensors(dir.Join("m.safetensors"), entries).ok());
  auto file = SafetensorsFile::Open(dir.Join("m.safetensors"));
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_EQ((*file)->tensors().size(), entries.size());
  for (size_t i = 0; i < entries.size(); ++i) {
    const SafetensorsTensor& t = (*file)->tensors()[i];
    EXPECT_EQ(t.name, entries[i].name);
    EXPECT_EQ(t.dtype, entries[i].dtype);
    EXPECT_EQ(t.shape, entries[i].shape);
    EXPECT_EQ(std::vector<uint8_t>(t.data.begin(), t.data.end()), entries[i].bytes) << t.name;
  }
  EXPECT_EQ((*file)->tensors()[0].type, gguf::GgmlType::kF16);
  EXPECT_EQ((*file)->tensors()[1].type, gguf::GgmlType::kBF16);
  EXPECT_EQ((*file)->tensors()[2].type, gguf::GgmlType::kF32);
  // One byte an element, and no ggml type: the importer decodes these itself.
  EXPECT_EQ((*file)->tensors()[3].type, std::nullopt);
  EXPECT_EQ((*file)->tensors()[4].type, std::nullopt);
  EXPECT_EQ((*file)->tensors()[0].n_elements(), 12);
}

TEST(SafetensorsTest, CheckpointIndexesEveryShard) {
  ScratchDir dir;
  ASSERT_TRUE(WriteSafetensors(dir.Join("model-00002-of-00002.safetensors"), {{"y", "F16", {2}, Bytes(4, 9)}}).ok());
  ASSERT_TRUE(WriteSafetensors(dir.Join("model-00001-of-00002.safetensors"), {{"x", "F32", {1}, Bytes(4, 5)}}).ok());
  WriteFileBytes(dir.Join("config.json"), {'{', '}'});
  auto ckpt = SafetensorsCheckpoint::Open(dir.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  ASSERT_EQ((*ckpt)->files().size(), 2u);
  const SafetensorsTensor* x = (*ckpt)->Find("x");
  const SafetensorsTensor* y = (*ckpt)->Find("y");
  ASSERT_NE(x, nullptr);
  ASSERT_NE(y, nullptr);
  EXPECT_EQ(x->shard, 0);  // sorted by name
  EXPECT_EQ(y->shard, 1);
  EXPECT_EQ(std::vector<uint8_t>(y->data.begin(), y->data.end()), Bytes(4, 9));
  EXPECT_EQ((*ckpt)->Find("z"), nullptr);
  EXPECT_EQ((*ckpt)->tensors().size(), 2u);
}

TEST(SafetensorsTest, RefusesATensorInTwoShards) {
  ScratchDir dir;
  ASSERT_TRUE(WriteSafetensors(dir.Join("a.safetensors"), {{"x", "F32", {1}, Bytes(4, 5)}}).ok());
  ASSERT_TRUE(WriteSafetensors(dir.Join("b.safetensors"), {{"x", "F32", {1}, Bytes(4, 5)}}).ok());
  EXPECT_THAT(SafetensorsCheckpoint::Open(dir.path()).status(),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "tensor 'x' is also in"));
}

TEST(SafetensorsTest, RefusesADirectoryWithoutSafetensors) {
  ScratchDir dir;
  EXPECT_THAT(SafetensorsCheckpoint::Open(dir.path()).status(),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "no *.safetensors files"));
}

TEST(SafetensorsTest, RefusesAFileTooShortForTheLength) {
  ScratchDir dir;
  WriteFileBytes(dir.Join("m.safetensors"), {1, 0, 0});
  EXPECT_THAT(SafetensorsFile::Open(dir.Join("m.safetensors")).status(),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "too short for the 8-byte header length"));
}

TEST(SafetensorsTest, RefusesAHeaderLengthPastTheEnd) {
  ScratchDir dir;
  std::vector<uint8_t> bytes = {200, 0, 0, 0, 0, 0, 0, 0, '{', '}'};
  WriteFileBytes(dir.Join("m.safetensors"), bytes);
  EXPECT_THAT(SafetensorsFile::Open(dir.Join("m.safetensors")).status(),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "header length 200 is past the end of the file"));
  bytes = {0, 0, 0, 0, 0, 0, 0, 0x80, '{', '}'};  // 2^63
  WriteFileBytes(dir.Join("m.safetensors"), bytes);
  EXPECT_THAT(SafetensorsFile::Open(dir.Join("m.safetensors")).status(),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "exceeds the limit"));
}

// Random corruptions of a valid file's length and header: each is refused or read, and whatever is read lies
// inside the file (under ASan, a read past it would also stop the test).
TEST(SafetensorsTest, CorruptedHeadersNeverReadOutsideTheFile) {
  ScratchDir dir;
  const std::string path = dir.Join("m.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, {{"a.weight", "F16", {3, 4}, Bytes(24, 1)},
                                      {"b.weight", "BF16", {2, 2}, Bytes(8, 2)}}).ok());
  const std::vector<uint8_t> good = ::strata::testing::ReadFileBytes(path);
  std::mt19937 rng(11);
  int refused = 0;
  for (int round = 0; round < 500; ++round) {
    std::vector<uint8_t> bad = good;
    const int edits = 1 + static_cast<int>(rng() % 3);
    for (int e = 0; e < edits; ++e) {
      // Mostly the length and the JSON, where the offsets and sizes are.
      const size_t at = rng() % (bad.size() - 32);
      bad[at] = static_cast<uint8_t>(rng() % 4 == 0 ? rng() : "0123456789[]{},:\"\\"[rng() % 17]);
    }
    if (rng() % 8 == 0) bad.resize(rng() % bad.size());
    WriteFileBytes(path, bad);
    auto file = SafetensorsFile::Open(path);
    if (!file.ok()) {
      ++refused;
      EXPECT_THAT(std::string(file.status().message()), HasSubstr(path));
      continue;
    }
    for (const SafetensorsTensor& t : (*file)->tensors()) {
      EXPECT_LE(t.data.size(), bad.size());
      EXPECT_EQ(t.data.size(), static_cast<uint64_t>(t.n_elements()) * (t.type == gguf::GgmlType::kF32 ? 4 : 2));
    }
  }
  EXPECT_GT(refused, 100);  // the corruptions do reach the checks
}

// One malformed header each: the file is refused and the message names what was wrong.
struct BadHeader {
  std::string json;
  size_t data_bytes;
  std::string message;
};

class SafetensorsBadHeaderTest : public ::testing::TestWithParam<BadHeader> {};

TEST_P(SafetensorsBadHeaderTest, IsRefusedWithItsMessage) {
  ScratchDir dir;
  const std::string path = dir.Join("m.safetensors");
  ASSERT_TRUE(WriteSafetensorsRaw(path, GetParam().json, std::vector<uint8_t>(GetParam().data_bytes, 0)).ok());
  absl::Status s = SafetensorsFile::Open(path).status();
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), HasSubstr(GetParam().message));
  EXPECT_THAT(std::string(s.message()), HasSubstr(path));
}

INSTANTIATE_TEST_SUITE_P(
    Malformed, SafetensorsBadHeaderTest,
    ::testing::Values(
        BadHeader{"{\"x\": ", 0, "header: not valid JSON"},
        BadHeader{"[1, 2]", 0, "header: expected a JSON object"},
        BadHeader{R"({"__metadata__": 3})", 0, "__metadata__: expected an object"},
        BadHeader{R"({"x": 1})", 4, "tensor 'x': expected an object"},
        BadHeader{R"({"x": {"shape": [1], "data_offsets": [0, 4]}})", 4, "tensor 'x': dtype: expected a string"},
        BadHeader{R"({"x": {"dtype": "I8", "shape": [4], "data_offsets": [0, 4]}})", 4,
                  "tensor 'x': dtype 'I8' is not supported (expected F16, BF16, F32, F8_E4M3 or U8)"},
        BadHeader{R"({"x": {"dtype": "F32", "data_offsets": [0, 4]}})", 4, "shape: expected an array"},
        BadHeader{R"({"x": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})", 4,
                  "shape: expected non-negative integers"},
        BadHeader{R"({"x": {"dtype": "F32", "shape": [1.5], "data_offsets": [0, 4]}})", 4,
                  "shape: expected non-negative integers"},
        BadHeader{R"({"x": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 4]}})", 4,
                  "shape: too many elements"},
        BadHeader{R"({"x": {"dtype": "F32", "shape": [1]}})", 4, "data_offsets: expected [begin, end]"},
        BadHeader{R"({"x": {"dtype": "F32", "shape": [1], "data_offsets": [0]}})", 4,
                  "data_offsets: expected [begin, end]"},
        BadHeader{R"({"x": {"dtype": "F32", "shape": [1], "data_offsets": [-4, 0]}})", 4,
                  "data_offsets: expected [begin, end]"},
        BadHeader{R"({"x": {"dtype": "F32", "shape": [1], "data_offsets": [4, 0]}})", 4,
                  "data_offsets: begin 4 is past end 0"},
        BadHeader{R"({"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})", 4,
                  "data_offsets: end 8 is past the data section's 4 bytes"},
        BadHeader{R"({"x": {"dtype": "F32", "shape": [1], "data_offsets": [0, 18446744073709551615]}})", 4,
                  "is past the data section's 4 bytes"},
        BadHeader{R"({"x": {"dtype": "F16", "shape": [3], "data_offsets": [0, 4]}})", 4,
                  "data_offsets: 4 bytes, expected 6 for F16 of 3 elements"}));

}  // namespace
}  // namespace strata::packtool
