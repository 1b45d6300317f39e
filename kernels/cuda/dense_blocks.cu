// The small dense blocks some architectures add around the base ones: q/k/v biases with OLMoE's q/k norm
// over the whole projection, gpt-oss's attention output bias, and the SwiGLU activation of a dense FFN (a
// shared expert, with Qwen2-MoE's sigmoid gate, or a dense leading block). They mirror engine/model (ops.cc,
// CpuDenseBackend) operation by operation: sums in double, the CPU's sigmoid and norm scale, no fused
// multiply-adds where the CPU rounds a product and a sum apart.

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/dense_device.cuh"
#include "kernels/cuda/dense_kernels.h"
#include "kernels/cuda/dependent_launch.cuh"

namespace strata::kernels::cuda {
namespace {

using detail::BadArgument;
using detail::NullArgument;
using detail::RmsScale;

constexpr int kBlockThreads = 256;

__device__ __forceinline__ float Sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

// row += bias (if any), then row = RmsNorm(row) * norm (if any), by the whole block. Each thread reads back
// only the elements it wrote.
__device__ void BiasAndNormRow(float* row, int64_t n, const float* bias, const float* norm, float eps) {
  double sum = 0;
  for (int64_t i = threadIdx.x; i < n; i += kBlockThreads) {
    float v = row[i];
    if (bias != nullptr) {
      v = __fadd_rn(v, bias[i]);
      row[i] = v;
    }
    sum += static_cast<double>(v) * v;
  }
  if (norm == nullptr) return;  // the same for the whole block
  const float scale = RmsScale(detail::BlockSumDouble(sum), n, eps);
  for (int64_t i = threadIdx.x; i < n; i += kBlockThreads) row[i] = row[i] * scale * norm[i];
}

// Block t: token t's q, k and v.
__global__ void __launch_bounds__(kBlockThreads)
    QkvBiasAndNormKernel(float* q, float* k, float* v, int64_t q_dim, int64_t kv_dim, const float* bq, const float* bk,
                         const float* bv, const float* q_norm, const float* k_norm, float eps) {
  WaitForPriorKernels();
  const int64_t t = blockIdx.x;
  BiasAndNormRow(q + t * q_dim, q_dim, bq, q_norm, eps);
  BiasAndNormRow(k + t * kv_dim, kv_dim, bk, k_norm, eps);
  if (bv != nullptr) BiasAndNormRow(v + t * kv_dim, kv_dim, bv, nullptr, eps);
}

// Block t: token t's activation; with a gate_inp, first the block's dot product gate_inp . h_t.
__global__ void __launch_bounds__(kBlockThreads)
    SwiGluKernel(const float* gate, const float* up, int64_t ff, const float* gate_inp, const float* h, int64_t n,
                 float* out) {
  WaitForPriorKernels();
  const int64_t t = blockIdx.x;
  float s = 1.0f;
  if (gate_inp != nullptr) {  // the same for the whole block
    const float* ht = h + t * n;
    double dot = 0;
    for (int64_t i = threadIdx.x; i < n; i += kBlockThreads) dot += static_cast<double>(gate_inp[i]) * ht[i];
    s = Sigmoid(static_cast<float>(detail::BlockSumDouble(dot)));
  }
  const float* gt = gate + t * ff;
  const float* ut = up + t * ff;
  float* ot = out + t * ff;
  for (int64_t i = threadIdx.x; i < ff; i += kBlockThreads) {
    const float g = gt[i];
    const float a = __fmul_rn(__fmul_rn(g, Sigmoid(g)), ut[i]);
    ot[i] = gate_inp != nullptr ? __fmul_rn(a, s) : a;
  }
}

// Block t: x[t] += bias.
__global__ void __launch_bounds__(kBlockThreads) AddRowBiasKernel(float* x, const float* bias, int64_t n) {
  WaitForPriorKernels();
  float* row = x + static_cast<int64_t>(blockIdx.x) * n;
  for (int64_t i = threadIdx.x; i < n; i += kBlockThreads) row[i] = __fadd_rn(row[i], bias[i]);
}

}  // namespace

absl::Status AddRowBias(float* x, const float* bias, int64_t n, int n_tokens, cudaStream_t stream) {
  constexpr absl::string_view kFn = "AddRowBias";
  if (n < 1) return BadArgument(kFn, "n", n, "it must be >= 1");
  if (n_tokens < 0) return BadArgument(kFn, "n_tokens", n_tokens, "it must be >= 0");
  if (x == nullptr) return NullArgument(kFn, "x");
  if (bias == nullptr) return NullArgument(kFn, "bias");
  if (n_tokens == 0) return absl::OkStatus();
  return LaunchKernel("AddRowBiasKernel", AddRowBiasKernel, n_tokens, kBlockThreads, 0, stream, x, bias, n);
}

absl::Status QkvBiasAndNorm(float* q, float* k, float* v, int n_tokens, int64_t q_dim, int64_t kv_dim, const float* bq,
                            const float* bk, const float* bv, const float* q_norm, const float* k_norm, float eps,
                            cudaStream_t stream) {
  constexpr absl::string_view kFn = "QkvBiasAndNorm";
  if (q_dim < 1) return BadArgument(kFn, "q_dim", q_dim, "it must be >= 1");
  if (kv_dim < 1) return BadArgument(kFn, "kv_dim", kv_dim, "it must be >= 1");
  if (n_tokens < 0) return BadArgument(kFn, "n_tokens", n_tokens, "it must be >= 0");
  if (q == nullptr) return NullArgument(kFn, "q");
  if (k == nullptr) return NullArgument(kFn, "k");
  if (v == nullptr) return NullArgument(kFn, "v");
  if ((q_norm == nullptr) != (k_norm == nullptr)) {
    return absl::InvalidArgumentError("QkvBiasAndNorm: q_norm and k_norm must both be given or both be null");
  }
  if (n_tokens == 0) return absl::OkStatus();
  return LaunchKernel("QkvBiasAndNormKernel", QkvBiasAndNormKernel, n_tokens, kBlockThreads, 0, stream, q, k, v, q_dim,
                      kv_dim, bq, bk, bv, q_norm, k_norm, eps);
}

absl::Status SwiGlu(const float* gate, const float* up, int64_t ff, int n_tokens, const float* gate_inp, const float* h,
                    int64_t n, float* out, cudaStream_t stream) {
  constexpr absl::string_view kFn = "SwiGlu";
  if (ff < 1) return BadArgument(kFn, "ff", ff, "it must be >= 1");
  if (n_tokens < 0) return BadArgument(kFn, "n_tokens", n_tokens, "it must be >= 0");
  if (gate == nullptr) return NullArgument(kFn, "gate");
  if (up == nullptr) return NullArgument(kFn, "up");
  if (out == nullptr) return NullArgument(kFn, "out");
  if (gate_inp != nullptr) {
    if (n < 1) return BadArgument(kFn, "n", n, "it must be >= 1 with a gate_inp");
    if (h == nullptr) return NullArgument(kFn, "h (with a gate_inp)");
  }
  if (n_tokens == 0) return absl::OkStatus();
  return LaunchKernel("SwiGluKernel", SwiGluKernel, n_tokens, kBlockThreads, 0, stream, gate, up, ff, gate_inp, h, n,
                      out);
}

}  // namespace strata::kernels::cuda
