#ifndef STRATA_KERNELS_CPU_QUANTIZE_H_
#define STRATA_KERNELS_CPU_QUANTIZE_H_

// The scalar references of the expert schemes (byte layouts in kernels/format/scheme.h): quantizing a
// role, decoding it, quantizing an activation and one row's dot product. Every SIMD and CUDA kernel is
// tested against these; they are pure and thread-safe.

#include <cstdint>
#include <vector>

#include "kernels/format/scheme.h"

namespace strata::kernels {

enum class CpuPath : uint8_t;  // role_gemv.h

// The error of a quantization against the f32 weights, summed in double: rel_rms = sqrt(err2 / ref2).
struct QuantizeError {
  double err2 = 0;     // sum of (w - decoded)^2
  double ref2 = 0;     // sum of w^2
  double max_abs = 0;  // largest |w - decoded|
  void Merge(const QuantizeError& o) {
    err2 += o.err2;
    ref2 += o.ref2;
    max_abs = max_abs > o.max_abs ? max_abs : o.max_abs;
  }
};

// Quantizes a row-major rows x cols f32 matrix into `dst` (RoleBytes bytes). Scales are chosen per group
// to minimise squared error (a search over candidate scales, refined by least squares for s4 and s2; the
// exact operations are in quantize_fit.h). When `error` is set, the error of the decoded role against `src`
// (what DequantizeRole would give) is added to it, computed in the same pass. Runs on the fastest CPU path;
// every path writes the same bytes. Thread-safe and single-threaded: converters split a model's roles across
// threads. Weights must be finite.
void QuantizeRole(Scheme scheme, const float* src, int64_t rows, int64_t cols, uint8_t* dst,
                  QuantizeError* error = nullptr);

// QuantizeRole on a given path, which must be available (CpuPathAvailable): for tests and benchmarks.
void QuantizeRoleOnPath(CpuPath path, Scheme scheme, const float* src, int64_t rows, int64_t cols, uint8_t* dst,
                        QuantizeError* error);

// Writes groups [first_group, first_group + n_groups) of a role of an integer scheme (s8, s4, s2, mxfp4) from
// codes already chosen, as QuantizeRole writes its fit: groups are numbered row-major (cols / Group per row),
// group k's codes are codes[k * Group + i] (s8: the int8 code's byte; s4 and mxfp4: 0..15; s2: 0..3), its
// scale d[k] and, for s4, its offset m[k] (ignored otherwise), both rounded to half (mxfp4: d[k] should be
// Mxfp4Scale(e) of an exponent byte e, kernels/format/mxfp4.h; another d is stored as the power of two nearest
// to it in the log). For converters that carry a source's codes over unchanged. Writes whole code bytes: no
// need to clear dst first.
void PackRoleGroups(Scheme scheme, int64_t rows, int64_t cols, int64_t first_group, int64_t n_groups, const float* d,
                    const float* m, const uint8_t* codes, uint8_t* dst);

// Decodes a role back to row-major f32.
void DequantizeRole(Scheme scheme, const uint8_t* src, int64_t rows, int64_t cols, float* dst);

// An activation vector quantized once per layer for the integer schemes: int8 codes with one fp32 scale
// per 32 elements (x ~= q * scale), plus the per-32 sums of the codes that affine schemes need. `f32` keeps
// the unquantized values, which the f16 scheme uses so that it is exact. The kernels rely on q being in
// [-127, 127] and sum matching q.
struct QuantizedActivation {
  int64_t n = 0;                 // multiple of 32
  std::vector<float> f32;        // n
  std::vector<int8_t> q;         // n
  std::vector<float> scale;      // n / 32
  std::vector<int32_t> sum;      // n / 32: sum of q over each block
};

// Quantizes x[0..n) (n a multiple of 32) into `out`, resizing its vectors. Per 32-block:
// scale = amax / 127.0f (amax = largest |x|); if scale is 0, every q is 0; otherwise
// q = round-half-even(x / scale) (IEEE f32 division), clamped to [-127, 127] (NaN gives -127).
// A GPU implementation must use the same operations to produce the same codes.
void QuantizeActivation(const float* x, int64_t n, QuantizedActivation* out);

// Sizes `out` for n elements (n a multiple of 32) without computing anything.
void ResizeActivation(int64_t n, QuantizedActivation* out);

// Whether the scheme's kernels read an activation's int8 codes (q, scale, sum); f16 reads only f32, so
// quantizing for it is wasted work.
inline bool ReadsQuantizedActivation(Scheme scheme) { return scheme != Scheme::kF16; }

// Quantizes blocks [block_begin, block_end) of out->f32 in place into out->q/scale/sum, exactly as
// QuantizeActivation would; `out` must already be sized. Distinct block ranges may be quantized by
// different threads at once.
void QuantizeActivationBlocks(int64_t block_begin, int64_t block_end, QuantizedActivation* out);

// Reference dot product of row `row` of a role with an activation of length cols.
float DotRowReference(Scheme scheme, const uint8_t* role, int64_t rows, int64_t cols, int64_t row,
                      const QuantizedActivation& x);

}  // namespace strata::kernels

#endif  // STRATA_KERNELS_CPU_QUANTIZE_H_
