#include "packtool/validate.h"

#include <atomic>
#include <filesystem>
#include <fstream>

#include "engine/gguf/gguf_file.h"
#include "engine/gguf/gguf_writer.h"
#include "engine/pack/pack_format.h"
#include "engine/pack/routing_profile.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/packtool/packtool_test_util.h"
#include "tests/testing/test_util.h"

namespace strata::packtool {
namespace {

namespace fs = std::filesystem;
using ::strata::testing::ReadFileBytes;
using ::strata::testing::ScratchDir;
using ::strata::testing::WriteFileBytes;
using ::testing::AllOf;
using ::testing::Field;
using ::testing::HasSubstr;
using ::testing::SizeIs;

// One tiny pack shared by the tests of this file; each test corrupts its own copy.
class ValidateTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new ScratchDir();
    manifest_ = new pack::v1::Manifest(testing::MakeTinyPack(dir_->Join("m.gguf"), dir_->Join("pack")));
  }
  static void TearDownTestSuite() {
    delete manifest_;
    delete dir_;
  }
  // A fresh copy of the pack.
  std::string CopyPack() {
    const std::string copy = scratch_.Join("pack");
    fs::copy(dir_->Join("pack"), copy, fs::copy_options::recursive);
    return copy;
  }
  ValidationReport Validate(const std::string& dir, bool quick = false) {
    auto report = ValidatePack(dir, {quick, 2});
    EXPECT_TRUE(report.ok()) << report.status();
    return report.ok() ? *report : ValidationReport{};
  }

  static ScratchDir* dir_;
  static pack::v1::Manifest* manifest_;
  ScratchDir scratch_;
};
ScratchDir* ValidateTest::dir_ = nullptr;
pack::v1::Manifest* ValidateTest::manifest_ = nullptr;

auto ProblemIn(const std::string& file, const std::string& text) {
  return AllOf(Field(&ValidationProblem::file, file), Field(&ValidationProblem::message, HasSubstr(text)));
}

TEST_F(ValidateTest, AGoodPackHasNoProblemsAndEveryBlobIsChecked) {
  const ValidationReport r = Validate(dir_->Join("pack"));
  EXPECT_TRUE(r.ok());
  EXPECT_THAT(r.problems, SizeIs(0));
  EXPECT_EQ(r.blobs_checked, 16u);
  EXPECT_EQ(r.bytes_checked, manifest_->experts_bytes());
  EXPECT_GT(r.gb_per_second, 0.0);
}

TEST_F(ValidateTest, ACancelledValidationStopsWithCancelledNotAReport) {
  std::atomic<bool> cancel{true};
  ValidateOptions options;
  options.threads = 2;
  options.cancel = &cancel;
  absl::StatusOr<ValidationReport> r = ValidatePack(dir_->Join("pack"), options);
  EXPECT_THAT(r.status(), StatusIs(absl::StatusCode::kCancelled));
  EXPECT_THAT(std::string(r.status().message()), HasSubstr(dir_->Join("pack")));
  // Not yet set: the flag is only looked at, and the pack validates.
  cancel.store(false);
  r = ValidatePack(dir_->Join("pack"), options);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->blobs_checked, 16u);
}

TEST_F(ValidateTest, MissingDirectoryIsAnError) {
  EXPECT_THAT(ValidatePack(scratch_.Join("nope"), {}).status(), StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(ValidateTest, CorruptionTruncatedExpertsNamesBothSizes) {
  const std::string p = CopyPack();
  fs::resize_file(p + "/experts.bin", manifest_->experts_bytes() - 4096);
  const ValidationReport r = Validate(p);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.problems, ::testing::Contains(ProblemIn(
                              "experts.bin", absl::StrCat("size ", manifest_->experts_bytes() - 4096, " bytes, expected"))));
  EXPECT_THAT(r.problems[0].message, HasSubstr(absl::StrCat(manifest_->experts_bytes())));
}

TEST_F(ValidateTest, CorruptionOneFlippedByteNamesTheBlob) {
  const std::string p = CopyPack();
  std::vector<uint8_t> bytes = ReadFileBytes(p + "/experts.bin");
  const uint64_t blob = 11;
  bytes[blob * manifest_->blob_bytes() + 1234] ^= 0x01;
  WriteFileBytes(p + "/experts.bin", bytes);
  const ValidationReport r = Validate(p);
  ASSERT_THAT(r.problems, SizeIs(1));
  EXPECT_THAT(r.problems[0], ProblemIn("experts.bin", "blob 11 (moe layer 1, expert 3)"));
  EXPECT_THAT(r.problems[0].message, HasSubstr("checksum"));
  // --quick skips the checksums, so it cannot see this.
  EXPECT_TRUE(Validate(p, /*quick=*/true).ok());
}

TEST_F(ValidateTest, CorruptionWrongGeometryInManifest) {
  const std::string p = CopyPack();
  pack::v1::Manifest m = *manifest_;
  m.mutable_geometry()->set_n_expert(16);
  ASSERT_THAT(pack::WriteManifest(m, p), IsOk());
  const ValidationReport r = Validate(p);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.problems[0], ProblemIn("manifest.json", "experts_bytes"));
}

TEST_F(ValidateTest, CorruptionDenseDisagreesWithManifestGeometry) {
  const std::string p = CopyPack();
  pack::v1::Manifest m = *manifest_;
  m.mutable_geometry()->set_n_expert_used(3);
  ASSERT_THAT(pack::WriteManifest(m, p), IsOk());
  const ValidationReport r = Validate(p, /*quick=*/true);
  EXPECT_THAT(r.problems, ::testing::Contains(ProblemIn("dense.gguf", "qwen3moe.expert_used_count is 2, manifest geometry says 3")));
}

// The geometry counts the blocks that run: a dense.gguf whose block_count includes multi-token-prediction
// blocks (nextn_predict_layers) agrees when the others match, and is a problem when they do not.
TEST_F(ValidateTest, DenseBlockCountLessMultiTokenPredictionBlocksMustMatchTheGeometry) {
  const std::string p = CopyPack();
  auto with_mtp = [&](uint32_t block_count) {
    auto file = gguf::GgufFile::Open(dir_->Join("pack/dense.gguf"));
    ASSERT_TRUE(file.ok()) << file.status();
    gguf::GgufWriter w((*file)->alignment());
    for (const auto& [key, value] : (*file)->metadata().entries()) {
      if (key == "general.alignment") continue;
      w.Set(key, key == "qwen3moe.block_count" ? gguf::Value::Uint32(block_count) : value);
    }
    w.Set("qwen3moe.nextn_predict_layers", gguf::Value::Uint32(1));
    for (const gguf::TensorInfo& t : (*file)->tensors()) {
      ASSERT_TRUE(w.AddTensorData(t.name, t.type, t.ne, {t.data, t.bytes}).ok()) << t.name;
    }
    ASSERT_THAT(w.WriteFile(p + "/dense.gguf"), IsOk());
    pack::v1::Manifest m = *manifest_;  // of the new file's size
    m.set_dense_bytes(fs::file_size(p + "/dense.gguf"));
    ASSERT_THAT(pack::WriteManifest(m, p), IsOk());
  };
  ASSERT_EQ(manifest_->geometry().n_layer(), 2u);
  with_mtp(3);
  EXPECT_THAT(Validate(p, /*quick=*/true).problems, SizeIs(0));
  with_mtp(2);
  EXPECT_THAT(Validate(p, /*quick=*/true).problems,
              ::testing::Contains(ProblemIn("dense.gguf", "qwen3moe.block_count is 2 less 1 multi-token-prediction, "
                                                          "manifest geometry says 2")));
}

// A pack of an architecture the engine cannot run (converted by an older packtool) does not validate.
TEST_F(ValidateTest, APackOfAnArchitectureTheEngineCannotRunIsAProblem) {
  const std::string p = CopyPack();
  testing::RewriteArchitecture(dir_->Join("pack/dense.gguf"), p + "/dense.gguf", "qwen3next");
  pack::v1::Manifest m = *manifest_;
  m.set_architecture("qwen3next");
  ASSERT_THAT(pack::WriteManifest(m, p), IsOk());
  const ValidationReport r = Validate(p, /*quick=*/true);
  EXPECT_THAT(r.problems,
              ::testing::Contains(ProblemIn("dense.gguf", "general.architecture 'qwen3next' is not supported")));
  EXPECT_THAT(r.problems, ::testing::Not(::testing::Contains(ProblemIn("dense.gguf", "manifest says"))));
}

// A consistent profile of the tiny pack (2 MoE layers x 8 experts, top-2): 3 tokens.
pack::RoutingProfile TinyProfile(const pack::v1::Manifest& m) {
  pack::RoutingProfile p = pack::EmptyRoutingProfile(m);
  p.tokens = 3;
  p.prompts = 1;
  p.counts[0] = p.counts[1] = 3;
  p.counts[8 + 6] = 2;
  p.counts[8 + 7] = 4;
  return p;
}

TEST_F(ValidateTest, AProfiledPackIsValid) {
  const std::string p = CopyPack();
  ASSERT_THAT(pack::WriteRoutingProfile(TinyProfile(*manifest_), *manifest_, p), IsOk());
  EXPECT_THAT(Validate(p).problems, SizeIs(0));
  EXPECT_THAT(Validate(p, /*quick=*/true).problems, SizeIs(0));
}

TEST_F(ValidateTest, CorruptionOfTheRoutingProfileIsNamedInQuickModeToo) {
  const std::string p = CopyPack();
  std::string bytes = pack::SerializeRoutingProfile(TinyProfile(*manifest_));
  bytes[40 + 3 * 8] ^= 0x04;  // a count
  WriteFileBytes(p + "/routing_profile.bin", std::vector<uint8_t>(bytes.begin(), bytes.end()));
  for (const bool quick : {false, true}) {
    const ValidationReport r = Validate(p, quick);
    ASSERT_THAT(r.problems, SizeIs(1));
    EXPECT_THAT(r.problems[0], ProblemIn("routing_profile.bin", "field 'xxh3'"));
  }
  bytes.resize(30);
  WriteFileBytes(p + "/routing_profile.bin", std::vector<uint8_t>(bytes.begin(), bytes.end()));
  EXPECT_THAT(Validate(p).problems, ::testing::Contains(ProblemIn("routing_profile.bin", "truncated: 30 bytes")));

  // A profile of another geometry, well formed.
  pack::v1::Manifest other = *manifest_;
  other.mutable_geometry()->set_n_expert_used(1);
  pack::RoutingProfile p1 = pack::EmptyRoutingProfile(other);
  p1.tokens = 2;
  p1.counts[0] = p1.counts[9] = 2;
  ASSERT_THAT(pack::WriteRoutingProfile(p1, other, p), IsOk());
  EXPECT_THAT(Validate(p).problems,
              ::testing::Contains(ProblemIn("routing_profile.bin", "field 'n_expert_used': 1, the pack's manifest says 2")));
}

TEST_F(ValidateTest, CorruptionEachMissingFileIsNamed) {
  for (const char* file : {"manifest.json", "experts.bin", "dense.gguf"}) {
    ScratchDir scratch;
    const std::string p = scratch.Join("pack");
    fs::copy(dir_->Join("pack"), p, fs::copy_options::recursive);
    fs::remove(p + "/" + file);
    const ValidationReport r = Validate(p);
    EXPECT_THAT(r.problems, ::testing::Contains(ProblemIn(file, "missing"))) << file;
  }
}

TEST_F(ValidateTest, CorruptionDenseHeaderAndDataAreCaught) {
  std::string p = CopyPack();
  std::vector<uint8_t> dense = ReadFileBytes(p + "/dense.gguf");
  std::vector<uint8_t> header = dense;
  header[0] = 'X';  // bad magic
  WriteFileBytes(p + "/dense.gguf", header);
  ValidationReport r = Validate(p, /*quick=*/true);
  EXPECT_THAT(r.problems, ::testing::Contains(Field(&ValidationProblem::file, "dense.gguf")));
  std::vector<uint8_t> data = dense;
  data[data.size() - 10] ^= 0x40;  // inside the last tensor
  WriteFileBytes(p + "/dense.gguf", data);
  r = Validate(p);
  EXPECT_THAT(r.problems, ::testing::Contains(ProblemIn("dense.gguf", "checksum")));
}

// The engine refuses a dense.gguf of another size, so even a quick validation must report it.
TEST_F(ValidateTest, CorruptionDenseOfAnotherSizeIsCaughtByAQuickValidation) {
  std::string p = CopyPack();
  std::vector<uint8_t> dense = ReadFileBytes(p + "/dense.gguf");
  dense.resize(dense.size() + 32, 0);  // still parses: padding after the data section
  WriteFileBytes(p + "/dense.gguf", dense);
  for (bool quick : {true, false}) {
    const ValidationReport r = Validate(p, quick);
    EXPECT_THAT(r.problems, ::testing::Contains(ProblemIn("dense.gguf", "(dense_bytes)"))) << "quick " << quick;
  }
}

TEST_F(ValidateTest, CorruptionGarbageManifestAndUnknownVersion) {
  std::string p = CopyPack();
  WriteFileBytes(p + "/manifest.json", {'n', 'o', 't', ' ', 'j', 's', 'o', 'n'});
  ValidationReport r = Validate(p);
  EXPECT_THAT(r.problems, ::testing::Contains(Field(&ValidationProblem::file, "manifest.json")));
  pack::v1::Manifest m = *manifest_;
  m.set_format_version(7);
  ASSERT_THAT(pack::WriteManifest(m, p), IsOk());
  r = Validate(p);
  EXPECT_THAT(r.problems, ::testing::Contains(ProblemIn("manifest.json", "format_version")));
}

// The report lists the first 20 bad blobs (in blob order) and sums up the rest in one line. A pack of
// 2 MoE layers x 16 experts has enough blobs to go past that limit.
TEST_F(ValidateTest, ManyBadBlobsAreSummarised) {
  SynthOptions o = testing::TinyOptions(scratch_.Join("unused.gguf"));
  o.geometry.n_expert = 16;
  o.output = scratch_.Join("wide");
  o.pack_scheme = kernels::Scheme::kS8;
  o.exact_quantize = false;  // random codes: the checksums are all this test needs
  const absl::StatusOr<pack::v1::Manifest> wide = SynthesizePack(o, nullptr, nullptr);
  ASSERT_TRUE(wide.ok()) << wide.status();
  const uint64_t n_blobs = uint64_t{wide->geometry().n_moe_layers()} * wide->geometry().n_expert();
  ASSERT_EQ(n_blobs, 32u);
  const std::vector<uint8_t> good = ReadFileBytes(o.output + "/experts.bin");
  ASSERT_EQ(good.size(), n_blobs * wide->blob_bytes());
  ASSERT_TRUE(Validate(o.output).ok());

  // Corrupts blobs [0, n_bad) and validates.
  auto validate_with_bad = [&](uint64_t n_bad) {
    std::vector<uint8_t> bytes = good;
    for (uint64_t b = 0; b < n_bad; ++b) bytes[b * wide->blob_bytes() + 17] ^= 0xFF;
    WriteFileBytes(o.output + "/experts.bin", bytes);
    return Validate(o.output);
  };
  auto listed = [&](uint64_t blob) {
    return ProblemIn("experts.bin", absl::StrCat("blob ", blob, " (moe layer ", blob / 16, ", expert ", blob % 16,
                                                 ") at offset ", blob * wide->blob_bytes(), ": checksum"));
  };

  // Exactly at the limit: every bad blob listed, no summary line.
  ValidationReport r = validate_with_bad(20);
  ASSERT_THAT(r.problems, SizeIs(20));
  for (uint64_t b = 0; b < 20; ++b) EXPECT_THAT(r.problems[b], listed(b)) << "problem " << b;

  // One past the limit: 20 listed, then the one left over summed up.
  r = validate_with_bad(21);
  ASSERT_THAT(r.problems, SizeIs(21));
  for (uint64_t b = 0; b < 20; ++b) EXPECT_THAT(r.problems[b], listed(b)) << "problem " << b;
  EXPECT_EQ(r.problems[20].file, "experts.bin");
  EXPECT_EQ(r.problems[20].message, "and 1 more bad blobs");

  // Every blob bad.
  r = validate_with_bad(n_blobs);
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.blobs_checked, n_blobs);
  ASSERT_THAT(r.problems, SizeIs(21));
  for (uint64_t b = 0; b < 20; ++b) EXPECT_THAT(r.problems[b], listed(b)) << "problem " << b;
  EXPECT_EQ(r.problems[20].file, "experts.bin");
  EXPECT_EQ(r.problems[20].message, "and 12 more bad blobs");
}

}  // namespace
}  // namespace strata::packtool
