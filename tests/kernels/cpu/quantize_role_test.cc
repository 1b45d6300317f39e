#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/quantize.h"
#include "kernels/cpu/role_gemv.h"
#include "kernels/format/scheme.h"

namespace strata::kernels {
namespace {

constexpr Scheme kIntegerSchemes[] = {Scheme::kS8, Scheme::kS4, Scheme::kS2};
constexpr CpuPath kSimdPaths[] = {CpuPath::kAvx2, CpuPath::kAvx512};

// Weights of several kinds, each group drawn from one: gaussian, heavy-tailed, constant (every code equal),
// all zero, tiny (near half's subnormals), large, and groups with one outlier.
std::vector<float> MixedWeights(int64_t n, int64_t group, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> uniform(0.05f, 1.0f);
  std::vector<float> w(n);
  for (int64_t g = 0; g < n / group; ++g) {
    const int kind = static_cast<int>(rng() % 7);
    const float c = normal(rng);
    for (int64_t i = 0; i < group; ++i) {
      float v = normal(rng);
      switch (kind) {
        case 1: v = v / uniform(rng); break;
        case 2: v = c; break;
        case 3: v = 0.0f; break;
        case 4: v *= 1e-6f; break;
        case 5: v *= 300.0f; break;
        case 6: v = i == 3 ? 40.0f * c : 0.02f * v; break;
        default: v *= 0.02f; break;
      }
      w[g * group + i] = v;
    }
  }
  return w;
}

// Every SIMD path this CPU has writes the scalar path's bytes and reports the same error. The shapes give
// group counts that fill some batches exactly and leave a tail for the scalar fit in others.
TEST(QuantizeRoleTest, EverySimdPathWritesTheScalarReferenceBytes) {
  const std::pair<int64_t, int64_t> shapes[] = {{16, 64}, {48, 320}, {16, 192}, {128, 512}};
  std::string ran = "scalar";
  for (CpuPath path : kSimdPaths) {
    if (!CpuPathAvailable(path)) continue;
    ran += std::string(",") + std::string(CpuPathName(path));
    for (Scheme s : kIntegerSchemes) {
      uint32_t seed = 1;
      for (const auto& [rows, cols] : shapes) {
        const std::vector<float> w = MixedWeights(rows * cols, s == Scheme::kS2 ? 64 : 32, seed++);
        std::vector<uint8_t> expected(RoleBytes(s, rows, cols)), got(expected.size(), 0xAB);
        QuantizeError expected_error, got_error;
        QuantizeRoleOnPath(CpuPath::kScalar, s, w.data(), rows, cols, expected.data(), &expected_error);
        QuantizeRoleOnPath(path, s, w.data(), rows, cols, got.data(), &got_error);
        const std::string where = std::string(CpuPathName(path)) + " " + std::string(SchemeName(s)) + " " +
                                  std::to_string(rows) + "x" + std::to_string(cols);
        ASSERT_EQ(expected.size(), got.size());
        EXPECT_EQ(0, std::memcmp(expected.data(), got.data(), got.size())) << where;
        EXPECT_NEAR(got_error.err2, expected_error.err2, 1e-12 * expected_error.err2) << where;
        EXPECT_NEAR(got_error.ref2, expected_error.ref2, 1e-12 * expected_error.ref2) << where;
        EXPECT_EQ(got_error.max_abs, expected_error.max_abs) << where;
        EXPECT_GT(expected_error.err2, 0.0) << where;
      }
    }
  }
  std::printf("quantize paths compared with the scalar reference: %s\n", ran.c_str());
}

// The error QuantizeRole reports is the error of the role as DequantizeRole decodes it.
TEST(QuantizeRoleTest, ReportedErrorIsThatOfTheDecodedRole) {
  const int64_t rows = 64, cols = 256;
  for (Scheme s : {Scheme::kF16, Scheme::kS8, Scheme::kS4, Scheme::kS2}) {
    const std::vector<float> w = MixedWeights(rows * cols, 64, 77);
    std::vector<uint8_t> role(RoleBytes(s, rows, cols));
    QuantizeError reported;
    reported.err2 = 1.0;  // added to, not overwritten
    QuantizeRole(s, w.data(), rows, cols, role.data(), &reported);
    std::vector<float> back(rows * cols);
    DequantizeRole(s, role.data(), rows, cols, back.data());
    double err2 = 1.0, ref2 = 0, max_abs = 0;
    for (int64_t i = 0; i < rows * cols; ++i) {
      const double e = static_cast<double>(w[i]) - back[i];
      err2 += e * e;
      ref2 += static_cast<double>(w[i]) * w[i];
      max_abs = std::max(max_abs, std::fabs(e));
    }
    EXPECT_NEAR(reported.err2, err2, 1e-9 * err2) << SchemeName(s);
    EXPECT_NEAR(reported.ref2, ref2, 1e-9 * ref2) << SchemeName(s);
    EXPECT_EQ(reported.max_abs, max_abs) << SchemeName(s);
    EXPECT_GT(err2, 1.0) << SchemeName(s);
  }
}

}  // namespace
}  // namespace strata::kernels
