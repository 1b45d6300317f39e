#include "engine/pack/expert_source.h"

#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "engine/pack/pack.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "packtool/convert.h"
#include "packtool/synth.h"
#include "tests/testing/test_util.h"

namespace strata::pack {
namespace {

using ::strata::testing::ReadFileBytes;
using ::strata::testing::ScratchDir;
using ::strata::testing::WriteFileBytes;

class ExpertSourceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    packtool::SynthOptions o;
    o.geometry = *packtool::PresetGeometry("mixtral", "tiny");
    o.output = dir_.Join("m.gguf");
    o.threads = 2;
    ASSERT_THAT(packtool::SynthesizeGguf(o), IsOk());
    packtool::ConvertOptions c;
    c.input = o.output;
    c.output_dir = dir_.Join("pack");
    c.scheme = kernels::Scheme::kS2;
    c.threads = 2;
    ASSERT_TRUE(packtool::ConvertGguf(c, nullptr, nullptr).ok());
    experts_ = ReadFileBytes(dir_.Join("pack/experts.bin"));
  }
  std::unique_ptr<Pack> OpenPack() {
    auto p = Pack::Open(dir_.Join("pack"));
    EXPECT_TRUE(p.ok()) << p.status();
    return p.ok() ? *std::move(p) : nullptr;
  }
  ScratchDir dir_;
  std::vector<uint8_t> experts_;
};

TEST_F(ExpertSourceTest, ArenaAndMmapServeTheFileBytes) {
  auto pack = OpenPack();
  for (const char* kind : {"arena", "mmap"}) {
    ExpertSourceStats stats;
    auto source = OpenExpertSource(*pack, {kind, /*verify=*/true, 2}, &stats);
    ASSERT_TRUE(source.ok()) << source.status();
    EXPECT_EQ((*source)->kind(), kind);
    EXPECT_EQ(stats.bytes, experts_.size());
    const uint64_t blob = pack->manifest().blob_bytes();
    for (int64_t layer = 0; layer < 2; ++layer) {
      for (int64_t e = 0; e < 8; ++e) {
        auto p = (*source)->Blob(layer, e);
        ASSERT_TRUE(p.ok()) << p.status();
        EXPECT_EQ(0, std::memcmp(*p, experts_.data() + (layer * 8 + e) * blob, blob)) << kind << layer << e;
      }
    }
    EXPECT_THAT((*source)->Blob(2, 0).status(), StatusIsWith(absl::StatusCode::kOutOfRange, "moe layer 2"));
    EXPECT_THAT((*source)->Blob(0, 8).status(), StatusIs(absl::StatusCode::kOutOfRange));
    EXPECT_THAT((*source)->Blob(-1, 0).status(), StatusIs(absl::StatusCode::kOutOfRange));
  }
}

TEST_F(ExpertSourceTest, ArenaReportsItsLoadRate) {
  auto pack = OpenPack();
  ExpertSourceStats stats;
  auto source = OpenExpertSource(*pack, {"arena", false, 2}, &stats);
  ASSERT_TRUE(source.ok());
  EXPECT_GT(stats.gb_per_second, 0.0);
  EXPECT_TRUE(stats.pinned || !stats.pin_note.empty());  // when not pinned, it says why
}

// Loading an arena reports the bytes read so far, growing, up to the whole experts file.
TEST_F(ExpertSourceTest, ArenaReportsItsLoadProgressUpToTheTotal) {
  auto pack = OpenPack();
  ExpertSourceOptions options{"arena", false, 2};
  std::vector<std::pair<uint64_t, uint64_t>> calls;
  options.on_load_progress = [&calls](uint64_t done, uint64_t total) { calls.emplace_back(done, total); };
  auto source = OpenExpertSource(*pack, options, nullptr);
  ASSERT_TRUE(source.ok()) << source.status();
  ASSERT_FALSE(calls.empty());
  const uint64_t total = pack->manifest().experts_bytes();
  for (size_t i = 0; i < calls.size(); ++i) {
    EXPECT_EQ(calls[i].second, total);
    if (i > 0) {
      EXPECT_GT(calls[i].first, calls[i - 1].first);
    }
  }
  EXPECT_EQ(calls.back().first, total);
}

TEST_F(ExpertSourceTest, CorruptionVerifiedArenaRefusesToLoadAFlippedBlob) {
  const uint64_t blob = 13;
  auto pack_bytes = experts_;
  auto pack = OpenPack();
  pack_bytes[blob * pack->manifest().blob_bytes() + 77] ^= 0x10;
  WriteFileBytes(dir_.Join("pack/experts.bin"), pack_bytes);
  EXPECT_THAT(OpenExpertSource(*pack, {"arena", true, 2}, nullptr).status(),
              StatusIsWith(absl::StatusCode::kDataLoss, "blob 13 (moe layer 1, expert 5)"));
  // Without verification the arena loads (validate is the tool that finds it).
  EXPECT_TRUE(OpenExpertSource(*pack, {"arena", false, 2}, nullptr).ok());
}

TEST_F(ExpertSourceTest, CorruptionVerifiedMmapFailsOnlyTheBadBlob) {
  auto pack = OpenPack();
  auto bytes = experts_;
  bytes[3 * pack->manifest().blob_bytes() + 5] ^= 0x01;
  WriteFileBytes(dir_.Join("pack/experts.bin"), bytes);
  auto source = OpenExpertSource(*pack, {"mmap", true, 2}, nullptr);
  ASSERT_TRUE(source.ok());
  EXPECT_TRUE((*source)->Blob(0, 2).ok());
  EXPECT_THAT((*source)->Blob(0, 3).status(), StatusIsWith(absl::StatusCode::kDataLoss, "checksum"));
  EXPECT_THAT((*source)->Blob(0, 3).status(), StatusIs(absl::StatusCode::kDataLoss));  // and stays failed
}

TEST_F(ExpertSourceTest, CorruptionPackOpenRefusesAWrongSizedExpertsFile) {
  std::filesystem::resize_file(dir_.Join("pack/experts.bin"), experts_.size() - 4096);
  EXPECT_THAT(Pack::Open(dir_.Join("pack")).status(),
              StatusIsWith(absl::StatusCode::kDataLoss, absl::StrCat("size ", experts_.size() - 4096)));
  std::filesystem::remove(dir_.Join("pack/experts.bin"));
  EXPECT_THAT(Pack::Open(dir_.Join("pack")).status(), StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(ExpertSourceTest, CorruptionMmapRefusesAnExpertsFileThatChangedSinceOpen) {
  auto pack = OpenPack();
  ASSERT_NE(pack, nullptr);
  std::filesystem::resize_file(dir_.Join("pack/experts.bin"), experts_.size() - 4096);
  EXPECT_THAT(OpenExpertSource(*pack, {"mmap", false, 1}, nullptr).status(),
              StatusIsWith(absl::StatusCode::kDataLoss, "size changed since the pack was opened"));
}

TEST_F(ExpertSourceTest, CorruptionPackOpenRefusesADenseFileOfAnotherSize) {
  // A dense.gguf that still parses (trailing bytes) but is not the one the manifest describes.
  std::vector<uint8_t> dense = ReadFileBytes(dir_.Join("pack/dense.gguf"));
  const size_t size = dense.size();
  dense.resize(size + 64, 0);
  WriteFileBytes(dir_.Join("pack/dense.gguf"), dense);
  EXPECT_THAT(Pack::Open(dir_.Join("pack")).status(),
              StatusIsWith(absl::StatusCode::kDataLoss,
                           absl::StrCat("dense.gguf: size ", size + 64, " bytes, the manifest says ", size)));
}

TEST_F(ExpertSourceTest, UnknownKindIsRefused) {
  auto pack = OpenPack();
  EXPECT_THAT(OpenExpertSource(*pack, {"disk", false, 1}, nullptr).status(),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "disk"));
}

}  // namespace
}  // namespace strata::pack
