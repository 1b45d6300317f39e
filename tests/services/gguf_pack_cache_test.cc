#include "services/gguf_pack_cache.h"

#include <filesystem>
#include <fstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "packtool/validate.h"
#include "tests/services/service_test_util.h"
#include "tests/testing/test_util.h"

namespace strata::services {
namespace {

namespace fs = std::filesystem;
using ::strata::testing::ScratchDir;

// Converts `gguf` through the cache; the number of conversion progress reports (0: nothing converted).
int Conversions(const std::string& gguf, PackCacheResult* result) {
  int reports = 0;
  absl::StatusOr<PackCacheResult> r = PackForGguf(gguf, [&](const packtool::ConvertProgress&) { ++reports; }, nullptr);
  EXPECT_TRUE(r.ok()) << r.status();
  if (r.ok()) *result = *r;
  return reports;
}

TEST(GgufPackCacheTest, ConvertsOnceBesideTheFileThenReusesWhileItIsUnchanged) {
  ScratchDir dir;
  const std::string gguf = dir.Join("model.gguf");
  fs::copy_file(testing::Models().tiny_gguf, gguf);
  PackCacheResult first;
  EXPECT_GT(Conversions(gguf, &first), 0);
  EXPECT_FALSE(first.reused);
  EXPECT_EQ(first.pack_dir, gguf + ".strata-pack");
  auto report = packtool::ValidatePack(first.pack_dir, {});
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_TRUE(report->ok());

  PackCacheResult second;
  EXPECT_EQ(Conversions(gguf, &second), 0);
  EXPECT_TRUE(second.reused);
  EXPECT_EQ(second.pack_dir, first.pack_dir);

  // A changed file (another modification time) is converted again.
  fs::last_write_time(gguf, fs::last_write_time(gguf) + std::chrono::seconds(5));
  PackCacheResult third;
  EXPECT_GT(Conversions(gguf, &third), 0);
  EXPECT_FALSE(third.reused);
}

// A cache cut short is never reused: without its stamp (the conversion or validation stopped), with a
// damaged file, or as a leftover .partial directory.
TEST(GgufPackCacheTest, AHalfWrittenCacheIsConvertedAgain) {
  ScratchDir dir;
  const std::string gguf = dir.Join("model.gguf");
  fs::copy_file(testing::Models().tiny_gguf, gguf);
  PackCacheResult result;
  ASSERT_GT(Conversions(gguf, &result), 0);

  fs::remove(result.pack_dir + "/source.stamp");
  EXPECT_GT(Conversions(gguf, &result), 0);
  EXPECT_FALSE(result.reused);

  fs::resize_file(result.pack_dir + "/experts.bin", 4096);
  EXPECT_GT(Conversions(gguf, &result), 0);
  EXPECT_FALSE(result.reused);

  fs::remove_all(result.pack_dir);
  fs::create_directories(result.pack_dir + ".partial");
  std::ofstream(result.pack_dir + ".partial/experts.bin") << "half";
  EXPECT_GT(Conversions(gguf, &result), 0);
  EXPECT_FALSE(fs::exists(result.pack_dir + ".partial"));
  EXPECT_EQ(Conversions(gguf, &result), 0);
  EXPECT_TRUE(result.reused);
}

TEST(GgufPackCacheTest, AMissingModelIsNamed) {
  ScratchDir dir;
  EXPECT_THAT(PackForGguf(dir.Join("absent.gguf"), nullptr, nullptr).status(),
              StatusIsWith(absl::StatusCode::kNotFound, "--model " + dir.Join("absent.gguf") + ": No such file"));
}

}  // namespace
}  // namespace strata::services
