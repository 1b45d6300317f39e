#ifndef STRATA_KERNELS_FORMAT_DENSE_TYPE_H_
#define STRATA_KERNELS_FORMAT_DENSE_TYPE_H_

// Storage types of the model's dense (non-expert) weight matrices that the CPU and CUDA kernels read in
// place: ggml's F32, F16, BF16 and Q8_0 row layouts (Q8_0: blocks of 34 bytes, an fp16 scale then 32 int8
// codes). A matrix is row-major with DenseRowBytes bytes a row. Other GGUF types are widened to F32 by the
// loader.

#include <cstdint>

namespace strata::kernels {

enum class DenseType : uint8_t { kF32, kF16, kBF16, kQ8_0 };

// Bytes of one row of `cols` weights (cols a multiple of 32 for Q8_0).
inline uint64_t DenseRowBytes(DenseType type, int64_t cols) {
  switch (type) {
    case DenseType::kF32:
      return static_cast<uint64_t>(cols) * 4;
    case DenseType::kF16:
    case DenseType::kBF16:
      return static_cast<uint64_t>(cols) * 2;
    case DenseType::kQ8_0:
      return static_cast<uint64_t>(cols / 32) * 34;
  }
  return 0;
}

// "F32", "F16", "BF16" or "Q8_0" (ggml's names), for messages.
inline const char* DenseTypeName(DenseType type) {
  switch (type) {
    case DenseType::kF32:
      return "F32";
    case DenseType::kF16:
      return "F16";
    case DenseType::kBF16:
      return "BF16";
    case DenseType::kQ8_0:
      return "Q8_0";
  }
  return "unknown";
}

}  // namespace strata::kernels

#endif  // STRATA_KERNELS_FORMAT_DENSE_TYPE_H_
