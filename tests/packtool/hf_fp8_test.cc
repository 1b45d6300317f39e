#include "packtool/hf_fp8.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace strata::packtool {
namespace {

using ::testing::HasSubstr;

TEST(HfFp8Test, DecodesHandPickedE4m3Codes) {
  const std::vector<std::pair<uint8_t, float>> cases = {
      {0x00, 0.0f},          {0x01, 0.001953125f},  // smallest subnormal: 1/8 * 2^-6 = 2^-9
      {0x07, 0.013671875f},  // largest subnormal: 7/8 * 2^-6
      {0x08, 0.015625f},     // smallest normal: 2^-6
      {0x38, 1.0f},          {0x3C, 1.5f},          {0x41, 2.25f},
      {0x7E, 448.0f},        // the largest finite value
      {0xB8, -1.0f},         {0xFE, -448.0f},       {0x81, -0.001953125f},
  };
  for (const auto& [code, value] : cases) EXPECT_EQ(DecodeE4m3(code), value) << static_cast<int>(code);
  EXPECT_TRUE(std::signbit(DecodeE4m3(0x80)));
  EXPECT_EQ(DecodeE4m3(0x80), 0.0f);
  // No infinities: exponent 15 is finite but for mantissa 7, which is NaN.
  EXPECT_EQ(DecodeE4m3(0x78), 256.0f);
  EXPECT_TRUE(std::isnan(DecodeE4m3(0x7F)));
  EXPECT_TRUE(std::isnan(DecodeE4m3(0xFF)));
}

// The test's own e4m3 decoding and bf16 rounding, to check the library's against.
float ExpectedE4m3(uint8_t code) {
  const int s = code >> 7, e = (code >> 3) & 15, m = code & 7;
  const double v = e == 0 ? m / 8.0 * std::pow(2.0, -6) : (1.0 + m / 8.0) * std::pow(2.0, e - 7);
  return static_cast<float>(s ? -v : v);
}

uint16_t ExpectedBf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  const uint32_t lower = bits & 0xFFFF, upper = bits >> 16;
  if (lower > 0x8000 || (lower == 0x8000 && (upper & 1))) return static_cast<uint16_t>(upper + 1);
  return static_cast<uint16_t>(upper);
}

std::vector<uint8_t> FloatBytes(const std::vector<float>& v) {
  std::vector<uint8_t> b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

uint16_t Bf16At(const std::vector<uint8_t>& out, size_t i) { return static_cast<uint16_t>(out[2 * i] | out[2 * i + 1] << 8); }

// 130 x 200 codes in 2 x 2 blocks, the last ones partial: each element takes its own block's scale.
TEST(HfFp8Test, DequantizesEachElementWithItsBlocksScale) {
  const int64_t rows = 130, cols = 200;
  std::mt19937 rng(3);
  std::vector<uint8_t> codes(rows * cols);
  for (uint8_t& c : codes) {
    do c = static_cast<uint8_t>(rng()); while ((c & 0x7F) == 0x7F);  // every finite code, subnormals included
  }
  const std::vector<float> scales = {0.0137f, 1.7f, 3.0e-3f, 250.5f};  // [2][2], not powers of two: rounding matters
  std::vector<uint8_t> out(rows * cols * 2);
  ASSERT_TRUE(DequantizeFp8Blocks(codes, FloatBytes(scales), rows, cols, "w", out).ok());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const size_t i = static_cast<size_t>(r * cols + c);
      const float expected = ExpectedE4m3(codes[i]) * scales[(r >= 128) * 2 + (c >= 128)];
      ASSERT_EQ(Bf16At(out, i), ExpectedBf16(expected)) << r << ", " << c;
    }
  }
}

TEST(HfFp8Test, RoundsProductsToNearestEvenBf16) {
  // 1.0 * (1 + 2^-8) lies halfway between bf16 1.0 and 1 + 2^-7: even, so 1.0. 1.5 * (1 + 2^-8) = 1.5 + 0.75 * 2^-7
  // rounds up to 1.5 + 2^-7. A subnormal code times 2^10: 2^-9 * 2^10 = 2.
  const std::vector<uint8_t> codes = {0x38, 0x3C, 0x01, 0x00};
  std::vector<uint8_t> out(8);
  ASSERT_TRUE(DequantizeFp8Blocks({codes.data(), 3}, FloatBytes({1.00390625f}), 1, 3, "w", {out.data(), 6}).ok());
  EXPECT_EQ(Bf16At(out, 0), 0x3F80);  // 1.0
  EXPECT_EQ(Bf16At(out, 1), 0x3FC1);  // 1.5078125
  ASSERT_TRUE(DequantizeFp8Blocks({codes.data() + 2, 1}, FloatBytes({1024.0f}), 1, 1, "w", {out.data(), 2}).ok());
  EXPECT_EQ(Bf16At(out, 0), 0x4000);  // 2.0
}

TEST(HfFp8Test, RefusesNaNCodesAndInfiniteProductsNamingTheElement) {
  std::vector<uint8_t> codes(4 * 6, 0x38);
  codes[3 * 6 + 5] = 0x7F;
  std::vector<uint8_t> out(codes.size() * 2);
  absl::Status s = DequantizeFp8Blocks(codes, FloatBytes({1.0f}), 4, 6, "model.layers.0.mlp.up_proj.weight", out);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("tensor 'model.layers.0.mlp.up_proj.weight': element [3, 5] is an FP8 NaN"));
  codes[3 * 6 + 5] = 0xFF;
  EXPECT_THAT(std::string(DequantizeFp8Blocks(codes, FloatBytes({1.0f}), 4, 6, "w", out).message()),
              HasSubstr("element [3, 5] is an FP8 NaN"));
  codes[3 * 6 + 5] = 0x38;
  s = DequantizeFp8Blocks(codes, FloatBytes({std::numeric_limits<float>::infinity()}), 4, 6, "w", out);
  EXPECT_THAT(std::string(s.message()), HasSubstr("element [0, 0] is 1 * scale_inv inf, not finite"));
}

TEST(HfFp8Test, RefusesSpansOfTheWrongSizeNamingTheTensor) {
  std::vector<uint8_t> codes(4 * 6, 0x38), out(4 * 6 * 2);
  EXPECT_TRUE(DequantizeFp8Blocks(codes, FloatBytes({1.0f}), 4, 6, "w", out).ok());
  const absl::Status short_codes = DequantizeFp8Blocks(std::span<const uint8_t>(codes).first(23),
                                                       FloatBytes({1.0f}), 4, 6, "w", out);
  EXPECT_EQ(short_codes.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(short_codes.message()), HasSubstr("tensor 'w': 23 FP8 codes"));
  EXPECT_FALSE(DequantizeFp8Blocks(codes, FloatBytes({1.0f, 2.0f}), 4, 6, "w", out).ok());
  EXPECT_FALSE(DequantizeFp8Blocks(codes, FloatBytes({1.0f}), 4, 6, "w", std::span<uint8_t>(out).first(47)).ok());
}

TEST(HfFp8Test, ChecksTheQuantizationConfig) {
  using nlohmann::json;
  EXPECT_EQ(ReadFp8QuantizationConfig(json::object(), "c.json").value(), false);
  EXPECT_EQ(ReadFp8QuantizationConfig(json{{"quantization_config", nullptr}}, "c.json").value(), false);
  const json fp8 = {{"quantization_config",
                     {{"activation_scheme", "dynamic"}, {"fmt", "e4m3"}, {"quant_method", "fp8"},
                      {"weight_block_size", {128, 128}}}}};
  EXPECT_EQ(ReadFp8QuantizationConfig(fp8, "c.json").value(), true);
  json other = fp8;
  other["quantization_config"]["quant_method"] = "gptq";
  absl::StatusOr<bool> r = ReadFp8QuantizationConfig(other, "c.json");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("c.json: quantization_config.quant_method: 'gptq' is not supported"));
  other = fp8;
  other["quantization_config"]["weight_block_size"] = {64, 64};
  EXPECT_THAT(std::string(ReadFp8QuantizationConfig(other, "c.json").status().message()),
              HasSubstr("quantization_config.weight_block_size: [64,64] is not supported"));
  other["quantization_config"].erase("weight_block_size");
  EXPECT_THAT(std::string(ReadFp8QuantizationConfig(other, "c.json").status().message()),
              HasSubstr("quantization_config.weight_block_size: null is not supported"));
  other = fp8;
  other["quantization_config"]["fmt"] = "e5m2";
  EXPECT_THAT(std::string(ReadFp8QuantizationConfig(other, "c.json").status().message()),
              HasSubstr("quantization_config.fmt: \"e5m2\" is not supported"));
  other["quantization_config"] = "fp8";
  EXPECT_THAT(std::string(ReadFp8QuantizationConfig(other, "c.json").status().message()),
              HasSubstr("quantization_config: expected an object"));
}

}  // namespace
}  // namespace strata::packtool
