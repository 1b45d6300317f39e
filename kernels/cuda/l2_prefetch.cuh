#ifndef STRATA_KERNELS_CUDA_L2_PREFETCH_CUH_
#define STRATA_KERNELS_CUDA_L2_PREFETCH_CUH_

// The device side of l2_prefetch.h (included by .cu files only).

#include <cstdint>

namespace strata::kernels::cuda {

// Bytes a bulk prefetch instruction asks for.
inline constexpr uint32_t kPrefetchPiece = 64 << 10;

// Starts an asynchronous read of [p, p + bytes) into L2 by the copy engine of the SM (the TMA): the calling
// thread does not wait. p 16-byte aligned, bytes a multiple of 16. A no-op before sm_90.
__device__ __forceinline__ void PrefetchPieceToL2(const uint8_t* p, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
#endif
}

// PrefetchPieceToL2 over [p, p + bytes), one piece after another, by one thread.
__device__ __forceinline__ void PrefetchToL2ByOneThread(const uint8_t* p, uint64_t bytes) {
  for (uint64_t at = 0; at < bytes; at += kPrefetchPiece) {
    PrefetchPieceToL2(p + at, static_cast<uint32_t>(bytes - at < kPrefetchPiece ? bytes - at : kPrefetchPiece));
  }
}

}  // namespace strata::kernels::cuda

#endif  // STRATA_KERNELS_CUDA_L2_PREFETCH_CUH_
