#ifndef STRATA_KERNELS_CPU_DENSE_GEMV_H_
#define STRATA_KERNELS_CPU_DENSE_GEMV_H_

// Products of the model's dense (non-expert) weight matrices with f32 activations of several tokens.
// Weights keep their GGUF storage type; activations and results are f32. Thread-safe; distinct row
// ranges may be computed by different threads at once.

#include <cstdint>

#include "kernels/format/dense_type.h"

namespace strata::kernels {

// For rows r in [row_begin, row_end) and tokens t < n_tokens:
//   y[t * y_stride + r] = sum_c W[r][c] * x[t * x_stride + c]
// W is row-major with DenseRowBytes(type, cols) bytes a row. Each weight row is read once for all tokens.
void DenseGemv(DenseType type, const uint8_t* w, int64_t cols, int64_t row_begin, int64_t row_end,
               const float* x, int64_t x_stride, int n_tokens, float* y, int64_t y_stride);

// The same with the portable scalar code only; the reference the SIMD paths are tested against.
void DenseGemvReference(DenseType type, const uint8_t* w, int64_t cols, int64_t row_begin, int64_t row_end,
                        const float* x, int64_t x_stride, int n_tokens, float* y, int64_t y_stride);

}  // namespace strata::kernels

#endif  // STRATA_KERNELS_CPU_DENSE_GEMV_H_
