// QuantizeActivations against the CPU's QuantizeActivation (kernels/cpu/quantize.h): bit for bit, on the
// special values (zeros, NaN, infinities, subnormals, ties, huge and tiny blocks) and real MoE widths.

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/quantize.h"
#include "kernels/cuda/expert_kernels.h"
#include "tests/kernels/cuda/dense_test_support.h"
#include "tests/testing/test_util.h"

namespace strata::kernels::cuda {
namespace {

using dense_test::Check;
using dense_test::DeviceArray;

// Gaussian activations whose first blocks are of every kind the quantizer must get exactly right (as many as
// fit).
std::vector<float> SpecialActivations(int64_t n, int n_tokens, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n) * n_tokens);
  for (float& v : x) v = normal(rng);
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  const std::vector<std::function<void(float*)>> kinds = {
      [](float* b) { std::fill(b, b + 32, 0.0f); },
      [](float* b) { std::fill(b, b + 32, -0.0f); },
      [&](float* b) {  // huge, up to -FLT_MAX
        for (int i = 0; i < 32; ++i) b[i] = unit(rng) * 3.4e38f;
        b[5] = -3.4028235e38f;
      },
      [&](float* b) {  // NaN among normal values: amax skips it, its code is -127
        b[3] = nan;
        b[17] = -nan;
      },
      [&](float* b) { std::fill(b, b + 32, nan); },
      [&](float* b) { b[9] = inf; },  // scale inf: finite values give 0, inf / inf = NaN gives -127
      [&](float* b) { std::fill(b, b + 32, -inf); },
      [&](float* b) {  // subnormals
        for (int i = 0; i < 32; ++i) b[i] = unit(rng) * 1e-39f;
      },
      [&](float* b) {  // amax / 127 underflows to 0: every code 0
        for (int i = 0; i < 32; ++i) b[i] = (i % 2 ? 1.0f : -1.0f) * 1e-44f;
      },
      [&](float* b) {  // scale exactly 1: halves round to even
        for (int i = 0; i < 32; ++i) b[i] = static_cast<float>(i) - 15.5f;
        b[31] = 127.0f;
        b[30] = -126.5f;
      },
      [&](float* b) {  // one large value among tiny ones
        for (int i = 0; i < 32; ++i) b[i] = unit(rng) * 1e-30f;
        b[0] = 1e30f;
      },
      [&](float* b) {  // mixed magnitudes
        for (int i = 0; i < 32; ++i) b[i] = unit(rng) * std::pow(10.0f, static_cast<float>(i % 20 - 10));
      },
  };
  const size_t blocks = x.size() / 32;
  for (size_t i = 0; i < std::min(blocks, kinds.size()); ++i) kinds[i](x.data() + 32 * i);
  return x;
}

TEST(QuantizeActivationsGpuTest, BitIdenticalToTheCpu) {
  std::mt19937 rng(51);
  cudaStream_t stream = nullptr;
  Check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  for (const auto& [n, n_tokens] : {std::pair<int64_t, int>{32, 1}, {2560, 7}, {768, 13}, {4096, 3}}) {
    SCOPED_TRACE("n " + std::to_string(n) + " tokens " + std::to_string(n_tokens));
    const std::vector<float> x = SpecialActivations(n, n_tokens, rng);
    const size_t count = static_cast<size_t>(n) * n_tokens, blocks = count / 32;
    DeviceArray<float> d_x(count), scale(blocks);
    DeviceArray<int8_t> q(count);
    DeviceArray<int32_t> sum(blocks);
    d_x.Upload(x);
    ASSERT_THAT(QuantizeActivations(d_x.get(), n, n_tokens, q.get(), scale.get(), sum.get(), stream), IsOk());
    Check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    EXPECT_TRUE(q.GuardsIntact() && scale.GuardsIntact() && sum.GuardsIntact());
    const std::vector<int8_t> got_q = q.Download();
    const std::vector<float> got_scale = scale.Download();
    const std::vector<int32_t> got_sum = sum.Download();
    for (int t = 0; t < n_tokens; ++t) {
      QuantizedActivation want;
      QuantizeActivation(x.data() + t * n, n, &want);
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(got_q[t * n + i], want.q[i]) << "token " << t << " element " << i << " x " << x[t * n + i];
      }
      for (int64_t b = 0; b < n / 32; ++b) {
        ASSERT_EQ(std::bit_cast<uint32_t>(got_scale[t * (n / 32) + b]), std::bit_cast<uint32_t>(want.scale[b]))
            << "token " << t << " block " << b;
        ASSERT_EQ(got_sum[t * (n / 32) + b], want.sum[b]) << "token " << t << " block " << b;
      }
    }
  }
  cudaStreamDestroy(stream);
}

TEST(QuantizeActivationsGpuTest, RejectsBadArguments) {
  DeviceArray<float> buffer(64);
  float* x = buffer.get();
  auto* q = reinterpret_cast<int8_t*>(x);
  auto* sum = reinterpret_cast<int32_t*>(x);
  using absl::StatusCode;
  EXPECT_THAT(QuantizeActivations(x, 48, 1, q, x, sum, nullptr), StatusIsWith(StatusCode::kInvalidArgument, "n 48"));
  EXPECT_THAT(QuantizeActivations(x, 0, 1, q, x, sum, nullptr), StatusIsWith(StatusCode::kInvalidArgument, "n 0"));
  EXPECT_THAT(QuantizeActivations(x, 32, -2, q, x, sum, nullptr),
              StatusIsWith(StatusCode::kInvalidArgument, "n_tokens -2"));
  EXPECT_THAT(QuantizeActivations(nullptr, 32, 1, q, x, sum, nullptr), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(QuantizeActivations(x, 32, 0, nullptr, nullptr, nullptr, nullptr), IsOk());
}

}  // namespace
}  // namespace strata::kernels::cuda
