#ifndef STRATA_KERNELS_CUDA_QK_ROPE_CUH_
#define STRATA_KERNELS_CUDA_QK_ROPE_CUH_

// One head's q/k norm and RoPE (QkNormRopeStore's arithmetic, dense_kernels.h), by one warp, shared by
// QkNormRopeStoreKernel (norm_rope.cu) and the decode attention that does the same work itself
// (attention_decode.cu, QkNormRopeAttention): both give the same bits because both run this code.
//
// Lane l owns the rotation pairs i = l, l + 32, ... of the head (both elements of each), so the norm and the
// rotation need no exchange beyond the warp's sum of squares. Pairs i < rope_dim / 2 are RoPE's; the others
// pair up the values past rope_dim, which are only normed and copied (partial RoPE). A lane's pair indices,
// cos and sin depend on the position alone, so a kernel may form them before it waits for the kernel that
// writes the heads.

#include <cuda_runtime.h>

#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "kernels/cuda/dense_device.cuh"
#include "kernels/cuda/dense_kernels.h"

namespace strata::kernels::cuda::detail {

// The per-step parameters of the q/k norm and RoPE (QkNormRopeStore's arguments, with rope_style as `neox`).
struct QkRopeParams {
  const double* freq = nullptr;  // rope_dim / 2 frequencies
  const float* q_norm = nullptr;  // head_dim floats, or null for no norm
  const float* k_norm = nullptr;
  float eps = 0.0f;
  float magnitude = 1.0f;
  int rope_dim = 0;
  int neox = 0;
};

// QkNormRopeStore's argument checks (dense_kernels.h), errors under the name `function`.
absl::Status CheckQkNormRope(absl::string_view function, const QkRopeInputs& in, const TokenSlot* slots, int n_tokens,
                             const KvPlace& place, int n_head, int n_head_kv, int head_dim);

// The kernels' view of the inputs' norm and RoPE parameters.
inline QkRopeParams ParamsOf(const QkRopeInputs& in) {
  return QkRopeParams{in.freq, in.q_norm, in.k_norm, in.eps, in.rope_magnitude, in.rope_dim, in.rope_style};
}

#ifdef __CUDACC__
// A lane's share of a head of head_dim values at one position: kPairs >= head_dim / 64 pairs (those past
// head_dim / 2 are idle).
template <int kPairs>
struct LaneRope {
  int ia[kPairs], ib[kPairs];
  float cos[kPairs], sin[kPairs];  // RoPE's pairs: the float cos and sin times the magnitude (as RopeAngles)
  bool live[kPairs];               // pair index < head_dim / 2
  bool rotated[kPairs];            // pair index < rope_dim / 2
};

template <int kPairs>
__device__ __forceinline__ LaneRope<kPairs> PrepareLaneRope(const QkRopeParams& p, int head_dim, int pos, int lane) {
  LaneRope<kPairs> r;
  const int half = head_dim / 2, rope_half = p.rope_dim / 2;
#pragma unroll
  for (int m = 0; m < kPairs; ++m) {
    const int i = lane + 32 * m;
    r.live[m] = i < half;
    r.rotated[m] = i < rope_half;
    if (i < rope_half) {
      r.ia[m] = p.neox ? i : 2 * i;
      r.ib[m] = p.neox ? i + rope_half : 2 * i + 1;
      double sin_d, cos_d;
      sincos(static_cast<double>(pos) * p.freq[i], &sin_d, &cos_d);
      r.cos[m] = __fmul_rn(static_cast<float>(cos_d), p.magnitude);
      r.sin[m] = __fmul_rn(static_cast<float>(sin_d), p.magnitude);
    } else {
      r.ia[m] = p.rope_dim + 2 * (i - rope_half);
      r.ib[m] = r.ia[m] + 1;
      r.cos[m] = r.sin[m] = 0.0f;
    }
  }
  return r;
}

// A lane's pairs of one head's values (its ia and ib elements).
template <int kPairs>
struct HeadPairs {
  float a[kPairs], b[kPairs];
};

template <int kPairs>
__device__ __forceinline__ HeadPairs<kPairs> LoadHeadPairs(const float* src, const LaneRope<kPairs>& r) {
  HeadPairs<kPairs> h;
#pragma unroll
  for (int m = 0; m < kPairs; ++m) {
    h.a[m] = r.live[m] ? src[r.ia[m]] : 0.0f;
    h.b[m] = r.live[m] ? src[r.ib[m]] : 0.0f;
  }
  return h;
}

// A lane's norm weights for its pairs (zeros for no norm), readable before the wait: weights are no kernel's
// output.
template <int kPairs>
using LaneNorm = HeadPairs<kPairs>;

template <int kPairs>
__device__ __forceinline__ LaneNorm<kPairs> LoadLaneNorm(const float* norm, const LaneRope<kPairs>& r) {
  return norm != nullptr ? LoadHeadPairs(norm, r) : LaneNorm<kPairs>{};
}

// RoPE(RmsNorm(head) * norm) (no norm when `normed` is false), by the whole warp (the norm's sum is the warp's).
template <int kPairs>
__device__ __forceinline__ HeadPairs<kPairs> NormRope(HeadPairs<kPairs> h, bool normed, const LaneNorm<kPairs>& norm,
                                                     float eps, int head_dim, const LaneRope<kPairs>& r) {
  if (normed) {
    double sum = 0;
#pragma unroll
    for (int m = 0; m < kPairs; ++m) {
      sum += static_cast<double>(h.a[m]) * h.a[m];
      sum += static_cast<double>(h.b[m]) * h.b[m];
    }
    const float scale = RmsScale(WarpSumDouble(sum), head_dim, eps);
#pragma unroll
    for (int m = 0; m < kPairs; ++m) {
      if (r.live[m]) {
        h.a[m] = h.a[m] * scale * norm.a[m];
        h.b[m] = h.b[m] * scale * norm.b[m];
      }
    }
  }
#pragma unroll
  for (int m = 0; m < kPairs; ++m) {
    if (!r.rotated[m]) continue;
    const float a = h.a[m], b = h.b[m];
    h.a[m] = __fsub_rn(__fmul_rn(a, r.cos[m]), __fmul_rn(b, r.sin[m]));
    h.b[m] = __fadd_rn(__fmul_rn(a, r.sin[m]), __fmul_rn(b, r.cos[m]));
  }
  return h;
}

// dst (shared or global memory) gets the lane's pairs.
template <int kPairs>
__device__ __forceinline__ void StoreHeadPairs(const HeadPairs<kPairs>& h, float* dst, const LaneRope<kPairs>& r) {
#pragma unroll
  for (int m = 0; m < kPairs; ++m) {
    if (!r.live[m]) continue;
    dst[r.ia[m]] = h.a[m];
    dst[r.ib[m]] = h.b[m];
  }
}

// dst = RoPE(RmsNorm(src) * norm) of one head, by the whole warp; dst may be src.
template <int kPairs>
__device__ __forceinline__ void NormRopeHead(const float* src, float* dst, bool normed, const LaneNorm<kPairs>& norm,
                                             float eps, int head_dim, const LaneRope<kPairs>& r) {
  StoreHeadPairs(NormRope(LoadHeadPairs(src, r), normed, norm, eps, head_dim, r), dst, r);
}
#endif  // __CUDACC__

}  // namespace strata::kernels::cuda::detail

#endif  // STRATA_KERNELS_CUDA_QK_ROPE_CUH_
