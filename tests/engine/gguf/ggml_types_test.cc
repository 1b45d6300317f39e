#include "engine/gguf/ggml_types.h"

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/test_util.h"

namespace strata::gguf {
namespace {

struct Geometry {
  uint32_t id;
  const char* name;
  int64_t block_size;
  int64_t type_size;
  bool decodable;
};

// Block sizes from each type's struct layout in ggml-common.h, written as the sum of its fields.
const Geometry kExpected[] = {
    {0, "f32", 1, 4, true},
    {1, "f16", 1, 2, true},
    {2, "q4_0", 32, 2 + 16, true},
    {3, "q4_1", 32, 2 + 2 + 16, true},
    {6, "q5_0", 32, 2 + 4 + 16, true},
    {7, "q5_1", 32, 2 + 2 + 4 + 16, true},
    {8, "q8_0", 32, 2 + 32, true},
    {9, "q8_1", 32, 2 + 2 + 32, false},
    {10, "q2_K", 256, 256 / 16 + 256 / 4 + 2 + 2, true},
    {11, "q3_K", 256, 256 / 8 + 256 / 4 + 12 + 2, true},
    {12, "q4_K", 256, 2 + 2 + 12 + 256 / 2, true},
    {13, "q5_K", 256, 2 + 2 + 12 + 256 / 8 + 256 / 2, true},
    {14, "q6_K", 256, 256 / 2 + 256 / 4 + 256 / 16 + 2, true},
    {15, "q8_K", 256, 4 + 256 + 2 * 256 / 16, false},
    {16, "iq2_xxs", 256, 2 + 2 * 256 / 8, false},
    {17, "iq2_xs", 256, 2 + 2 * 256 / 8 + 256 / 32, false},
    {18, "iq3_xxs", 256, 2 + 3 * 256 / 8, false},
    {19, "iq1_s", 256, 2 + 256 / 8 + 256 / 16, false},
    {20, "iq4_nl", 32, 2 + 16, false},
    {21, "iq3_s", 256, 2 + 256 / 4 + 256 / 32 + 256 / 8 + 256 / 64, false},
    {22, "iq2_s", 256, 2 + 256 / 4 + 256 / 32 + 256 / 32, false},
    {23, "iq4_xs", 256, 2 + 2 + 256 / 64 + 256 / 2, false},
    {24, "i8", 1, 1, false},
    {25, "i16", 1, 2, false},
    {26, "i32", 1, 4, false},
    {27, "i64", 1, 8, false},
    {28, "f64", 1, 8, false},
    {29, "iq1_m", 256, 256 / 8 + 256 / 16 + 256 / 32, false},
    {30, "bf16", 1, 2, true},
    {34, "tq1_0", 256, (256 - 4 * 256 / 64) / 5 + 256 / 64 + 2, false},
    {35, "tq2_0", 256, 256 / 4 + 2, false},
    {39, "mxfp4", 32, 1 + 16, true},
};

TEST(GgufTypes, GeometryMatchesGgmlLayouts) {
  for (const Geometry& g : kExpected) {
    SCOPED_TRACE(g.name);
    absl::StatusOr<GgmlTypeInfo> info = LookupType(g.id);
    ASSERT_TRUE(info.ok()) << info.status();
    EXPECT_EQ(info->name, g.name);
    EXPECT_EQ(info->block_size, g.block_size);
    EXPECT_EQ(info->type_size, g.type_size);
    EXPECT_EQ(info->can_dequantize, g.decodable);
    EXPECT_EQ(TypeName(g.id), g.name);
  }
}

TEST(GgufTypes, GetTypeInfoRefusesUndecodableTypesByName) {
  EXPECT_TRUE(GetTypeInfo(12).ok());
  EXPECT_THAT(GetTypeInfo(16).status(), StatusIsWith(absl::StatusCode::kUnimplemented, "iq2_xxs"));
  EXPECT_THAT(GetTypeInfo(40).status(), StatusIsWith(absl::StatusCode::kUnimplemented, "nvfp4"));
  EXPECT_THAT(GetTypeInfo(15).status(), StatusIsWith(absl::StatusCode::kUnimplemented, "q8_K"));
}

TEST(GgufTypes, UnknownIdsAreInvalid) {
  for (uint32_t id : {4u, 5u, 200u, 0xffffffffu}) {
    EXPECT_THAT(LookupType(id).status(), StatusIs(absl::StatusCode::kInvalidArgument)) << id;
    EXPECT_THAT(GetTypeInfo(id).status(), StatusIs(absl::StatusCode::kInvalidArgument)) << id;
  }
  EXPECT_EQ(TypeName(200), "type200");
}

TEST(GgufTypes, TensorBytes) {
  const std::vector<int64_t> shape = {64, 3, 2};
  ASSERT_TRUE(TensorBytes(GgmlType::kQ4_0, shape).ok());
  EXPECT_EQ(*TensorBytes(GgmlType::kQ4_0, shape), 2u * 18 * 3 * 2);
  EXPECT_EQ(*TensorBytes(GgmlType::kF32, shape), 64u * 3 * 2 * 4);
  EXPECT_EQ(*TensorBytes(GgmlType::kQ6_K, std::vector<int64_t>{512, 5}), 2u * 210 * 5);
  // Undecodable types still have sizes.
  EXPECT_EQ(*TensorBytes(static_cast<GgmlType>(16), std::vector<int64_t>{256, 2}), 2u * 66);
  EXPECT_THAT(TensorBytes(GgmlType::kQ4_K, std::vector<int64_t>{100, 2}).status(),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "whole number"));
  EXPECT_THAT(TensorBytes(GgmlType::kF32, std::vector<int64_t>{-1}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(GgufTypes, TensorBytesRefusesOverflow) {
  const int64_t big = int64_t{1} << 40;
  EXPECT_THAT(TensorBytes(GgmlType::kF32, std::vector<int64_t>{big, big}).status(),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "overflow"));
  // Elements fit in int64 but bytes do not.
  EXPECT_THAT(TensorBytes(GgmlType::kF32, std::vector<int64_t>{int64_t{1} << 61, 2}).status(),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "overflow"));
  EXPECT_THAT(TensorBytes(GgmlType::kF32, std::vector<int64_t>{0, big, big, big}).status(),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "overflow"));
}

TEST(GgufTypes, RowBytes) {
  EXPECT_EQ(*RowBytes(GgmlType::kQ8_0, 96), 3u * 34);
  EXPECT_EQ(*RowBytes(GgmlType::kBF16, 7), 14u);
  EXPECT_EQ(*RowBytes(GgmlType::kQ5_K, 0), 0u);
  EXPECT_THAT(RowBytes(GgmlType::kQ8_0, 33).status(), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(GgufTypes, DequantizeRefusesUndecodableAndPartialBlocks) {
  std::vector<uint8_t> src(1024);
  std::vector<float> dst(256);
  EXPECT_THAT(Dequantize(static_cast<GgmlType>(20), src.data(), dst.data(), 32),
              StatusIsWith(absl::StatusCode::kUnimplemented, "iq4_nl"));
  EXPECT_THAT(Dequantize(GgmlType::kQ4_0, src.data(), dst.data(), 31), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(Quantize(GgmlType::kQ5_0, dst.data(), src.data(), 256),
              StatusIsWith(absl::StatusCode::kUnimplemented, "cannot encode ggml type q5_0"));
}

uint32_t Bits(float f) { return std::bit_cast<uint32_t>(f); }

TEST(GgufTypes, HalfKnownValues) {
  EXPECT_EQ(HalfToFloat(0x3c00), 1.0f);
  EXPECT_EQ(HalfToFloat(0xc000), -2.0f);
  EXPECT_EQ(HalfToFloat(0x7bff), 65504.0f);
  EXPECT_EQ(HalfToFloat(0x0400), std::ldexp(1.0f, -14));
  EXPECT_EQ(HalfToFloat(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(HalfToFloat(0x03ff), std::ldexp(1023.0f, -24));
  EXPECT_TRUE(std::isinf(HalfToFloat(0x7c00)));
  EXPECT_TRUE(std::isnan(HalfToFloat(0x7e00)));
  EXPECT_EQ(Bits(HalfToFloat(0x8000)), 0x80000000u);

  EXPECT_EQ(FloatToHalf(1.0f), 0x3c00);
  EXPECT_EQ(FloatToHalf(-0.0f), 0x8000);
  EXPECT_EQ(FloatToHalf(1.0f + std::ldexp(1.0f, -11)), 0x3c00);      // tie: stays even
  EXPECT_EQ(FloatToHalf(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);  // tie: rounds up to even
  EXPECT_EQ(FloatToHalf(65519.0f), 0x7bff);
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7c00);
  EXPECT_EQ(FloatToHalf(1e10f), 0x7c00);
  EXPECT_EQ(FloatToHalf(-std::numeric_limits<float>::infinity()), 0xfc00);
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -25)), 0x0000);      // tie between 0 and the smallest subnormal
  EXPECT_EQ(FloatToHalf(std::ldexp(3.0f, -25)), 0x0002);      // tie between 1 and 2 steps: even
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -14)), 0x0400);
  EXPECT_EQ(FloatToHalf(std::ldexp(1023.75f, -24)), 0x0400);  // rounds up into the normals
  const uint16_t nan = FloatToHalf(std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(nan & 0x7c00, 0x7c00);
  EXPECT_NE(nan & 0x03ff, 0);
}

TEST(GgufTypes, HalfRoundTripsEveryValue) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = HalfToFloat(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(f)))) << h;
      continue;
    }
    ASSERT_EQ(FloatToHalf(f), h) << std::hex << h;
  }
}

// The result must be a nearest half: no other half is closer to the input.
TEST(GgufTypes, HalfRoundsToNearest) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> exponent(-26.0f, 15.99f);  // below 65504, the largest half
  for (int i = 0; i < 20000; ++i) {
    const float f = std::exp2(exponent(rng)) * (i % 2 ? -1.0f : 1.0f);
    const uint16_t h = FloatToHalf(f);
    const double err = std::fabs(static_cast<double>(HalfToFloat(h)) - f);
    const uint16_t magnitude = h & 0x7fff;
    for (int delta : {-1, 1}) {
      const int neighbour = magnitude + delta;
      if (neighbour < 0 || neighbour > 0x7bff) continue;
      const uint16_t other = static_cast<uint16_t>((h & 0x8000) | neighbour);
      ASSERT_LE(err, std::fabs(static_cast<double>(HalfToFloat(other)) - f)) << f;
    }
  }
}

TEST(GgufTypes, Bf16) {
  EXPECT_EQ(Bf16ToFloat(0x3f80), 1.0f);
  EXPECT_EQ(Bf16ToFloat(0xc040), -3.0f);
  EXPECT_EQ(FloatToBf16(1.0f), 0x3f80);
  EXPECT_EQ(FloatToBf16(std::bit_cast<float>(0x3f808000u)), 0x3f80);  // tie: stays even
  EXPECT_EQ(FloatToBf16(std::bit_cast<float>(0x3f818000u)), 0x3f82);  // tie: rounds up to even
  EXPECT_EQ(FloatToBf16(std::bit_cast<float>(0x3f808001u)), 0x3f81);  // above the tie
  EXPECT_EQ(FloatToBf16(std::numeric_limits<float>::max()), 0x7f80);  // rounds to infinity
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(std::numeric_limits<float>::quiet_NaN()))));
  // A NaN whose payload lies only in the dropped bits must stay a NaN.
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(std::bit_cast<float>(0x7f800001u)))));
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = Bf16ToFloat(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(FloatToBf16(f), h);
  }
}

}  // namespace
}  // namespace strata::gguf
