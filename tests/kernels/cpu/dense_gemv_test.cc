#include "kernels/cpu/dense_gemv.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "engine/gguf/ggml_types.h"
#include "gtest/gtest.h"
#include "kernels/format/fp16.h"

namespace strata::kernels {
namespace {

// Random weights of `type` for rows x cols, stored as the GGUF layout.
std::vector<uint8_t> RandomWeights(DenseType type, int64_t rows, int64_t cols, std::mt19937* rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<uint8_t> w(DenseRowBytes(type, cols) * rows);
  for (int64_t r = 0; r < rows; ++r) {
    uint8_t* row = w.data() + r * DenseRowBytes(type, cols);
    for (int64_t c = 0; c < cols; ++c) {
      const float v = normal(*rng);
      switch (type) {
        case DenseType::kF32:
          std::memcpy(row + 4 * c, &v, 4);
          break;
        case DenseType::kF16: {
          const uint16_t h = FloatToHalf(v);
          std::memcpy(row + 2 * c, &h, 2);
          break;
        }
        case DenseType::kBF16: {
          uint32_t bits;
          std::memcpy(&bits, &v, 4);
          const uint16_t h = static_cast<uint16_t>(bits >> 16);
          std::memcpy(row + 2 * c, &h, 2);
          break;
        }
        case DenseType::kQ8_0: {
          uint8_t* block = row + 34 * (c / 32);
          if (c % 32 == 0) {
            const uint16_t d = FloatToHalf(0.02f + 0.001f * static_cast<float>(c % 7));
            std::memcpy(block, &d, 2);
          }
          block[2 + c % 32] = static_cast<uint8_t>(static_cast<int8_t>(std::lround(std::clamp(v * 40.0f, -127.0f, 127.0f))));
          break;
        }
      }
    }
  }
  return w;
}

gguf::GgmlType GgmlTypeOf(DenseType type) {
  switch (type) {
    case DenseType::kF32:
      return gguf::GgmlType::kF32;
    case DenseType::kF16:
      return gguf::GgmlType::kF16;
    case DenseType::kBF16:
      return gguf::GgmlType::kBF16;
    case DenseType::kQ8_0:
      return gguf::GgmlType::kQ8_0;
  }
  return gguf::GgmlType::kF32;
}

class DenseGemvTest : public ::testing::TestWithParam<DenseType> {};

// Against an oracle outside the kernels: each row decoded by gguf::Dequantize (ggml's block formats, which
// the gguf tests check against blocks written by llama.cpp) and dotted in double. DenseGemv falls back to
// DenseGemvReference on some shapes and machines, so agreeing with that alone would prove nothing about
// the decoding. The shapes include columns that are not a multiple of 8 (the SIMD paths' step) where the
// type allows it.
TEST_P(DenseGemvTest, MatchesRowsDecodedByGgml) {
  const DenseType type = GetParam();
  std::mt19937 rng(13);
  std::vector<std::pair<int64_t, int64_t>> shapes = {{24, 256}, {8, 2560}, {5, 4096 + 32}};
  if (type != DenseType::kQ8_0) shapes.insert(shapes.end(), {{7, 100}, {3, 13}, {9, 8 * 33 + 5}});
  for (auto [rows, cols] : shapes) {
    const std::vector<uint8_t> w = RandomWeights(type, rows, cols, &rng);
    const uint64_t row_bytes = DenseRowBytes(type, cols);
    ASSERT_EQ(*gguf::RowBytes(GgmlTypeOf(type), cols), row_bytes) << "cols " << cols;
    std::vector<float> decoded(rows * cols);
    for (int64_t r = 0; r < rows; ++r) {
      ASSERT_TRUE(gguf::Dequantize(GgmlTypeOf(type), w.data() + r * row_bytes, decoded.data() + r * cols, cols).ok());
    }
    for (int n : {1, 2, 5}) {
      std::normal_distribution<float> normal(0.0f, 1.0f);
      std::vector<float> x(n * cols);
      for (float& v : x) v = normal(rng);
      std::vector<float> got(n * rows), scalar(n * rows);
      DenseGemv(type, w.data(), cols, 0, rows, x.data(), cols, n, got.data(), rows);
      DenseGemvReference(type, w.data(), cols, 0, rows, x.data(), cols, n, scalar.data(), rows);
      for (int t = 0; t < n; ++t) {
        for (int64_t r = 0; r < rows; ++r) {
          double want = 0, magnitude = 0;
          for (int64_t c = 0; c < cols; ++c) {
            const double p = static_cast<double>(decoded[r * cols + c]) * x[t * cols + c];
            want += p;
            magnitude += std::fabs(p);
          }
          // f32 accumulation over `cols` terms; a wrongly decoded weight is off by far more.
          const double tolerance = 1e-5 * magnitude + 1e-6;
          EXPECT_NEAR(got[t * rows + r], want, tolerance)
              << "DenseGemv rows " << rows << " cols " << cols << " n " << n << " t " << t << " r " << r;
          EXPECT_NEAR(scalar[t * rows + r], want, tolerance)
              << "DenseGemvReference rows " << rows << " cols " << cols << " n " << n << " t " << t << " r " << r;
        }
      }
    }
  }
}

TEST_P(DenseGemvTest, MatchesTheReferenceOnRealShapes) {
  std::mt19937 rng(5);
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{64, 1024}, {96, 2560}, {40, 64}, {16, 4096 + 32}}) {
    const std::vector<uint8_t> w = RandomWeights(GetParam(), rows, cols, &rng);
    for (int n : {1, 2, 3, 5}) {
      std::normal_distribution<float> normal(0.0f, 1.0f);
      std::vector<float> x(n * cols);
      for (float& v : x) v = normal(rng);
      std::vector<float> got(n * rows, -1.0f), want(n * rows, -2.0f);
      DenseGemv(GetParam(), w.data(), cols, 3, rows, x.data(), cols, n, got.data(), rows);
      DenseGemvReference(GetParam(), w.data(), cols, 3, rows, x.data(), cols, n, want.data(), rows);
      for (int t = 0; t < n; ++t) {
        for (int64_t r = 0; r < 3; ++r) EXPECT_EQ(got[t * rows + r], -1.0f) << "row outside the range was written";
        for (int64_t r = 3; r < rows; ++r) {
          const float a = got[t * rows + r], b = want[t * rows + r];
          EXPECT_NEAR(a, b, 1e-4f * std::sqrt(static_cast<float>(cols)) + 1e-5f * std::fabs(b))
              << "rows " << rows << " cols " << cols << " n " << n << " t " << t << " r " << r;
        }
      }
    }
  }
}

TEST_P(DenseGemvTest, ATokensResultDoesNotDependOnItsBatch) {
  std::mt19937 rng(9);
  const int64_t rows = 48, cols = 1024 + 64;
  const std::vector<uint8_t> w = RandomWeights(GetParam(), rows, cols, &rng);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int n = 5;
  std::vector<float> x(n * cols);
  for (float& v : x) v = normal(rng);
  std::vector<float> batched(n * rows);
  DenseGemv(GetParam(), w.data(), cols, 0, rows, x.data(), cols, n, batched.data(), rows);
  for (int t = 0; t < n; ++t) {
    std::vector<float> alone(rows);
    DenseGemv(GetParam(), w.data(), cols, 0, rows, x.data() + t * cols, cols, 1, alone.data(), rows);
    for (int64_t r = 0; r < rows; ++r) EXPECT_EQ(alone[r], batched[t * rows + r]) << "t " << t << " r " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(Types, DenseGemvTest,
                         ::testing::Values(DenseType::kF32, DenseType::kF16, DenseType::kBF16, DenseType::kQ8_0));

}  // namespace
}  // namespace strata::kernels
