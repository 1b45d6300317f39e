#include "engine/model/miss_path.h"

#include "gtest/gtest.h"

namespace strata::model {
namespace {

TEST(MissPathTest, EveryNameParsesBackToItselfAndOthersAreRefusedNamingTheChoices) {
  for (MissPath path : {MissPath::kGpu, MissPath::kCpu, MissPath::kBoth}) {
    const absl::StatusOr<MissPath> parsed = ParseMissPath(MissPathName(path));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, path);
  }
  for (const char* bad : {"", "GPU", "host", "both "}) {
    const absl::StatusOr<MissPath> parsed = ParseMissPath(bad);
    ASSERT_FALSE(parsed.ok()) << bad;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(parsed.status().message().find("(gpu, cpu or both)"), std::string::npos) << parsed.status();
  }
}

}  // namespace
}  // namespace strata::model
