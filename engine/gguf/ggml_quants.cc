#include "engine/gguf/ggml_quants.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/cpu/cpu_features.h"
#include "kernels/format/mxfp4.h"

namespace strata::gguf::internal {
namespace {

// Blocks are packed byte arrays; fields are read by offset with memcpy so no alignment is assumed.
uint16_t LoadU16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

uint32_t LoadU32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

float LoadHalf(const uint8_t* p) { return HalfToFloat(LoadU16(p)); }

void StoreHalf(uint8_t* p, float f) {
  const uint16_t h = FloatToHalf(f);
  std::memcpy(p, &h, sizeof(h));
}

// Legacy 32-element blocks. Element j (j < 16) uses the low nibble of qs[j]; element j + 16 the high one.

void DecodeQ4_0(const uint8_t* b, float* y) {  // d:f16, qs[16]
  const float d = LoadHalf(b);
  const uint8_t* qs = b + 2;
  for (int j = 0; j < 16; ++j) {
    y[j] = d * static_cast<float>((qs[j] & 0x0f) - 8);
    y[j + 16] = d * static_cast<float>((qs[j] >> 4) - 8);
  }
}

void DecodeQ4_1(const uint8_t* b, float* y) {  // d:f16, m:f16, qs[16]
  const float d = LoadHalf(b);
  const float m = LoadHalf(b + 2);
  const uint8_t* qs = b + 4;
  for (int j = 0; j < 16; ++j) {
    y[j] = d * static_cast<float>(qs[j] & 0x0f) + m;
    y[j + 16] = d * static_cast<float>(qs[j] >> 4) + m;
  }
}

// Q5: bit j of the 32-bit qh is the fifth bit of element j.
void DecodeQ5_0(const uint8_t* b, float* y) {  // d:f16, qh[4], qs[16]
  const float d = LoadHalf(b);
  const uint32_t qh = LoadU32(b + 2);
  const uint8_t* qs = b + 6;
  for (int j = 0; j < 16; ++j) {
    const int lo = (qs[j] & 0x0f) | static_cast<int>(((qh >> j) & 1) << 4);
    const int hi = (qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1) << 4);
    y[j] = d * static_cast<float>(lo - 16);
    y[j + 16] = d * static_cast<float>(hi - 16);
  }
}

void DecodeQ5_1(const uint8_t* b, float* y) {  // d:f16, m:f16, qh[4], qs[16]
  const float d = LoadHalf(b);
  const float m = LoadHalf(b + 2);
  const uint32_t qh = LoadU32(b + 4);
  const uint8_t* qs = b + 8;
  for (int j = 0; j < 16; ++j) {
    const int lo = (qs[j] & 0x0f) | static_cast<int>(((qh >> j) & 1) << 4);
    const int hi = (qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1) << 4);
    y[j] = d * static_cast<float>(lo) + m;
    y[j + 16] = d * static_cast<float>(hi) + m;
  }
}

void DecodeQ8_0(const uint8_t* b, float* y) {  // d:f16, qs[32] int8
  const float d = LoadHalf(b);
  for (int j = 0; j < 32; ++j) y[j] = d * static_cast<float>(static_cast<int8_t>(b[2 + j]));
}

// K-quants: 256-element super-blocks of 16 or 8 sub-blocks, each with its own scale.

// Q2_K: scales[16] (low nibble scale, high nibble min), qs[64], d:f16, dmin:f16. Element
// 128h + 32j + l (h < 2, j < 4, l < 32) is bits 2j..2j+1 of qs[32h + l], in sub-block 8h + 2j + l/16.
void DecodeQ2_K(const uint8_t* b, float* y) {
  const uint8_t* scales = b;
  const uint8_t* qs = b + 16;
  const float d = LoadHalf(b + 80);
  const float dmin = LoadHalf(b + 82);
  for (int h = 0; h < 2; ++h) {
    for (int j = 0; j < 4; ++j) {
      for (int l = 0; l < 32; ++l) {
        const uint8_t sc = scales[8 * h + 2 * j + l / 16];
        const int q = (qs[32 * h + l] >> (2 * j)) & 3;
        y[128 * h + 32 * j + l] = d * static_cast<float>(sc & 0x0f) * static_cast<float>(q) -
                                  dmin * static_cast<float>(sc >> 4);
      }
    }
  }
}

// Q3_K's sixteen 6-bit scales (stored biased by 32): low nibbles in bytes 0-7 (scales 0-7 low half,
// scales 8-15 high half), top two bits in bytes 8-11 (byte 8 + i % 4, bit pair i / 4).
int Q3Scale(const uint8_t* packed, int i) {
  const int low = i < 8 ? (packed[i] & 0x0f) : (packed[i - 8] >> 4);
  const int high = (packed[8 + i % 4] >> (2 * (i / 4))) & 3;
  return (low | (high << 4)) - 32;
}

// Q3_K: hmask[32], qs[64], scales[12], d:f16. Element 128h + 32j + l takes its two low bits like Q2_K and
// its third bit from hmask[l] bit 4h + j; a clear bit subtracts 4.
void DecodeQ3_K(const uint8_t* b, float* y) {
  const uint8_t* hmask = b;
  const uint8_t* qs = b + 32;
  const uint8_t* scales = b + 96;
  const float d = LoadHalf(b + 108);
  for (int h = 0; h < 2; ++h) {
    for (int j = 0; j < 4; ++j) {
      for (int l = 0; l < 32; ++l) {
        const int scale = Q3Scale(scales, 8 * h + 2 * j + l / 16);
        int q = (qs[32 * h + l] >> (2 * j)) & 3;
        if ((hmask[l] & (1 << (4 * h + j))) == 0) q -= 4;
        y[128 * h + 32 * j + l] = d * static_cast<float>(scale) * static_cast<float>(q);
      }
    }
  }
}

// Q4_K/Q5_K pack eight 6-bit (scale, min) pairs into 12 bytes: pairs 0-3 are the low six bits of bytes
// 0-3 and 4-7; pairs 4-7 take a nibble of bytes 8-11 and their top two bits from the spare bits of
// bytes 0-7.
void K4ScaleMin(const uint8_t* packed, int i, int* scale, int* min) {
  if (i < 4) {
    *scale = packed[i] & 63;
    *min = packed[i + 4] & 63;
  } else {
    *scale = (packed[i + 4] & 0x0f) | ((packed[i - 4] >> 6) << 4);
    *min = (packed[i + 4] >> 4) | ((packed[i] >> 6) << 4);
  }
}

// Q4_K: d:f16, dmin:f16, scales[12], qs[128]. Element 64g + l (l < 32) is the low nibble of qs[32g + l]
// in sub-block 2g; element 64g + 32 + l the high nibble, sub-block 2g + 1.
void DecodeQ4_K(const uint8_t* b, float* y) {
  const float d = LoadHalf(b);
  const float dmin = LoadHalf(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qs = b + 16;
  for (int g = 0; g < 4; ++g) {
    for (int half = 0; half < 2; ++half) {
      int sc, m;
      K4ScaleMin(scales, 2 * g + half, &sc, &m);
      const float dl = d * static_cast<float>(sc);
      const float ml = dmin * static_cast<float>(m);
      for (int l = 0; l < 32; ++l) {
        const int q = half == 0 ? (qs[32 * g + l] & 0x0f) : (qs[32 * g + l] >> 4);
        y[64 * g + 32 * half + l] = dl * static_cast<float>(q) - ml;
      }
    }
  }
}

// Q5_K: d:f16, dmin:f16, scales[12], qh[32], qs[128]. As Q4_K, plus a fifth bit for element
// 64g + 32*half + l from qh[l] bit 2g + half.
void DecodeQ5_K(const uint8_t* b, float* y) {
  const float d = LoadHalf(b);
  const float dmin = LoadHalf(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qh = b + 16;
  const uint8_t* qs = b + 48;
  for (int g = 0; g < 4; ++g) {
    for (int half = 0; half < 2; ++half) {
      int sc, m;
      K4ScaleMin(scales, 2 * g + half, &sc, &m);
      const float dl = d * static_cast<float>(sc);
      const float ml = dmin * static_cast<float>(m);
      for (int l = 0; l < 32; ++l) {
        int q = half == 0 ? (qs[32 * g + l] & 0x0f) : (qs[32 * g + l] >> 4);
        if (qh[l] & (1 << (2 * g + half))) q += 16;
        y[64 * g + 32 * half + l] = dl * static_cast<float>(q) - ml;
      }
    }
  }
}

// Q6_K: ql[128], qh[64], scales[16] int8, d:f16. In half h, element 128h + 32k + l (k < 4, l < 32) has
// its low nibble from ql[64h + l + 32*(k & 1)] (low nibble for k < 2, high for k >= 2) and its top two
// bits from qh[32h + l] bits 2k..2k+1; stored biased by 32; scale index 8h + 2k + l/16.
void DecodeQ6_K(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const int8_t* scales = reinterpret_cast<const int8_t*>(b + 192);
  const float d = LoadHalf(b + 208);
  for (int h = 0; h < 2; ++h) {
    for (int k = 0; k < 4; ++k) {
      for (int l = 0; l < 32; ++l) {
        const uint8_t low_byte = ql[64 * h + l + 32 * (k & 1)];
        const int low = k < 2 ? (low_byte & 0x0f) : (low_byte >> 4);
        const int high = (qh[32 * h + l] >> (2 * k)) & 3;
        const int q = (low | (high << 4)) - 32;
        const int scale = scales[8 * h + 2 * k + l / 16];
        y[128 * h + 32 * k + l] = d * static_cast<float>(scale) * static_cast<float>(q);
      }
    }
  }
}

// Encoders (round to nearest; enough fidelity for test models).

// Clamps then rounds half away from zero; inputs are finite (checked by the caller).
int RoundClamp(float v, int lo, int hi) {
  const float clamped = std::clamp(v, static_cast<float>(lo), static_cast<float>(hi));
  return static_cast<int>(std::lround(clamped));
}

void EncodeQ8_0(const float* x, uint8_t* b) {
  float amax = 0.0f;
  for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float d = amax / 127.0f;
  const float inv = d > 0.0f ? 1.0f / d : 0.0f;
  StoreHalf(b, d);
  for (int j = 0; j < 32; ++j) b[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(RoundClamp(x[j] * inv, -127, 127)));
}

// Q4_0 maps the element of largest magnitude to -8, so the block's range is [-8d, 7d] with d of either sign.
void EncodeQ4_0(const float* x, uint8_t* b) {
  float extreme = 0.0f;
  for (int j = 0; j < 32; ++j) {
    if (std::fabs(x[j]) > std::fabs(extreme)) extreme = x[j];
  }
  const float d = extreme / -8.0f;
  const float inv = d != 0.0f ? 1.0f / d : 0.0f;
  StoreHalf(b, d);
  for (int j = 0; j < 16; ++j) {
    const int lo = RoundClamp(x[j] * inv + 8.0f, 0, 15);
    const int hi = RoundClamp(x[j + 16] * inv + 8.0f, 0, 15);
    b[2 + j] = static_cast<uint8_t>(lo | (hi << 4));
  }
}

void EncodeQ4_1(const float* x, uint8_t* b) {
  float lo = x[0], hi = x[0];
  for (int j = 1; j < 32; ++j) {
    lo = std::min(lo, x[j]);
    hi = std::max(hi, x[j]);
  }
  const float d = (hi - lo) / 15.0f;
  const float inv = d > 0.0f ? 1.0f / d : 0.0f;
  StoreHalf(b, d);
  StoreHalf(b + 2, lo);
  for (int j = 0; j < 16; ++j) {
    const int q0 = RoundClamp((x[j] - lo) * inv, 0, 15);
    const int q1 = RoundClamp((x[j + 16] - lo) * inv, 0, 15);
    b[4 + j] = static_cast<uint8_t>(q0 | (q1 << 4));
  }
}

// MXFP4 (ggml type 39, ggml-common.h block_mxfp4): e (an E8M0 exponent byte), qs[16]; element j < 16 is
// the low nibble of qs[j], element j + 16 the high one. A nibble is an E2M1 value, doubled in ggml's table
// kvalues_mxfp4, and the scale is ggml_e8m0_to_fp32_half(e) = 2^(e - 128) (2^-128 and 2^-127, subnormal,
// for e = 0 and 1), so element = kvalues_mxfp4[nibble] * 2^(e - 128) (dequantize_row_mxfp4); the table and
// the scale are kernels/format/mxfp4.h's.
using kernels::Mxfp4Scale;
constexpr const int8_t* kMxfp4Values = kernels::kMxfp4Levels;

void DecodeMxfp4(const uint8_t* b, float* y) {
  const float d = Mxfp4Scale(b[0]);
  for (int j = 0; j < 16; ++j) {
    y[j] = kMxfp4Values[b[1 + j] & 0x0F] * d;
    y[j + 16] = kMxfp4Values[b[1 + j] >> 4] * d;
  }
}

// As ggml's quantize_row_mxfp4_ref: e = floor(log2(amax)) - 2 + 127 (so 2^(e - 128) * 12 is about amax),
// each element the nearest table value (the first of equals).
void EncodeMxfp4(const float* x, uint8_t* b) {
  float amax = 0.0f;
  for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
  const int e = amax > 0.0f ? std::clamp(static_cast<int>(std::floor(std::log2(amax))) - 2 + 127, 0, 254) : 0;
  b[0] = static_cast<uint8_t>(e);
  const float d = Mxfp4Scale(b[0]);
  auto nearest = [&](float v) {
    int best = 0;
    for (int i = 1; i < 16; ++i) {
      if (std::fabs(kMxfp4Values[i] * d - v) < std::fabs(kMxfp4Values[best] * d - v)) best = i;
    }
    return best;
  };
  for (int j = 0; j < 16; ++j) b[1 + j] = static_cast<uint8_t>(nearest(x[j]) | (nearest(x[j + 16]) << 4));
}

using BlockDecoder = void (*)(const uint8_t*, float*);

struct Codec {
  BlockDecoder decode;
  int block_size;
  int type_size;
};

bool FindDecoder(GgmlType type, Codec* codec) {
  switch (type) {
    case GgmlType::kQ4_0: *codec = {DecodeQ4_0, 32, 18}; return true;
    case GgmlType::kQ4_1: *codec = {DecodeQ4_1, 32, 20}; return true;
    case GgmlType::kQ5_0: *codec = {DecodeQ5_0, 32, 22}; return true;
    case GgmlType::kQ5_1: *codec = {DecodeQ5_1, 32, 24}; return true;
    case GgmlType::kQ8_0: *codec = {DecodeQ8_0, 32, 34}; return true;
    case GgmlType::kMXFP4: *codec = {DecodeMxfp4, 32, 17}; return true;
    case GgmlType::kQ2_K: *codec = {DecodeQ2_K, 256, 84}; return true;
    case GgmlType::kQ3_K: *codec = {DecodeQ3_K, 256, 110}; return true;
    case GgmlType::kQ4_K: *codec = {DecodeQ4_K, 256, 144}; return true;
    case GgmlType::kQ5_K: *codec = {DecodeQ5_K, 256, 176}; return true;
    case GgmlType::kQ6_K: *codec = {DecodeQ6_K, 256, 210}; return true;
    default: return false;
  }
}

// Every half's float, built once from HalfToFloat (so exactly its values): decoding an f16 source, the bulk
// of what convert reads, is then one table load a weight instead of HalfToFloat's branches.
const float* HalfTable() {
  static const float* const table = [] {
    auto* t = new float[65536];
    for (uint32_t h = 0; h < 65536; ++h) t[h] = HalfToFloat(static_cast<uint16_t>(h));
    return t;
  }();
  return table;
}

// n halves to floats with F16C, eight at a time, the rest through the table: HalfTable's floats for every
// half (F16C also keeps NaN payloads and makes them quiet). Call only where the CPU has AVX2, which
// GetCpuFeatures reports only with F16C.
__attribute__((target("avx,f16c"))) void HalvesToFloatsF16c(const uint8_t* src, int64_t n, float* dst) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 2 * i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
  }
  const float* table = HalfTable();
  for (; i < n; ++i) dst[i] = table[LoadU16(src + 2 * i)];
}

}  // namespace

void ReadMxfp4Blocks(const uint8_t* src, int64_t n_blocks, int8_t* values, int* exponents) {
  for (int64_t i = 0; i < n_blocks; ++i) {
    const uint8_t* b = src + 17 * i;
    exponents[i] = static_cast<int>(b[0]) - 128;
    for (int j = 0; j < 16; ++j) {
      values[32 * i + j] = kMxfp4Values[b[1 + j] & 0x0F];
      values[32 * i + j + 16] = kMxfp4Values[b[1 + j] >> 4];
    }
  }
}

bool DequantizeBlocks(GgmlType type, const uint8_t* src, float* dst, int64_t n_blocks) {
  switch (type) {
    case GgmlType::kF32:
      std::memcpy(dst, src, static_cast<size_t>(n_blocks) * sizeof(float));
      return true;
    case GgmlType::kF16: {
      if (kernels::GetCpuFeatures().avx2) {
        HalvesToFloatsF16c(src, n_blocks, dst);
        return true;
      }
      const float* table = HalfTable();
      for (int64_t i = 0; i < n_blocks; ++i) dst[i] = table[LoadU16(src + 2 * i)];
      return true;
    }
    case GgmlType::kBF16:
      for (int64_t i = 0; i < n_blocks; ++i) dst[i] = Bf16ToFloat(LoadU16(src + 2 * i));
      return true;
    default:
      break;
  }
  Codec codec;
  if (!FindDecoder(type, &codec)) return false;
  for (int64_t i = 0; i < n_blocks; ++i) {
    codec.decode(src + i * codec.type_size, dst + i * codec.block_size);
  }
  return true;
}

// Q4_0 decodes d * (q - 8), which equals d * q + (-8 d) exactly: d is a half, so both products and their
// sum are exact in float (only a zero's sign can differ: d * 0 keeps d's, d * 8 - 8 d is +0). Q4_1 decodes d * q + m, Q4_K dl * q - ml: the same operations.
bool ReadAffine4Blocks(GgmlType type, const uint8_t* src, int64_t n_blocks, uint8_t* codes, float* scale,
                       float* offset) {
  for (int64_t i = 0; i < n_blocks; ++i) {
    switch (type) {
      case GgmlType::kQ4_0:
      case GgmlType::kQ4_1: {
        const uint8_t* b = src + i * (type == GgmlType::kQ4_0 ? 18 : 20);
        const uint8_t* qs = b + (type == GgmlType::kQ4_0 ? 2 : 4);
        const float d = LoadHalf(b);
        scale[i] = d;
        offset[i] = type == GgmlType::kQ4_0 ? -8.0f * d : LoadHalf(b + 2);
        for (int j = 0; j < 16; ++j) {
          codes[32 * i + j] = qs[j] & 0x0f;
          codes[32 * i + j + 16] = qs[j] >> 4;
        }
        break;
      }
      case GgmlType::kQ4_K: {  // layout as in DecodeQ4_K
        const uint8_t* b = src + i * 144;
        const float d = LoadHalf(b);
        const float dmin = LoadHalf(b + 2);
        const uint8_t* qs = b + 16;
        for (int sub = 0; sub < 8; ++sub) {
          int sc, m;
          K4ScaleMin(b + 4, sub, &sc, &m);
          scale[8 * i + sub] = d * static_cast<float>(sc);
          offset[8 * i + sub] = -(dmin * static_cast<float>(m));
          const int g = sub / 2, half = sub % 2;
          for (int l = 0; l < 32; ++l) {
            codes[256 * i + 32 * sub + l] = half == 0 ? (qs[32 * g + l] & 0x0f) : (qs[32 * g + l] >> 4);
          }
        }
        break;
      }
      default:
        return false;
    }
  }
  return true;
}

bool QuantizeBlocks(GgmlType type, const float* src, uint8_t* dst, int64_t n_blocks) {
  switch (type) {
    case GgmlType::kF32:
      std::memcpy(dst, src, static_cast<size_t>(n_blocks) * sizeof(float));
      return true;
    case GgmlType::kF16:
      for (int64_t i = 0; i < n_blocks; ++i) {
        const uint16_t h = FloatToHalf(src[i]);
        std::memcpy(dst + 2 * i, &h, sizeof(h));
      }
      return true;
    case GgmlType::kBF16:
      for (int64_t i = 0; i < n_blocks; ++i) {
        const uint16_t h = FloatToBf16(src[i]);
        std::memcpy(dst + 2 * i, &h, sizeof(h));
      }
      return true;
    case GgmlType::kQ8_0:
      for (int64_t i = 0; i < n_blocks; ++i) EncodeQ8_0(src + 32 * i, dst + 34 * i);
      return true;
    case GgmlType::kQ4_0:
      for (int64_t i = 0; i < n_blocks; ++i) EncodeQ4_0(src + 32 * i, dst + 18 * i);
      return true;
    case GgmlType::kQ4_1:
      for (int64_t i = 0; i < n_blocks; ++i) EncodeQ4_1(src + 32 * i, dst + 20 * i);
      return true;
    case GgmlType::kMXFP4:
      for (int64_t i = 0; i < n_blocks; ++i) EncodeMxfp4(src + 32 * i, dst + 17 * i);
      return true;
    default:
      break;
  }
  void (*encode)(const float*, uint8_t*) = nullptr;
  Codec codec;
  switch (type) {
    case GgmlType::kQ2_K: encode = EncodeQ2_K; break;
    case GgmlType::kQ3_K: encode = EncodeQ3_K; break;
    case GgmlType::kQ4_K: encode = EncodeQ4_K; break;
    case GgmlType::kQ5_K: encode = EncodeQ5_K; break;
    case GgmlType::kQ6_K: encode = EncodeQ6_K; break;
    default: return false;
  }
  if (!FindDecoder(type, &codec)) return false;
  for (int64_t i = 0; i < n_blocks; ++i) encode(src + 256 * i, dst + codec.type_size * i);
  return true;
}

}  // namespace strata::gguf::internal
