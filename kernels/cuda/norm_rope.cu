// RMS norms, the MoE combine fused with the next norm, and the per-head q/k norm + RoPE + KV-cache store.
//
// These mirror engine/model/ops.cc operation by operation: sums of squares in double, the scale as
// 1 / sqrtf(float(sum / n) + eps) (IEEE division and square root), products in the CPU's order, and
// explicit __fmul_rn / __fadd_rn where the compiler would otherwise fuse a multiply and an add that the CPU
// rounds separately. Results then match the CPU to the last bit except where a double sum in a different
// order rounds differently.

#include <cmath>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/dense_device.cuh"
#include "kernels/cuda/dense_kernels.h"
#include "kernels/cuda/dependent_launch.cuh"
#include "kernels/cuda/qk_rope.cuh"

namespace strata::kernels::cuda {
namespace {

using detail::BadArgument;
using detail::NullArgument;
using detail::RmsScale;

// One block a row: 1024 threads, so a 2560-wide row takes three rounds of loads, not ten.
constexpr int kNormThreads = 1024;

// Block r normalizes row r. Every thread reads its elements in both passes before writing them, so out
// may be x.
__global__ void __launch_bounds__(kNormThreads) RmsNormKernel(const float* x, int64_t x_stride, const float* weight,
                                                              int64_t n, float eps, float* out, int64_t out_stride) {
  WaitForPriorKernels();
  const float* xr = x + blockIdx.x * x_stride;
  float* outr = out + blockIdx.x * out_stride;
  double sum = 0;
  for (int64_t i = threadIdx.x; i < n; i += kNormThreads) {
    const double v = xr[i];
    sum += v * v;
  }
  const float scale = RmsScale(detail::BlockSumDouble(sum), n, eps);
  for (int64_t i = threadIdx.x; i < n; i += kNormThreads) outr[i] = xr[i] * scale * weight[i];
}

// v + w * p, rounded as the CPU rounds it (a product, then a sum: no fused multiply-add).
__device__ __forceinline__ float AddScaled(float v, float w, float p) { return __fadd_rn(v, __fmul_rn(w, p)); }
__device__ __forceinline__ float4 AddScaled(float4 v, float w, float4 p) {
  return make_float4(AddScaled(v.x, w, p.x), AddScaled(v.y, w, p.y), AddScaled(v.z, w, p.z), AddScaled(v.w, w, p.w));
}
__device__ __forceinline__ double Squares(float v) { return static_cast<double>(v) * v; }
__device__ __forceinline__ double Squares(float4 v) { return Squares(v.x) + Squares(v.y) + Squares(v.z) + Squares(v.w); }
__device__ __forceinline__ float4 operator*(float4 a, float4 b) {
  return make_float4(a.x * b.x, a.y * b.y, a.z * b.z, a.w * b.w);
}
__device__ __forceinline__ float4 operator*(float4 a, float s) { return make_float4(a.x * s, a.y * s, a.z * s, a.w * s); }

// Block t: x[t] += sum_j weights[t][j] * parts[t][j], then h[t] = RmsNorm(x[t]) * norm_weight. V is float
// (any n) or float4 (n a multiple of 4, the arrays 16-byte aligned: a 2560-wide row is one round of loads).
template <typename V>
__global__ void __launch_bounds__(kNormThreads)
    CombineAndNormKernel(const float* parts, const float* weights, int k, int64_t n, float* x, const float* norm_weight,
                         float eps, float* h) {
  constexpr int kWidth = sizeof(V) / sizeof(float);
  const int64_t t = blockIdx.x, nv = n / kWidth;
  const V* g = reinterpret_cast<const V*>(norm_weight);
  // The norm weight of this thread's first element, read while the kernel before finishes (a weight: no kernel
  // writes it), so that the last loop below waits for no load (a row of up to 1024 Vs is that element alone).
  V g_first{};
  if (g != nullptr && threadIdx.x < nv) g_first = __ldg(g + threadIdx.x);
  WaitForPriorKernels();
  V* xt = reinterpret_cast<V*>(x + t * n);
  const float* wt = weights + t * k;
  const V* pt = reinterpret_cast<const V*>(parts + t * k * n);
  double sum = 0;
  for (int64_t i = threadIdx.x; i < nv; i += kNormThreads) {
    V v = xt[i];
    // Eight parts are loaded before any is added (in j order, as the CPU adds them), so the loads overlap
    // instead of each waiting for the add before it.
    for (int j = 0; j < k; j += 8) {
      V p[8];
      float w[8];
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        if (j + u < k) {
          p[u] = __ldg(pt + (j + u) * nv + i);
          w[u] = __ldg(wt + j + u);
        }
      }
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        if (j + u < k) v = AddScaled(v, w[u], p[u]);
      }
    }
    xt[i] = v;
    sum += Squares(v);
  }
  if (norm_weight == nullptr) return;  // the same for the whole block
  const float scale = RmsScale(detail::BlockSumDouble(sum), n, eps);
  V* ht = reinterpret_cast<V*>(h + t * n);
  // Each thread reads back only the elements it wrote.
  for (int64_t i = threadIdx.x; i < nv; i += kNormThreads) {
    ht[i] = xt[i] * scale * (i == threadIdx.x ? g_first : g[i]);
  }
}

// A warp per head: blockIdx.y is the token, blockIdx.x * kRopeWarps + warp the head (q heads first, then
// k heads); the head's arithmetic is detail::NormRopeHead (qk_rope.cuh), whose cos, sin and norm weights are
// formed before the wait (the slots, frequencies and weights are no kernel's output).
constexpr int kRopeWarps = 4;
constexpr int kMaxHeadDim = 256;
constexpr int kMaxPairsPerLane = kMaxHeadDim / 2 / 32;

__global__ void __launch_bounds__(32 * kRopeWarps)
    QkNormRopeStoreKernel(float* q, const float* k, const float* v, const TokenSlot* slots, KvPlace place, int n_head,
                          int n_head_kv, int head_dim, detail::QkRopeParams rope) {
  const int64_t t = blockIdx.y;
  const int head = blockIdx.x * kRopeWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const bool is_q = head < n_head;
  const TokenSlot slot = slots[t];
  const float* norm = is_q ? rope.q_norm : rope.k_norm;
  const auto lane_rope = detail::PrepareLaneRope<kMaxPairsPerLane>(rope, head_dim, slot.pos, lane);
  const auto lane_norm = detail::LoadLaneNorm(head < n_head + n_head_kv ? norm : nullptr, lane_rope);
  WaitForPriorKernels();
  if (head >= n_head + n_head_kv) return;
  const int64_t kv_dim = static_cast<int64_t>(n_head_kv) * head_dim;
  const int kv_head = head - n_head;
  const int64_t cache_offset =
      (detail::LayerFirstSlot(slot, place) + detail::PositionSlot(slot, place, slot.pos)) * kv_dim +
      static_cast<int64_t>(kv_head) * head_dim;
  const float* src =
      is_q ? q + (t * n_head + head) * head_dim : k + t * kv_dim + static_cast<int64_t>(kv_head) * head_dim;
  float* dst = is_q ? q + (t * n_head + head) * head_dim : slot.keys + cache_offset;
  detail::NormRopeHead(src, dst, norm != nullptr, lane_norm, rope.eps, head_dim, lane_rope);
  if (!is_q) {
    const float* vs = v + t * kv_dim + static_cast<int64_t>(kv_head) * head_dim;
    float* vd = slot.values + cache_offset;
    for (int d = lane; d < head_dim; d += 32) vd[d] = vs[d];
  }
}

}  // namespace

absl::Status RmsNorm(const float* x, int64_t x_stride, const float* weight, int64_t n, int rows, float eps, float* out,
                     int64_t out_stride, cudaStream_t stream) {
  constexpr absl::string_view kFn = "RmsNorm";
  if (n < 1) return BadArgument(kFn, "n", n, "it must be >= 1");
  if (rows < 0) return BadArgument(kFn, "rows", rows, "it must be >= 0");
  if (x_stride < n) return BadArgument(kFn, "x_stride", x_stride, "it must be >= n");
  if (out_stride < n) return BadArgument(kFn, "out_stride", out_stride, "it must be >= n");
  if (x == nullptr) return NullArgument(kFn, "x");
  if (weight == nullptr) return NullArgument(kFn, "weight");
  if (out == nullptr) return NullArgument(kFn, "out");
  if (rows == 0) return absl::OkStatus();
  return LaunchKernel("RmsNormKernel", RmsNormKernel, rows, kNormThreads, 0, stream, x, x_stride, weight, n, eps, out,
                      out_stride);
}

absl::Status CombineAndNorm(const float* parts, const float* weights, int n_tokens, int k, int64_t n, float* x,
                            const float* norm_weight, float eps, float* h, cudaStream_t stream) {
  constexpr absl::string_view kFn = "CombineAndNorm";
  if (n < 1) return BadArgument(kFn, "n", n, "it must be >= 1");
  if (k < 1) return BadArgument(kFn, "k", k, "it must be >= 1");
  if (n_tokens < 0) return BadArgument(kFn, "n_tokens", n_tokens, "it must be >= 0");
  if (parts == nullptr) return NullArgument(kFn, "parts");
  if (weights == nullptr) return NullArgument(kFn, "weights");
  if (x == nullptr) return NullArgument(kFn, "x");
  if (norm_weight != nullptr && h == nullptr) return NullArgument(kFn, "h (with a norm_weight)");
  if (n_tokens == 0) return absl::OkStatus();
  const bool vec4 = n % 4 == 0 && detail::Aligned16(parts) && detail::Aligned16(x) &&
                    (norm_weight == nullptr || (detail::Aligned16(norm_weight) && detail::Aligned16(h)));
  const auto kernel = vec4 ? CombineAndNormKernel<float4> : CombineAndNormKernel<float>;
  return LaunchKernel("CombineAndNormKernel", kernel, n_tokens, kNormThreads, 0, stream, parts, weights, k, n, x,
                      norm_weight, eps, h);
}

namespace detail {

absl::Status CheckQkNormRope(absl::string_view kFn, const QkRopeInputs& in, const TokenSlot* slots, int n_tokens,
                             const KvPlace& place, int n_head, int n_head_kv, int head_dim) {
  if (n_tokens < 0 || n_tokens > 65535) return BadArgument(kFn, "n_tokens", n_tokens, "it must be in [0, 65535]");
  if (n_head < 1) return BadArgument(kFn, "n_head", n_head, "it must be >= 1");
  if (n_head_kv < 1) return BadArgument(kFn, "n_head_kv", n_head_kv, "it must be >= 1");
  if (head_dim < 2 || head_dim > kMaxHeadDim || head_dim % 2 != 0) {
    return BadArgument(kFn, "head_dim", head_dim, "it must be even and in [2, 256]");
  }
  if (in.rope_dim < 2 || in.rope_dim > head_dim || in.rope_dim % 2 != 0) {
    return BadArgument(kFn, "rope_dim", in.rope_dim,
                       absl::StrCat("it must be even and in [2, head_dim ", head_dim, "]"));
  }
  if (in.rope_style != 0 && in.rope_style != 1) {
    return BadArgument(kFn, "rope_style", in.rope_style, "it must be 0 or 1");
  }
  if (place.full_before < 0) return BadArgument(kFn, "place.full_before", place.full_before, "it must be >= 0");
  if (place.windowed_before < 0) {
    return BadArgument(kFn, "place.windowed_before", place.windowed_before, "it must be >= 0");
  }
  if (in.q == nullptr) return NullArgument(kFn, "q");
  if (in.k == nullptr) return NullArgument(kFn, "k");
  if (in.v == nullptr) return NullArgument(kFn, "v");
  if (slots == nullptr) return NullArgument(kFn, "slots");
  if (in.freq == nullptr) return NullArgument(kFn, "freq");
  if (!(in.rope_magnitude > 0.0f) || !std::isfinite(in.rope_magnitude)) {
    return absl::InvalidArgumentError(
        absl::StrCat(kFn, ": rope_magnitude is ", in.rope_magnitude, ", not a finite positive number"));
  }
  return absl::OkStatus();
}

}  // namespace detail

absl::Status QkNormRopeStore(float* q, const float* k, const float* v, const TokenSlot* slots, int n_tokens,
                             const KvPlace& place, int n_head, int n_head_kv, int head_dim, int rope_dim,
                             const float* q_norm, const float* k_norm, float eps, const double* freq,
                             float rope_magnitude, int rope_style, cudaStream_t stream) {
  const QkRopeInputs in{q, k, v, rope_dim, q_norm, k_norm, eps, freq, rope_magnitude, rope_style};
  const absl::Status checked =
      detail::CheckQkNormRope("QkNormRopeStore", in, slots, n_tokens, place, n_head, n_head_kv, head_dim);
  if (!checked.ok()) return checked;
  if (n_tokens == 0) return absl::OkStatus();
  const dim3 grid((n_head + n_head_kv + kRopeWarps - 1) / kRopeWarps, n_tokens);
  return LaunchKernel("QkNormRopeStoreKernel", QkNormRopeStoreKernel, grid, 32 * kRopeWarps, 0, stream, q, k, v, slots,
                      place, n_head, n_head_kv, head_dim, detail::ParamsOf(in));
}

}  // namespace strata::kernels::cuda
