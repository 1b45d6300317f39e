#include "engine/pack/routing_profile.h"

#include <cstring>
#include <filesystem>
#include <string>

#include "engine/pack/pack.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "packtool/synth.h"
#include "tests/testing/test_util.h"
#include "xxhash.h"

namespace strata::pack {
namespace {

namespace fs = std::filesystem;
using ::strata::testing::ScratchDir;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

// Only the geometry matters to a profile.
v1::Manifest Manifest(uint32_t layers, uint32_t experts, uint32_t used) {
  v1::Manifest m;
  v1::Geometry* g = m.mutable_geometry();
  g->set_n_layer(layers);
  g->set_n_moe_layers(layers);
  g->set_n_expert(experts);
  g->set_n_expert_used(used);
  return m;
}

// 2 layers x 4 experts, top-2, 5 tokens: each layer's counts sum to 10.
const v1::Manifest& TwoByFour() {
  static const v1::Manifest* m = new v1::Manifest(Manifest(2, 4, 2));
  return *m;
}

RoutingProfile Profile() {
  RoutingProfile p = EmptyRoutingProfile(TwoByFour());
  p.tokens = 5;
  p.prompts = 2;
  p.counts = {4, 3, 2, 1, 0, 0, 7, 3};
  return p;
}

template <typename T>
void Poke(std::string* bytes, size_t offset, T value) {
  std::memcpy(bytes->data() + offset, &value, sizeof(value));
}

// `bytes` with its checksum made right again, so that a later check is the one that refuses them.
std::string Resealed(std::string bytes) {
  bytes.resize(bytes.size() - sizeof(uint64_t));
  const uint64_t hash = XXH3_64bits(bytes.data(), bytes.size());
  bytes.append(reinterpret_cast<const char*>(&hash), sizeof(hash));
  return bytes;
}

absl::Status ParseError(const std::string& bytes) { return ParseRoutingProfile(bytes, TwoByFour()).status(); }

TEST(RoutingProfileTest, SerializeParseRoundTripAndTheLayoutIsAsDocumented) {
  const RoutingProfile p = Profile();
  ASSERT_THAT(CheckRoutingProfile(p, TwoByFour()), IsOk());
  const std::string bytes = SerializeRoutingProfile(p);
  EXPECT_EQ(bytes.size(), kRoutingProfileOverhead + 8 * 8);
  EXPECT_EQ(bytes.substr(0, 8), "STRATAPF");
  uint64_t third_count = 0;
  std::memcpy(&third_count, bytes.data() + 40 + 2 * 8, 8);
  EXPECT_EQ(third_count, 2u);
  absl::StatusOr<RoutingProfile> back = ParseRoutingProfile(bytes, TwoByFour());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, p);
}

TEST(RoutingProfileTest, WriteThenReadGivesTheSameProfileAndLeavesNoPartialFile) {
  ScratchDir dir;
  absl::StatusOr<std::optional<RoutingProfile>> none = ReadRoutingProfile(dir.path(), TwoByFour());
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_FALSE(none->has_value());

  ASSERT_THAT(WriteRoutingProfile(Profile(), TwoByFour(), dir.path()), IsOk());
  absl::StatusOr<std::optional<RoutingProfile>> read = ReadRoutingProfile(dir.path(), TwoByFour());
  ASSERT_TRUE(read.ok()) << read.status();
  ASSERT_TRUE(read->has_value());
  EXPECT_EQ(**read, Profile());
  EXPECT_FALSE(fs::exists(dir.Join("routing_profile.bin.partial")));

  // A second write replaces the first.
  RoutingProfile twice = Profile();
  twice.tokens *= 2;
  for (uint64_t& c : twice.counts) c *= 2;
  ASSERT_THAT(WriteRoutingProfile(twice, TwoByFour(), dir.path()), IsOk());
  read = ReadRoutingProfile(dir.path(), TwoByFour());
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(**read, twice);
}

TEST(RoutingProfileTest, AnInconsistentProfileIsNotWrittenAndTheOldOneStays) {
  ScratchDir dir;
  ASSERT_THAT(WriteRoutingProfile(Profile(), TwoByFour(), dir.path()), IsOk());
  RoutingProfile bad = Profile();
  bad.counts[0] += 1;
  EXPECT_THAT(WriteRoutingProfile(bad, TwoByFour(), dir.path()),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "routing_profile.bin: not written: field 'counts'"));
  absl::StatusOr<std::optional<RoutingProfile>> read = ReadRoutingProfile(dir.path(), TwoByFour());
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(**read, Profile());
  EXPECT_FALSE(fs::exists(dir.Join("routing_profile.bin.partial")));
}

TEST(RoutingProfileTest, AnUnwritableDirectoryIsAnErrorNamingThePartialFile) {
  ScratchDir dir;
  EXPECT_THAT(WriteRoutingProfile(Profile(), TwoByFour(), dir.Join("missing")),
              StatusIsWith(absl::StatusCode::kUnavailable, "routing_profile.bin.partial: cannot create"));
}

TEST(RoutingProfileTest, ATruncatedFileIsDataLossWithBothSizes) {
  const std::string bytes = SerializeRoutingProfile(Profile());
  EXPECT_THAT(ParseError(bytes.substr(0, 20)), StatusIsWith(absl::StatusCode::kDataLoss, "truncated: 20 bytes"));
  EXPECT_THAT(ParseError(bytes.substr(0, bytes.size() - 9)),
              StatusIsWith(absl::StatusCode::kDataLoss, "truncated: 103 bytes, expected 48 + 8 x n_moe_layers x "
                                                        "n_expert = 48 + 8 x 2 x 4 = 112"));
  EXPECT_THAT(ParseError(bytes + "x"), StatusIsWith(absl::StatusCode::kDataLoss, "size: 113 bytes"));
}

TEST(RoutingProfileTest, AFlippedByteFailsTheChecksum) {
  std::string bytes = SerializeRoutingProfile(Profile());
  bytes[40 + 8 * 3] ^= 0x01;  // a count
  EXPECT_THAT(ParseError(bytes), StatusIsWith(absl::StatusCode::kDataLoss, "field 'xxh3': the contents hash to"));
  bytes = SerializeRoutingProfile(Profile());
  bytes[bytes.size() - 1] ^= 0x80;  // the checksum itself
  EXPECT_THAT(ParseError(bytes), StatusIsWith(absl::StatusCode::kDataLoss, "field 'xxh3'"));
}

TEST(RoutingProfileTest, EachBadHeaderFieldIsNamed) {
  const std::string good = SerializeRoutingProfile(Profile());
  std::string bytes = good;
  bytes[0] = 'X';
  EXPECT_THAT(ParseError(bytes), StatusIsWith(absl::StatusCode::kInvalidArgument, "field 'magic'"));
  bytes = good;
  Poke<uint32_t>(&bytes, 8, 2);
  EXPECT_THAT(ParseError(Resealed(bytes)),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "field 'version': 2, this build reads version 1"));
  bytes = good;
  Poke<uint32_t>(&bytes, 20, 3);  // n_expert_used
  EXPECT_THAT(ParseError(Resealed(bytes)),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "field 'n_expert_used': 3, the pack's manifest says 2"));
  bytes = good;
  Poke<uint64_t>(&bytes, 24, 0);  // tokens
  EXPECT_THAT(ParseError(Resealed(bytes)), StatusIsWith(absl::StatusCode::kInvalidArgument, "field 'tokens' is 0"));
  bytes = good;
  Poke<uint64_t>(&bytes, 24, 6);  // tokens, no longer what the counts add up to
  EXPECT_THAT(ParseError(Resealed(bytes)),
              StatusIsWith(absl::StatusCode::kInvalidArgument,
                           "field 'counts' of moe layer 0: they sum to 10, expected tokens x n_expert_used = 6 x 2"));
  bytes = good;
  Poke<uint64_t>(&bytes, 40 + 8 * 7, 4);  // layer 1's last count
  EXPECT_THAT(ParseError(Resealed(bytes)),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "field 'counts' of moe layer 1: they sum to 11"));
}

TEST(RoutingProfileTest, AProfileOfAnotherGeometryIsRefusedNamingTheField) {
  const std::string bytes = SerializeRoutingProfile(Profile());
  EXPECT_THAT(ParseRoutingProfile(bytes, Manifest(3, 4, 2)).status(),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "field 'n_moe_layers': 2, the pack's manifest says 3"));
  EXPECT_THAT(ParseRoutingProfile(bytes, Manifest(2, 8, 2)).status(),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "field 'n_expert': 4, the pack's manifest says 8"));
  // Same number of counts, other shape: the header is checked, not just the size.
  EXPECT_THAT(ParseRoutingProfile(bytes, Manifest(4, 2, 2)).status(),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "field 'n_moe_layers'"));
}

TEST(RoutingProfileTest, ReadNamesTheFile) {
  ScratchDir dir;
  std::string bytes = SerializeRoutingProfile(Profile());
  bytes[45] ^= 1;
  strata::testing::WriteFileBytes(dir.Join(kRoutingProfileFile), std::vector<uint8_t>(bytes.begin(), bytes.end()));
  EXPECT_THAT(ReadRoutingProfile(dir.path(), TwoByFour()).status(),
              StatusIsWith(absl::StatusCode::kDataLoss, dir.Join("routing_profile.bin: field 'xxh3'")));
}

// Pack::Open reads the profile of a real pack.
class PackRoutingProfileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    packtool::SynthOptions o;
    o.geometry = *packtool::PresetGeometry("qwen3moe", "tiny");
    o.pack_scheme = kernels::Scheme::kS4;
    o.output = dir_.Join("pack");
    o.threads = 1;
    ASSERT_TRUE(packtool::SynthesizePack(o, nullptr, nullptr).ok());
    pack_ = o.output;
    absl::StatusOr<v1::Manifest> m = ReadManifest(pack_);
    ASSERT_TRUE(m.ok()) << m.status();
    manifest_ = *m;
  }

  // A consistent profile of the tiny pack: every token picks experts 0 and 1 of each layer but the last,
  // which picks its last two.
  RoutingProfile TinyProfile() const {
    RoutingProfile p = EmptyRoutingProfile(manifest_);
    p.tokens = 7;
    p.prompts = 1;
    for (uint32_t l = 0; l < p.n_moe_layers; ++l) {
      const uint32_t first = l + 1 < p.n_moe_layers ? 0 : p.n_expert - 2;
      p.counts[l * p.n_expert + first] = p.counts[l * p.n_expert + first + 1] = 7;
    }
    return p;
  }

  ScratchDir dir_;
  std::string pack_;
  v1::Manifest manifest_;
};

TEST_F(PackRoutingProfileTest, APackWithoutAProfileHasNoCounts) {
  absl::StatusOr<std::unique_ptr<Pack>> pack = Pack::Open(pack_);
  ASSERT_TRUE(pack.ok()) << pack.status();
  EXPECT_EQ((*pack)->routing_profile(), nullptr);
  EXPECT_TRUE((*pack)->routing_counts().empty());
}

TEST_F(PackRoutingProfileTest, OpenReadsTheProfile) {
  ASSERT_THAT(WriteRoutingProfile(TinyProfile(), manifest_, pack_), IsOk());
  absl::StatusOr<std::unique_ptr<Pack>> pack = Pack::Open(pack_);
  ASSERT_TRUE(pack.ok()) << pack.status();
  ASSERT_NE((*pack)->routing_profile(), nullptr);
  EXPECT_EQ(*(*pack)->routing_profile(), TinyProfile());
  EXPECT_THAT((*pack)->routing_counts(), ElementsAreArray(TinyProfile().counts));
  EXPECT_EQ((*pack)->routing_counts().size(), (*pack)->n_blobs());
}

TEST_F(PackRoutingProfileTest, OpenRefusesAMalformedProfileUnlessToldToIgnoreIt) {
  std::string bytes = SerializeRoutingProfile(TinyProfile());
  bytes.resize(bytes.size() - 16);
  strata::testing::WriteFileBytes(pack_ + "/" + kRoutingProfileFile, std::vector<uint8_t>(bytes.begin(), bytes.end()));
  absl::StatusOr<std::unique_ptr<Pack>> pack = Pack::Open(pack_);
  EXPECT_THAT(pack.status(), StatusIsWith(absl::StatusCode::kDataLoss, pack_ + "/routing_profile.bin: truncated"));
  EXPECT_THAT(std::string(pack.status().message()), HasSubstr("strata-pack profile writes a new one"));

  pack = Pack::Open(pack_, {.ignore_routing_profile = true});
  ASSERT_TRUE(pack.ok()) << pack.status();
  EXPECT_TRUE((*pack)->routing_counts().empty());
}

TEST_F(PackRoutingProfileTest, OpenRefusesAProfileOfAnotherModel) {
  v1::Manifest other = manifest_;
  other.mutable_geometry()->set_n_expert(manifest_.geometry().n_expert() * 2);
  RoutingProfile p = EmptyRoutingProfile(other);
  p.tokens = 1;
  p.counts[0] = p.counts[1] = p.counts[p.n_expert] = p.counts[p.n_expert + 1] = 1;
  ASSERT_THAT(WriteRoutingProfile(p, other, pack_), IsOk());
  EXPECT_THAT(Pack::Open(pack_).status(),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "routing_profile.bin: field 'n_expert': 16"));
}

}  // namespace
}  // namespace strata::pack
