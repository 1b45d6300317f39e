#ifndef STRATA_TESTS_KERNELS_CUDA_DENSE_TEST_SUPPORT_H_
#define STRATA_TESTS_KERNELS_CUDA_DENSE_TEST_SUPPORT_H_

// What the dense-kernel GPU tests share: poisoned device arrays with guard bands, seeded random inputs,
// the CPU widening of each dense type, row comparison and the test fixture (a stream and a matmul context).


#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/model/model_config.h"
#include "engine/model/ops.h"
#include "gtest/gtest.h"
#include "kernels/cpu/dense_gemv.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/dense_kernels.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/format/dense_type.h"
#include "kernels/format/fp16.h"
#include "tests/testing/test_util.h"


namespace strata::kernels::cuda::dense_test {


// ---------------------------------------------------------------------------------------------------------
// Test plumbing. Failures of CUDA calls throw, which gtest reports as a failure of the test.

inline void Check(cudaError_t e, const std::string& what) {
  if (e != cudaSuccess) throw std::runtime_error(what + ": " + cudaGetErrorString(e));
}

template <typename T>
T Unwrap(absl::StatusOr<T> v) {
  if (!v.ok()) throw std::runtime_error(std::string(v.status().message()));
  return *std::move(v);
}

constexpr uint32_t kPoison = 0x7fa5a5a5u;  // a NaN no kernel computes
constexpr size_t kGuardBytes = 256;

inline bool IsPoison(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  return bits == kPoison;
}

inline float PoisonFloat() {
  float f;
  std::memcpy(&f, &kPoison, 4);
  return f;
}

// n elements of device memory between two poisoned guard bands; the elements start poisoned too unless
// `poison` is false (huge tables whose rows are uploaded one by one).
template <typename T>
class DeviceArray {
 public:
  explicit DeviceArray(size_t n, bool poison = true) : n_(n) {
    words_ = (n * sizeof(T) + 3) / 4 + 2 * kGuardBytes / 4;
    buffer_ = Unwrap(DeviceBuffer::Allocate(words_ * 4));
    if (poison) {
      const std::vector<uint32_t> fill(words_, kPoison);
      Check(cudaMemcpy(buffer_.data(), fill.data(), words_ * 4, cudaMemcpyHostToDevice), "poison");
    } else {
      const std::vector<uint32_t> fill(kGuardBytes / 4, kPoison);
      Check(cudaMemcpy(buffer_.data(), fill.data(), kGuardBytes, cudaMemcpyHostToDevice), "poison");
      Check(cudaMemcpy(static_cast<char*>(buffer_.data()) + words_ * 4 - kGuardBytes, fill.data(), kGuardBytes,
                       cudaMemcpyHostToDevice),
            "poison");
    }
    Landed();
  }
  T* get() const { return reinterpret_cast<T*>(static_cast<char*>(buffer_.data()) + kGuardBytes); }
  size_t size() const { return n_; }

  void Upload(const std::vector<T>& v) {
    if (v.size() != n_) throw std::runtime_error("upload of the wrong size");
    Check(cudaMemcpy(get(), v.data(), n_ * sizeof(T), cudaMemcpyHostToDevice), "upload");
    Landed();
  }
  void UploadAt(size_t offset, const T* v, size_t count) {
    Check(cudaMemcpy(get() + offset, v, count * sizeof(T), cudaMemcpyHostToDevice), "upload");
    Landed();
  }
  std::vector<T> Download() const {
    std::vector<T> v(n_);
    Check(cudaMemcpy(v.data(), get(), n_ * sizeof(T), cudaMemcpyDeviceToHost), "download");
    return v;
  }
  // Whether both guard bands still hold the poison.
  bool GuardsIntact() const {
    std::vector<uint32_t> head(kGuardBytes / 4), tail(kGuardBytes / 4);
    Check(cudaMemcpy(head.data(), buffer_.data(), kGuardBytes, cudaMemcpyDeviceToHost), "guard");
    Check(cudaMemcpy(tail.data(), static_cast<char*>(buffer_.data()) + words_ * 4 - kGuardBytes, kGuardBytes,
                     cudaMemcpyDeviceToHost),
          "guard");
    // Bytes between the end of the elements and the tail band (padding to 4 bytes) are not checked.
    return std::all_of(head.begin(), head.end(), [](uint32_t w) { return w == kPoison; }) &&
           std::all_of(tail.begin(), tail.end(), [](uint32_t w) { return w == kPoison; });
  }

 private:
  // cudaMemcpy from pageable memory may return before its DMA has landed, and the kernels under test run on a
  // non-blocking stream that does not wait for the legacy stream's copies: wait for them here.
  static void Landed() { Check(cudaDeviceSynchronize(), "upload"); }

  size_t n_;
  size_t words_;
  DeviceBuffer buffer_;
};

inline uint64_t NextSeed() {
  static std::atomic<uint64_t> counter{1};
  return 0x5eed5eedull * 1000003 + counter++;
}

// splitmix64: fast enough for the vocabulary-sized matrices.
class Random {
 public:
  explicit Random(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  float Uniform(float lo, float hi) { return lo + (hi - lo) * static_cast<float>(Next() >> 40) * 0x1p-24f; }
  int UniformInt(int lo, int hi) { return lo + static_cast<int>(Next() % static_cast<uint64_t>(hi - lo + 1)); }

 private:
  uint64_t state_;
};

inline std::vector<float> RandomFloats(size_t n, float lo, float hi, Random& rng) {
  std::vector<float> v(n);
  for (float& f : v) f = rng.Uniform(lo, hi);
  return v;
}

// fn(begin, end) over [0, n) split across the machine's cores.
inline void ParallelFor(int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
  const int64_t threads = std::max<int64_t>(1, std::min<int64_t>(n, std::thread::hardware_concurrency()));
  const int64_t chunk = (n + threads - 1) / threads;
  std::vector<std::thread> pool;
  for (int64_t begin = 0; begin < n; begin += chunk) pool.emplace_back(fn, begin, std::min(n, begin + chunk));
  for (std::thread& t : pool) t.join();
}

constexpr DenseType kAllTypes[] = {DenseType::kF32, DenseType::kF16, DenseType::kBF16, DenseType::kQ8_0};

// A rows x cols matrix in `type` with random values (Q8_0: random scales and every int8 code).
inline std::vector<uint8_t> RandomMatrix(DenseType type, int64_t rows, int64_t cols, uint64_t seed) {
  const uint64_t row_bytes = DenseRowBytes(type, cols);
  std::vector<uint8_t> bytes(static_cast<size_t>(rows) * row_bytes);
  ParallelFor(rows, [&](int64_t r0, int64_t r1) {
    Random rng(seed * 7919 + static_cast<uint64_t>(r0));
    for (int64_t r = r0; r < r1; ++r) {
      uint8_t* row = bytes.data() + static_cast<uint64_t>(r) * row_bytes;
      switch (type) {
        case DenseType::kF32:
          for (int64_t c = 0; c < cols; ++c) {
            const float v = rng.Uniform(-1.0f, 1.0f);
            std::memcpy(row + 4 * c, &v, 4);
          }
          break;
        case DenseType::kF16:
          for (int64_t c = 0; c < cols; ++c) StoreHalf(FloatToHalf(rng.Uniform(-1.0f, 1.0f)), row + 2 * c);
          break;
        case DenseType::kBF16:
          for (int64_t c = 0; c < cols; ++c) StoreHalf(FloatToBf16(rng.Uniform(-1.0f, 1.0f)), row + 2 * c);
          break;
        case DenseType::kQ8_0:
          for (int64_t b = 0; b < cols / 32; ++b) {
            StoreHalf(FloatToHalf(rng.Uniform(-0.02f, 0.02f)), row + 34 * b);
            for (int i = 0; i < 32; ++i) row[34 * b + 2 + i] = static_cast<uint8_t>(rng.Next() & 0xff);
          }
          break;
      }
    }
  });
  return bytes;
}

// One row widened as the CPU does.
inline std::vector<float> WidenRow(DenseType type, const uint8_t* row, int64_t cols) {
  std::vector<float> out(static_cast<size_t>(cols));
  for (int64_t c = 0; c < cols; ++c) {
    switch (type) {
      case DenseType::kF32:
        std::memcpy(&out[c], row + 4 * c, 4);
        break;
      case DenseType::kF16:
        out[c] = HalfToFloat(LoadHalf(row + 2 * c));
        break;
      case DenseType::kBF16:
        out[c] = Bf16ToFloat(LoadHalf(row + 2 * c));
        break;
      case DenseType::kQ8_0: {
        const uint8_t* block = row + 34 * (c / 32);
        out[c] = HalfToFloat(LoadHalf(block)) * static_cast<float>(static_cast<int8_t>(block[2 + c % 32]));
        break;
      }
    }
  }
  return out;
}

// y[t*y_stride + r] by the CPU reference (gaps poisoned).
inline std::vector<float> ReferenceProduct(DenseType type, const std::vector<uint8_t>& w, int64_t rows, int64_t cols,
                                    const std::vector<float>& x, int64_t x_stride, int n_tokens, int64_t y_stride) {
  std::vector<float> y(static_cast<size_t>(n_tokens) * y_stride, PoisonFloat());
  ParallelFor(rows, [&](int64_t r0, int64_t r1) {
    DenseGemvReference(type, w.data(), cols, r0, r1, x.data(), x_stride, n_tokens, y.data(), y_stride);
  });
  return y;
}

// n_rows rows of row_len values at `stride`: each row's relative L2 error against `want` at most `tol` and
// no element left poisoned; the gaps between rows still poisoned.
inline void ExpectRows(const std::vector<float>& got, const std::vector<float>& want, int64_t n_rows, int64_t row_len,
                int64_t stride, double tol, const std::string& what) {
  int failures = 0;
  double worst = 0;
  for (int64_t i = 0; i < n_rows; ++i) {
    double err2 = 0, ref2 = 0;
    int64_t unwritten = 0;
    for (int64_t j = 0; j < row_len; ++j) {
      const float g = got[i * stride + j], w = want[i * stride + j];
      if (IsPoison(g)) ++unwritten;
      const double d = static_cast<double>(g) - w;
      err2 += d * d;
      ref2 += static_cast<double>(w) * w;
    }
    const double rel = std::sqrt(err2) / std::max(std::sqrt(ref2), 1e-30);
    if (rel > worst || std::isnan(rel)) worst = rel;
    if (unwritten > 0 || !(rel <= tol)) {
      if (++failures <= 5) {
        ADD_FAILURE() << what << ": row " << i << " has relative L2 error " << rel << " (bound " << tol << "), "
                      << unwritten << " of " << row_len << " elements unwritten";
      }
    }
    for (int64_t j = row_len; j < stride; ++j) {
      if (!IsPoison(got[i * stride + j]) && ++failures <= 5) {
        ADD_FAILURE() << what << ": row " << i << ", element " << j << " is past the row and was written";
      }
    }
  }
  EXPECT_EQ(failures, 0) << what << " (worst relative error " << worst << ")";
}

template <typename T>
inline void ExpectGuards(const DeviceArray<T>& a, const std::string& what) {
  EXPECT_TRUE(a.GuardsIntact()) << what << ": a guard band around the buffer was written";
}

class DenseKernelsTest : public ::testing::Test {
 protected:
  void SetUp() override { Check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "stream"); }
  void TearDown() override { cudaStreamDestroy(stream_); }
  void Sync() { Check(cudaStreamSynchronize(stream_), "kernel"); }

  cudaStream_t stream_ = nullptr;
};

// ---------------------------------------------------------------------------------------------------------
// DenseMatmul and DenseMatmulGroup.

// Widening workspace of the contexts below: smaller than the vocabulary matrices, which therefore run in
// row blocks.

}  // namespace strata::kernels::cuda::dense_test

#endif  // STRATA_TESTS_KERNELS_CUDA_DENSE_TEST_SUPPORT_H_
