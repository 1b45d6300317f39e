#include "engine/gguf/gguf_writer.h"

#include <sys/stat.h>

#include <cmath>
#include <cstring>
#include <random>

#include "engine/gguf/gguf_file.h"
#include "gtest/gtest.h"
#include "tests/testing/test_util.h"

namespace strata::gguf {
namespace {

using ::strata::testing::ReadFileBytes;
using ::strata::testing::ScratchDir;

bool SameValue(const Value& a, const Value& b) {
  if (a.type != b.type || a.data.index() != b.data.index()) return false;
  if (const Array* x = std::get_if<Array>(&a.data)) {
    const Array& y = std::get<Array>(b.data);
    if (x->element_type != y.element_type || x->elements.size() != y.elements.size()) return false;
    for (size_t i = 0; i < x->elements.size(); ++i) {
      if (!SameValue(x->elements[i], y.elements[i])) return false;
    }
    return true;
  }
  if (const uint64_t* u = std::get_if<uint64_t>(&a.data)) return *u == std::get<uint64_t>(b.data);
  if (const int64_t* i = std::get_if<int64_t>(&a.data)) return *i == std::get<int64_t>(b.data);
  if (const double* d = std::get_if<double>(&a.data)) return *d == std::get<double>(b.data);
  if (const bool* f = std::get_if<bool>(&a.data)) return *f == std::get<bool>(b.data);
  return std::get<std::string>(a.data) == std::get<std::string>(b.data);
}

std::vector<Value> Ints(std::initializer_list<int32_t> v) {
  std::vector<Value> out;
  for (int32_t i : v) out.push_back(Value::Int32(i));
  return out;
}

// Every value type, including arrays of arrays and empty ones.
Metadata SampleMetadata() {
  Metadata md;
  md.Add("general.architecture", Value::String("llama"));
  md.Add("u8", Value::Uint8(255));
  md.Add("i8", Value::Int8(-128));
  md.Add("u16", Value::Uint16(65535));
  md.Add("i16", Value::Int16(-32768));
  md.Add("u32", Value::Uint32(0xffffffffu));
  md.Add("i32", Value::Int32(-7));
  md.Add("u64", Value::Uint64(~uint64_t{0}));
  md.Add("i64", Value::Int64(std::numeric_limits<int64_t>::min()));
  md.Add("f32", Value::Float32(-0.375f));
  md.Add("f64", Value::Float64(1e300));
  md.Add("bool", Value::Bool(true));
  md.Add("empty_string", Value::String(""));
  md.Add("binary_string", Value::String(std::string("\0\xff\n", 3)));
  md.Add("strings", Value::MakeArray(ValueType::kString, {Value::String("a"), Value::String("bc")}));
  md.Add("empty_array", Value::MakeArray(ValueType::kFloat64, {}));
  md.Add("nested", Value::MakeArray(ValueType::kArray, {Value::MakeArray(ValueType::kInt32, Ints({1, 2, 3})),
                                                         Value::MakeArray(ValueType::kInt32, {})}));
  md.Add("nested_strings",
         Value::MakeArray(ValueType::kArray,
                          {Value::MakeArray(ValueType::kArray,
                                            {Value::MakeArray(ValueType::kString, {Value::String("deep")})})}));
  return md;
}

std::vector<float> RandomFloats(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& f : v) f = dist(gen);
  return v;
}

TEST(GgufWriter, RoundTripsMetadataAndTensors) {
  ScratchDir dir;
  const std::string path = dir.Join("model.gguf");
  GgufWriter writer;
  const Metadata md = SampleMetadata();
  for (const auto& [key, value] : md.entries()) writer.Set(key, value);
  writer.SetStringArray("tokens", {"<s>", "hello", ""});
  writer.SetFloat32Array("scores", {0.5f, -1.0f, 3.0f});
  writer.SetInt32Array("types", {1, 2, -3});

  const std::vector<float> values = RandomFloats(64 * 3, 1);
  struct Expected {
    std::string name;
    GgmlType type;
    std::vector<int64_t> ne;
  };
  const std::vector<Expected> expected = {
      {"f32", GgmlType::kF32, {64, 3}},   {"f16", GgmlType::kF16, {64, 3}},   {"bf16", GgmlType::kBF16, {64, 3}},
      {"q8_0", GgmlType::kQ8_0, {64, 3}}, {"q4_0", GgmlType::kQ4_0, {64, 3}}, {"q4_1", GgmlType::kQ4_1, {64, 1, 3}},
  };
  std::vector<std::vector<uint8_t>> encoded;
  for (const Expected& e : expected) {
    std::vector<uint8_t> bytes(*TensorBytes(e.type, e.ne));
    ASSERT_TRUE(Quantize(e.type, values.data(), bytes.data(), 64 * 3).ok());
    encoded.push_back(bytes);
  }
  for (size_t i = 0; i < expected.size(); ++i) {
    ASSERT_TRUE(writer.AddTensorData(expected[i].name, expected[i].type, expected[i].ne, encoded[i]).ok());
  }
  // An undecodable type is written from raw bytes like any other.
  std::vector<uint8_t> iq(66 * 2, 0xab);
  ASSERT_TRUE(writer.AddTensorData("iq2", static_cast<GgmlType>(16), {512}, iq).ok());
  ASSERT_TRUE(writer.WriteFile(path).ok());

  struct stat st;
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(static_cast<uint64_t>(st.st_size), writer.PlannedFileSize());

  auto file = GgufFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->version(), 3u);
  const auto& entries = (*file)->metadata().entries();
  ASSERT_EQ(entries.size(), md.entries().size() + 3);
  for (size_t i = 0; i < md.entries().size(); ++i) {
    EXPECT_EQ(entries[i].first, md.entries()[i].first);
    EXPECT_TRUE(SameValue(entries[i].second, md.entries()[i].second)) << entries[i].first;
  }
  EXPECT_EQ(*(*file)->metadata().GetStringArray("tokens"), (std::vector<std::string>{"<s>", "hello", ""}));
  EXPECT_EQ(*(*file)->metadata().GetFloatArray("scores"), (std::vector<float>{0.5f, -1.0f, 3.0f}));
  EXPECT_EQ(*(*file)->metadata().GetIntArray("types"), (std::vector<int64_t>{1, 2, -3}));

  ASSERT_EQ((*file)->tensors().size(), expected.size() + 1);
  for (size_t i = 0; i < expected.size(); ++i) {
    const TensorInfo& t = (*file)->tensors()[i];
    EXPECT_EQ(t.name, expected[i].name);
    EXPECT_EQ(t.type, expected[i].type);
    EXPECT_EQ(t.ne, expected[i].ne);
    EXPECT_EQ(t.offset % 32, 0u);
    ASSERT_EQ(t.bytes, encoded[i].size());
    EXPECT_EQ(std::memcmp(t.data, encoded[i].data(), t.bytes), 0) << t.name;
    absl::StatusOr<std::vector<float>> decoded = DequantizeTensor(t);
    ASSERT_TRUE(decoded.ok());
    for (size_t j = 0; j < values.size(); ++j) ASSERT_NEAR((*decoded)[j], values[j], 0.6) << t.name;
  }
  const TensorInfo* iq_info = (*file)->FindTensor("iq2");
  ASSERT_NE(iq_info, nullptr);
  EXPECT_EQ(std::memcmp(iq_info->data, iq.data(), iq.size()), 0);
}

// The exact bytes of a tiny file, spelled out from the GGUF specification.
TEST(GgufWriter, ByteExactLayout) {
  ScratchDir dir;
  GgufWriter writer;
  writer.SetUint32("a", 7);
  const float data[2] = {1.0f, 2.0f};
  ASSERT_TRUE(writer.AddTensorData("t", GgmlType::kF32, {2}, {reinterpret_cast<const uint8_t*>(data), 8}).ok());
  ASSERT_TRUE(writer.WriteFile(dir.Join("x.gguf")).ok());

  std::vector<uint8_t> want = {'G', 'G', 'U', 'F', 3, 0, 0, 0};
  auto u64 = [&](uint64_t v) { for (int i = 0; i < 8; ++i) want.push_back(static_cast<uint8_t>(v >> (8 * i))); };
  auto u32 = [&](uint32_t v) { for (int i = 0; i < 4; ++i) want.push_back(static_cast<uint8_t>(v >> (8 * i))); };
  u64(1);               // tensors
  u64(1);               // metadata entries
  u64(1);               // key length
  want.push_back('a');  // key
  u32(4);               // uint32
  u32(7);
  u64(1);               // tensor name length
  want.push_back('t');
  u32(1);               // n_dims
  u64(2);               // ne[0]
  u32(0);               // f32
  u64(0);               // offset
  while (want.size() % 32) want.push_back(0);
  u32(0x3f800000);
  u32(0x40000000);
  while (want.size() % 32) want.push_back(0);
  EXPECT_EQ(ReadFileBytes(dir.Join("x.gguf")), want);
}

TEST(GgufWriter, CustomAlignmentIsRecorded) {
  ScratchDir dir;
  GgufWriter writer(64);
  writer.SetString("name", "x");
  std::vector<float> v = RandomFloats(32, 2);
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(writer.AddTensor("t" + std::to_string(i), GgmlType::kF32, {8 + 8 * i}, [&](std::span<uint8_t> dst) {
      std::memcpy(dst.data(), v.data(), dst.size());
      return absl::OkStatus();
    }).ok());
  }
  ASSERT_TRUE(writer.WriteFile(dir.Join("a.gguf")).ok());
  auto file = GgufFile::Open(dir.Join("a.gguf"));
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->alignment(), 64u);
  EXPECT_EQ(*(*file)->metadata().GetUint("general.alignment"), 64u);
  EXPECT_EQ((*file)->metadata().Find("general.alignment")->type, ValueType::kUint32);
  EXPECT_EQ((*file)->data_offset() % 64, 0u);
  for (const TensorInfo& t : (*file)->tensors()) EXPECT_EQ(t.offset % 64, 0u) << t.name;
  EXPECT_EQ((*file)->file_size(), writer.PlannedFileSize());
}

TEST(GgufWriter, FillersRunOneAtATimeInOrder) {
  ScratchDir dir;
  GgufWriter writer;
  std::vector<std::string> calls;
  for (std::string name : {"a", "b", "c"}) {
    ASSERT_TRUE(writer.AddTensor(name, GgmlType::kF16, {4}, [&calls, name](std::span<uint8_t> dst) {
      EXPECT_EQ(dst.size(), 8u);
      calls.push_back(name);
      std::memset(dst.data(), name[0], dst.size());
      return absl::OkStatus();
    }).ok());
  }
  EXPECT_TRUE(calls.empty());
  ASSERT_TRUE(writer.WriteFile(dir.Join("f.gguf")).ok());
  EXPECT_EQ(calls, (std::vector<std::string>{"a", "b", "c"}));
  auto file = GgufFile::Open(dir.Join("f.gguf"));
  ASSERT_TRUE(file.ok());
  EXPECT_EQ((*file)->FindTensor("b")->data[7], 'b');
}

TEST(GgufWriter, FailingFillerNamesTensorAndLeavesNoFile) {
  ScratchDir dir;
  GgufWriter writer;
  ASSERT_TRUE(writer.AddTensor("ok", GgmlType::kF32, {4}, [](std::span<uint8_t>) { return absl::OkStatus(); }).ok());
  ASSERT_TRUE(writer.AddTensor("bad", GgmlType::kF32, {4}, [](std::span<uint8_t>) {
    return absl::DataLossError("source vanished");
  }).ok());
  const std::string path = dir.Join("g.gguf");
  EXPECT_THAT(writer.WriteFile(path), StatusIsWith(absl::StatusCode::kDataLoss, path + ": tensor 'bad': source vanished"));
  struct stat st;
  EXPECT_NE(stat(path.c_str(), &st), 0);
}

TEST(GgufWriter, RejectsBadTensors) {
  GgufWriter writer;
  auto fill = [](std::span<uint8_t>) { return absl::OkStatus(); };
  ASSERT_TRUE(writer.AddTensor("w", GgmlType::kQ4_0, {32}, fill).ok());
  EXPECT_THAT(writer.AddTensor("w", GgmlType::kQ4_0, {32}, fill), StatusIsWith(absl::StatusCode::kInvalidArgument, "already"));
  EXPECT_THAT(writer.AddTensor("x", GgmlType::kQ4_0, {33}, fill), StatusIsWith(absl::StatusCode::kInvalidArgument, "tensor 'x'"));
  EXPECT_THAT(writer.AddTensor("x", GgmlType::kF32, {}, fill), StatusIsWith(absl::StatusCode::kInvalidArgument, "dimensions"));
  EXPECT_THAT(writer.AddTensor("x", GgmlType::kF32, {1, 1, 1, 1, 1}, fill), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(writer.AddTensor("x", GgmlType::kF32, {4, 0}, fill), StatusIsWith(absl::StatusCode::kInvalidArgument, "ne[1]"));
  EXPECT_THAT(writer.AddTensor("x", static_cast<GgmlType>(5), {4}, fill), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(writer.AddTensor(std::string(64, 'n'), GgmlType::kF32, {4}, fill),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "64 bytes"));
  EXPECT_THAT(writer.AddTensor("", GgmlType::kF32, {4}, fill), StatusIs(absl::StatusCode::kInvalidArgument));
  std::vector<uint8_t> short_data(10);
  EXPECT_THAT(writer.AddTensorData("y", GgmlType::kF32, {4}, short_data),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "10 bytes given"));
}

TEST(GgufWriter, RejectsInconsistentValues) {
  ScratchDir dir;
  {
    GgufWriter writer;
    writer.Set("too_big", Value{ValueType::kUint8, uint64_t{300}});
    EXPECT_THAT(writer.WriteFile(dir.Join("a.gguf")), StatusIsWith(absl::StatusCode::kInvalidArgument, "too_big"));
  }
  {
    GgufWriter writer;
    writer.Set("mixed", Value::MakeArray(ValueType::kInt32, {Value::Int32(1), Value::String("x")}));
    EXPECT_THAT(writer.WriteFile(dir.Join("b.gguf")),
                StatusIsWith(absl::StatusCode::kInvalidArgument, "metadata key 'mixed'[1]: element is string"));
  }
  {
    GgufWriter writer(48);
    EXPECT_THAT(writer.WriteFile(dir.Join("c.gguf")), StatusIsWith(absl::StatusCode::kInvalidArgument, "alignment 48"));
  }
}

TEST(GgufWriter, SetReplacesInPlace) {
  ScratchDir dir;
  GgufWriter writer;
  writer.SetUint32("a", 1);
  writer.SetString("b", "x");
  writer.SetUint32("a", 2);
  ASSERT_TRUE(writer.WriteFile(dir.Join("r.gguf")).ok());
  auto file = GgufFile::Open(dir.Join("r.gguf"));
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_EQ((*file)->metadata().entries().size(), 2u);
  EXPECT_EQ((*file)->metadata().entries()[0].first, "a");
  EXPECT_EQ(*(*file)->metadata().GetUint("a"), 2u);
}

}  // namespace
}  // namespace strata::gguf
