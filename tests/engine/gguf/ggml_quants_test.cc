// Block decoders checked against blocks assembled by hand. Each packer below places logical values
// (scales, mins, quants) where ggml-common.h's block layout says they go, using flat element-index
// formulas rather than the decoder's loop structure; the expected value of every element is then the
// format's formula, e.g. q4_K: d * scale[i / 32] * q[i] - dmin * min[i / 32].

#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <set>
#include <vector>

#include "engine/gguf/ggml_types.h"
#include "gtest/gtest.h"
#include "tests/testing/test_util.h"

namespace strata::gguf {
namespace {

void PutHalf(std::vector<uint8_t>& b, size_t at, float v) {
  const uint16_t h = FloatToHalf(v);
  ASSERT_EQ(HalfToFloat(h), v) << "test scales must be exact halves";
  std::memcpy(b.data() + at, &h, 2);
}

std::vector<float> Decode(GgmlType type, const std::vector<uint8_t>& block, int64_t n) {
  std::vector<float> out(n, -12345.0f);
  absl::Status status = Dequantize(type, block.data(), out.data(), n);
  EXPECT_TRUE(status.ok()) << status;
  return out;
}

class Rng {
 public:
  explicit Rng(uint32_t seed) : gen_(seed) {}
  int Int(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(gen_); }

 private:
  std::mt19937 gen_;
};

// F16 decodes every half (NaNs, infinities, subnormals, both zeros) to exactly HalfToFloat's bits.
TEST(GgufQuants, F16DecodesEveryHalfAsHalfToFloat) {
  std::vector<uint8_t> halves(2 * 65536);
  for (uint32_t h = 0; h < 65536; ++h) {
    halves[2 * h] = static_cast<uint8_t>(h);
    halves[2 * h + 1] = static_cast<uint8_t>(h >> 8);
  }
  std::vector<float> got(65536);
  ASSERT_TRUE(Dequantize(GgmlType::kF16, halves.data(), got.data(), 65536).ok());
  for (uint32_t h = 0; h < 65536; ++h) {
    const float want = HalfToFloat(static_cast<uint16_t>(h));
    ASSERT_EQ(0, std::memcmp(&want, &got[h], sizeof(float))) << "half 0x" << std::hex << h;
  }
}

TEST(GgufQuants, Q4_0HandBlock) {
  std::vector<uint8_t> b(18, 0x88);  // every quant 8 -> 0
  PutHalf(b, 0, 0.5f);
  b[2 + 0] = 0x3a;   // element 0: 0xa - 8 = 2 -> 1.0; element 16: 3 - 8 = -5 -> -2.5
  b[2 + 15] = 0xf0;  // element 15: 0 - 8 -> -4.0; element 31: 15 - 8 -> 3.5
  std::vector<float> y = Decode(GgmlType::kQ4_0, b, 32);
  EXPECT_EQ(y[0], 1.0f);
  EXPECT_EQ(y[16], -2.5f);
  EXPECT_EQ(y[15], -4.0f);
  EXPECT_EQ(y[31], 3.5f);
  EXPECT_EQ(y[1], 0.0f);
}

// MXFP4 (ggml-common.h block_mxfp4, dequantize_row_mxfp4): e then qs[16]; element j < 16 is qs[j]'s low
// nibble, j + 16 its high one; value = kvalues_mxfp4[nibble] * 2^(e - 128), kvalues_mxfp4 = {0, 1, 2, 3, 4, 6,
// 8, 12, 0, -1, -2, -3, -4, -6, -8, -12} (E2M1 doubled).
TEST(GgufQuants, Mxfp4HandBlock) {
  std::vector<uint8_t> b(17, 0x00);
  b[0] = 130;        // 2^(130 - 128) = 4
  b[1 + 0] = 0x97;   // element 0: nibble 7 -> 12 * 4 = 48; element 16: nibble 9 -> -1 * 4 = -4
  b[1 + 15] = 0x8C;  // element 15: nibble 12 -> -4 * 4 = -16; element 31: nibble 8 -> -0
  b[1 + 3] = 0x52;   // element 3: nibble 2 -> 2 * 4 = 8; element 19: nibble 5 -> 6 * 4 = 24
  std::vector<float> y = Decode(GgmlType::kMXFP4, b, 32);
  EXPECT_EQ(y[0], 48.0f);
  EXPECT_EQ(y[16], -4.0f);
  EXPECT_EQ(y[15], -16.0f);
  EXPECT_EQ(y[31], 0.0f);
  EXPECT_EQ(y[3], 8.0f);
  EXPECT_EQ(y[19], 24.0f);
  EXPECT_EQ(y[1], 0.0f);
  // Every nibble, at the smallest exponents (ggml's subnormal 2^-128 and 2^-127) and a large one.
  const float table[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
  for (int e : {0, 1, 127, 200}) {
    for (int j = 0; j < 16; ++j) b[1 + j] = static_cast<uint8_t>(j | ((15 - j) << 4));
    b[0] = static_cast<uint8_t>(e);
    y = Decode(GgmlType::kMXFP4, b, 32);
    for (int j = 0; j < 16; ++j) {
      EXPECT_EQ(y[j], table[j] * std::ldexp(1.0f, e - 128)) << "e " << e << " nibble " << j;
      EXPECT_EQ(y[j + 16], table[15 - j] * std::ldexp(1.0f, e - 128)) << "e " << e << " nibble " << 15 - j;
    }
  }
  // The codes gguf::ReadMxfp4Codes gives decode to the same values.
  b[0] = 125;
  std::vector<int8_t> codes(32);
  int exponent = 0;
  ASSERT_TRUE(ReadMxfp4Codes(b.data(), 32, codes.data(), &exponent).ok());
  EXPECT_EQ(exponent, -3);
  y = Decode(GgmlType::kMXFP4, b, 32);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(y[i], codes[i] * 0.125f) << i;
  EXPECT_FALSE(ReadMxfp4Codes(b.data(), 16, codes.data(), &exponent).ok());
}

// The encoder (ggml's quantize_row_mxfp4_ref rule) keeps values already on the grid and stays within half a
// step of the others.
TEST(GgufQuants, Mxfp4EncodesOnGridValuesExactly) {
  std::vector<float> x(32);
  const float grid[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
  for (int i = 0; i < 32; ++i) x[i] = (i % 2 ? -1.0f : 1.0f) * grid[i % 8];
  std::vector<uint8_t> b(17);
  ASSERT_TRUE(Quantize(GgmlType::kMXFP4, x.data(), b.data(), 32).ok());
  EXPECT_EQ(b[0], 127);  // floor(log2(6)) - 2 + 127: scale 2^-1
  EXPECT_EQ(Decode(GgmlType::kMXFP4, b, 32), x);
  std::mt19937 gen(9);
  std::normal_distribution<float> normal(0.0f, 0.05f);
  for (float& v : x) v = normal(gen);
  ASSERT_TRUE(Quantize(GgmlType::kMXFP4, x.data(), b.data(), 32).ok());
  const std::vector<float> y = Decode(GgmlType::kMXFP4, b, 32);
  const float step = 2.0f * std::ldexp(1.0f, b[0] - 128);  // the widest gap (4 -> 6, 6 -> 8 doubled) / 2 * 2
  for (int i = 0; i < 32; ++i) EXPECT_LE(std::fabs(y[i] - x[i]), step) << i;
}

TEST(GgufQuants, Q4_1HandBlock) {
  std::vector<uint8_t> b(20, 0);
  PutHalf(b, 0, 0.25f);
  PutHalf(b, 2, -1.0f);
  b[4 + 5] = 0xf0;  // element 5: 0 * 0.25 - 1 = -1; element 21: 15 * 0.25 - 1 = 2.75
  std::vector<float> y = Decode(GgmlType::kQ4_1, b, 32);
  EXPECT_EQ(y[5], -1.0f);
  EXPECT_EQ(y[21], 2.75f);
  EXPECT_EQ(y[0], -1.0f);
}

TEST(GgufQuants, Q5_0HandBlock) {
  std::vector<uint8_t> b(22, 0);
  PutHalf(b, 0, 1.0f);
  const uint32_t qh = (1u << 3) | (1u << 20);
  std::memcpy(b.data() + 2, &qh, 4);
  b[6 + 3] = 0x21;
  b[6 + 4] = 0x21;
  std::vector<float> y = Decode(GgmlType::kQ5_0, b, 32);
  EXPECT_EQ(y[3], 1.0f);     // low nibble 1, fifth bit set: 17 - 16
  EXPECT_EQ(y[4], -15.0f);   // low nibble 1, fifth bit clear
  EXPECT_EQ(y[19], -14.0f);  // high nibble 2 of byte 3, bit 19 clear
  EXPECT_EQ(y[20], 2.0f);    // high nibble 2 of byte 4, bit 20 set: 18 - 16
}

TEST(GgufQuants, Q5_1HandBlock) {
  std::vector<uint8_t> b(24, 0);
  PutHalf(b, 0, 0.5f);
  PutHalf(b, 2, 2.0f);
  const uint32_t qh = 1u << 31;
  std::memcpy(b.data() + 4, &qh, 4);
  b[8 + 15] = 0xf7;
  std::vector<float> y = Decode(GgmlType::kQ5_1, b, 32);
  EXPECT_EQ(y[15], 7 * 0.5f + 2.0f);
  EXPECT_EQ(y[31], 31 * 0.5f + 2.0f);
}

TEST(GgufQuants, Q8_0HandBlock) {
  std::vector<uint8_t> b(34, 0);
  PutHalf(b, 0, 0.25f);
  b[2 + 7] = static_cast<uint8_t>(int8_t{-100});
  b[2 + 31] = 127;
  std::vector<float> y = Decode(GgmlType::kQ8_0, b, 32);
  EXPECT_EQ(y[7], -25.0f);
  EXPECT_EQ(y[31], 31.75f);
  EXPECT_EQ(y[0], 0.0f);
}

// Legacy formats over random blocks: element i's nibble is in byte i % 16 (low for i < 16), its fifth
// bit is bit i of qh.
TEST(GgufQuants, LegacyRandomBlocks) {
  Rng rng(1);
  for (int trial = 0; trial < 20; ++trial) {
    int q[32];
    for (int& v : q) v = rng.Int(0, 31);
    const float d = 0.125f * rng.Int(1, 16), m = -0.5f * rng.Int(0, 8);
    std::vector<uint8_t> q5_0(22, 0), q5_1(24, 0), q4_1(20, 0);
    PutHalf(q5_0, 0, d);
    PutHalf(q5_1, 0, d);
    PutHalf(q5_1, 2, m);
    PutHalf(q4_1, 0, d);
    PutHalf(q4_1, 2, m);
    uint32_t qh = 0;
    for (int i = 0; i < 32; ++i) {
      const int shift = 4 * (i / 16);
      q5_0[6 + i % 16] |= static_cast<uint8_t>((q[i] & 15) << shift);
      q5_1[8 + i % 16] |= static_cast<uint8_t>((q[i] & 15) << shift);
      q4_1[4 + i % 16] |= static_cast<uint8_t>((q[i] & 15) << shift);
      if (q[i] & 16) qh |= 1u << i;
    }
    std::memcpy(q5_0.data() + 2, &qh, 4);
    std::memcpy(q5_1.data() + 4, &qh, 4);
    std::vector<float> y50 = Decode(GgmlType::kQ5_0, q5_0, 32);
    std::vector<float> y51 = Decode(GgmlType::kQ5_1, q5_1, 32);
    std::vector<float> y41 = Decode(GgmlType::kQ4_1, q4_1, 32);
    for (int i = 0; i < 32; ++i) {
      ASSERT_EQ(y50[i], d * static_cast<float>(q[i] - 16)) << i;
      ASSERT_EQ(y51[i], d * static_cast<float>(q[i]) + m) << i;
      ASSERT_EQ(y41[i], d * static_cast<float>(q[i] & 15) + m) << i;
    }
  }
}

// Q2_K: 16 sub-blocks of 16; scales[s] = scale | min << 4; element i's two bits sit in
// qs[32 * (i / 128) + i % 32] at bit 2 * ((i / 32) % 4).
TEST(GgufQuants, Q2_K) {
  Rng rng(2);
  int sc[16], mn[16], q[256];
  for (int s = 0; s < 16; ++s) sc[s] = rng.Int(0, 15), mn[s] = rng.Int(0, 15);
  for (int& v : q) v = rng.Int(0, 3);
  std::vector<uint8_t> b(84, 0);
  for (int s = 0; s < 16; ++s) b[s] = static_cast<uint8_t>(sc[s] | (mn[s] << 4));
  for (int i = 0; i < 256; ++i) b[16 + 32 * (i / 128) + i % 32] |= static_cast<uint8_t>(q[i] << (2 * ((i / 32) % 4)));
  const float d = 0.5f, dmin = 0.25f;
  PutHalf(b, 80, d);
  PutHalf(b, 82, dmin);
  std::vector<float> y = Decode(GgmlType::kQ2_K, b, 256);
  for (int i = 0; i < 256; ++i) ASSERT_EQ(y[i], d * sc[i / 16] * q[i] - dmin * mn[i / 16]) << i;

  // One element by hand: element 200 is in sub-block 12 (scale 3, min 2), byte 16 + 32 + 8, bits 4-5.
  std::vector<uint8_t> h(84, 0);
  h[12] = 0x23;
  h[16 + 40] = 2 << 4;
  PutHalf(h, 80, 1.0f);
  PutHalf(h, 82, 0.5f);
  EXPECT_EQ(Decode(GgmlType::kQ2_K, h, 256)[200], 1.0f * 3 * 2 - 0.5f * 2);
}

// Q3_K: hmask bit for element i at hmask[i % 32] bit i / 32 (set: no -4 offset); low two bits as Q2_K;
// sixteen 6-bit scales stored +32: low nibbles in bytes 0-7 (s < 8 low half, else byte s - 8 high half),
// top bits in byte 8 + s % 4 at bit 2 * (s / 4).
TEST(GgufQuants, Q3_K) {
  Rng rng(3);
  int scale[16], q[256];
  for (int& s : scale) s = rng.Int(-32, 31);
  for (int& v : q) v = rng.Int(-4, 3);
  std::vector<uint8_t> b(110, 0);
  for (int i = 0; i < 256; ++i) {
    const int stored = q[i] + 4;  // 0..7; bit 2 set means "no offset"
    b[32 + 32 * (i / 128) + i % 32] |= static_cast<uint8_t>((stored & 3) << (2 * ((i / 32) % 4)));
    if (stored & 4) b[i % 32] |= static_cast<uint8_t>(1 << (i / 32));
  }
  for (int s = 0; s < 16; ++s) {
    const int stored = scale[s] + 32;
    b[96 + s % 8] |= static_cast<uint8_t>((stored & 15) << (s < 8 ? 0 : 4));
    b[96 + 8 + s % 4] |= static_cast<uint8_t>((stored >> 4) << (2 * (s / 4)));
  }
  const float d = 0.125f;
  PutHalf(b, 108, d);
  std::vector<float> y = Decode(GgmlType::kQ3_K, b, 256);
  for (int i = 0; i < 256; ++i) ASSERT_EQ(y[i], d * scale[i / 16] * q[i]) << i;

  // By hand: element 37 (sub-block 2, hmask[5] bit 1 clear, qs[5] bits 2-3 = 1 -> 1 - 4 = -3) with
  // scale 2 stored as 34 = 0b10'0010: byte 2 low nibble 2, byte 10 bits 0-1 = 2.
  std::vector<uint8_t> h(110, 0);
  h[32 + 5] = 1 << 2;
  h[96 + 2] = 0x02;
  h[96 + 10] = 0x02;
  PutHalf(h, 108, 1.0f);
  EXPECT_EQ(Decode(GgmlType::kQ3_K, h, 256)[37], 2.0f * -3.0f);
}

// Eight 6-bit (scale, min) pairs as q4_K and q5_K pack them: pairs 0-3 in the low six bits of bytes 0-3
// (scales) and 4-7 (mins); pairs 4-7 keep their low nibbles in bytes 8-11 (scale low, min high) and
// their top two bits in the top bits of bytes 0-3 (scales) and 4-7 (mins).
void PackK4Scales(const int* sc, const int* mn, uint8_t* out) {
  std::memset(out, 0, 12);
  for (int j = 0; j < 4; ++j) {
    out[j] = static_cast<uint8_t>(sc[j] | ((sc[j + 4] >> 4) << 6));
    out[j + 4] = static_cast<uint8_t>(mn[j] | ((mn[j + 4] >> 4) << 6));
    out[j + 8] = static_cast<uint8_t>((sc[j + 4] & 15) | ((mn[j + 4] & 15) << 4));
  }
}

// Q4_K: element i is nibble (i / 32) % 2 of qs[32 * (i / 64) + i % 32], in sub-block i / 32.
TEST(GgufQuants, Q4_K) {
  Rng rng(4);
  int sc[8], mn[8], q[256];
  for (int s = 0; s < 8; ++s) sc[s] = rng.Int(0, 63), mn[s] = rng.Int(0, 63);
  for (int& v : q) v = rng.Int(0, 15);
  std::vector<uint8_t> b(144, 0);
  const float d = 0.0625f, dmin = 0.5f;
  PutHalf(b, 0, d);
  PutHalf(b, 2, dmin);
  PackK4Scales(sc, mn, b.data() + 4);
  for (int i = 0; i < 256; ++i) b[16 + 32 * (i / 64) + i % 32] |= static_cast<uint8_t>(q[i] << (4 * ((i / 32) % 2)));
  std::vector<float> y = Decode(GgmlType::kQ4_K, b, 256);
  for (int i = 0; i < 256; ++i) ASSERT_EQ(y[i], d * sc[i / 32] * q[i] - dmin * mn[i / 32]) << i;

  // By hand: element 230 is sub-block 7 (pair 7: scale from byte 11 low nibble + byte 3 top bits, min
  // from byte 11 high nibble + byte 7 top bits) and the high nibble of qs[96 + 6].
  std::vector<uint8_t> h(144, 0);
  PutHalf(h, 0, 1.0f);
  PutHalf(h, 2, 1.0f);
  h[4 + 11] = 0x35;            // scale low 5, min low 3
  h[4 + 3] = 0x40;             // scale top bits 01 -> scale 16 + 5 = 21
  h[4 + 7] = 0x80;             // min top bits 10 -> min 32 + 3 = 35
  h[16 + 96 + 6] = 0x90;       // high nibble 9
  EXPECT_EQ(Decode(GgmlType::kQ4_K, h, 256)[230], 21.0f * 9 - 35.0f);
}

// Q5_K: as Q4_K plus a fifth bit for element i at qh[i % 32] bit i / 32.
TEST(GgufQuants, Q5_K) {
  Rng rng(5);
  int sc[8], mn[8], q[256];
  for (int s = 0; s < 8; ++s) sc[s] = rng.Int(0, 63), mn[s] = rng.Int(0, 63);
  for (int& v : q) v = rng.Int(0, 31);
  std::vector<uint8_t> b(176, 0);
  const float d = 0.25f, dmin = 0.125f;
  PutHalf(b, 0, d);
  PutHalf(b, 2, dmin);
  PackK4Scales(sc, mn, b.data() + 4);
  for (int i = 0; i < 256; ++i) {
    b[48 + 32 * (i / 64) + i % 32] |= static_cast<uint8_t>((q[i] & 15) << (4 * ((i / 32) % 2)));
    if (q[i] & 16) b[16 + i % 32] |= static_cast<uint8_t>(1 << (i / 32));
  }
  std::vector<float> y = Decode(GgmlType::kQ5_K, b, 256);
  for (int i = 0; i < 256; ++i) ASSERT_EQ(y[i], d * sc[i / 32] * q[i] - dmin * mn[i / 32]) << i;
}

// Q6_K: element i's low nibble is nibble (i % 128) / 64 of ql[64 * (i / 128) + i % 64], its top two bits
// are bits 2 * ((i % 128) / 32) of qh[32 * (i / 128) + i % 32]; stored +32; signed scale i / 16.
TEST(GgufQuants, Q6_K) {
  Rng rng(6);
  int scale[16], q[256];
  for (int& s : scale) s = rng.Int(-128, 127);
  for (int& v : q) v = rng.Int(-32, 31);
  std::vector<uint8_t> b(210, 0);
  for (int i = 0; i < 256; ++i) {
    const int stored = q[i] + 32;
    b[64 * (i / 128) + i % 64] |= static_cast<uint8_t>((stored & 15) << (4 * ((i % 128) / 64)));
    b[128 + 32 * (i / 128) + i % 32] |= static_cast<uint8_t>((stored >> 4) << (2 * ((i % 128) / 32)));
  }
  for (int s = 0; s < 16; ++s) b[192 + s] = static_cast<uint8_t>(static_cast<int8_t>(scale[s]));
  const float d = 0.03125f;
  PutHalf(b, 208, d);
  std::vector<float> y = Decode(GgmlType::kQ6_K, b, 256);
  for (int i = 0; i < 256; ++i) ASSERT_EQ(y[i], d * scale[i / 16] * q[i]) << i;

  // By hand: element 170 = 128 + 42: ql[64 + 42] low nibble (k = 1), qh[32 + 10] bits 2-3, scale 10.
  std::vector<uint8_t> h(210, 0);
  h[64 + 42] = 0x07;
  h[128 + 42] = 0x3 << 2;  // top bits 3 -> stored 48 + 7 = 55 -> q = 23
  h[192 + 10] = static_cast<uint8_t>(int8_t{-2});
  PutHalf(h, 208, 1.0f);
  EXPECT_EQ(Decode(GgmlType::kQ6_K, h, 256)[170], -2.0f * 23);
}

TEST(GgufQuants, DecodesConsecutiveBlocks) {
  // Three q8_0 blocks with different scales: the second block's elements use the second scale.
  std::vector<uint8_t> b(3 * 34, 1);
  PutHalf(b, 0, 1.0f);
  PutHalf(b, 34, 2.0f);
  PutHalf(b, 68, 4.0f);
  std::vector<float> y = Decode(GgmlType::kQ8_0, b, 96);
  EXPECT_EQ(y[31], 1.0f);
  EXPECT_EQ(y[32], 2.0f);
  EXPECT_EQ(y[95], 4.0f);
}

TEST(GgufQuants, FloatFormatsDecode) {
  const float values[3] = {1.5f, -0.25f, 1024.0f};
  std::vector<uint8_t> f32(12), f16(6), bf16(6);
  std::memcpy(f32.data(), values, 12);
  for (int i = 0; i < 3; ++i) {
    const uint16_t h = FloatToHalf(values[i]), b = FloatToBf16(values[i]);
    std::memcpy(f16.data() + 2 * i, &h, 2);
    std::memcpy(bf16.data() + 2 * i, &b, 2);
  }
  for (GgmlType type : {GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16}) {
    const std::vector<uint8_t>& src = type == GgmlType::kF32 ? f32 : type == GgmlType::kF16 ? f16 : bf16;
    std::vector<float> y = Decode(type, src, 3);
    for (int i = 0; i < 3; ++i) EXPECT_EQ(y[i], values[i]);
  }
}

// Quantize then dequantize stays within each format's step.
TEST(GgufQuants, QuantizeRoundTrip) {
  std::mt19937 gen(9);
  std::normal_distribution<float> dist(0.0f, 2.0f);
  const int64_t n = 32 * 8;
  std::vector<float> x(n);
  for (float& v : x) v = dist(gen);
  x[5] = 0.0f;
  for (GgmlType type : {GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16, GgmlType::kQ8_0, GgmlType::kQ4_0,
                        GgmlType::kQ4_1}) {
    SCOPED_TRACE(TypeName(static_cast<uint32_t>(type)));
    std::vector<uint8_t> q(*RowBytes(type, n));
    ASSERT_TRUE(Quantize(type, x.data(), q.data(), n).ok());
    std::vector<float> y = Decode(type, q, n);
    for (int64_t blk = 0; blk < n / 32; ++blk) {
      float amax = 0, lo = x[blk * 32], hi = x[blk * 32];
      for (int j = 0; j < 32; ++j) {
        amax = std::max(amax, std::fabs(x[blk * 32 + j]));
        lo = std::min(lo, x[blk * 32 + j]);
        hi = std::max(hi, x[blk * 32 + j]);
      }
      for (int j = 0; j < 32; ++j) {
        const int64_t i = blk * 32 + j;
        double tol = 0;
        switch (type) {
          case GgmlType::kF32: tol = 0; break;
          case GgmlType::kF16: tol = std::fabs(x[i]) * 0x1p-11; break;
          case GgmlType::kBF16: tol = std::fabs(x[i]) * 0x1p-8; break;
          case GgmlType::kQ8_0: tol = 0.51 * amax / 127 + amax * 0x1p-10; break;
          case GgmlType::kQ4_0: tol = 1.01 * amax / 8 + amax * 0x1p-9; break;
          default: tol = 0.51 * (hi - lo) / 15 + (std::fabs(lo) + std::fabs(hi)) * 0x1p-10; break;
        }
        ASSERT_LE(std::fabs(y[i] - x[i]), tol) << "element " << i << " " << x[i] << " -> " << y[i];
      }
    }
  }
}

// The K-quant encoders write blocks the decoders read back close to the input: on weights whose spread and
// centre change from one 16-weight sub-block to the next (so that a scale, min or code bit put in the wrong
// place shows), the relative RMS error stays within each format's bound (measured: q2_K 0.254, q3_K 0.144,
// q4_K 0.075, q5_K 0.039, q6_K 0.016), and no weight is off by more than its sub-block's range (or, for a
// narrow sub-block, a tenth of its super-block's widest, which sets the step of the quantized scales).
TEST(GgufQuants, KQuantEncodersRoundTrip) {
  std::mt19937 gen(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> spread(0.02f, 1.0f), centre(-0.5f, 0.5f);
  const int64_t n = 256 * 64;
  std::vector<float> x(n), sub_range(n / 16), super_range(n / 256, 0.0f);
  for (int64_t s = 0; s < n / 16; ++s) {
    const float scale = spread(gen), mid = s % 3 == 0 ? centre(gen) : 0.0f;
    float lo = 0, hi = 0;
    for (int i = 0; i < 16; ++i) {
      x[16 * s + i] = mid + scale * normal(gen);
      lo = std::min(lo, x[16 * s + i]);
      hi = std::max(hi, x[16 * s + i]);
    }
    sub_range[s] = hi - lo;
    super_range[s / 16] = std::max(super_range[s / 16], hi - lo);
  }
  x[100] = 0.0f;
  std::fill(x.begin() + 512, x.begin() + 768, 0.0f);  // a whole super-block of zeros
  const std::pair<GgmlType, double> bounds[] = {{GgmlType::kQ2_K, 0.30}, {GgmlType::kQ3_K, 0.17},
                                                {GgmlType::kQ4_K, 0.09}, {GgmlType::kQ5_K, 0.046},
                                                {GgmlType::kQ6_K, 0.02}};
  for (const auto& [type, bound] : bounds) {
    SCOPED_TRACE(TypeName(static_cast<uint32_t>(type)));
    std::vector<uint8_t> q(*RowBytes(type, n));
    ASSERT_TRUE(Quantize(type, x.data(), q.data(), n).ok());
    std::vector<float> y = Decode(type, q, n);
    double err2 = 0, ref2 = 0;
    for (int64_t i = 0; i < n; ++i) {
      err2 += (y[i] - x[i]) * (y[i] - x[i]);
      ref2 += x[i] * x[i];
      // Clipping and the scales' own quantization (q2_K's are 4-bit against the super-block's largest) cost
      // some weights more than half a step, never a sub-block's range against the super-block's.
      ASSERT_LE(std::fabs(y[i] - x[i]), std::max(sub_range[i / 16], 0.1f * super_range[i / 256])) << "element " << i;
      if (i >= 512 && i < 768) {
        ASSERT_EQ(y[i], 0.0f) << "element " << i;
      }
    }
    const double rel_rms = std::sqrt(err2 / ref2);
    std::printf("%s rel_rms %.4f\n", std::string(TypeName(static_cast<uint32_t>(type))).c_str(), rel_rms);
    EXPECT_LT(rel_rms, bound);
    EXPECT_GT(rel_rms, bound / 10);  // a format of these bits cannot be near-exact on Gaussian weights
    // Deterministic: the same input gives the same bytes.
    std::vector<uint8_t> again(q.size());
    ASSERT_TRUE(Quantize(type, x.data(), again.data(), n).ok());
    EXPECT_EQ(q, again);
  }
}

// q4_0, q4_1 and q4_K read as 4-bit codes with a scale and offset per 32: scale * code + offset is the
// decoder's value exactly (q4_0's d * (8 - 8) keeps d's sign on its zero, d * 8 - 8 d does not); other types
// are refused by name.
TEST(GgufQuants, Affine4CodesGiveTheDecodedValuesExactly) {
  std::mt19937 gen(12);
  std::normal_distribution<float> normal(0.0f, 0.05f);
  const int64_t n = 256 * 4;
  std::vector<float> x(n);
  for (float& v : x) v = normal(gen);
  for (GgmlType type : {GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ4_K}) {
    SCOPED_TRACE(TypeName(static_cast<uint32_t>(type)));
    ASSERT_TRUE(HasAffine4Codes(type));
    std::vector<uint8_t> q(*RowBytes(type, n));
    ASSERT_TRUE(Quantize(type, x.data(), q.data(), n).ok());
    const std::vector<float> y = Decode(type, q, n);
    std::vector<uint8_t> codes(n);
    std::vector<float> scale(n / 32), offset(n / 32);
    ASSERT_TRUE(ReadAffine4Codes(type, q.data(), n, codes.data(), scale.data(), offset.data()).ok());
    std::set<int> seen;
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_LE(codes[i], 15);
      seen.insert(codes[i]);
      const float value = scale[i / 32] * static_cast<float>(codes[i]) + offset[i / 32];
      if (y[i] != 0.0f) {
        ASSERT_EQ(std::bit_cast<uint32_t>(value), std::bit_cast<uint32_t>(y[i])) << "element " << i;
      }
      ASSERT_EQ(value, y[i]) << "element " << i;
    }
    EXPECT_EQ(seen.size(), 16u);
  }
  std::vector<uint8_t> codes(256), q(210);
  std::vector<float> scale(8), offset(8);
  EXPECT_FALSE(HasAffine4Codes(GgmlType::kQ6_K));
  EXPECT_THAT(ReadAffine4Codes(GgmlType::kQ6_K, q.data(), 256, codes.data(), scale.data(), offset.data()),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "q6_K does not store 4-bit affine codes"));
  EXPECT_THAT(ReadAffine4Codes(GgmlType::kQ4_K, q.data(), 100, codes.data(), scale.data(), offset.data()),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(GgufQuants, QuantizeRejectsNonFinite) {
  std::vector<float> x(32, 1.0f);
  x[3] = std::nanf("");
  std::vector<uint8_t> q(34);
  EXPECT_THAT(Quantize(GgmlType::kQ8_0, x.data(), q.data(), 32),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "element 3"));
}

TEST(GgufQuants, ZeroBlocksQuantizeToZero) {
  std::vector<float> x(256, 0.0f);
  for (GgmlType type : {GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ2_K, GgmlType::kQ3_K,
                        GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K}) {
    std::vector<uint8_t> q(*RowBytes(type, 256));
    ASSERT_TRUE(Quantize(type, x.data(), q.data(), 256).ok());
    for (float v : Decode(type, q, 256)) EXPECT_EQ(v, 0.0f);
  }
}

}  // namespace
}  // namespace strata::gguf
