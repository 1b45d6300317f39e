#include "kernels/cpu/quantize.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/format/fp16.h"
#include "kernels/format/mxfp4.h"
#include "tests/testing/test_util.h"

namespace strata::kernels {
namespace {

constexpr Scheme kAllSchemes[] = {Scheme::kF16, Scheme::kS8, Scheme::kS4, Scheme::kS2, Scheme::kMxfp4};

std::vector<float> Gaussian(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

double RelativeRms(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(a[i]) * a[i];
  }
  return std::sqrt(num / den);
}

TEST(SchemeTest, NamesRoundTrip) {
  for (Scheme s : kAllSchemes) {
    absl::StatusOr<Scheme> parsed = ParseScheme(SchemeName(s));
    ASSERT_THAT(parsed.status(), IsOk());
    EXPECT_EQ(*parsed, s);
  }
  EXPECT_THAT(ParseScheme("q4_0").status(), StatusIsWith(absl::StatusCode::kInvalidArgument, "q4_0"));
  EXPECT_THAT(ParseScheme("").status(), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(SchemeTest, GroupsAndBits) {
  EXPECT_EQ(SchemeGroup(Scheme::kF16), 1);
  EXPECT_EQ(SchemeGroup(Scheme::kS8), 32);
  EXPECT_EQ(SchemeGroup(Scheme::kS4), 32);
  EXPECT_EQ(SchemeGroup(Scheme::kS2), 64);
  EXPECT_EQ(SchemeGroup(Scheme::kMxfp4), 32);
  for (Scheme s : kAllSchemes) {
    // bits/weight must agree with RoleBytes.
    EXPECT_DOUBLE_EQ(SchemeBitsPerWeight(s), RoleBytes(s, 64, 1024) * 8.0 / (64 * 1024)) << SchemeName(s);
  }
}

TEST(SchemeTest, RoleBytes) {
  EXPECT_EQ(RoleBytes(Scheme::kS2, 640, 2560), 409600u + 51200u);
  EXPECT_EQ(RoleBytes(Scheme::kS2, 640, 2560) * 2 + RoleBytes(Scheme::kS2, 2560, 640), 1382400u);
  EXPECT_EQ(RoleBytes(Scheme::kF16, 16, 32), 1024u);
  EXPECT_EQ(RoleBytes(Scheme::kS8, 16, 32), 16u * 32 + 16 * 2);
  EXPECT_EQ(RoleBytes(Scheme::kS4, 16, 32), 16u * 16 + 16 * 4);
  EXPECT_EQ(RoleBytes(Scheme::kS2, 16, 64), 16u * 16 + 16 * 2);
  EXPECT_EQ(RoleBytes(Scheme::kMxfp4, 16, 32), 16u * 16 + 16 * 1);  // as GGUF's 17-byte blocks
}

TEST(SchemeTest, CheckRoleShape) {
  for (Scheme s : kAllSchemes) {
    EXPECT_THAT(CheckRoleShape(s, 16, 64), IsOk());
    EXPECT_THAT(CheckRoleShape(s, 2048, 768), IsOk());
    EXPECT_THAT(CheckRoleShape(s, 0, 64), StatusIsWith(absl::StatusCode::kInvalidArgument, "rows 0"));
    EXPECT_THAT(CheckRoleShape(s, -16, 64), StatusIsWith(absl::StatusCode::kInvalidArgument, "rows -16"));
    EXPECT_THAT(CheckRoleShape(s, 24, 64), StatusIsWith(absl::StatusCode::kInvalidArgument, "multiple of 16"));
    EXPECT_THAT(CheckRoleShape(s, 16, 0), StatusIsWith(absl::StatusCode::kInvalidArgument, "cols 0"));
    EXPECT_THAT(CheckRoleShape(s, 16, 48), StatusIsWith(absl::StatusCode::kInvalidArgument, "cols 48"));
    EXPECT_THAT(CheckRoleShape(s, 16, kMaxRoleDim * 2), StatusIs(absl::StatusCode::kInvalidArgument));
    EXPECT_THAT(CheckRoleShape(s, kMaxRoleDim * 2, 64), StatusIs(absl::StatusCode::kInvalidArgument));
  }
  EXPECT_THAT(CheckRoleShape(Scheme::kS2, 16, 96), StatusIsWith(absl::StatusCode::kInvalidArgument, "of 64"));
  EXPECT_THAT(CheckRoleShape(Scheme::kS4, 16, 96), IsOk());
}

TEST(Fp16Test, EveryHalfRoundTrips) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = HalfToFloat(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(f)))) << h;
      continue;
    }
    EXPECT_EQ(FloatToHalf(f), h) << h;
  }
  EXPECT_EQ(HalfToFloat(0x3C00), 1.0f);
  EXPECT_EQ(HalfToFloat(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(HalfToFloat(0xFBFF), -65504.0f);
}

TEST(Fp16Test, RoundsToNearestEven) {
  // Between consecutive positive finite halves a < b: the midpoint goes to the even one, and anything
  // nearer to one side goes there.
  for (uint16_t h = 0; h < 0x7BFF; ++h) {
    const float a = HalfToFloat(h), b = HalfToFloat(h + 1);
    const float mid = (a + b) / 2;  // exact in float
    const uint16_t even = (h & 1) == 0 ? h : static_cast<uint16_t>(h + 1);
    ASSERT_EQ(FloatToHalf(mid), even) << h;
    ASSERT_EQ(FloatToHalf(std::nextafter(mid, 0.0f)), h) << h;
    ASSERT_EQ(FloatToHalf(std::nextafter(mid, 1e9f)), h + 1) << h;
    ASSERT_EQ(FloatToHalf(-mid), even | 0x8000) << h;
  }
  EXPECT_EQ(FloatToHalf(65519.0f), 0x7BFF);
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7C00);
  EXPECT_EQ(FloatToHalf(1e30f), 0x7C00);
  EXPECT_EQ(FloatToHalf(-INFINITY), 0xFC00);
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -26)), 0);
}

// The layout documented in scheme.h, written out independently of the library's offset helpers.
struct DocLayout {
  Scheme s;
  int64_t rows, cols;
  int bits() const { return s == Scheme::kS8 ? 8 : s == Scheme::kS4 || s == Scheme::kMxfp4 ? 4 : 2; }
  int64_t group() const { return s == Scheme::kS2 ? 64 : 32; }
  int scale_bytes() const { return s == Scheme::kMxfp4 ? 1 : 2; }
  int64_t Byte(int64_t r, int64_t c) const {
    const int64_t P = 8 / bits(), t = r / 16, i = r % 16, k = c / (4 * P), p = (c % (4 * P)) / 4, j = c % 4;
    (void)p;
    return t * 16 * cols * bits() / 8 + k * 64 + 4 * i + j;
  }
  int Shift(int64_t c) const {
    const int64_t P = 8 / bits();
    return static_cast<int>((c % (4 * P)) / 4 * bits());
  }
  int64_t Scale(int64_t r, int64_t c) const {
    const int64_t record = s == Scheme::kS4 ? 64 : 16 * scale_bytes();
    return rows * cols * bits() / 8 + ((r / 16) * (cols / group()) + c / group()) * record +
           scale_bytes() * (r % 16);
  }
};

TEST(SchemeTest, DequantizeFollowsDocumentedLayout) {
  std::mt19937 rng(7);
  for (Scheme s : {Scheme::kS8, Scheme::kS4, Scheme::kS2, Scheme::kMxfp4}) {
    const int64_t rows = 32, cols = 128;
    const DocLayout doc{s, rows, cols};
    std::vector<uint8_t> role(RoleBytes(s, rows, cols));
    for (uint8_t& b : role) b = static_cast<uint8_t>(rng());
    // Give every scale and min a distinct, exactly representable value (mxfp4: its random exponent bytes).
    const int64_t records = rows / 16 * (cols / doc.group()) * (s == Scheme::kS4 ? 32 : 16);
    for (int64_t i = 0; i < records && s != Scheme::kMxfp4; ++i) {
      StoreHalf(FloatToHalf(0.5f + static_cast<float>(i % 97) / 64.0f), role.data() + doc.Scale(0, 0) + 2 * i);
    }
    std::vector<float> w(rows * cols);
    DequantizeRole(s, role.data(), rows, cols, w.data());
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        const unsigned code = (role[doc.Byte(r, c)] >> doc.Shift(c)) & ((1u << doc.bits()) - 1);
        // mxfp4: 2^(e - 128) and twice the E2M1 value (OCP MX: sign, 2 exponent bits, 1 mantissa bit).
        const float d = s == Scheme::kMxfp4 ? std::ldexp(1.0f, role[doc.Scale(r, c)] - 128)
                                            : HalfToFloat(LoadHalf(role.data() + doc.Scale(r, c)));
        float expect;
        if (s == Scheme::kMxfp4) {
          const int e2 = (code >> 1) & 3, m1 = code & 1;
          const float e2m1 = e2 == 0 ? 0.5f * m1 : std::ldexp(1.0f + 0.5f * m1, e2 - 1);
          expect = d * (2.0f * ((code & 8) != 0 ? -e2m1 : e2m1));
        } else if (s == Scheme::kS8) {
          expect = d * static_cast<int8_t>(code);
        } else if (s == Scheme::kS4) {
          expect = d * code + HalfToFloat(LoadHalf(role.data() + doc.Scale(r, c) + 32));
        } else {
          expect = d * (2 * static_cast<int>(code) - 3);
        }
        ASSERT_EQ(w[r * cols + c], expect) << SchemeName(s) << " row " << r << " col " << c;
      }
    }
  }
}

TEST(SchemeTest, ErrorWithinDocumentedBound) {
  const int64_t rows = 256, cols = 1024;
  const std::vector<float> w = Gaussian(rows * cols, 1234);
  for (Scheme s : kAllSchemes) {
    std::vector<uint8_t> role(RoleBytes(s, rows, cols));
    QuantizeRole(s, w.data(), rows, cols, role.data());
    std::vector<float> back(rows * cols);
    DequantizeRole(s, role.data(), rows, cols, back.data());
    const double err = RelativeRms(w, back);
    std::printf("%s relative RMS error %.5f (bound %.5f)\n", std::string(SchemeName(s)).c_str(), err,
                SchemeErrorBound(s));
    EXPECT_LT(err, SchemeErrorBound(s)) << SchemeName(s);
    // The bound is not loose by an order of magnitude either.
    EXPECT_GT(err, SchemeErrorBound(s) / 4) << SchemeName(s);
  }
}

TEST(SchemeTest, RepresentableWeightsRoundTripExactly) {
  std::mt19937 rng(99);
  const int64_t rows = 32, cols = 256;
  for (Scheme s : kAllSchemes) {
    // Weights built from codes and half scales, every group reaching its extreme codes.
    std::vector<float> w(rows * cols);
    const int64_t group = s == Scheme::kS2 ? 64 : 32;
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t g = 0; g < cols / group; ++g) {
        const float d = static_cast<float>(1 + rng() % 64) / 256.0f;
        const float m = -static_cast<float>(rng() % 64) / 16.0f;
        for (int64_t i = 0; i < group; ++i) {
          float v;
          if (s == Scheme::kF16) {
            v = HalfToFloat(FloatToHalf(static_cast<float>(rng() % 2001) / 100.0f - 10.0f));
          } else if (s == Scheme::kS8) {
            const int q = i == 0 ? 127 : i == 1 ? -127 : static_cast<int>(rng() % 255) - 127;
            v = d * q;
          } else if (s == Scheme::kS4) {
            const int q = i == 0 ? 0 : i == 1 ? 15 : static_cast<int>(rng() % 16);
            v = d * q + m;
          } else if (s == Scheme::kMxfp4) {
            // A power-of-two scale per group and levels reaching 12 (the fit's exponent is then this one).
            const float p = std::ldexp(1.0f, -static_cast<int>(3 + (r * 7 + g) % 12));
            const int q = i == 0 ? 7 : static_cast<int>(rng() % 16);
            v = p * static_cast<float>(kMxfp4Levels[q]);
          } else {
            const int q = i == 0 ? 3 : static_cast<int>(rng() % 4);
            v = d * (2 * q - 3);
          }
          w[r * cols + g * group + i] = v;
        }
      }
    }
    std::vector<uint8_t> role(RoleBytes(s, rows, cols));
    QuantizeRole(s, w.data(), rows, cols, role.data());
    std::vector<float> back(rows * cols);
    DequantizeRole(s, role.data(), rows, cols, back.data());
    EXPECT_EQ(w, back) << SchemeName(s);
    // Quantizing the decoded weights again reproduces the bytes.
    std::vector<uint8_t> again(role.size());
    QuantizeRole(s, back.data(), rows, cols, again.data());
    EXPECT_EQ(role, again) << SchemeName(s);
  }
}

TEST(SchemeTest, ZeroWeightsStayZero) {
  const int64_t rows = 16, cols = 128;
  const std::vector<float> w(rows * cols, 0.0f);
  for (Scheme s : kAllSchemes) {
    std::vector<uint8_t> role(RoleBytes(s, rows, cols), 0xEE);
    QuantizeRole(s, w.data(), rows, cols, role.data());
    std::vector<float> back(rows * cols, 1.0f);
    DequantizeRole(s, role.data(), rows, cols, back.data());
    for (float v : back) ASSERT_EQ(v, 0.0f) << SchemeName(s);
  }
}

TEST(ActivationTest, QuantizesPerBlock) {
  std::vector<float> x(64, 0.0f);
  // Block 0: amax 127 gives scale 1, so codes are x rounded half to even.
  x[0] = 127.0f;
  x[1] = 2.5f;
  x[2] = 3.5f;
  x[3] = -2.5f;
  x[4] = -0.4f;
  x[5] = -126.6f;
  // Block 1 stays zero.
  QuantizedActivation q;
  QuantizeActivation(x.data(), 64, &q);
  ASSERT_EQ(q.n, 64);
  ASSERT_EQ(q.q.size(), 64u);
  ASSERT_EQ(q.scale.size(), 2u);
  EXPECT_EQ(q.scale[0], 1.0f);
  EXPECT_EQ(q.q[0], 127);
  EXPECT_EQ(q.q[1], 2);
  EXPECT_EQ(q.q[2], 4);
  EXPECT_EQ(q.q[3], -2);
  EXPECT_EQ(q.q[4], 0);
  EXPECT_EQ(q.q[5], -127);
  EXPECT_EQ(q.sum[0], 127 + 2 + 4 - 2 - 127);
  EXPECT_EQ(q.scale[1], 0.0f);
  EXPECT_EQ(q.sum[1], 0);
  for (int i = 32; i < 64; ++i) EXPECT_EQ(q.q[i], 0);
  EXPECT_EQ(q.f32, x);
}

TEST(ActivationTest, RandomBlocksMatchDefinition) {
  const std::vector<float> x = Gaussian(4096, 5);
  QuantizedActivation q;
  QuantizeActivation(x.data(), 4096, &q);
  for (int64_t b = 0; b < 128; ++b) {
    float amax = 0;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[b * 32 + i]));
    ASSERT_EQ(q.scale[b], amax / 127.0f);
    int32_t sum = 0;
    for (int i = 0; i < 32; ++i) {
      const float v = x[b * 32 + i] / q.scale[b];
      ASSERT_EQ(q.q[b * 32 + i], static_cast<int>(std::nearbyint(v)));
      sum += q.q[b * 32 + i];
    }
    ASSERT_EQ(q.sum[b], sum);
  }
  // Block ranges quantized separately give the same result.
  QuantizedActivation parts;
  ResizeActivation(4096, &parts);
  parts.f32 = x;
  QuantizeActivationBlocks(64, 128, &parts);
  QuantizeActivationBlocks(0, 64, &parts);
  EXPECT_EQ(parts.q, q.q);
  EXPECT_EQ(parts.scale, q.scale);
  EXPECT_EQ(parts.sum, q.sum);
}

TEST(ActivationTest, NonFiniteInputsFollowDefinition) {
  std::vector<float> x(96, 0.5f);
  x[3] = NAN;            // block 0: skipped by amax, coded -127
  x[40] = INFINITY;      // block 1: scale inf, finite values code 0, inf/inf is NaN: -127
  x[70] = -1e-40f;       // block 2: a subnormal among ordinary values
  QuantizedActivation q;
  QuantizeActivation(x.data(), 96, &q);
  EXPECT_EQ(q.scale[0], 0.5f / 127.0f);
  EXPECT_EQ(q.q[3], -127);
  EXPECT_EQ(q.q[4], 127);
  EXPECT_EQ(q.sum[0], 31 * 127 - 127);
  EXPECT_EQ(q.scale[1], INFINITY);
  EXPECT_EQ(q.q[40], -127);
  EXPECT_EQ(q.q[41], 0);
  EXPECT_EQ(q.sum[1], -127);
  EXPECT_EQ(q.q[70], 0);
  EXPECT_EQ(q.q[71], 127);
}

TEST(Mxfp4Test, ScaleIsTwoToTheEMinus128ForEveryByteAndInverts) {
  for (int e = 0; e < 256; ++e) {
    const float d = Mxfp4Scale(static_cast<uint8_t>(e));
    ASSERT_EQ(d, std::ldexp(1.0f, e - 128)) << e;
    ASSERT_EQ(Mxfp4ExponentOf(d), e) << e;
  }
  EXPECT_EQ(Mxfp4ExponentOf(3.0f), -1);
  EXPECT_EQ(Mxfp4ExponentOf(0.0f), -1);
  EXPECT_EQ(Mxfp4ExponentOf(-1.0f), -1);
  EXPECT_EQ(Mxfp4ExponentOf(std::ldexp(1.0f, -129)), -1);
  EXPECT_EQ(Mxfp4ExponentOf(INFINITY), -1);
}

// PackRoleGroups stores an mxfp4 scale that is 2^(e - 128) as e, and another one as the power of two nearest to
// it in the log (a converter's mistake should not turn a group into zeros).
TEST(Mxfp4Test, PackRoleGroupsStoresExponentsAndRoundsOtherScales) {
  std::vector<uint8_t> role(RoleBytes(Scheme::kMxfp4, 16, 32), 0xEE);
  std::vector<uint8_t> codes(16 * 32, 1);  // level 1 everywhere
  std::vector<float> d(16), m(16, 0.0f);
  for (int r = 0; r < 16; ++r) d[r] = Mxfp4Scale(static_cast<uint8_t>(100 + r));
  d[3] = 3.0f;    // log2 1.58: 4
  d[4] = 2.5f;    // log2 1.32: 2
  d[5] = 0.0f;    // exponent 0
  d[6] = -8.0f;   // the magnitude's
  PackRoleGroups(Scheme::kMxfp4, 16, 32, 0, 16, d.data(), m.data(), codes.data(), role.data());
  std::vector<float> back(16 * 32);
  DequantizeRole(Scheme::kMxfp4, role.data(), 16, 32, back.data());
  const float expect[16] = {d[0], d[1], d[2], 4.0f, 2.0f, Mxfp4Scale(0), 8.0f, d[7], d[8], d[9], d[10], d[11],
                            d[12], d[13], d[14], d[15]};
  for (int r = 0; r < 16; ++r) EXPECT_EQ(back[r * 32 + 31], expect[r]) << "row " << r;
}

// The fit's rules (quantize_fit.h): the better of two exponents, the nearest level, a tie to the smaller level
// and, between exponents of equal error, the first.
TEST(Mxfp4Test, FitTakesTheNearestLevelAndTheBetterOfTwoExponents) {
  std::vector<uint8_t> role(RoleBytes(Scheme::kMxfp4, 16, 32));
  std::vector<float> rows(16 * 32, 0.0f);
  std::fill(rows.begin(), rows.begin() + 32, 1.9f);
  std::vector<float> decoded(rows.size());
  QuantizeRole(Scheme::kMxfp4, rows.data(), 16, 32, role.data());
  DequantizeRole(Scheme::kMxfp4, role.data(), 16, 32, decoded.data());
  // ggml's exponent gives 12 * 2^-3 = 1.5 at most; the next one 8 * 2^-2 = 2.0, nearer.
  for (int i = 0; i < 32; ++i) ASSERT_EQ(decoded[i], 2.0f) << i;

  std::fill(rows.begin(), rows.end(), 0.0f);
  const float group[6] = {12.0f, 5.0f, -5.0f, 2.5f, 0.25f, -0.75f};
  std::copy(group, group + 6, rows.begin());
  QuantizeRole(Scheme::kMxfp4, rows.data(), 16, 32, role.data());
  DequantizeRole(Scheme::kMxfp4, role.data(), 16, 32, decoded.data());
  // Scale 1 (ggml's; 2^1 errs more on -0.75): 5 is midway between 4 and 6 and 2.5 between 2 and 3 (both go
  // down), 0.25 is below the first midpoint, -0.75 nearest to -1.
  const float expect[6] = {12.0f, 4.0f, -4.0f, 2.0f, 0.0f, -1.0f};
  for (int i = 0; i < 6; ++i) EXPECT_EQ(decoded[i], expect[i]) << i;
  EXPECT_EQ(role[RoleBytes(Scheme::kMxfp4, 16, 32) - 16], 128);  // row 0's exponent byte: 2^0
  for (int i = 6; i < 16 * 32; ++i) ASSERT_EQ(decoded[i], 0.0f) << i;
}

TEST(ReferenceTest, DotMatchesDequantizedProduct) {
  const int64_t rows = 32, cols = 256;
  const std::vector<float> w = Gaussian(rows * cols, 11);
  const std::vector<float> xf = Gaussian(cols, 12);
  QuantizedActivation x;
  QuantizeActivation(xf.data(), cols, &x);
  for (Scheme s : kAllSchemes) {
    std::vector<uint8_t> role(RoleBytes(s, rows, cols));
    QuantizeRole(s, w.data(), rows, cols, role.data());
    std::vector<float> back(rows * cols);
    DequantizeRole(s, role.data(), rows, cols, back.data());
    for (int64_t r = 0; r < rows; ++r) {
      // The integer schemes see the quantized activation, f16 the exact one.
      double expect = 0, magnitude = 0;
      for (int64_t c = 0; c < cols; ++c) {
        const double xv = s == Scheme::kF16 ? xf[c] : double(x.q[c]) * x.scale[c / 32];
        expect += double(back[r * cols + c]) * xv;
        magnitude += std::fabs(double(back[r * cols + c]) * xv);
      }
      const float got = DotRowReference(s, role.data(), rows, cols, r, x);
      EXPECT_NEAR(got, expect, 1e-5 * magnitude) << SchemeName(s) << " row " << r;
    }
  }
}

}  // namespace
}  // namespace strata::kernels
