// Encoders of the K-quant super-blocks (q2_K .. q6_K), the layouts their decoders in ggml_quants.cc read.
//
// Each super-block of 256 weights is fitted sub-block by sub-block (candidate ranges, each refined by least
// squares, the least squared error winning); the sub-block scales (and mins) are then quantized to the
// format's 4, 6 or 8 bits against the super-block's fp16 scale, and every code is chosen again against the
// quantized scales. This is not ggml's search, but it writes the same grids with the same constraints (mins
// are never negative, a sub-block's codes need not reach both ends), which is what a converter reading a
// real K-quant file meets.

#include <algorithm>
#include <cmath>
#include <cstring>

#include "engine/gguf/ggml_quants.h"

namespace strata::gguf::internal {
namespace {

void StoreHalfAt(uint8_t* p, float f) {
  const uint16_t h = FloatToHalf(f);
  std::memcpy(p, &h, sizeof(h));
}

float Half(float f) { return HalfToFloat(FloatToHalf(f)); }

int RoundClampInt(float v, int lo, int hi) {
  const float clamped = std::clamp(v, static_cast<float>(lo), static_cast<float>(hi));
  return static_cast<int>(std::lround(clamped));
}

// One sub-block's grid: x ~ scale * q + offset.
struct SubBlockFit {
  float scale = 0;
  float offset = 0;
};

// Squared error of x against scale * q + offset, the codes rounded on the grid (lo, hi the code range).
float GridError(const float* x, int n, float scale, float offset, int lo, int hi) {
  float err = 0;
  for (int i = 0; i < n; ++i) {
    const int q = scale != 0 ? RoundClampInt((x[i] - offset) / scale, lo, hi) : 0;
    const float e = scale * static_cast<float>(q) + offset - x[i];
    err += e * e;
  }
  return err;
}

// The least-squares scale and offset for the codes the grid (scale, offset) gives x; with `fixed_offset`
// the offset stays and only the scale is solved. Returns false when the codes are all equal.
bool RefineGrid(const float* x, int n, int lo, int hi, bool fixed_offset, SubBlockFit* fit) {
  double sq = 0, sqq = 0, sx = 0, sqx = 0;
  for (int i = 0; i < n; ++i) {
    const int q = fit->scale != 0 ? RoundClampInt((x[i] - fit->offset) / fit->scale, lo, hi) : 0;
    sq += q;
    sqq += static_cast<double>(q) * q;
    sx += x[i];
    sqx += static_cast<double>(q) * x[i];
  }
  if (fixed_offset) {
    if (sqq <= 0) return false;
    fit->scale = static_cast<float>((sqx - fit->offset * sq) / sqq);
    return true;
  }
  const double det = n * sqq - sq * sq;
  if (det <= 0) return false;
  fit->scale = static_cast<float>((n * sqx - sq * sx) / det);
  fit->offset = static_cast<float>((sqq * sx - sq * sqx) / det);
  return true;
}

// Affine sub-block: x ~ scale * q + offset, q in 0..qmax, scale >= 0 and offset <= 0 (K-quants store the
// offset as a non-negative min that is subtracted).
SubBlockFit FitAffine(const float* x, int n, int qmax) {
  float lo = 0, hi = 0;
  for (int i = 0; i < n; ++i) lo = std::min(lo, x[i]), hi = std::max(hi, x[i]);
  SubBlockFit best{(hi - lo) / static_cast<float>(qmax), lo};
  if (best.scale == 0) return best;
  float best_err = GridError(x, n, best.scale, best.offset, 0, qmax);
  // The full range and ranges shrunk by 4% steps from either end (clipping outliers), each refined.
  for (int k = 0; k < 7; ++k) {
    for (int end = 0; end < 2; ++end) {
      const float cut = 0.04f * static_cast<float>(k) * (hi - lo);
      const float l = end == 0 ? lo + cut : lo, h = end == 0 ? hi : hi - cut;
      SubBlockFit fit{(h - l) / static_cast<float>(qmax), std::min(l, 0.0f)};
      if (!RefineGrid(x, n, 0, qmax, false, &fit)) continue;
      if (fit.offset > 0) {  // a positive offset cannot be stored: solve the scale with offset 0
        fit.offset = 0;
        if (!RefineGrid(x, n, 0, qmax, true, &fit)) continue;
      }
      if (!(fit.scale > 0)) continue;
      const float err = GridError(x, n, fit.scale, fit.offset, 0, qmax);
      if (err < best_err) best_err = err, best = fit;
    }
  }
  return best;
}

// Symmetric sub-block: x ~ scale * q, q in -(qmax + 1)..qmax, scale of either sign.
float FitSymmetric(const float* x, int n, int qmax) {
  float extreme = 0;
  for (int i = 0; i < n; ++i) {
    if (std::fabs(x[i]) > std::fabs(extreme)) extreme = x[i];
  }
  if (extreme == 0) return 0;
  const int qmin = -qmax - 1;
  float best = extreme / static_cast<float>(qmin);  // the extreme on the longer, negative end
  float best_err = GridError(x, n, best, 0, qmin, qmax);
  for (int k = 0; k < 8; ++k) {
    for (float end : {static_cast<float>(qmin), static_cast<float>(qmax)}) {
      const float shrink = 1.0f - 0.03f * static_cast<float>(k);
      SubBlockFit fit{extreme / (end * shrink), 0};
      if (!RefineGrid(x, n, qmin, qmax, true, &fit)) continue;
      const float err = GridError(x, n, fit.scale, 0, qmin, qmax);
      if (err < best_err) best_err = err, best = fit.scale;
    }
  }
  return best;
}

// Quantizes sub-block values v[0..n) (all >= 0) against a super-block scale for codes 0..qmax: writes the
// codes and returns the fp16 super-block scale.
float QuantizeUnsignedScales(const float* v, int n, int qmax, int* codes) {
  float vmax = 0;
  for (int i = 0; i < n; ++i) vmax = std::max(vmax, v[i]);
  const float d = Half(vmax / static_cast<float>(qmax));
  for (int i = 0; i < n; ++i) codes[i] = d > 0 ? RoundClampInt(v[i] / d, 0, qmax) : 0;
  return d;
}

// As above for signed scales with codes in -(qmax + 1)..qmax (the largest magnitude maps to -(qmax + 1)).
float QuantizeSignedScales(const float* v, int n, int qmax, int* codes) {
  float extreme = 0;
  for (int i = 0; i < n; ++i) {
    if (std::fabs(v[i]) > std::fabs(extreme)) extreme = v[i];
  }
  const float d = Half(extreme / static_cast<float>(-qmax - 1));
  for (int i = 0; i < n; ++i) codes[i] = d != 0 ? RoundClampInt(v[i] / d, -qmax - 1, qmax) : 0;
  return d;
}

// The affine K-quants' common part: fits `n_sub` sub-blocks of 256 / n_sub, quantizes their scales and mins
// to `scale_bits` against fp16 d and dmin, then codes every weight (0..qmax) against the quantized grid.
// The decoders compute a weight as (d * sc) * q - (dmin * m), so the codes are chosen with those products.
void EncodeAffineSuperBlock(const float* x, int n_sub, int qmax, int scale_bits, float* d, float* dmin, int* sc,
                            int* mn, int* q) {
  const int sub = 256 / n_sub;
  float scales[16], mins[16];
  for (int j = 0; j < n_sub; ++j) {
    const SubBlockFit fit = FitAffine(x + sub * j, sub, qmax);
    scales[j] = fit.scale;
    mins[j] = -fit.offset;
  }
  const int smax = (1 << scale_bits) - 1;
  *d = QuantizeUnsignedScales(scales, n_sub, smax, sc);
  *dmin = QuantizeUnsignedScales(mins, n_sub, smax, mn);
  for (int j = 0; j < n_sub; ++j) {
    const float dl = *d * static_cast<float>(sc[j]);
    const float ml = *dmin * static_cast<float>(mn[j]);
    for (int i = 0; i < sub; ++i) q[sub * j + i] = dl > 0 ? RoundClampInt((x[sub * j + i] + ml) / dl, 0, qmax) : 0;
  }
}

// The symmetric K-quants' common part: 16 sub-blocks of 16, signed scales of `scale_qmax` (codes
// -(scale_qmax + 1)..scale_qmax) against an fp16 d, weights coded in -(qmax + 1)..qmax.
void EncodeSymmetricSuperBlock(const float* x, int qmax, int scale_qmax, float* d, int* sc, int* q) {
  float scales[16];
  for (int j = 0; j < 16; ++j) scales[j] = FitSymmetric(x + 16 * j, 16, qmax);
  *d = QuantizeSignedScales(scales, 16, scale_qmax, sc);
  for (int j = 0; j < 16; ++j) {
    const float dl = *d * static_cast<float>(sc[j]);
    for (int i = 0; i < 16; ++i) q[16 * j + i] = dl != 0 ? RoundClampInt(x[16 * j + i] / dl, -qmax - 1, qmax) : 0;
  }
}

// Q4_K/Q5_K's twelve bytes of eight 6-bit (scale, min) pairs (see K4ScaleMin in ggml_quants.cc).
void PackK4ScaleMin(const int* sc, const int* mn, uint8_t* packed) {
  for (int i = 0; i < 4; ++i) {
    packed[i] = static_cast<uint8_t>(sc[i] | ((sc[i + 4] >> 4) << 6));
    packed[i + 4] = static_cast<uint8_t>(mn[i] | ((mn[i + 4] >> 4) << 6));
    packed[i + 8] = static_cast<uint8_t>((sc[i + 4] & 0x0f) | ((mn[i + 4] & 0x0f) << 4));
  }
}

}  // namespace

// Q2_K: scales[16] (scale | min << 4), qs[64], d, dmin. Element i's two bits: qs[32 (i / 128) + i % 32]
// at bit 2 ((i / 32) % 4).
void EncodeQ2_K(const float* x, uint8_t* b) {
  float d, dmin;
  int sc[16], mn[16], q[256];
  EncodeAffineSuperBlock(x, 16, 3, 4, &d, &dmin, sc, mn, q);
  std::memset(b, 0, 84);
  for (int j = 0; j < 16; ++j) b[j] = static_cast<uint8_t>(sc[j] | (mn[j] << 4));
  for (int i = 0; i < 256; ++i) b[16 + 32 * (i / 128) + i % 32] |= static_cast<uint8_t>(q[i] << (2 * ((i / 32) % 4)));
  StoreHalfAt(b + 80, d);
  StoreHalfAt(b + 82, dmin);
}

// Q3_K: hmask[32], qs[64], scales[12], d. Stored code q + 4: its bit 2 in hmask[i % 32] bit i / 32, its low
// bits as Q2_K's; scales stored + 32, low nibbles in bytes 0-7, top bits in byte 8 + j % 4 at 2 (j / 4).
void EncodeQ3_K(const float* x, uint8_t* b) {
  float d;
  int sc[16], q[256];
  EncodeSymmetricSuperBlock(x, 3, 31, &d, sc, q);
  std::memset(b, 0, 110);
  for (int i = 0; i < 256; ++i) {
    const int stored = q[i] + 4;
    b[32 + 32 * (i / 128) + i % 32] |= static_cast<uint8_t>((stored & 3) << (2 * ((i / 32) % 4)));
    if (stored & 4) b[i % 32] |= static_cast<uint8_t>(1 << (i / 32));
  }
  for (int j = 0; j < 16; ++j) {
    const int stored = sc[j] + 32;
    b[96 + j % 8] |= static_cast<uint8_t>((stored & 0x0f) << (j < 8 ? 0 : 4));
    b[96 + 8 + j % 4] |= static_cast<uint8_t>((stored >> 4) << (2 * (j / 4)));
  }
  StoreHalfAt(b + 108, d);
}

// Q4_K: d, dmin, scales[12], qs[128]; element i is nibble (i / 32) % 2 of qs[32 (i / 64) + i % 32].
void EncodeQ4_K(const float* x, uint8_t* b) {
  float d, dmin;
  int sc[8], mn[8], q[256];
  EncodeAffineSuperBlock(x, 8, 15, 6, &d, &dmin, sc, mn, q);
  std::memset(b, 0, 144);
  StoreHalfAt(b, d);
  StoreHalfAt(b + 2, dmin);
  PackK4ScaleMin(sc, mn, b + 4);
  for (int i = 0; i < 256; ++i) b[16 + 32 * (i / 64) + i % 32] |= static_cast<uint8_t>(q[i] << (4 * ((i / 32) % 2)));
}

// Q5_K: as Q4_K with qh[32] before qs; the fifth bit of element i in qh[i % 32] bit i / 32.
void EncodeQ5_K(const float* x, uint8_t* b) {
  float d, dmin;
  int sc[8], mn[8], q[256];
  EncodeAffineSuperBlock(x, 8, 31, 6, &d, &dmin, sc, mn, q);
  std::memset(b, 0, 176);
  StoreHalfAt(b, d);
  StoreHalfAt(b + 2, dmin);
  PackK4ScaleMin(sc, mn, b + 4);
  for (int i = 0; i < 256; ++i) {
    b[48 + 32 * (i / 64) + i % 32] |= static_cast<uint8_t>((q[i] & 0x0f) << (4 * ((i / 32) % 2)));
    if (q[i] & 16) b[16 + i % 32] |= static_cast<uint8_t>(1 << (i / 32));
  }
}

// Q6_K: ql[128], qh[64], scales[16] int8, d. Stored code q + 32: low nibble is nibble (i % 128) / 64 of
// ql[64 (i / 128) + i % 64], top two bits at 2 ((i % 128) / 32) of qh[32 (i / 128) + i % 32].
void EncodeQ6_K(const float* x, uint8_t* b) {
  float d;
  int sc[16], q[256];
  EncodeSymmetricSuperBlock(x, 31, 127, &d, sc, q);
  std::memset(b, 0, 210);
  for (int i = 0; i < 256; ++i) {
    const int stored = q[i] + 32;
    b[64 * (i / 128) + i % 64] |= static_cast<uint8_t>((stored & 0x0f) << (4 * ((i % 128) / 64)));
    b[128 + 32 * (i / 128) + i % 32] |= static_cast<uint8_t>((stored >> 4) << (2 * ((i % 128) / 32)));
  }
  for (int j = 0; j < 16; ++j) b[192 + j] = static_cast<uint8_t>(static_cast<int8_t>(sc[j]));
  StoreHalfAt(b + 208, d);
}

}  // namespace strata::gguf::internal
