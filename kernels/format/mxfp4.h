#ifndef STRATA_KERNELS_FORMAT_MXFP4_H_
#define STRATA_KERNELS_FORMAT_MXFP4_H_

// MXFP4's numbers (OCP Microscaling FP4), the one definition for GGUF's MXFP4 blocks (engine/gguf) and the
// mxfp4 pack scheme (scheme.h): a 4-bit code is an E2M1 value, kept doubled as an integer level, and a block
// of 32 shares an exponent byte e that scales the levels by 2^(e - 128) (ggml's GGML_E8M0_TO_FP32_HALF: half
// of E8M0's 2^(e - 127), because the levels are doubled). Pure and thread-safe.

#include <cstdint>
#include <cstring>

#include "kernels/format/scheme.h"  // STRATA_HOST_DEVICE

namespace strata::kernels {

// Twice the E2M1 value of each code (ggml's kvalues_mxfp4): codes 8..15 are the negatives of 0..7.
inline constexpr int8_t kMxfp4Levels[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

// 2^(e - 128), exact in float for every byte (e = 0 and 1 are subnormal floats). CUDA kernels call it too.
STRATA_HOST_DEVICE inline float Mxfp4Scale(uint8_t e) {
  const uint32_t bits = e >= 2 ? (static_cast<uint32_t>(e) - 1u) << 23 : 0x00200000u << e;
  float d;
  std::memcpy(&d, &bits, sizeof d);
  return d;
}

// The exponent byte e whose Mxfp4Scale is d, or -1 when d is no such power of two.
inline int Mxfp4ExponentOf(float d) {
  uint32_t bits;
  std::memcpy(&bits, &d, sizeof bits);
  if (bits == 0x00200000u) return 0;
  if (bits == 0x00400000u) return 1;
  const uint32_t field = bits >> 23;
  if ((bits & 0x007FFFFFu) != 0 || field < 1 || field > 254) return -1;
  return static_cast<int>(field) + 1;
}

}  // namespace strata::kernels

#endif  // STRATA_KERNELS_FORMAT_MXFP4_H_
