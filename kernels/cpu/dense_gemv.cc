#include "kernels/cpu/dense_gemv.h"

#include <cstring>
#include <memory>

#include "kernels/cpu/cpu_features.h"
#include "kernels/format/fp16.h"

namespace strata::kernels {

// Defined in dense_gemv_avx2.cc (compiled with AVX2/FMA/F16C).
void DenseGemvAvx2(DenseType type, const uint8_t* w, int64_t cols, int64_t row_begin, int64_t row_end,
                   const float* x, int64_t x_stride, int n_tokens, float* y, int64_t y_stride);

namespace {

// Widens one row into `row` (cols floats).
void WidenRow(DenseType type, const uint8_t* src, int64_t cols, float* row) {
  switch (type) {
    case DenseType::kF32:
      std::memcpy(row, src, static_cast<size_t>(cols) * sizeof(float));
      return;
    case DenseType::kF16:
      for (int64_t c = 0; c < cols; ++c) {
        uint16_t h;
        std::memcpy(&h, src + 2 * c, 2);
        row[c] = HalfToFloat(h);
      }
      return;
    case DenseType::kBF16:
      for (int64_t c = 0; c < cols; ++c) {
        uint16_t h;
        std::memcpy(&h, src + 2 * c, 2);
        row[c] = Bf16ToFloat(h);
      }
      return;
    case DenseType::kQ8_0:
      // Blocks of 34 bytes: an fp16 scale then 32 int8 codes.
      for (int64_t b = 0; b < cols / 32; ++b) {
        const uint8_t* block = src + 34 * b;
        uint16_t h;
        std::memcpy(&h, block, 2);
        const float d = HalfToFloat(h);
        for (int i = 0; i < 32; ++i) row[32 * b + i] = d * static_cast<float>(static_cast<int8_t>(block[2 + i]));
      }
      return;
  }
}

}  // namespace

void DenseGemvReference(DenseType type, const uint8_t* w, int64_t cols, int64_t row_begin, int64_t row_end,
                        const float* x, int64_t x_stride, int n_tokens, float* y, int64_t y_stride) {
  const uint64_t row_bytes = DenseRowBytes(type, cols);
  float row_buf[4096];
  float* row = row_buf;
  std::unique_ptr<float[]> big;
  if (cols > 4096) {
    big.reset(new float[static_cast<size_t>(cols)]);
    row = big.get();
  }
  for (int64_t r = row_begin; r < row_end; ++r) {
    WidenRow(type, w + static_cast<uint64_t>(r) * row_bytes, cols, row);
    for (int t = 0; t < n_tokens; ++t) {
      const float* xt = x + t * x_stride;
      // Four partial sums: some instruction-level parallelism without changing the result between paths
      // that share this reference's order.
      float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
      int64_t c = 0;
      for (; c + 4 <= cols; c += 4) {
        s0 += row[c] * xt[c];
        s1 += row[c + 1] * xt[c + 1];
        s2 += row[c + 2] * xt[c + 2];
        s3 += row[c + 3] * xt[c + 3];
      }
      for (; c < cols; ++c) s0 += row[c] * xt[c];
      y[t * y_stride + r] = (s0 + s1) + (s2 + s3);
    }
  }
}

void DenseGemv(DenseType type, const uint8_t* w, int64_t cols, int64_t row_begin, int64_t row_end,
               const float* x, int64_t x_stride, int n_tokens, float* y, int64_t y_stride) {
  if (GetCpuFeatures().avx2 && cols % 8 == 0) {
    DenseGemvAvx2(type, w, cols, row_begin, row_end, x, x_stride, n_tokens, y, y_stride);
    return;
  }
  DenseGemvReference(type, w, cols, row_begin, row_end, x, x_stride, n_tokens, y, y_stride);
}

}  // namespace strata::kernels
