// GgufFile over hand-assembled byte images: every field written explicitly so each malformation can be
// placed exactly.

#include "engine/gguf/gguf_file.h"

#include <cstring>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/test_util.h"

namespace strata::gguf {
namespace {

using ::strata::testing::ScratchDir;
using ::strata::testing::WriteFileBytes;
using ::testing::HasSubstr;
using ::testing::StartsWith;

class Bytes {
 public:
  template <typename T>
  Bytes& Put(T v) {
    uint8_t raw[sizeof(T)];
    std::memcpy(raw, &v, sizeof(T));
    data_.insert(data_.end(), raw, raw + sizeof(T));
    return *this;
  }
  Bytes& U32(uint32_t v) { return Put(v); }
  Bytes& U64(uint64_t v) { return Put(v); }
  Bytes& I64(int64_t v) { return Put(v); }
  Bytes& Str(std::string_view s) {
    U64(s.size());
    data_.insert(data_.end(), s.begin(), s.end());
    return *this;
  }
  Bytes& Header(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3) {
    return U32(0x46554747).U32(version).U64(n_tensors).U64(n_kv);
  }
  // key, type id, then the caller writes the value.
  Bytes& Key(std::string_view key, ValueType type) { return Str(key).U32(static_cast<uint32_t>(type)); }
  Bytes& TensorInfo(std::string_view name, std::vector<int64_t> ne, uint32_t type, uint64_t offset) {
    Str(name).U32(static_cast<uint32_t>(ne.size()));
    for (int64_t d : ne) I64(d);
    return U32(type).U64(offset);
  }
  Bytes& PadTo(size_t alignment) {
    while (data_.size() % alignment != 0) data_.push_back(0);
    return *this;
  }
  Bytes& Fill(size_t n, uint8_t v) {
    data_.insert(data_.end(), n, v);
    return *this;
  }
  size_t size() const { return data_.size(); }
  const std::vector<uint8_t>& vec() const { return data_; }

 private:
  std::vector<uint8_t> data_;
};

absl::StatusOr<std::unique_ptr<GgufFile>> ParseBytes(const Bytes& b) {
  return GgufFile::Parse("model.gguf", b.vec());
}

// A file with one f32 tensor [4, 2] and no metadata.
Bytes OneTensorFile(uint32_t version = 3) {
  Bytes b;
  b.Header(1, 0, version).TensorInfo("w", {4, 2}, 0, 0).PadTo(32);
  for (int i = 0; i < 8; ++i) b.Put(static_cast<float>(i) * 0.5f);
  return b;
}

TEST(GgufFile, ParsesVersions2And3) {
  for (uint32_t version : {2u, 3u}) {
    Bytes b = OneTensorFile(version);
    auto file = ParseBytes(b);
    ASSERT_TRUE(file.ok()) << file.status();
    EXPECT_EQ((*file)->version(), version);
    EXPECT_EQ((*file)->alignment(), 32u);
    EXPECT_EQ((*file)->data_offset() % 32, 0u);
    ASSERT_EQ((*file)->tensors().size(), 1u);
    const TensorInfo* t = (*file)->FindTensor("w");
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->ne, (std::vector<int64_t>{4, 2}));
    EXPECT_EQ(t->n_elements(), 8);
    EXPECT_EQ(t->n_rows(), 2);
    EXPECT_EQ(t->bytes, 32u);
    EXPECT_EQ(t->data, b.vec().data() + (*file)->data_offset());
    absl::StatusOr<std::vector<float>> values = DequantizeTensor(*t);
    ASSERT_TRUE(values.ok());
    EXPECT_EQ((*values)[7], 3.5f);
    EXPECT_EQ((*file)->FindTensor("missing"), nullptr);
  }
}

TEST(GgufFile, ReadsEveryValueType) {
  Bytes b;
  b.Header(0, 15);
  b.Key("u8", ValueType::kUint8).Put<uint8_t>(200);
  b.Key("i8", ValueType::kInt8).Put<int8_t>(-100);
  b.Key("u16", ValueType::kUint16).Put<uint16_t>(60000);
  b.Key("i16", ValueType::kInt16).Put<int16_t>(-30000);
  b.Key("u32", ValueType::kUint32).Put<uint32_t>(4000000000u);
  b.Key("i32", ValueType::kInt32).Put<int32_t>(-2000000000);
  b.Key("u64", ValueType::kUint64).Put<uint64_t>(~uint64_t{0});
  b.Key("i64", ValueType::kInt64).Put<int64_t>(-(int64_t{1} << 62));
  b.Key("f32", ValueType::kFloat32).Put<float>(0.1f);
  b.Key("f64", ValueType::kFloat64).Put<double>(0.1);
  b.Key("bool", ValueType::kBool).Put<uint8_t>(1);
  b.Key("str", ValueType::kString).Str(std::string("a\0b", 3));
  b.Key("strs", ValueType::kArray).U32(8).U64(2).Str("x").Str("");
  // [[1, 2], []] as arrays of int32.
  b.Key("nested", ValueType::kArray).U32(9).U64(2);
  b.U32(5).U64(2).Put<int32_t>(1).Put<int32_t>(2);
  b.U32(5).U64(0);
  b.Key("empty", ValueType::kArray).U32(6).U64(0);
  auto file = ParseBytes(b);
  ASSERT_TRUE(file.ok()) << file.status();
  const Metadata& md = (*file)->metadata();
  ASSERT_EQ(md.entries().size(), 15u);
  EXPECT_EQ(md.entries()[0].first, "u8");
  EXPECT_EQ(*md.GetUint("u8"), 200u);
  EXPECT_EQ(md.Find("u8")->type, ValueType::kUint8);
  EXPECT_EQ(*md.GetInt("i8"), -100);
  EXPECT_EQ(*md.GetUint("u16"), 60000u);
  EXPECT_EQ(*md.GetInt("i16"), -30000);
  EXPECT_EQ(*md.GetUint("u32"), 4000000000u);
  EXPECT_EQ(*md.GetInt("i32"), -2000000000);
  EXPECT_EQ(*md.GetUint("u64"), ~uint64_t{0});
  EXPECT_EQ(*md.GetInt("i64"), -(int64_t{1} << 62));
  EXPECT_EQ(*md.GetFloat("f32"), static_cast<double>(0.1f));
  EXPECT_EQ(*md.GetFloat("f64"), 0.1);
  EXPECT_TRUE(*md.GetBool("bool"));
  EXPECT_EQ(*md.GetString("str"), std::string("a\0b", 3));
  EXPECT_EQ(*md.GetStringArray("strs"), (std::vector<std::string>{"x", ""}));
  const Value* nested = md.Find("nested");
  ASSERT_NE(nested, nullptr);
  const Array& outer = std::get<Array>(nested->data);
  EXPECT_EQ(outer.element_type, ValueType::kArray);
  ASSERT_EQ(outer.elements.size(), 2u);
  const Array& first = std::get<Array>(outer.elements[0].data);
  EXPECT_EQ(first.element_type, ValueType::kInt32);
  ASSERT_EQ(first.elements.size(), 2u);
  EXPECT_EQ(std::get<int64_t>(first.elements[1].data), 2);
  EXPECT_TRUE(std::get<Array>(outer.elements[1].data).elements.empty());
  EXPECT_TRUE(md.GetFloatArray("empty")->empty());
}

TEST(GgufFile, TypedGettersCheckTypesAndRanges) {
  Bytes b;
  b.Header(0, 6);
  b.Key("neg", ValueType::kInt32).Put<int32_t>(-1);
  b.Key("huge", ValueType::kUint64).Put<uint64_t>(~uint64_t{0});
  b.Key("name", ValueType::kString).Str("gpt2");
  b.Key("ints", ValueType::kArray).U32(5).U64(2).Put<int32_t>(-3).Put<int32_t>(4);
  b.Key("flag", ValueType::kBool).Put<uint8_t>(0);
  b.Key("mixed", ValueType::kArray).U32(8).U64(1).Str("s");
  auto file = ParseBytes(b);
  ASSERT_TRUE(file.ok()) << file.status();
  const Metadata& md = (*file)->metadata();
  EXPECT_THAT(md.GetUint("neg").status(), StatusIsWith(absl::StatusCode::kInvalidArgument, "neg"));
  EXPECT_EQ(*md.GetInt("neg"), -1);
  EXPECT_EQ(*md.GetFloat("neg"), -1.0);
  EXPECT_THAT(md.GetInt("huge").status(), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(md.GetUint("name").status(),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "metadata key 'name': expected an unsigned integer, found string"));
  EXPECT_THAT(md.GetString("ints").status(), StatusIsWith(absl::StatusCode::kInvalidArgument, "found array"));
  EXPECT_THAT(md.GetString("absent").status(), StatusIsWith(absl::StatusCode::kNotFound, "absent"));
  EXPECT_EQ(*md.GetIntArray("ints"), (std::vector<int64_t>{-3, 4}));
  EXPECT_EQ(*md.GetFloatArray("ints"), (std::vector<float>{-3.0f, 4.0f}));
  EXPECT_THAT(md.GetStringArray("ints").status(), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(md.GetIntArray("mixed").status(), StatusIsWith(absl::StatusCode::kInvalidArgument, "'mixed["));
  EXPECT_THAT(md.GetFloatArray("mixed").status(), StatusIsWith(absl::StatusCode::kInvalidArgument, "'mixed["));
  EXPECT_THAT(md.GetFloatArray("name").status(), StatusIsWith(absl::StatusCode::kInvalidArgument, "array of numbers"));
  EXPECT_THAT(md.GetIntArray("name").status(), StatusIsWith(absl::StatusCode::kInvalidArgument, "array of integers"));
  EXPECT_THAT(md.GetIntArray("absent").status(), StatusIsWith(absl::StatusCode::kNotFound, "absent"));
  EXPECT_FALSE(*md.GetBool("flag"));
  EXPECT_THAT(md.GetBool("name").status(), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(*md.GetUintOr("absent", 7), 7u);
  EXPECT_EQ(*md.GetFloatOr("absent", 0.5), 0.5);
  EXPECT_TRUE(*md.GetBoolOr("absent", true));
  EXPECT_THAT(md.GetUintOr("name", 7).status(), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(GgufFile, UnsupportedVersions) {
  EXPECT_THAT(ParseBytes(OneTensorFile(1)).status(),
              StatusIsWith(absl::StatusCode::kUnimplemented, "model.gguf: GGUF version 1 is not supported"));
  EXPECT_THAT(ParseBytes(OneTensorFile(4)).status(), StatusIs(absl::StatusCode::kUnimplemented));
  EXPECT_THAT(ParseBytes(OneTensorFile(0x03000000)).status(),
              StatusIsWith(absl::StatusCode::kUnimplemented, "big-endian"));
}

TEST(GgufFile, BadMagicAndShortFiles) {
  Bytes b = OneTensorFile();
  std::vector<uint8_t> bytes = b.vec();
  bytes[0] = 'X';
  EXPECT_THAT(GgufFile::Parse("model.gguf", bytes).status(),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "model.gguf: bad magic"));
  EXPECT_THAT(GgufFile::Parse("model.gguf", {}).status(), StatusIsWith(absl::StatusCode::kInvalidArgument, "0 bytes"));
  std::vector<uint8_t> header_only(b.vec().begin(), b.vec().begin() + 10);
  EXPECT_THAT(GgufFile::Parse("model.gguf", header_only).status(),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "tensor count"));
}

TEST(GgufFile, AbsurdCountsAndLengthsFailFast) {
  Bytes kv_count;
  kv_count.Header(0, uint64_t{1} << 40);
  EXPECT_THAT(ParseBytes(kv_count).status(), StatusIsWith(absl::StatusCode::kInvalidArgument, "metadata count"));

  Bytes tensor_count;
  tensor_count.Header(uint64_t{1} << 40, 0).Fill(64, 0);
  EXPECT_THAT(ParseBytes(tensor_count).status(), StatusIsWith(absl::StatusCode::kInvalidArgument, "tensor count"));

  Bytes key_length;
  key_length.Header(0, 1).U64(uint64_t{1} << 62).Fill(16, 'a');
  EXPECT_THAT(ParseBytes(key_length).status(),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "string length 4611686018427387904"));

  Bytes value_length;
  value_length.Header(0, 1).Key("k", ValueType::kString).U64(uint64_t{1} << 62);
  EXPECT_THAT(ParseBytes(value_length).status(),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "metadata entry 0 'k'"));

  Bytes array_length;
  array_length.Header(0, 1).Key("k", ValueType::kArray).U32(4).U64(uint64_t{1} << 61).Fill(40, 0);
  EXPECT_THAT(ParseBytes(array_length).status(), StatusIsWith(absl::StatusCode::kInvalidArgument, "array length"));

  // A string array whose count fits the bytes as one-byte elements but not as 8-byte lengths.
  Bytes string_array;
  string_array.Header(0, 1).Key("k", ValueType::kArray).U32(8).U64(100).Fill(100, 0);
  EXPECT_THAT(ParseBytes(string_array).status(), StatusIsWith(absl::StatusCode::kInvalidArgument, "array length 100"));
}

TEST(GgufFile, BadValueTypesAndNesting) {
  Bytes bad_type;
  bad_type.Header(0, 1).Str("k").U32(13).U32(0);
  EXPECT_THAT(ParseBytes(bad_type).status(), StatusIsWith(absl::StatusCode::kInvalidArgument, "value type id 13"));

  Bytes bad_element;
  bad_element.Header(0, 1).Key("k", ValueType::kArray).U32(99).U64(0);
  EXPECT_THAT(ParseBytes(bad_element).status(), StatusIsWith(absl::StatusCode::kInvalidArgument, "array element type"));

  Bytes deep;
  deep.Header(0, 1).Key("k", ValueType::kArray);
  for (int i = 0; i < 40; ++i) deep.U32(9).U64(1);
  deep.U32(0).U64(0);
  EXPECT_THAT(ParseBytes(deep).status(), StatusIsWith(absl::StatusCode::kInvalidArgument, "nest deeper"));

  Bytes duplicate;
  duplicate.Header(0, 2).Key("k", ValueType::kUint8).Put<uint8_t>(1).Key("k", ValueType::kUint8).Put<uint8_t>(2);
  EXPECT_THAT(ParseBytes(duplicate).status(),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "metadata entry 1 'k': duplicate key"));
}

TEST(GgufFile, ErrorsEscapeAndShortenNames) {
  Bytes binary;
  binary.Header(0, 1).Str(std::string("a\x01", 2)).U32(77);
  EXPECT_THAT(ParseBytes(binary).status(), StatusIsWith(absl::StatusCode::kInvalidArgument, "metadata entry 0 'a\\x01'"));

  Bytes long_name;
  long_name.Header(0, 1).Str(std::string(100000, 'k')).U32(77);
  absl::Status status = ParseBytes(long_name).status();
  EXPECT_THAT(status, StatusIsWith(absl::StatusCode::kInvalidArgument, "... (100000 bytes)"));
  EXPECT_LT(status.message().size(), 300u);
}

absl::Status ParseTensor(std::vector<int64_t> ne, uint32_t type, uint64_t offset = 0, size_t data_bytes = 4096) {
  Bytes b;
  b.Header(1, 0).TensorInfo("blk.0.attn_q.weight", std::move(ne), type, offset).PadTo(32).Fill(data_bytes, 0);
  return ParseBytes(b).status();
}

TEST(GgufFile, BadTensorShapes) {
  EXPECT_THAT(ParseTensor({}, 0), StatusIsWith(absl::StatusCode::kInvalidArgument, "has 0 dimensions"));
  EXPECT_THAT(ParseTensor({1, 1, 1, 1, 1}, 0), StatusIsWith(absl::StatusCode::kInvalidArgument, "has 5 dimensions"));
  EXPECT_THAT(ParseTensor({4, 0}, 0),
              StatusIsWith(absl::StatusCode::kInvalidArgument,
                           "model.gguf: tensor 0 'blk.0.attn_q.weight': ne[1] is 0, expected a positive size"));
  EXPECT_THAT(ParseTensor({-4}, 0), StatusIsWith(absl::StatusCode::kInvalidArgument, "ne[0] is -4"));
  const int64_t big = int64_t{1} << 32;
  EXPECT_THAT(ParseTensor({big, big, big}, 0), StatusIsWith(absl::StatusCode::kInvalidArgument, "overflow"));
  EXPECT_THAT(ParseTensor({int64_t{1} << 62, 1}, 0), StatusIsWith(absl::StatusCode::kInvalidArgument, "overflow"));
  EXPECT_THAT(ParseTensor({48}, 2), StatusIsWith(absl::StatusCode::kInvalidArgument, "whole number of q4_0 blocks"));
  EXPECT_THAT(ParseTensor({32}, 77), StatusIsWith(absl::StatusCode::kInvalidArgument, "type id 77"));
}

TEST(GgufFile, OffsetsChecked) {
  EXPECT_THAT(ParseTensor({4}, 0, 16), StatusIsWith(absl::StatusCode::kInvalidArgument,
                                                    "offset 16 is not a multiple of the alignment 32"));
  EXPECT_THAT(ParseTensor({4}, 0, 4096 + 32), StatusIsWith(absl::StatusCode::kInvalidArgument, "past the end"));
  EXPECT_THAT(ParseTensor({2048}, 0, 0, 4096), StatusIsWith(absl::StatusCode::kInvalidArgument, "past the end"));
  EXPECT_THAT(ParseTensor({4}, 0, ~uint64_t{0} - 31), StatusIsWith(absl::StatusCode::kInvalidArgument, "past the end"));
  EXPECT_TRUE(ParseTensor({1024}, 0, 0, 4096).ok());

  // The message names the file, the tensor by index and name, the offset and the alignment.
  Bytes b;
  b.Header(4, 0);
  b.TensorInfo("token_embd.weight", {32}, 0, 0);
  b.TensorInfo("blk.0.attn_k.weight", {32}, 0, 128);
  b.TensorInfo("blk.0.attn_v.weight", {32}, 0, 256);
  b.TensorInfo("blk.0.attn_q.weight", {32}, 0, 1234);
  b.PadTo(32).Fill(2048, 0);
  EXPECT_THAT(ParseBytes(b).status(),
              StatusIsWith(absl::StatusCode::kInvalidArgument,
                           "model.gguf: tensor 3 'blk.0.attn_q.weight': offset 1234 is not a multiple of the alignment 32"));
}

TEST(GgufFile, OverlappingTensorsAreRefused) {
  // Tensor 1's offset points into tensor 0 (f32, 32 elements = 128 bytes): it would read tensor 0's bytes.
  Bytes b;
  b.Header(2, 0).TensorInfo("a", {32}, 0, 0).TensorInfo("b", {8}, 0, 96).PadTo(32).Fill(256, 0);
  EXPECT_THAT(ParseBytes(b).status(),
              StatusIsWith(absl::StatusCode::kInvalidArgument,
                           "tensor 1 'b' at offset 96 overlaps tensor 0 'a' (offset 0, 128 bytes)"));
  // Gaps between tensors and any declaration order are fine.
  Bytes ok;
  ok.Header(2, 0).TensorInfo("a", {8}, 0, 128).TensorInfo("b", {8}, 0, 0).PadTo(32).Fill(256, 0);
  EXPECT_TRUE(ParseBytes(ok).ok());
}

TEST(GgufFile, ArrayElementsInAllAreBounded) {
  // A uint8 array one element past the budget: the bytes are there, but holding them as values would take
  // tens of times the file's size.
  const uint64_t count = (uint64_t{1} << 24) + 1;
  Bytes b;
  b.Header(0, 1).Key("big", ValueType::kArray).U32(0).U64(count).Fill(count, 7);
  EXPECT_THAT(ParseBytes(b).status(),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "past 16777216 array elements in all"));
}

TEST(GgufFile, DuplicateTensorNames) {
  Bytes b;
  b.Header(2, 0).TensorInfo("w", {8}, 0, 0).TensorInfo("w", {8}, 0, 32).PadTo(32).Fill(64, 0);
  EXPECT_THAT(ParseBytes(b).status(),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "tensor 1 'w': duplicate name (also tensor 0)"));
}

TEST(GgufFile, Alignment) {
  Bytes b;
  b.Header(1, 1).Key("general.alignment", ValueType::kUint32).U32(64).TensorInfo("w", {8}, 0, 0).PadTo(64).Fill(64, 0);
  auto file = ParseBytes(b);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->alignment(), 64u);
  EXPECT_EQ((*file)->data_offset(), b.size() - 64);

  for (uint32_t bad : {0u, 48u}) {
    Bytes c;
    c.Header(0, 1).Key("general.alignment", ValueType::kUint32).U32(bad);
    EXPECT_THAT(ParseBytes(c).status(), StatusIsWith(absl::StatusCode::kInvalidArgument, "power of two")) << bad;
  }
  Bytes s;
  s.Header(0, 1).Key("general.alignment", ValueType::kString).Str("32");
  EXPECT_THAT(ParseBytes(s).status(), StatusIsWith(absl::StatusCode::kInvalidArgument, "general.alignment"));
}

TEST(GgufFile, UndecodableTypesParseButAreRefusedByName) {
  Bytes b;
  b.Header(1, 0).TensorInfo("x", {256, 2}, 16, 0).PadTo(32).Fill(2 * 66, 0);
  auto file = ParseBytes(b);
  ASSERT_TRUE(file.ok()) << file.status();
  const TensorInfo& t = (*file)->tensors()[0];
  EXPECT_EQ(t.bytes, 2u * 66);
  EXPECT_THAT(CheckDecodable(t),
              StatusIsWith(absl::StatusCode::kUnimplemented, "tensor 'x' has type iq2_xxs, which Strata cannot decode"));
  EXPECT_THAT(DequantizeTensor(t).status(), StatusIs(absl::StatusCode::kUnimplemented));
}

TEST(GgufFile, OpenErrors) {
  ScratchDir dir;
  EXPECT_THAT(GgufFile::Open(dir.Join("none.gguf")).status(),
              StatusIsWith(absl::StatusCode::kNotFound, dir.Join("none.gguf")));
  EXPECT_THAT(GgufFile::Open(dir.path()).status(), StatusIsWith(absl::StatusCode::kInvalidArgument, dir.path()));
  WriteFileBytes(dir.Join("empty.gguf"), {});
  EXPECT_THAT(GgufFile::Open(dir.Join("empty.gguf")).status(),
              StatusIsWith(absl::StatusCode::kInvalidArgument, dir.Join("empty.gguf") + ": file is 0 bytes"));
  WriteFileBytes(dir.Join("ok.gguf"), OneTensorFile().vec());
  auto file = GgufFile::Open(dir.Join("ok.gguf"));
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->path(), dir.Join("ok.gguf"));
  EXPECT_EQ((*file)->file_size(), OneTensorFile().size());
  EXPECT_EQ(DequantizeTensor((*file)->tensors()[0]).value()[3], 1.5f);
}

}  // namespace
}  // namespace strata::gguf
