#include "kernels/format/expert_layout.h"

#include "gtest/gtest.h"
#include "tests/testing/test_util.h"

namespace strata::kernels {
namespace {

TEST(ExpertLayoutTest, SeedGeometryInS2) {
  const absl::StatusOr<ExpertLayout> l = ComputeExpertLayout(Scheme::kS2, 2560, 640);
  ASSERT_THAT(l.status(), IsOk());
  EXPECT_EQ(l->role_offset[kGate], 0u);
  EXPECT_EQ(l->role_offset[kUp], 460800u);
  EXPECT_EQ(l->role_offset[kDown], 921600u);
  EXPECT_EQ(l->role_bytes[kDown], 460800u);
  EXPECT_EQ(l->weight_bytes(), 1382400u);
  EXPECT_EQ(l->blob_bytes, 1384448u);  // 1382400 rounded up to 4096
  EXPECT_EQ(l->rows(kGate), 640);
  EXPECT_EQ(l->cols(kGate), 2560);
  EXPECT_EQ(l->rows(kDown), 2560);
  EXPECT_EQ(l->cols(kDown), 640);
}

TEST(ExpertLayoutTest, RolesAreAlignedWhenTheirSizesAreNot) {
  const absl::StatusOr<ExpertLayout> l = ComputeExpertLayout(Scheme::kS4, 96, 32);
  ASSERT_THAT(l.status(), IsOk());
  EXPECT_EQ(l->role_offset[kUp] % kRoleAlignment, 0u);
  EXPECT_GE(l->role_offset[kUp], RoleBytes(Scheme::kS4, 32, 96));
  EXPECT_EQ(l->role_offset[kDown] % kRoleAlignment, 0u);
  EXPECT_LE(l->role_offset[kDown] + l->role_bytes[kDown], l->blob_bytes);
  EXPECT_EQ(l->blob_bytes % kBlobAlignment, 0u);
}

TEST(ExpertLayoutTest, RefusesShapesTheSchemeCannotHold) {
  EXPECT_THAT(ComputeExpertLayout(Scheme::kS2, 2560, 600).status(),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "expert_ff 600"));
  EXPECT_THAT(ComputeExpertLayout(Scheme::kS8, 2500, 640).status(),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "n_embd 2500"));
  EXPECT_THAT(ComputeExpertLayout(Scheme::kF16, 0, 640).status(),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "must be positive"));
  // f16 has no groups, but roles still need rows in tiles of 16 and cols in multiples of 32.
  EXPECT_THAT(ComputeExpertLayout(Scheme::kF16, 2560, 40).status(),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "role"));
}

}  // namespace
}  // namespace strata::kernels
