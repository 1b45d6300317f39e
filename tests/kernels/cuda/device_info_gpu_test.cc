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

// The chain probe the decode bench prints beside its results: a positive time a kernel, far below a
// millisecond, and a refusal of empty chains.
TEST(CudaDeviceTest, DependentKernelProbeMeasuresAKernelOfAChain) {
  const absl::StatusOr<double> micros = MeasureDependentKernelMicros(64, 8, 3);
  ASSERT_TRUE(micros.ok()) << micros.status();
  EXPECT_GT(*micros, 0.0);
  EXPECT_LT(*micros, 1000.0);
  EXPECT_EQ(MeasureDependentKernelMicros(0, 8, 3).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MeasureDependentKernelMicros(64, 0, 3).status().code(), absl::StatusCode::kInvalidArgument);
}

// The code-fetch probe: positive times for one kernel repeated and sixteen in turn, and refusals.
TEST(CudaDeviceTest, CodeFetchProbeMeasuresKernelsRepeatedAndInTurn) {
  for (int in_turn : {1, 16}) {
    const absl::StatusOr<double> micros = MeasureCodeFetchMicros(in_turn, 64, 8, 3);
    ASSERT_TRUE(micros.ok()) << micros.status();
    EXPECT_GT(*micros, 0.0);
    EXPECT_LT(*micros, 1000.0);
  }
  EXPECT_EQ(MeasureCodeFetchMicros(0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MeasureCodeFetchMicros(17).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MeasureCodeFetchMicros(4, 0).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace strata::kernels::cuda
