#include "engine/pack/pack_format.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/test_util.h"

namespace strata::pack {
namespace {

using kernels::Scheme;
using ::testing::HasSubstr;

v1::Manifest ValidManifest(Scheme scheme, uint32_t layers, uint32_t experts, uint32_t embd, uint32_t ff) {
  v1::Manifest m;
  m.set_format_version(kFormatVersion);
  m.set_architecture("qwen3moe");
  v1::Geometry* g = m.mutable_geometry();
  g->set_n_layer(layers);
  g->set_n_moe_layers(layers);
  for (uint32_t l = 0; l < layers; ++l) g->add_moe_layers(l);
  g->set_n_expert(experts);
  g->set_n_expert_used(2);
  g->set_n_embd(embd);
  g->set_expert_ff(ff);
  auto layout = ComputeBlobLayout(scheme, embd, ff);
  EXPECT_TRUE(layout.ok()) << layout.status();
  SetManifestLayout(*layout, &m);
  m.set_experts_bytes(uint64_t{layers} * experts * layout->blob_bytes);
  for (uint32_t i = 0; i < layers * experts; ++i) m.add_blob_xxh3(HashHex(0x0123456789abcdefull + i));
  m.set_dense_file(std::string(kDenseFile));
  return m;
}

TEST(PackFormatTest, SeedGeometryS2BlobMatchesTheSeedEngine) {
  auto layout = ComputeBlobLayout(Scheme::kS2, 2560, 640);
  ASSERT_TRUE(layout.ok()) << layout.status();
  // 3 roles x 1,638,400 weights at 2 bits plus one fp16 scale per 64: 460,800 B each.
  EXPECT_EQ(layout->role_bytes[0], 460800u);
  EXPECT_EQ(layout->role_bytes[2], 460800u);
  EXPECT_EQ(layout->role_offset[1], 460800u);
  EXPECT_EQ(layout->role_offset[2], 921600u);
  // 1,382,400 bytes of roles, padded to the next multiple of 4096.
  EXPECT_EQ(layout->blob_bytes, 1384448u);
  EXPECT_EQ(layout->blob_bytes % kBlobAlignment, 0u);
}

TEST(PackFormatTest, RolesAreAlignedAndDoNotOverlap) {
  for (Scheme s : {Scheme::kF16, Scheme::kS8, Scheme::kS4, Scheme::kS2, Scheme::kMxfp4}) {
    auto layout = ComputeBlobLayout(s, 192, 320);
    ASSERT_TRUE(layout.ok()) << layout.status();
    for (int r = 0; r < 3; ++r) {
      EXPECT_EQ(layout->role_offset[r] % kRoleAlignment, 0u);
      if (r > 0) {
        EXPECT_GE(layout->role_offset[r], layout->role_offset[r - 1] + layout->role_bytes[r - 1]);
      }
    }
    EXPECT_LE(layout->role_offset[2] + layout->role_bytes[2], layout->blob_bytes);
    EXPECT_EQ(layout->blob_bytes % kBlobAlignment, 0u);
  }
}

TEST(PackFormatTest, RefusesGeometryTheSchemeCannotGroup) {
  auto layout = ComputeBlobLayout(Scheme::kS2, 96, 640);
  EXPECT_THAT(layout.status(), StatusIsWith(absl::StatusCode::kInvalidArgument, "n_embd 96"));
  layout = ComputeBlobLayout(Scheme::kS8, 64, 48);
  EXPECT_THAT(layout.status(), StatusIsWith(absl::StatusCode::kInvalidArgument, "expert_ff 48"));
}

TEST(PackFormatTest, ValidManifestPassesAndSurvivesJson) {
  const v1::Manifest m = ValidManifest(Scheme::kS4, 2, 4, 128, 64);
  ASSERT_THAT(CheckManifest(m), IsOk());
  strata::testing::ScratchDir dir;
  ASSERT_THAT(WriteManifest(m, dir.path()), IsOk());
  auto back = ReadManifest(dir.path());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->SerializeAsString(), m.SerializeAsString());
  EXPECT_THAT(CheckManifest(*back), IsOk());
}

TEST(PackFormatTest, CheckManifestNamesTheBadField) {
  v1::Manifest m = ValidManifest(Scheme::kS8, 2, 4, 128, 64);
  v1::Manifest bad = m;
  bad.set_format_version(2);
  EXPECT_THAT(CheckManifest(bad), StatusIsWith(absl::StatusCode::kInvalidArgument, "format_version"));
  bad = m;
  bad.set_experts_bytes(m.experts_bytes() + 1);
  EXPECT_THAT(CheckManifest(bad), StatusIsWith(absl::StatusCode::kInvalidArgument, "experts_bytes"));
  bad = m;
  bad.mutable_geometry()->set_n_expert_used(9);
  EXPECT_THAT(CheckManifest(bad), StatusIsWith(absl::StatusCode::kInvalidArgument, "n_expert_used"));
  bad = m;
  bad.set_scheme("s3");
  EXPECT_THAT(CheckManifest(bad), StatusIsWith(absl::StatusCode::kInvalidArgument, "scheme"));
  bad = m;
  bad.mutable_roles(1)->set_offset(bad.roles(1).offset() + 256);
  EXPECT_THAT(CheckManifest(bad), StatusIsWith(absl::StatusCode::kInvalidArgument, "roles[1]"));
  bad = m;
  bad.set_blob_bytes(4096);
  EXPECT_THAT(CheckManifest(bad), StatusIsWith(absl::StatusCode::kInvalidArgument, "blob_bytes"));
  bad = m;
  bad.mutable_blob_xxh3()->RemoveLast();
  EXPECT_THAT(CheckManifest(bad), StatusIsWith(absl::StatusCode::kInvalidArgument, "blob_xxh3"));
  bad = m;
  bad.set_blob_xxh3(3, "xyz");
  EXPECT_THAT(CheckManifest(bad), StatusIsWith(absl::StatusCode::kInvalidArgument, "blob_xxh3[3]"));
  bad = m;
  bad.mutable_geometry()->set_moe_layers(1, 0);
  EXPECT_THAT(CheckManifest(bad), StatusIsWith(absl::StatusCode::kInvalidArgument, "moe_layers[1]"));
}

TEST(PackFormatCorruptionTest, ReadManifestRejectsGarbageNamingTheFile) {
  strata::testing::ScratchDir dir;
  EXPECT_THAT(ReadManifest(dir.path()).status(), StatusIsWith(absl::StatusCode::kNotFound, "manifest.json"));
  strata::testing::WriteFileBytes(dir.Join("manifest.json"), {'{', '"', 'x'});
  EXPECT_THAT(ReadManifest(dir.path()).status(), StatusIsWith(absl::StatusCode::kInvalidArgument, "manifest.json"));
  const std::string unknown = R"({"format_version": 1, "colour": "blue"})";
  strata::testing::WriteFileBytes(dir.Join("manifest.json"), std::vector<uint8_t>(unknown.begin(), unknown.end()));
  EXPECT_THAT(ReadManifest(dir.path()).status(), StatusIsWith(absl::StatusCode::kInvalidArgument, "colour"));
}

TEST(PackFormatTest, HashHexRoundTrips) {
  EXPECT_EQ(HashHex(0xabcull), "0000000000000abc");
  EXPECT_EQ(*ParseHashHex("ffffffffffffffff"), UINT64_MAX);
  EXPECT_EQ(*ParseHashHex(HashHex(0x1234567890abcdefull)), 0x1234567890abcdefull);
  EXPECT_FALSE(ParseHashHex("123").ok());
  EXPECT_FALSE(ParseHashHex("123456789012345g").ok());
}

}  // namespace
}  // namespace strata::pack
