#ifndef STRATA_KERNELS_CUDA_DENSE_DEVICE_CUH_
#define STRATA_KERNELS_CUDA_DENSE_DEVICE_CUH_

// Device code shared by the dense kernels (included by .cu files only): reading weights in their storage
// type, warp and block reductions, argument checks.

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "kernels/cuda/dense_kernels.h"
#include "kernels/format/dense_type.h"

namespace strata::kernels::cuda::detail {

constexpr unsigned kFullMask = 0xffffffffu;

// ---------------------------------------------------------------------------------------------------------
// Weights are read in chunks of 8 consecutive weights of a row: chunk k holds columns [8k, 8k + 8).

template <DenseType kType>
struct RawChunk;
template <>
struct RawChunk<DenseType::kF32> {
  uint4 a, b;
};
template <>
struct RawChunk<DenseType::kF16> {
  uint4 a;
};
template <>
struct RawChunk<DenseType::kBF16> {
  uint4 a;
};
// Q8_0: the 8 int8 codes (little-endian in lo, hi) and the fp16 scale of their block.
template <>
struct RawChunk<DenseType::kQ8_0> {
  uint32_t lo, hi, scale;
};

// 16 bytes that are read once: not kept in L1, so the activations stay there.
__device__ __forceinline__ uint4 LoadStreaming16(const void* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

// Chunk k of the row starting at `row`. F32/F16/BF16 rows must be 16-byte aligned. Q8_0 rows are 2-byte
// aligned (34-byte blocks): the 8 codes at block*34 + 2 + 8*(k % 4) are read as aligned words and shifted;
// no byte outside the codes' and scale's words is read, so the last chunk of a matrix stays in bounds.
template <DenseType kType>
__device__ __forceinline__ RawChunk<kType> LoadChunk(const uint8_t* row, int64_t k) {
  RawChunk<kType> c;
  if constexpr (kType == DenseType::kF32) {
    c.a = LoadStreaming16(row + 32 * k);
    c.b = LoadStreaming16(row + 32 * k + 16);
  } else if constexpr (kType == DenseType::kF16 || kType == DenseType::kBF16) {
    c.a = LoadStreaming16(row + 16 * k);
  } else {
    const uint8_t* block = row + 34 * (k >> 2);
    c.scale = __ldg(reinterpret_cast<const unsigned short*>(block));
    const uintptr_t codes = reinterpret_cast<uintptr_t>(block + 2 + 8 * (k & 3));
    const uint32_t* words = reinterpret_cast<const uint32_t*>(codes & ~uintptr_t{3});
    const uint32_t shift = static_cast<uint32_t>(codes & 3) * 8;  // 0 or 16
    const uint32_t w0 = __ldg(words);
    const uint32_t w1 = __ldg(words + 1);
    // With shift 16 the codes end 2 bytes into the third word: read only those 2 bytes.
    const uint32_t w2 = shift != 0 ? __ldg(reinterpret_cast<const unsigned short*>(words + 2)) : 0u;
    c.lo = __funnelshift_r(w0, w1, shift);
    c.hi = __funnelshift_r(w1, w2, shift);
  }
  return c;
}

__device__ __forceinline__ float HalfBitsToFloat(uint32_t bits16) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(bits16)));
}

__device__ __forceinline__ float SignedByte(uint32_t word, int byte) {
  return static_cast<float>(static_cast<int32_t>(word << (24 - 8 * byte)) >> 24);
}

// The 8 weights of a chunk. For Q8_0, v holds the codes and *scale the block scale (weight = scale * code);
// for the other types *scale is 1.
template <DenseType kType>
__device__ __forceinline__ void WidenChunk(const RawChunk<kType>& c, float v[8], float* scale) {
  if constexpr (kType == DenseType::kF32) {
    v[0] = __uint_as_float(c.a.x);
    v[1] = __uint_as_float(c.a.y);
    v[2] = __uint_as_float(c.a.z);
    v[3] = __uint_as_float(c.a.w);
    v[4] = __uint_as_float(c.b.x);
    v[5] = __uint_as_float(c.b.y);
    v[6] = __uint_as_float(c.b.z);
    v[7] = __uint_as_float(c.b.w);
    *scale = 1.0f;
  } else if constexpr (kType == DenseType::kF16) {
    const uint32_t w[4] = {c.a.x, c.a.y, c.a.z, c.a.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      v[2 * i] = HalfBitsToFloat(w[i] & 0xffffu);
      v[2 * i + 1] = HalfBitsToFloat(w[i] >> 16);
    }
    *scale = 1.0f;
  } else if constexpr (kType == DenseType::kBF16) {
    const uint32_t w[4] = {c.a.x, c.a.y, c.a.z, c.a.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      v[2 * i] = __uint_as_float(w[i] << 16);
      v[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
    *scale = 1.0f;
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      v[i] = SignedByte(c.lo, i);
      v[4 + i] = SignedByte(c.hi, i);
    }
    *scale = HalfBitsToFloat(c.scale);
  }
}

// The 8 weights as the CPU widens them (Q8_0: scale * code, an exact product in f32).
template <DenseType kType>
__device__ __forceinline__ void WidenChunkExact(const RawChunk<kType>& c, float v[8]) {
  float scale;
  WidenChunk<kType>(c, v, &scale);
  if constexpr (kType == DenseType::kQ8_0) {
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = scale * v[i];
  }
}

// ---------------------------------------------------------------------------------------------------------
// KV cache slots (KvPlace).

// The first slot of `place`'s layer in the token's cache.
__device__ __forceinline__ int64_t LayerFirstSlot(const TokenSlot& slot, const KvPlace& place) {
  return place.full_before * slot.capacity + place.windowed_before * slot.ring_slots;
}

// The slot of position `pos` within the layer (positions and ring lengths fit 31 bits: TokenSlot::pos).
__device__ __forceinline__ int64_t PositionSlot(const TokenSlot& slot, const KvPlace& place, int pos) {
  return place.windowed ? pos % static_cast<int>(slot.ring_slots) : pos;
}

// ---------------------------------------------------------------------------------------------------------
// Reductions. The Block* ones must be called by every thread of the block (they synchronize).

__device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(kFullMask, v, offset);
  return v;
}

__device__ __forceinline__ double WarpSumDouble(double v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(kFullMask, v, offset);
  return v;
}

__device__ __forceinline__ float WarpMax(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, offset));
  return v;
}

// The RMS norm's scale from a row's sum of squares, as strata::model::RmsNorm computes it.
__device__ __forceinline__ float RmsScale(double sum_of_squares, int64_t n, float eps) {
  return 1.0f / sqrtf(static_cast<float>(sum_of_squares / static_cast<double>(n)) + eps);
}

// The block's total, returned to every thread (same order of additions in every thread).
__device__ __forceinline__ double BlockSumDouble(double v) {
  __shared__ double warp_sums[32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  v = WarpSumDouble(v);
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  double total = 0;
  const int n_warps = (blockDim.x + 31) / 32;
  for (int i = 0; i < n_warps; ++i) total += warp_sums[i];
  __syncthreads();  // warp_sums may be reused by the next call
  return total;
}

// ---------------------------------------------------------------------------------------------------------
// Host-side argument checks.

inline absl::Status BadArgument(absl::string_view function, absl::string_view what, int64_t value,
                                absl::string_view requirement) {
  return absl::InvalidArgumentError(absl::StrCat(function, ": ", what, " is ", value, "; ", requirement));
}

inline absl::Status NullArgument(absl::string_view function, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(function, ": ", what, " is null"));
}

inline bool Aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

inline absl::Status Misaligned(absl::string_view function, absl::string_view what, const void* p) {
  return absl::InvalidArgumentError(absl::StrCat(function, ": ", what, " (", reinterpret_cast<uintptr_t>(p) % 16,
                                                 " bytes past a 16-byte boundary) must be 16-byte aligned"));
}

// Columns must fill whole chunks (and whole Q8_0 blocks).
inline absl::Status CheckColumns(absl::string_view function, absl::string_view what, DenseType type, int64_t cols) {
  const int64_t multiple = type == DenseType::kQ8_0 ? 32 : 8;
  if (cols < 1 || cols % multiple != 0) {
    return BadArgument(function, what, cols,
                       absl::StrCat("it must be a positive multiple of ", multiple, " for ", DenseTypeName(type)));
  }
  return absl::OkStatus();
}

}  // namespace strata::kernels::cuda::detail

#endif  // STRATA_KERNELS_CUDA_DENSE_DEVICE_CUH_
