#include "kernels/cuda/device_info.h"

#include "gtest/gtest.h"

namespace strata::kernels::cuda {
namespace {

TEST(CudaDeviceTest, FindsAHopperOrNewerDevice) {
  auto info = QueryDevices();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_GE(info->device_count, 1);
  EXPECT_GE(info->sm_major, 9) << info->name;
  EXPECT_GT(info->total_memory, size_t{1} << 30);
}

TEST(CudaDeviceTest, SmokeKernelComputesTheRightSums) {
  const absl::Status s = SmokeTest();
  EXPECT_TRUE(s.ok()) << s;
}

}  // namespace
}  // namespace strata::kernels::cuda
