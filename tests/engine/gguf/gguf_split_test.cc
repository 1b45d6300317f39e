#include <cstring>
#include <string>
#include <vector>

#include "engine/gguf/gguf_file.h"
#include "engine/gguf/gguf_writer.h"
#include "gtest/gtest.h"
#include "tests/testing/test_util.h"

namespace strata::gguf {
namespace {

using ::strata::testing::ScratchDir;

struct ShardSpec {
  std::vector<std::string> tensors;
  int split_no = -1;     // -1: the right value
  int split_count = -1;  // -1: the right value
  int tensors_count = -1;
};

// Writes `<dir>/m-0000i-of-0000n.gguf` for each spec, the way gguf-split does: split.* keys in every
// shard (u16, u16, i32), model metadata in the first only.
void WriteShards(const ScratchDir& dir, const std::vector<ShardSpec>& specs) {
  int total = 0;
  for (const ShardSpec& s : specs) total += static_cast<int>(s.tensors.size());
  const int n = static_cast<int>(specs.size());
  for (int i = 0; i < n; ++i) {
    const ShardSpec& s = specs[i];
    GgufWriter writer;
    if (i == 0) writer.SetString("general.architecture", "llama");
    writer.Set("split.no", Value::Uint16(static_cast<uint16_t>(s.split_no >= 0 ? s.split_no : i)));
    writer.Set("split.count", Value::Uint16(static_cast<uint16_t>(s.split_count >= 0 ? s.split_count : n)));
    writer.SetInt32("split.tensors.count", s.tensors_count >= 0 ? s.tensors_count : total);
    for (const std::string& name : s.tensors) {
      const char tag = static_cast<char>('A' + i);
      ASSERT_TRUE(writer.AddTensor(name, GgmlType::kF32, {8}, [tag](std::span<uint8_t> dst) {
        std::memset(dst.data(), tag, dst.size());
        return absl::OkStatus();
      }).ok());
    }
    char name[64];
    std::snprintf(name, sizeof(name), "m-%05d-of-%05d.gguf", i + 1, n);
    ASSERT_TRUE(writer.WriteFile(dir.Join(name)).ok());
  }
}

TEST(GgufSplit, ShardPaths) {
  EXPECT_EQ(SplitShardPaths("/d/model-00002-of-00003.gguf"),
            (std::vector<std::string>{"/d/model-00001-of-00003.gguf", "/d/model-00002-of-00003.gguf",
                                      "/d/model-00003-of-00003.gguf"}));
  EXPECT_EQ(SplitShardPaths("a-00001-of-00001.gguf"), (std::vector<std::string>{"a-00001-of-00001.gguf"}));
  EXPECT_TRUE(SplitShardPaths("model.gguf").empty());
  EXPECT_TRUE(SplitShardPaths("model-0001-of-0003.gguf").empty());
  EXPECT_TRUE(SplitShardPaths("model-00004-of-00003.gguf").empty());
  EXPECT_TRUE(SplitShardPaths("model-00000-of-00003.gguf").empty());
  EXPECT_TRUE(SplitShardPaths("model-00001-of-00000.gguf").empty());
  EXPECT_TRUE(SplitShardPaths("model-00001-of-00003.bin").empty());
  EXPECT_TRUE(SplitShardPaths("model-0000x-of-00003.gguf").empty());
}

TEST(GgufSplit, OpensAllShardsFromAnyShard) {
  ScratchDir dir;
  WriteShards(dir, {{{"a", "b"}}, {{"c"}}, {{"d", "e", "f"}}});
  for (int shard = 1; shard <= 3; ++shard) {
    char name[64];
    std::snprintf(name, sizeof(name), "m-%05d-of-00003.gguf", shard);
    auto model = GgufModel::Open(dir.Join(name));
    ASSERT_TRUE(model.ok()) << model.status();
    ASSERT_EQ((*model)->shards().size(), 3u);
    ASSERT_EQ((*model)->tensors().size(), 6u);
    EXPECT_EQ((*model)->tensors()[2].name, "c");
    EXPECT_EQ(*(*model)->metadata().GetString("general.architecture"), "llama");
    const TensorInfo* e = (*model)->FindTensor("e");
    ASSERT_NE(e, nullptr);
    EXPECT_EQ(e->shard, 2);
    EXPECT_EQ(e->data[0], 'C');
    EXPECT_EQ((*model)->FindTensor("a")->data[0], 'A');
    EXPECT_EQ((*model)->FindTensor("zz"), nullptr);
    uint64_t sum = 0;
    for (const auto& f : (*model)->shards()) sum += f->file_size();
    EXPECT_EQ((*model)->total_bytes(), sum);
  }
}

TEST(GgufSplit, MissingShard) {
  ScratchDir dir;
  WriteShards(dir, {{{"a"}}, {{"b"}}, {{"c"}}});
  ASSERT_EQ(std::remove(dir.Join("m-00002-of-00003.gguf").c_str()), 0);
  EXPECT_THAT(GgufModel::Open(dir.Join("m-00001-of-00003.gguf")).status(),
              StatusIsWith(absl::StatusCode::kNotFound, "shard 2 of 3: " + dir.Join("m-00002-of-00003.gguf")));
}

TEST(GgufSplit, WrongSplitKeys) {
  {
    ScratchDir dir;
    WriteShards(dir, {{{"a"}}, {{"b"}, /*split_no=*/0}});
    EXPECT_THAT(GgufModel::Open(dir.Join("m-00001-of-00002.gguf")).status(),
                StatusIsWith(absl::StatusCode::kInvalidArgument, "split.no is 0, expected 1"));
  }
  {
    ScratchDir dir;
    WriteShards(dir, {{{"a"}}, {{"b"}, -1, /*split_count=*/3}});
    EXPECT_THAT(GgufModel::Open(dir.Join("m-00001-of-00002.gguf")).status(),
                StatusIsWith(absl::StatusCode::kInvalidArgument,
                             dir.Join("m-00002-of-00002.gguf") + ": split.count is 3, expected 2"));
  }
  {
    ScratchDir dir;
    WriteShards(dir, {{{"a"}, -1, -1, /*tensors_count=*/5}, {{"b"}}});
    EXPECT_THAT(GgufModel::Open(dir.Join("m-00002-of-00002.gguf")).status(),
                StatusIsWith(absl::StatusCode::kInvalidArgument, "split.tensors.count is 5 but the 2 shards hold 2"));
  }
  {
    ScratchDir dir;
    WriteShards(dir, {{{"a", "b"}}, {{"b"}}});
    EXPECT_THAT(GgufModel::Open(dir.Join("m-00001-of-00002.gguf")).status(),
                StatusIsWith(absl::StatusCode::kInvalidArgument, "tensor 'b' is also in"));
  }
}

TEST(GgufSplit, SingleFiles) {
  ScratchDir dir;
  {
    GgufWriter writer;
    writer.SetString("general.architecture", "llama");
    ASSERT_TRUE(writer.AddTensor("w", GgmlType::kF32, {4}, [](std::span<uint8_t>) { return absl::OkStatus(); }).ok());
    ASSERT_TRUE(writer.WriteFile(dir.Join("plain.gguf")).ok());
  }
  auto model = GgufModel::Open(dir.Join("plain.gguf"));
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->shards().size(), 1u);
  EXPECT_EQ((*model)->tensors()[0].shard, 0);
  EXPECT_EQ((*model)->total_bytes(), (*model)->shards()[0]->file_size());

  {
    GgufWriter writer;
    writer.Set("split.count", Value::Uint16(2));
    ASSERT_TRUE(writer.WriteFile(dir.Join("renamed.gguf")).ok());
  }
  EXPECT_THAT(GgufModel::Open(dir.Join("renamed.gguf")).status(),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "split.count is 2 but the file name"));
  EXPECT_THAT(GgufModel::Open(dir.Join("absent.gguf")).status(), StatusIs(absl::StatusCode::kNotFound));
}

}  // namespace
}  // namespace strata::gguf
