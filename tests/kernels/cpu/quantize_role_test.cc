#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/quantize.h"
#include "kernels/cpu/quantize_fit.h"
#include "kernels/cpu/role_gemv.h"
#include "kernels/format/fp16.h"
#include "kernels/format/scheme.h"

namespace strata::kernels {
namespace {

constexpr Scheme kSchemes[] = {Scheme::kS8, Scheme::kS4, Scheme::kS2, Scheme::kF16, Scheme::kMxfp4};
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
    for (Scheme s : kSchemes) {
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

// The f16 scheme's F16C rounding gives FloatToHalf's half for every kind of float: a sweep over the 2^32 bit
// patterns (every 4099th: an odd stride, so every low-bit pattern of the mantissa comes up) and the edges
// (the largest half, the floats around the first that rounds to infinity, infinities, NaNs with payloads,
// half's smallest subnormals and the ties between them, signed zeros).
TEST(QuantizeRoleTest, F16cRoundingIsFloatToHalfForEveryKindOfFloat) {
  if (!CpuPathAvailable(CpuPath::kAvx2)) {
    std::printf("no AVX2 (F16C) on this CPU: nothing to compare\n");
    return;
  }
  std::vector<float> w;
  for (uint64_t bits = 0; bits <= 0xFFFFFFFFu; bits += 4099) {
    w.push_back(std::bit_cast<float>(static_cast<uint32_t>(bits)));
  }
  const float kHalfMin = std::ldexp(1.0f, -24);  // half's smallest subnormal
  for (float edge : {65504.0f, 65519.99f, 65520.0f, 65520.01f, 1e9f, std::numeric_limits<float>::infinity(),
                     std::numeric_limits<float>::quiet_NaN(), std::bit_cast<float>(0x7F800001u),
                     std::bit_cast<float>(0x7FC12345u), std::bit_cast<float>(0xFFBFFFFFu), kHalfMin, 0.5f * kHalfMin,
                     1.5f * kHalfMin, 2.5f * kHalfMin, 0.49f * kHalfMin, 0.0f, std::ldexp(1.0f, -14),
                     std::ldexp(1.0f, -15) * 1.0009765625f, 1.0f + std::ldexp(1.0f, -11),
                     1.0f + 3.0f * std::ldexp(1.0f, -11)}) {
    w.push_back(edge);
    w.push_back(-edge);
  }
  while (w.size() % 8 != 0) w.push_back(0.0f);
  std::vector<uint8_t> halves(2 * w.size(), 0xAB);
  QuantizeError error;
  ASSERT_EQ(internal::RoundToHalfAvx2(w.data(), static_cast<int64_t>(w.size()), halves.data(), &error),
            static_cast<int64_t>(w.size()));
  int wrong = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    const uint16_t got = LoadHalf(halves.data() + 2 * i);
    const uint16_t expected = FloatToHalf(w[i]);
    if (got != expected && ++wrong <= 5) {
      ADD_FAILURE() << "float bits 0x" << std::hex << std::bit_cast<uint32_t>(w[i]) << ": F16C gives 0x" << got
                    << ", FloatToHalf 0x" << expected;
    }
  }
  EXPECT_EQ(wrong, 0) << "of " << w.size() << " floats";
}

// The error QuantizeRole reports is the error of the role as DequantizeRole decodes it.
TEST(QuantizeRoleTest, ReportedErrorIsThatOfTheDecodedRole) {
  const int64_t rows = 64, cols = 256;
  for (Scheme s : {Scheme::kF16, Scheme::kS8, Scheme::kS4, Scheme::kS2, Scheme::kMxfp4}) {
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

// The s4 search the fit replaced (12 shrunk ranges, without the two least-squares steps on the best): its
// squared error summed over `n_groups` groups of 32, in double.
double FormerS4SearchErr2(const float* w, int64_t n_groups) {
  using namespace internal;
  constexpr int n = 32;
  const auto inverse = [](float d) { return d == 0.0f ? 0.0f : 1.0f / d; };
  const auto code = [](float x, float inv, float m) { return CvttPs(MinPs(MaxPs((x - m) * inv, 0.0f), 15.0f) + 0.5f); };
  const auto sse_of = [&](const float* g, float d, float m) {
    const float inv = inverse(d);
    float sse = 0.0f;
    for (int i = 0; i < n; ++i) {
      const float e = d * static_cast<float>(code(g[i], inv, m)) + m - g[i];
      sse = sse + e * e;
    }
    return sse;
  };
  double err2 = 0;
  for (int64_t k = 0; k < n_groups; ++k) {
    const float* g = w + k * n;
    float lo = g[0], hi = g[0], sum_w = 0.0f;
    for (int i = 0; i < n; ++i) lo = MinPs(lo, g[i]), hi = MaxPs(hi, g[i]), sum_w = sum_w + g[i];
    float best_d = RoundHalf((hi - lo) / 15.0f), best_m = RoundHalf(lo);
    float best_sse = sse_of(g, best_d, best_m);
    for (int c = 0; c < 12; ++c) {
      const float cut = (hi - lo) * S4Shrink(c) * 0.5f, clo = lo + cut, chi = hi - cut;
      float d = RoundHalf((chi - clo) / 15.0f), m = RoundHalf(clo);
      const float inv = inverse(d);
      int32_t sum_q = 0, sum_qq = 0;
      float sum_qw = 0.0f;
      for (int i = 0; i < n; ++i) {
        const int32_t q = code(g[i], inv, m);
        sum_q += q, sum_qq += q * q, sum_qw = sum_qw + static_cast<float>(q) * g[i];
      }
      SolveAffine(n, sum_q, sum_qq, sum_w, sum_qw, &d, &m);
      d = RoundHalf(d), m = RoundHalf(m);
      if (!(d > 0.0f) || !(std::fabs(m) < INFINITY)) continue;
      const float sse = sse_of(g, d, m);
      if (sse < best_sse) best_d = d, best_m = m, best_sse = sse;
    }
    for (int i = 0; i < n; ++i) {
      const double e = static_cast<double>(g[i]) - (best_d * static_cast<float>(code(g[i], inverse(best_d), best_m)) + best_m);
      err2 += e * e;
    }
  }
  return err2;
}

// n weights of std 0.02 (about): kind 0 light-tailed (synth's: a sum of four uniforms), 1 gaussian, 2 heavy-tailed.
std::vector<float> WeightsOfKind(int kind, uint32_t seed, int64_t n) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> w(static_cast<size_t>(n));
  for (float& v : w) {
    if (kind == 0) v = 0.02f * 1.7320508f * (uniform(rng) + uniform(rng) + uniform(rng) + uniform(rng) - 2.0f);
    if (kind == 1) v = 0.02f * normal(rng);
    if (kind == 2) v = 0.02f * normal(rng) / (0.05f + 0.95f * uniform(rng));
  }
  return w;
}

// The s4 fit, with 15 passes over a group's weights where the search it replaced took 27, adds less error
// than that search did, on light-tailed weights (synth's: a sum of four uniforms), gaussian and heavy-tailed
// ones.
TEST(QuantizeRoleTest, S4FitAddsLessErrorThanTheFormerSearch) {
  const int64_t rows = 256, cols = 1024;
  for (int kind = 0; kind < 3; ++kind) {
    const std::vector<float> w = WeightsOfKind(kind, 11 + kind, rows * cols);
    std::vector<uint8_t> role(RoleBytes(Scheme::kS4, rows, cols));
    QuantizeError now;
    QuantizeRoleOnPath(CpuPath::kScalar, Scheme::kS4, w.data(), rows, cols, role.data(), &now);
    const double former = FormerS4SearchErr2(w.data(), rows * cols / 32);
    EXPECT_LT(now.err2, former) << "weights of kind " << kind;
    std::printf("s4, weights of kind %d: err2 %.6e, former search %.6e (%+.2e)\n", kind, now.err2, former,
                now.err2 / former - 1);
  }
}

// The s2 search as it was before its candidates' errors came from sums (the same candidates, each one's
// squared error summed weight by weight in float): its err2 and largest error over `n_groups` groups of 64.
QuantizeError FormerS2Search(const float* w, int64_t n_groups) {
  using namespace internal;
  constexpr int n = 64;
  const auto code = [](float x, float inv) { return CvttPs(MinPs(MaxPs(x * inv + 2.0f, 0.0f), 3.0f)); };
  const auto decode = [](float d, int32_t q) { return d * static_cast<float>(2 * q - 3); };
  const auto sse_of = [&](const float* g, float d) {
    const float inv = d == 0.0f ? 0.0f : 0.5f / d;
    float sse = 0.0f;
    for (int i = 0; i < n; ++i) {
      const float e = decode(d, code(g[i], inv)) - g[i];
      sse = sse + e * e;
    }
    return sse;
  };
  QuantizeError error;
  for (int64_t k = 0; k < n_groups; ++k) {
    const float* g = w + k * n;
    float amax = 0.0f;
    for (int i = 0; i < n; ++i) amax = MaxPs(amax, std::fabs(g[i]));
    float best_d = RoundHalf(amax / 3.0f);
    float best_sse = sse_of(g, best_d);
    for (int c = 1; c <= 16; ++c) {
      const float d = RoundHalf(amax / S2Divisor(c));
      if (!(d > 0.0f)) continue;
      const float sse = sse_of(g, d);
      if (sse < best_sse) best_d = d, best_sse = sse;
      float sum_lw = 0.0f;
      int32_t sum_ll = 0;
      for (int i = 0; i < n; ++i) {
        const int32_t l = 2 * code(g[i], 0.5f / d) - 3;
        sum_lw = sum_lw + static_cast<float>(l) * g[i];
        sum_ll += l * l;
      }
      const float refined = RoundHalf(sum_lw / static_cast<float>(sum_ll));
      if (!(refined > 0.0f)) continue;
      const float refined_sse = sse_of(g, refined);
      if (refined_sse < best_sse) best_d = refined, best_sse = refined_sse;
    }
    const float inv = best_d == 0.0f ? 0.0f : 0.5f / best_d;
    for (int i = 0; i < n; ++i) {
      const double e = static_cast<double>(g[i]) - decode(best_d, code(g[i], inv));
      error.err2 += e * e;
      error.ref2 += static_cast<double>(g[i]) * g[i];
      error.max_abs = std::max(error.max_abs, std::fabs(e));
    }
  }
  return error;
}

// The s2 fit weighs the candidates the former search did, by sums (their errors compared in double) instead
// of weight by weight in float, and adds no more error than it on light-tailed, gaussian and heavy-tailed
// weights: the same largest error, and an err2 no larger (where the two differ, a near-tie went the other way).
TEST(QuantizeRoleTest, S2FitAddsNoMoreErrorThanTheFormerSearch) {
  const int64_t rows = 256, cols = 1024;
  for (int kind = 0; kind < 3; ++kind) {
    std::vector<float> w = WeightsOfKind(kind, 21 + kind, rows * cols);
    for (float& v : w) v = HalfToFloat(FloatToHalf(v));  // as an f16 source gives them, with ties at 2d
    std::vector<uint8_t> role(RoleBytes(Scheme::kS2, rows, cols));
    QuantizeError now;
    QuantizeRoleOnPath(CpuPath::kScalar, Scheme::kS2, w.data(), rows, cols, role.data(), &now);
    const QuantizeError former = FormerS2Search(w.data(), rows * cols / 64);
    EXPECT_LE(now.err2, former.err2) << "weights of kind " << kind;
    EXPECT_LE(now.max_abs, former.max_abs) << "weights of kind " << kind;
    EXPECT_GT(now.err2, 0.5 * former.err2) << "weights of kind " << kind;
    std::printf("s2, weights of kind %d: err2 %.9e, former search %.9e (%+.2e); max_abs %.6e, former %.6e\n", kind,
                now.err2, former.err2, now.err2 / former.err2 - 1, now.max_abs, former.max_abs);
  }
}

}  // namespace
}  // namespace strata::kernels
