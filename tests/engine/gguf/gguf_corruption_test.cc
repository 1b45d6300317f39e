// Damaged copies of a writer-produced file: truncated and overwritten at many positions. Parse must
// return an error naming the file or a file whose every tensor lies inside the bytes; it must never
// crash or read out of bounds (the sanitizer build runs these tests with ASan/UBSan). Each trial parses
// its own exactly-sized heap copy so that any overread is caught.

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "engine/gguf/gguf_file.h"
#include "engine/gguf/gguf_writer.h"
#include "gtest/gtest.h"
#include "tests/testing/test_util.h"

namespace strata::gguf {
namespace {

using ::strata::testing::ReadFileBytes;
using ::strata::testing::ScratchDir;
using ::strata::testing::WriteFileBytes;

constexpr char kName[] = "corrupt.gguf";

struct Sample {
  std::vector<uint8_t> bytes;
  uint64_t header_end = 0;   // data_offset of the intact file
};

// A small model with metadata of every shape and tensors of several types.
const Sample& GetSample() {
  static const Sample* sample = [] {
    GgufWriter writer;
    writer.SetString("general.architecture", "llama");
    writer.SetUint32("llama.block_count", 2);
    writer.SetFloat32("llama.rope.freq_base", 10000.0f);
    writer.SetBool("tokenizer.ggml.add_bos_token", true);
    writer.SetStringArray("tokenizer.ggml.tokens", {"<unk>", "<s>", "</s>", "a", "b"});
    writer.SetFloat32Array("tokenizer.ggml.scores", {0.0f, -1.0f, -2.0f, -3.0f, -4.0f});
    writer.SetInt32Array("tokenizer.ggml.token_type", {2, 3, 3, 1, 1});
    writer.Set("nested", Value::MakeArray(ValueType::kArray, {Value::MakeArray(ValueType::kUint16, {Value::Uint16(9)})}));
    writer.Set("big", Value::Int64(-5));
    std::vector<float> values(64);
    for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i) / 7.0f - 4.0f;
    struct Spec {
      const char* name;
      GgmlType type;
      std::vector<int64_t> ne;
    };
    const Spec specs[] = {{"token_embd.weight", GgmlType::kF16, {32, 2}},
                          {"blk.0.attn_q.weight", GgmlType::kQ8_0, {32, 2}},
                          {"blk.0.ffn_up.weight", GgmlType::kQ4_0, {64}},
                          {"blk.1.attn_norm.weight", GgmlType::kF32, {16}},
                          {"output.weight", GgmlType::kQ4_1, {32, 1, 2}}};
    for (const Spec& s : specs) {
      absl::Status status = writer.AddTensor(s.name, s.type, s.ne, [&values, s](std::span<uint8_t> dst) {
        int64_t n = 1;
        for (int64_t d : s.ne) n *= d;
        return Quantize(s.type, values.data(), dst.data(), n);
      });
      if (!status.ok()) ADD_FAILURE() << status;
    }
    // Raw q6_K bytes: quantizing q6_K is not supported, decoding is.
    std::vector<uint8_t> q6(210, 0x5a);
    if (!writer.AddTensorData("blk.1.ffn_down.weight", GgmlType::kQ6_K, {256}, q6).ok()) ADD_FAILURE();
    ScratchDir dir;
    const std::string path = dir.Join("sample.gguf");
    if (!writer.WriteFile(path).ok()) ADD_FAILURE();
    auto* s = new Sample;
    s->bytes = ReadFileBytes(path);
    auto file = GgufFile::Parse(kName, s->bytes);
    if (!file.ok()) {
      ADD_FAILURE() << file.status();
    } else {
      s->header_end = (*file)->data_offset();
    }
    return s;
  }();
  return *sample;
}

// Walks every value so that strings and arrays are touched.
size_t VisitValue(const Value& v) {
  if (const Array* a = std::get_if<Array>(&v.data)) {
    size_t n = 1;
    for (const Value& e : a->elements) n += VisitValue(e);
    return n;
  }
  if (const std::string* s = std::get_if<std::string>(&v.data)) return s->size();
  return 1;
}

// Parses `bytes` (an exact-size heap copy) and checks the outcome is an error naming the file or a
// self-consistent file. Returns whether it parsed.
bool ParseAndCheck(const std::vector<uint8_t>& bytes) {
  std::vector<uint8_t> copy(bytes);  // exactly sized, so ASan sees any read past the end
  absl::StatusOr<std::unique_ptr<GgufFile>> file = GgufFile::Parse(kName, copy);
  if (!file.ok()) {
    EXPECT_EQ(std::string(file.status().message()).rfind(std::string(kName) + ": ", 0), 0u) << file.status();
    EXPECT_TRUE(file.status().code() == absl::StatusCode::kInvalidArgument ||
                file.status().code() == absl::StatusCode::kUnimplemented)
        << file.status();
    return false;
  }
  const GgufFile& f = **file;
  for (const auto& [key, value] : f.metadata().entries()) VisitValue(value);
  const uint8_t* begin = copy.data();
  const uint8_t* end = copy.data() + copy.size();
  for (const TensorInfo& t : f.tensors()) {
    EXPECT_EQ(f.FindTensor(t.name), &t);
    EXPECT_EQ(t.offset % f.alignment(), 0u);
    EXPECT_EQ(*TensorBytes(t.type, t.ne), t.bytes);
    // The tensor lies inside the data section: compared as addresses, start first, so that a data pointer
    // past the end cannot make `end - t.data` wrap to a huge size that every t.bytes fits under.
    const uintptr_t data = reinterpret_cast<uintptr_t>(t.data);
    const uintptr_t data_begin = reinterpret_cast<uintptr_t>(begin) + f.data_offset();
    const uintptr_t data_end = reinterpret_cast<uintptr_t>(end);
    const bool inside = t.data != nullptr && data >= data_begin && data <= data_end && t.bytes <= data_end - data;
    EXPECT_TRUE(inside) << "tensor '" << t.name << "': " << t.bytes << " bytes at offset " << t.offset
                        << " of the data section, which starts " << f.data_offset() << " bytes into a "
                        << bytes.size() << "-byte file";
    if (!inside) continue;  // reading it would run off the buffer
    unsigned sum = 0;
    for (uint64_t i = 0; i < t.bytes; ++i) sum += t.data[i];
    (void)sum;
    absl::StatusOr<GgmlTypeInfo> info = GetTypeInfo(static_cast<uint32_t>(t.type));
    if (info.ok()) {
      std::vector<float> block(info->block_size);
      if (t.bytes >= static_cast<uint64_t>(info->type_size)) {  // an empty tensor has no block
        EXPECT_TRUE(Dequantize(t.type, t.data, block.data(), info->block_size).ok());
      }
    } else {
      EXPECT_THAT(CheckDecodable(t), StatusIsWith(absl::StatusCode::kUnimplemented, t.name));
    }
  }
  return true;
}

TEST(GgufCorruption, SampleIsValid) {
  const Sample& s = GetSample();
  ASSERT_GT(s.header_end, 0u);
  ASSERT_TRUE(ParseAndCheck(s.bytes));
}

TEST(GgufCorruption, TruncatedEverywhereInTheHeader) {
  const Sample& s = GetSample();
  for (uint64_t len = 0; len < s.header_end; ++len) {
    std::vector<uint8_t> prefix(s.bytes.begin(), s.bytes.begin() + len);
    ASSERT_FALSE(ParseAndCheck(prefix)) << "a " << len << "-byte prefix of a " << s.bytes.size()
                                        << "-byte file parsed";
  }
}

TEST(GgufCorruption, TruncatedInTheData) {
  const Sample& s = GetSample();
  auto intact = GgufFile::Parse(kName, s.bytes);
  ASSERT_TRUE(intact.ok());
  uint64_t data_end = 0;
  for (const TensorInfo& t : (*intact)->tensors()) {
    data_end = std::max<uint64_t>(data_end, (*intact)->data_offset() + t.offset + t.bytes);
  }
  for (uint64_t len = s.header_end; len <= s.bytes.size(); len += 5) {
    std::vector<uint8_t> prefix(s.bytes.begin(), s.bytes.begin() + len);
    EXPECT_EQ(ParseAndCheck(prefix), len >= data_end) << len;
  }
}

TEST(GgufCorruption, EveryHeaderByteOverwritten) {
  const Sample& s = GetSample();
  int parsed = 0, failed = 0;
  for (uint64_t pos = 0; pos < s.header_end; ++pos) {
    for (int mode = 0; mode < 4; ++mode) {
      std::vector<uint8_t> bytes = s.bytes;
      switch (mode) {
        case 0: bytes[pos] = 0xff; break;
        case 1: bytes[pos] = 0x00; break;
        case 2: bytes[pos] ^= 0xff; break;
        case 3: bytes[pos] ^= 0x01; break;
      }
      (ParseAndCheck(bytes) ? parsed : failed)++;
      if (::testing::Test::HasFailure()) FAIL() << "position " << pos << " mode " << mode;
    }
  }
  // Most corruptions of lengths, counts, types and offsets are caught; some (in string bytes or
  // padding) are harmless.
  EXPECT_GT(failed, 0);
  EXPECT_GT(parsed, 0);
}

TEST(GgufCorruption, DataBytesAreNotValidated) {
  const Sample& s = GetSample();
  for (uint64_t pos = s.header_end; pos < s.bytes.size(); pos += 3) {
    std::vector<uint8_t> bytes = s.bytes;
    bytes[pos] = 0xff;
    ASSERT_TRUE(ParseAndCheck(bytes)) << pos;
  }
}

TEST(GgufCorruption, RandomMultiByteDamage) {
  const Sample& s = GetSample();
  std::mt19937 gen(1234);
  for (int trial = 0; trial < 3000; ++trial) {
    std::vector<uint8_t> bytes = s.bytes;
    const int edits = 1 + trial % 8;
    for (int e = 0; e < edits; ++e) {
      const size_t pos = gen() % s.header_end;
      // Overwrite with a plausible-but-wrong little-endian word half the time.
      if (gen() % 2 == 0 && pos + 8 <= bytes.size()) {
        const uint64_t word = uint64_t{1} << (gen() % 64);
        std::memcpy(bytes.data() + pos, &word, 8);
      } else {
        bytes[pos] = static_cast<uint8_t>(gen());
      }
    }
    if (trial % 5 == 0) bytes.resize(gen() % (bytes.size() + 1));
    ParseAndCheck(bytes);
    if (::testing::Test::HasFailure()) FAIL() << "trial " << trial;
  }
}

TEST(GgufCorruption, OpenTruncatedFilesNamesThePath) {
  const Sample& s = GetSample();
  ScratchDir dir;
  for (uint64_t len : {uint64_t{3}, uint64_t{20}, s.header_end / 2, s.header_end - 1}) {
    const std::string path = dir.Join("t" + std::to_string(len) + ".gguf");
    WriteFileBytes(path, std::vector<uint8_t>(s.bytes.begin(), s.bytes.begin() + len));
    EXPECT_THAT(GgufFile::Open(path).status(), StatusIsWith(absl::StatusCode::kInvalidArgument, path + ": "));
  }
}

}  // namespace
}  // namespace strata::gguf
