#ifndef STRATA_KERNELS_FORMAT_FP16_H_
#define STRATA_KERNELS_FORMAT_FP16_H_

// The project's one set of number conversions: IEEE binary16 and bfloat16 <-> binary32, in portable code,
// bit-identical to F16C's vcvtph2ps and vcvtps2ph with round-to-nearest-even (and to CUDA's __half2float
// and __float2half_rn). Used by the CPU kernels, the GGUF reader and writer, packs and the tests.

#include <cstdint>
#include <cstring>

namespace strata::kernels {

// Exact widening (every half is a float); NaN payloads are kept in the top mantissa bits.
inline float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1Fu;
  uint32_t man = h & 0x3FFu;
  uint32_t bits;
  if (exp == 0x1F) {
    bits = sign | 0x7F800000u | (man << 13) | (man != 0 ? 0x00400000u : 0u);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  } else if (man == 0) {
    bits = sign;
  } else {
    // Subnormal: normalise the mantissa.
    exp = 113;
    while ((man & 0x400u) == 0) {
      man <<= 1;
      --exp;
    }
    bits = sign | (exp << 23) | ((man & 0x3FFu) << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// Round-to-nearest-even narrowing; overflow gives infinity, NaN stays NaN (quiet).
inline uint16_t FloatToHalf(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t abs = bits & 0x7FFFFFFFu;
  if (abs >= 0x7F800000u) {  // inf or NaN
    return sign | 0x7C00u | (abs > 0x7F800000u ? static_cast<uint16_t>(0x200u | ((abs >> 13) & 0x3FFu)) : 0);
  }
  if (abs >= 0x477FF000u) return sign | 0x7C00u;  // rounds to >= 65520: infinity
  if (abs < 0x38800000u) {
    // Result is subnormal or zero: value = abs_float * 2^24 half-ulps, rounded to nearest even.
    if (abs < 0x33000000u) return sign;  // below half the smallest subnormal (ties at exactly 2^-25 -> 0)
    const uint32_t exp = abs >> 23;
    const uint32_t man = (abs & 0x7FFFFFu) | 0x800000u;
    const uint32_t shift = 126 - exp;  // 14 .. 24
    uint32_t result = man >> shift;
    const uint32_t rem = man & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (result & 1u))) ++result;
    return sign | static_cast<uint16_t>(result);
  }
  // Normal: rebias the exponent and round the mantissa to 10 bits.
  uint32_t result = ((abs >> 23) - 112) << 10 | ((abs >> 13) & 0x3FFu);
  const uint32_t rem = abs & 0x1FFFu;
  if (rem > 0x1000u || (rem == 0x1000u && (result & 1u))) ++result;  // may carry into the exponent
  return sign | static_cast<uint16_t>(result);
}

// bfloat16 is the top half of a binary32: widening is exact.
inline float Bf16ToFloat(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// Round-to-nearest-even narrowing; NaN stays a quiet NaN.
inline uint16_t FloatToBf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);
  const uint32_t odd = (bits >> 16) & 1u;
  return static_cast<uint16_t>((bits + 0x7FFFu + odd) >> 16);
}

// Little-endian 16-bit loads and stores at any alignment (half and bf16 fields in packed blocks).
inline uint16_t LoadHalf(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
inline void StoreHalf(uint16_t h, uint8_t* p) {
  p[0] = static_cast<uint8_t>(h);
  p[1] = static_cast<uint8_t>(h >> 8);
}

}  // namespace strata::kernels

#endif  // STRATA_KERNELS_FORMAT_FP16_H_
