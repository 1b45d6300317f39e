#include "kernels/cpu/role_gemv.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "gtest/gtest.h"
#include "kernels/format/fp16.h"
#include "kernels/format/role_layout.h"
#include "tests/testing/test_util.h"

namespace strata::kernels {
namespace {

constexpr Scheme kAllSchemes[] = {Scheme::kF16, Scheme::kS8, Scheme::kS4, Scheme::kS2, Scheme::kMxfp4};
constexpr CpuPath kAllPaths[] = {CpuPath::kScalar, CpuPath::kAvx2, CpuPath::kAvx512};
constexpr float kSentinel = -12345.0f;

// The paths the current test ran through RoleGemvOnPath; cleared before each test.
std::set<CpuPath>& PathsRun() {
  static std::set<CpuPath> paths;
  return paths;
}

// STRATA_REQUIRE_CPU_PATHS, e.g. "avx2,avx512": paths every kernel test must run. The tests skip a path the
// CPU lacks (or STRATA_CPU caps), which on a machine without it would leave that path's code untested while
// every test passes; CI machines that have the paths set this so that losing one is a failure.
struct RequiredPaths {
  std::vector<CpuPath> paths;
  std::vector<std::string> unknown;  // names that are no path
};
RequiredPaths ReadRequiredPaths() {
  RequiredPaths required;
  const char* env = std::getenv("STRATA_REQUIRE_CPU_PATHS");
  if (env == nullptr) return required;
  for (absl::string_view part : absl::StrSplit(env, ',', absl::SkipWhitespace())) {
    const std::string name(absl::StripAsciiWhitespace(part));
    bool known = false;
    for (CpuPath p : kAllPaths) {
      if (CpuPathName(p) == name) {
        required.paths.push_back(p);
        known = true;
      }
    }
    if (!known) required.unknown.push_back(name);
  }
  return required;
}

std::string PathNames(const std::vector<CpuPath>& paths) {
  std::vector<std::string> names;
  for (CpuPath p : paths) names.emplace_back(CpuPathName(p));
  return names.empty() ? "none" : absl::StrJoin(names, ",");
}

// Every test of this fixture runs kernels. After each it says which paths ran (stdout, and the properties
// cpu_paths_run / cpu_paths_not_run in the XML report) and fails when a required path did not.
class RoleGemvTest : public ::testing::Test {
 protected:
  void SetUp() override { PathsRun().clear(); }
  void TearDown() override {
    std::vector<CpuPath> ran, not_run;
    for (CpuPath p : kAllPaths) (PathsRun().count(p) ? ran : not_run).push_back(p);
    RecordProperty("cpu_paths_run", PathNames(ran));
    RecordProperty("cpu_paths_not_run", PathNames(not_run));
    std::printf("role_gemv paths run: %s; not run (not available here): %s\n", PathNames(ran).c_str(),
                PathNames(not_run).c_str());
    EXPECT_TRUE(PathsRun().count(CpuPath::kScalar)) << "the scalar path always runs";
    const RequiredPaths required = ReadRequiredPaths();
    for (const std::string& name : required.unknown) {
      ADD_FAILURE() << "STRATA_REQUIRE_CPU_PATHS names '" << name << "', which is no path (scalar, avx2, avx512)";
    }
    for (CpuPath p : required.paths) {
      EXPECT_TRUE(PathsRun().count(p)) << "STRATA_REQUIRE_CPU_PATHS requires the " << CpuPathName(p)
                                       << " path, which did not run: this CPU lacks it or STRATA_CPU caps it";
    }
  }
};

// A role of random bytes with sane scales (codes are valid for any byte, except int8 -128 for s8, which
// is remapped), so the kernels see every code pattern.
std::vector<uint8_t> RandomRole(Scheme s, int64_t rows, int64_t cols, std::mt19937& rng) {
  std::vector<uint8_t> role(RoleBytes(s, rows, cols));
  for (uint8_t& b : role) b = static_cast<uint8_t>(rng());
  std::uniform_real_distribution<float> scale(0.001f, 0.1f), min(-0.5f, 0.5f), f16(-2.0f, 2.0f);
  if (s == Scheme::kF16) {
    for (int64_t i = 0; i < rows * cols; ++i) StoreHalf(FloatToHalf(f16(rng)), role.data() + 2 * i);
    return role;
  }
  const int64_t codes = layout::CodesBytes(s, rows, cols);
  if (s == Scheme::kS8) {
    for (int64_t i = 0; i < codes; ++i) {
      if (role[i] == 0x80) role[i] = 0x81;
    }
  }
  if (s == Scheme::kMxfp4) {  // exponent bytes: scales 2^-10 .. 2^9
    for (size_t i = codes; i < role.size(); ++i) role[i] = static_cast<uint8_t>(118 + rng() % 20);
    return role;
  }
  const int64_t halves = (static_cast<int64_t>(role.size()) - codes) / 2;
  for (int64_t i = 0; i < halves; ++i) {
    const bool is_min = s == Scheme::kS4 && (i / 16) % 2 == 1;
    StoreHalf(FloatToHalf(is_min ? min(rng) : scale(rng)), role.data() + codes + 2 * i);
  }
  return role;
}

QuantizedActivation RandomActivation(int64_t n, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(n);
  for (float& v : x) v = dist(rng);
  // Some blocks all zero, some with a large outlier.
  if (n >= 96) {
    for (int i = 32; i < 64; ++i) x[i] = 0.0f;
    x[70] = 50.0f;
  }
  QuantizedActivation q;
  QuantizeActivation(x.data(), n, &q);
  return q;
}

uint32_t Bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  return b;
}

struct Case {
  int64_t rows, cols;
};

// Runs every available path on rows [r0, r1) and compares with the reference: bit-exact for the integer
// schemes, within float rounding for f16. Rows outside the range must stay untouched.
void CheckAgainstReference(Scheme s, const std::vector<uint8_t>& role, int64_t rows, int64_t cols,
                           const std::vector<QuantizedActivation>& xs, int64_t r0, int64_t r1) {
  const int n = static_cast<int>(xs.size());
  std::vector<const QuantizedActivation*> xp;
  for (const QuantizedActivation& x : xs) xp.push_back(&x);
  ASSERT_THAT(CheckRoleGemvArgs(s, rows, cols, r0, r1, xp.data(), n), IsOk());

  std::vector<std::vector<float>> expect(n, std::vector<float>(rows, kSentinel));
  std::vector<std::vector<double>> magnitude(n, std::vector<double>(rows, 0.0));
  for (int t = 0; t < n; ++t) {
    for (int64_t r = r0; r < r1; ++r) {
      expect[t][r] = DotRowReference(s, role.data(), rows, cols, r, xs[t]);
      if (s != Scheme::kF16) continue;
      for (int64_t c = 0; c < cols; ++c) {
        magnitude[t][r] +=
            std::fabs(double(HalfToFloat(LoadHalf(role.data() + 2 * (r * cols + c)))) * xs[t].f32[c]);
      }
    }
  }
  for (CpuPath path : kAllPaths) {
    if (!CpuPathAvailable(path)) continue;  // RoleGemvTest::TearDown reports it, and fails if it is required
    PathsRun().insert(path);
    std::vector<std::vector<float>> out(n, std::vector<float>(rows, kSentinel));
    std::vector<float*> op;
    for (auto& o : out) op.push_back(o.data());
    RoleGemvOnPath(path, s, role.data(), rows, cols, r0, r1, xp.data(), n, op.data());
    for (int t = 0; t < n; ++t) {
      for (int64_t r = 0; r < rows; ++r) {
        const std::string where = std::string(SchemeName(s)) + " " + std::string(CpuPathName(path)) + " " +
                                  std::to_string(rows) + "x" + std::to_string(cols) + " rows [" +
                                  std::to_string(r0) + "," + std::to_string(r1) + ") token " +
                                  std::to_string(t) + "/" + std::to_string(n) + " row " + std::to_string(r);
        if (r < r0 || r >= r1) {
          ASSERT_EQ(out[t][r], kSentinel) << where;
        } else if (s == Scheme::kF16) {
          ASSERT_NEAR(out[t][r], expect[t][r], 1e-5 * magnitude[t][r] + 1e-30) << where;
        } else {
          ASSERT_EQ(Bits(out[t][r]), Bits(expect[t][r])) << where << ": " << out[t][r] << " vs " << expect[t][r];
        }
      }
    }
  }
}

TEST_F(RoleGemvTest, ReportsPathsAndRunsEveryAvailableOne) {
  // The machines this project runs on have AVX512-VNNI; say which paths this one has so a log shows it.
  for (CpuPath p : kAllPaths) {
    std::printf("path %s: %s\n", std::string(CpuPathName(p)).c_str(),
                CpuPathAvailable(p) ? "available" : "not available");
  }
  EXPECT_TRUE(CpuPathAvailable(CpuPath::kScalar));
  EXPECT_TRUE(CpuPathAvailable(BestCpuPath()));
  for (CpuPath p : kAllPaths) {
    if (CpuPathAvailable(p)) {
      EXPECT_GE(static_cast<int>(BestCpuPath()), static_cast<int>(p)) << CpuPathName(p);
    }
  }
  std::mt19937 rng(6);
  for (Scheme s : kAllSchemes) {
    const std::vector<uint8_t> role = RandomRole(s, 32, 128, rng);
    CheckAgainstReference(s, role, 32, 128, {RandomActivation(128, rng), RandomActivation(128, rng)}, 0, 32);
  }
  for (CpuPath p : kAllPaths) {
    EXPECT_EQ(PathsRun().count(p), CpuPathAvailable(p) ? 1u : 0u) << CpuPathName(p);
  }
}

TEST_F(RoleGemvTest, SmallShapesAllTokenCounts) {
  std::mt19937 rng(1);
  for (Scheme s : kAllSchemes) {
    for (const Case c : {Case{16, 64}, Case{32, 128}, Case{48, 192}, Case{16, 320}}) {
      const std::vector<uint8_t> role = RandomRole(s, c.rows, c.cols, rng);
      for (int n = 1; n <= 5; ++n) {
        std::vector<QuantizedActivation> xs;
        for (int t = 0; t < n; ++t) xs.push_back(RandomActivation(c.cols, rng));
        CheckAgainstReference(s, role, c.rows, c.cols, xs, 0, c.rows);
      }
    }
  }
}

TEST_F(RoleGemvTest, OddRowRanges) {
  std::mt19937 rng(2);
  const int64_t rows = 64, cols = 128;
  for (Scheme s : kAllSchemes) {
    const std::vector<uint8_t> role = RandomRole(s, rows, cols, rng);
    for (int n : {1, 3, 5}) {
      std::vector<QuantizedActivation> xs;
      for (int t = 0; t < n; ++t) xs.push_back(RandomActivation(cols, rng));
      for (const auto& [r0, r1] : std::vector<std::pair<int64_t, int64_t>>{
               {3, 61}, {0, 1}, {15, 17}, {16, 32}, {5, 6}, {63, 64}, {7, 7}, {9, 40}, {32, 64}, {0, 8}}) {
        CheckAgainstReference(s, role, rows, cols, xs, r0, r1);
      }
    }
  }
}

TEST_F(RoleGemvTest, RandomShapes) {
  std::mt19937 rng(3);
  for (int iter = 0; iter < 24; ++iter) {
    const Scheme s = kAllSchemes[iter % 4];
    const int64_t rows = 16 * (1 + rng() % 6);
    const int64_t cols = 64 * (1 + rng() % 10);
    const std::vector<uint8_t> role = RandomRole(s, rows, cols, rng);
    const int n = 1 + static_cast<int>(rng() % 5);
    std::vector<QuantizedActivation> xs;
    for (int t = 0; t < n; ++t) xs.push_back(RandomActivation(cols, rng));
    const int64_t r0 = rng() % rows;
    const int64_t r1 = r0 + 1 + rng() % (rows - r0);
    CheckAgainstReference(s, role, rows, cols, xs, r0, r1);
  }
}

TEST_F(RoleGemvTest, RealMoeShapes) {
  std::mt19937 rng(4);
  // Qwen3-30B-A3B (n_embd 2048, ff 768) gate/up and down, and the 2560 x 640 expert.
  for (const Case c : {Case{768, 2048}, Case{2048, 768}, Case{640, 2560}, Case{2560, 640}}) {
    for (Scheme s : kAllSchemes) {
      const std::vector<uint8_t> role = RandomRole(s, c.rows, c.cols, rng);
      std::vector<QuantizedActivation> xs;
      for (int t = 0; t < 5; ++t) xs.push_back(RandomActivation(c.cols, rng));
      CheckAgainstReference(s, role, c.rows, c.cols, xs, 0, c.rows);
      // A thread's share that starts mid-tile.
      CheckAgainstReference(s, role, c.rows, c.cols, {xs[0], xs[1]}, 40, 203);
    }
  }
}

TEST_F(RoleGemvTest, ExtremeValuesStayExact) {
  // Largest codes against the largest activations: the s16 partial sums of the AVX2 path are at their
  // bound, and the int32 sums at theirs.
  const int64_t rows = 32, cols = 4096;
  for (Scheme s : {Scheme::kS8, Scheme::kS4, Scheme::kS2, Scheme::kMxfp4}) {
    for (int sign : {1, -1}) {
      std::mt19937 rng(5);
      std::vector<uint8_t> role = RandomRole(s, rows, cols, rng);
      // mxfp4: +12 for both signs of x (levels + 12 = 24 is the unsigned operand's largest; the int16 sums
      // reach +-24384).
      const uint8_t code = s == Scheme::kS8 ? (sign > 0 ? 0x7F : 0x81) : s == Scheme::kMxfp4 ? 0x77 : 0xFF;
      std::memset(role.data(), code, layout::CodesBytes(s, rows, cols));
      std::vector<float> xf(cols, 1.0f * sign);
      QuantizedActivation x;
      QuantizeActivation(xf.data(), cols, &x);
      ASSERT_EQ(x.q[0], 127 * sign);
      CheckAgainstReference(s, role, rows, cols, {x, x, x, x, x}, 0, rows);
      // Alternating signs.
      for (int64_t c = 0; c < cols; c += 2) xf[c] = -xf[c];
      QuantizeActivation(xf.data(), cols, &x);
      CheckAgainstReference(s, role, rows, cols, {x}, 0, rows);
    }
  }
}

// mxfp4's scales as the SIMD paths widen them: the subnormal 2^-128 and 2^-127 (bytes 0 and 1), the first
// normal ones and large ones, on every row of a tile and in every block.
TEST_F(RoleGemvTest, Mxfp4ExponentsOfEveryKindStayExact) {
  const int64_t rows = 32, cols = 256;
  std::mt19937 rng(17);
  std::vector<uint8_t> role = RandomRole(Scheme::kMxfp4, rows, cols, rng);
  const uint8_t exponents[] = {0, 1, 2, 3, 100, 127, 128, 129, 170, 180};
  const int64_t codes = layout::CodesBytes(Scheme::kMxfp4, rows, cols);
  for (size_t i = codes; i < role.size(); ++i) role[i] = exponents[(i * 7) % std::size(exponents)];
  CheckAgainstReference(Scheme::kMxfp4, role, rows, cols, {RandomActivation(cols, rng), RandomActivation(cols, rng)},
                        0, rows);
}

TEST(RoleGemvArgsTest, CheckArgs) {
  QuantizedActivation x;
  std::vector<float> xf(128, 1.0f);
  QuantizeActivation(xf.data(), 128, &x);
  const QuantizedActivation* xp[] = {&x, &x};
  EXPECT_THAT(CheckRoleGemvArgs(Scheme::kS4, 32, 128, 0, 32, xp, 2), IsOk());
  EXPECT_THAT(CheckRoleGemvArgs(Scheme::kS4, 32, 128, 4, 33, xp, 2),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "row range"));
  EXPECT_THAT(CheckRoleGemvArgs(Scheme::kS4, 32, 128, 5, 4, xp, 2), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(CheckRoleGemvArgs(Scheme::kS4, 32, 128, 0, 32, xp, 0),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "n_tokens"));
  EXPECT_THAT(CheckRoleGemvArgs(Scheme::kS4, 32, 256, 0, 32, xp, 1),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "256"));
  EXPECT_THAT(CheckRoleGemvArgs(Scheme::kS2, 32, 96, 0, 32, xp, 1), StatusIs(absl::StatusCode::kInvalidArgument));
  const QuantizedActivation* null_xp[] = {&x, nullptr};
  EXPECT_THAT(CheckRoleGemvArgs(Scheme::kS4, 32, 128, 0, 32, null_xp, 2),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "token 1"));
}

}  // namespace
}  // namespace strata::kernels
