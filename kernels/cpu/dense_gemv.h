#ifndef STRATA_KERNELS_CPU_DENSE_GEMV_H_
#define STRATA_KERNELS_CPU_DENSE_GEMV_H_

// Products of the model's dense (non-expert) weight matrices with f32 activations of several tokens.
// Weights keep their GGUF storage type; activations and results are f32. Thread-safe; distinct row
// ranges may be computed by different threads at once.

#include <cstdint>

namespace strata::kernels {

// Storage types the dense kernels read directly (ggml's F32, F16, BF16 and Q8_0 layouts). Other GGUF
// types are widened to F32 by the loader.
enum class DenseType : uint8_t { kF32, kF16, kBF16, kQ8_0 };

// Bytes of one row of `cols` weights (cols a multiple of 32 for Q8_0).
uint64_t DenseRowBytes(DenseType type, int64_t cols);

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
