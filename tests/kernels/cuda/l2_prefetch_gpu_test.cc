// PrefetchToL2: ranges of any size read without faults or changes, bad arguments refused, and the launch
// captured in a graph as one kernel.

#include "kernels/cuda/l2_prefetch.h"

#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <numeric>
#include <vector>

#include "gtest/gtest.h"
#include "tests/kernels/cuda/expert_test_support.h"
#include "tests/testing/test_util.h"

namespace strata::kernels::cuda {
namespace {

using expert_test::CudaOk;
using expert_test::Download;
using expert_test::Upload;

class PrefetchToL2GpuTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(CudaOk(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking))); }
  void TearDown() override {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  cudaStream_t stream_ = nullptr;
};

TEST_F(PrefetchToL2GpuTest, ReadsRangesOfAnySizeAndChangesNothing) {
  std::vector<uint32_t> words((size_t{24} << 20) / 4);
  std::iota(words.begin(), words.end(), 7u);
  DeviceBuffer buffer = Upload(words);
  const uint8_t* base = buffer.as<uint8_t>();
  // A piece and a bit, a whole buffer of many pieces, less than 16 bytes (nothing), 16 bytes, an empty and an
  // absent range, and two ranges over the same bytes.
  const ByteRange ranges[] = {{base, (64 << 10) + 48}, {base, words.size() * 4}, {base + 16, 15}, {base + 32, 16},
                              {base + 64, 0},          {nullptr, 4096},          {base + 4096, 1 << 20}, {base, 17}};
  ASSERT_TRUE(PrefetchToL2(ranges, stream_).ok());
  ASSERT_TRUE(CudaOk(cudaStreamSynchronize(stream_)));
  ASSERT_TRUE(CudaOk(cudaGetLastError()));
  const std::vector<uint32_t> after = Download<uint32_t>(buffer.as<uint32_t>(), words.size());
  EXPECT_EQ(std::memcmp(after.data(), words.data(), words.size() * 4), 0);
}

TEST_F(PrefetchToL2GpuTest, RefusesTooManyRangesAndMisalignedData) {
  DeviceBuffer buffer = Upload(std::vector<uint32_t>(1024, 1));
  const ByteRange nine[9] = {};
  EXPECT_THAT(PrefetchToL2(nine, stream_), StatusIsWith(absl::StatusCode::kInvalidArgument, "9 ranges, at most 8"));
  const ByteRange misaligned[] = {{buffer.as<uint8_t>() + 4, 256}};
  EXPECT_THAT(PrefetchToL2(misaligned, stream_), StatusIsWith(absl::StatusCode::kInvalidArgument, "16-byte aligned"));
  EXPECT_TRUE(PrefetchToL2({}, stream_).ok());  // nothing to read: nothing enqueued
}

TEST_F(PrefetchToL2GpuTest, IsOneKernelInACapturedGraph) {
  DeviceBuffer buffer = Upload(std::vector<uint32_t>(1 << 20, 3));
  const ByteRange ranges[] = {{buffer.data(), 4u << 20}};
  cudaGraph_t graph = nullptr;
  ASSERT_TRUE(CudaOk(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal)));
  const absl::Status captured = PrefetchToL2(ranges, stream_);
  ASSERT_TRUE(CudaOk(cudaStreamEndCapture(stream_, &graph)));
  ASSERT_TRUE(captured.ok()) << captured;
  size_t nodes = 0;
  EXPECT_TRUE(CudaOk(cudaGraphGetNodes(graph, nullptr, &nodes)));
  EXPECT_EQ(nodes, 1u);
  cudaGraphExec_t exec = nullptr;
  ASSERT_TRUE(CudaOk(cudaGraphInstantiate(&exec, graph, 0)));
  EXPECT_TRUE(CudaOk(cudaGraphLaunch(exec, stream_)));
  EXPECT_TRUE(CudaOk(cudaStreamSynchronize(stream_)));
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

}  // namespace
}  // namespace strata::kernels::cuda
