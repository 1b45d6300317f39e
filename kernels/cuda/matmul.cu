// Dense weight products (GEMV for decode, cuBLAS SGEMM for prefill) and the embedding lookup.

#include <cublas_v2.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <memory>
#include <span>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/dense_device.cuh"
#include "kernels/cuda/dense_kernels.h"
#include "kernels/cuda/dependent_launch.cuh"

namespace strata::kernels::cuda {
namespace {

using detail::BadArgument;
using detail::kFullMask;
using detail::LoadChunk;
using detail::RawChunk;

absl::Status CublasStatus(cublasStatus_t status, absl::string_view what) {
  if (status == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  const std::string message = absl::StrCat(what, ": ", cublasGetStatusString(status));
  switch (status) {
    case CUBLAS_STATUS_ALLOC_FAILED:
      return absl::ResourceExhaustedError(message);
    case CUBLAS_STATUS_INVALID_VALUE:
      return absl::InvalidArgumentError(message);
    case CUBLAS_STATUS_NOT_INITIALIZED:
    case CUBLAS_STATUS_ARCH_MISMATCH:
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return absl::UnavailableError(message);
    default:
      return absl::InternalError(message);
  }
}

// Hopper's recommended cuBLAS workspace; given explicitly so cuBLAS never allocates during a call.
constexpr size_t kCublasWorkspaceBytes = size_t{32} << 20;

// ---------------------------------------------------------------------------------------------------------
// GEMV.
//
// A block of 4 warps computes kRowsPerBlock rows for all tokens. Each warp's lanes form kRowGroups groups
// of kColumnLanes lanes; a group owns kRowsPerGroup rows, and its lanes (across the 4 warps) take the row's
// chunks of 8 columns in turn. Lanes of different groups in a warp read the same activations (one L1
// transaction serves them), so more groups cut activation traffic when there are more tokens; fewer
// groups and more blocks keep more weight loads in flight when there are few tokens. Every weight is read
// once, with 16-byte loads, kUnroll chunks per row issued before they are used.

constexpr int kGemvWarps = 4;
constexpr int kGemvThreads = 32 * kGemvWarps;
constexpr int kMaxGroupOutputs = 3;

template <int kTokens>
struct GemvShape {
  static constexpr int kRowGroups = kTokens <= 4 ? 1 : (kTokens <= 8 ? 2 : 4);
  static constexpr int kRowsPerGroup = 2;
  static constexpr int kRowsPerBlock = kRowGroups * kRowsPerGroup;
  static constexpr int kColumnLanes = 32 / kRowGroups;  // per warp
  static constexpr int kBlockColumnLanes = kColumnLanes * kGemvWarps;
  static constexpr int kUnroll = kTokens >= 16 ? 2 : 4;
};

struct GemvOutput {
  const uint8_t* w;
  float* y;
  int64_t rows;
  int64_t y_stride;
  int64_t block_begin;  // first block of this output
  int accumulate;
};

struct GemvParams {
  GemvOutput outputs[kMaxGroupOutputs];
  int n_outputs;
  int64_t cols;
  uint64_t row_bytes;
  const float* x;
  int64_t x_stride;
  int n_tokens;  // <= the kernel's kTokens
};

// The output holding grid block `block` and that block's first row (constant indices keep the parameters out
// of local memory).
template <int kTokens>
__device__ __forceinline__ void LocateGemvBlock(const GemvParams& p, int64_t block, GemvOutput* out, int64_t* row0) {
  *out = p.outputs[0];
#pragma unroll
  for (int i = 1; i < kMaxGroupOutputs; ++i) {
    if (i < p.n_outputs && block >= p.outputs[i].block_begin) *out = p.outputs[i];
  }
  *row0 = (block - out->block_begin) * GemvShape<kTokens>::kRowsPerBlock;
}

// A grid of at most as many blocks as the GPU holds at once: each block takes row blocks b, b + gridDim.x, ...
// (n_row_blocks in all) and issues the next one's first loads before it reduces and stores the current one,
// so the memory system stays busy across row blocks and no second wave starts cold.
template <DenseType kType, int kTokens>
__global__ void __launch_bounds__(kGemvThreads) GemvKernel(const GemvParams p, int64_t n_row_blocks) {
  using Shape = GemvShape<kTokens>;
  constexpr int R = Shape::kRowsPerGroup;
  constexpr int kGroups = Shape::kRowGroups;
  constexpr int kColumnLanes = Shape::kColumnLanes;
  constexpr int kStep = Shape::kBlockColumnLanes;
  constexpr int U = Shape::kUnroll;
  __shared__ float partial[kGemvWarps][kGroups][R][kTokens];

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int group = lane / kColumnLanes, column_lane = lane % kColumnLanes;
  const int block_lane = warp * kColumnLanes + column_lane;
  const int64_t n_chunks = p.cols / 8;

  int64_t block = blockIdx.x;
  GemvOutput out;
  int64_t row0;
  LocateGemvBlock<kTokens>(p, block, &out, &row0);
  // Rows past the end read the last row (valid memory) and are not stored.
  const uint8_t* row_ptr[R];
  auto set_rows = [&](const GemvOutput& o, int64_t first_row) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int64_t row = min(first_row + group * R + r, o.rows - 1);
      row_ptr[r] = o.w + static_cast<uint64_t>(row) * p.row_bytes;
    }
  };
  set_rows(out, row0);

  // All U chunks are loaded before any is used; past the row's end the last chunk is read again (and not
  // used), so the loads need no branch. The first U are in flight before the wait for the kernel before.
  RawChunk<kType> raw[U][R];
  auto load = [&](int64_t k0) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t k = min(k0 + int64_t{u} * kStep, n_chunks - 1);
#pragma unroll
      for (int r = 0; r < R; ++r) raw[u][r] = LoadChunk<kType>(row_ptr[r], k);
    }
  };
  if (block_lane < n_chunks) load(block_lane);
  WaitForPriorKernels();
  for (;;) {
    float acc[R][kTokens];
#pragma unroll
    for (int r = 0; r < R; ++r) {
#pragma unroll
      for (int t = 0; t < kTokens; ++t) acc[r][t] = 0.0f;
    }
    for (int64_t k0 = block_lane; k0 < n_chunks; k0 += int64_t{kStep} * U) {
      if (k0 != block_lane) load(k0);
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t k = k0 + int64_t{u} * kStep;
        if (k < n_chunks) {
          float wv[R][8];
          float scale[R];
#pragma unroll
          for (int r = 0; r < R; ++r) detail::WidenChunk<kType>(raw[u][r], wv[r], &scale[r]);
#pragma unroll
          for (int t = 0; t < kTokens; ++t) {
            if (t < p.n_tokens) {
              const float4* xp = reinterpret_cast<const float4*>(p.x + t * p.x_stride + 8 * k);
              const float4 xa = __ldg(xp);
              const float4 xb = __ldg(xp + 1);
#pragma unroll
              for (int r = 0; r < R; ++r) {
                if constexpr (kType == DenseType::kQ8_0) {
                  // Codes times activations, then the block scale once.
                  float s = wv[r][0] * xa.x;
                  s = fmaf(wv[r][1], xa.y, s);
                  s = fmaf(wv[r][2], xa.z, s);
                  s = fmaf(wv[r][3], xa.w, s);
                  s = fmaf(wv[r][4], xb.x, s);
                  s = fmaf(wv[r][5], xb.y, s);
                  s = fmaf(wv[r][6], xb.z, s);
                  s = fmaf(wv[r][7], xb.w, s);
                  acc[r][t] = fmaf(scale[r], s, acc[r][t]);
                } else {
                  float a = acc[r][t];
                  a = fmaf(wv[r][0], xa.x, a);
                  a = fmaf(wv[r][1], xa.y, a);
                  a = fmaf(wv[r][2], xa.z, a);
                  a = fmaf(wv[r][3], xa.w, a);
                  a = fmaf(wv[r][4], xb.x, a);
                  a = fmaf(wv[r][5], xb.y, a);
                  a = fmaf(wv[r][6], xb.z, a);
                  a = fmaf(wv[r][7], xb.w, a);
                  acc[r][t] = a;
                }
              }
            }
          }
        }
      }
    }

    // The next row block's first chunks go out before this one's reduction.
    const int64_t next = block + gridDim.x;
    GemvOutput next_out = out;
    int64_t next_row0 = row0;
    if (next < n_row_blocks) {
      LocateGemvBlock<kTokens>(p, next, &next_out, &next_row0);
      set_rows(next_out, next_row0);
      if (block_lane < n_chunks) load(block_lane);
    }

    // Sum over the group's lanes of this warp, then over the 4 warps.
#pragma unroll
    for (int r = 0; r < R; ++r) {
#pragma unroll
      for (int t = 0; t < kTokens; ++t) {
#pragma unroll
        for (int offset = kColumnLanes / 2; offset > 0; offset /= 2) {
          acc[r][t] += __shfl_xor_sync(kFullMask, acc[r][t], offset);
        }
      }
    }
    if (column_lane == 0) {
#pragma unroll
      for (int r = 0; r < R; ++r) {
#pragma unroll
        for (int t = 0; t < kTokens; ++t) partial[warp][group][r][t] = acc[r][t];
      }
    }
    __syncthreads();
    // Element i: row (i % kRowsPerBlock) of the block, token i / kRowsPerBlock (neighbouring threads store
    // neighbouring rows).
    for (int i = threadIdx.x; i < Shape::kRowsPerBlock * kTokens; i += kGemvThreads) {
      const int row_in_block = i % Shape::kRowsPerBlock, t = i / Shape::kRowsPerBlock;
      const int g = row_in_block / R, r = row_in_block % R;
      const int64_t row = row0 + row_in_block;
      if (t >= p.n_tokens || row >= out.rows) continue;
      float sum = partial[0][g][r][t];
#pragma unroll
      for (int w = 1; w < kGemvWarps; ++w) sum += partial[w][g][r][t];
      float* y = out.y + t * out.y_stride + row;
      *y = out.accumulate ? *y + sum : sum;
    }
    if (next >= n_row_blocks) break;
    __syncthreads();  // every thread has read `partial` before the next row block writes it
    block = next;
    out = next_out;
    row0 = next_row0;
  }
}

// The GEMV's token buckets: bucket b computes up to 1 << b tokens a launch.
static_assert(1 << (MatmulContext::kGemvBuckets - 1) == kMaxGemvTokens);

template <DenseType kType, int kTokens>
absl::Status LaunchGemvFor(GemvParams p, int resident_blocks, cudaStream_t stream) {
  int64_t blocks = 0;
  for (int i = 0; i < p.n_outputs; ++i) {
    p.outputs[i].block_begin = blocks;
    blocks += (p.outputs[i].rows + GemvShape<kTokens>::kRowsPerBlock - 1) / GemvShape<kTokens>::kRowsPerBlock;
  }
  // A persistent grid: the blocks the device holds at once, each looping over row blocks.
  const int64_t grid = std::min<int64_t>(blocks, resident_blocks);
  return LaunchKernel("GemvKernel", GemvKernel<kType, kTokens>, static_cast<unsigned>(grid), kGemvThreads, 0, stream,
                      p, blocks);
}

// Calls f.template operator()<kTokens>() for the bucket of n_tokens (<= kMaxGemvTokens).
template <typename F>
auto ForTokenBucket(int n_tokens, F&& f) {
  if (n_tokens <= 1) return f.template operator()<1>();
  if (n_tokens <= 2) return f.template operator()<2>();
  if (n_tokens <= 4) return f.template operator()<4>();
  if (n_tokens <= 8) return f.template operator()<8>();
  if (n_tokens <= 16) return f.template operator()<16>();
  return f.template operator()<32>();
}

// Calls f.template operator()<kType>() for `type`; INVALID_ARGUMENT for an unknown one.
template <typename F>
absl::Status ForDenseType(DenseType type, F&& f) {
  switch (type) {
    case DenseType::kF32:
      return f.template operator()<DenseType::kF32>();
    case DenseType::kF16:
      return f.template operator()<DenseType::kF16>();
    case DenseType::kBF16:
      return f.template operator()<DenseType::kBF16>();
    case DenseType::kQ8_0:
      return f.template operator()<DenseType::kQ8_0>();
  }
  return absl::InvalidArgumentError("DenseMatmul: unknown DenseType");
}

constexpr int BucketOf(int tokens) { return tokens <= 1 ? 0 : 1 + BucketOf((tokens + 1) / 2); }

// Any n_tokens: one launch per kMaxGemvTokens tokens.
absl::Status LaunchGemv(const MatmulContext& ctx, DenseType type, const GemvParams& p, cudaStream_t stream) {
  for (int t0 = 0; t0 < p.n_tokens; t0 += kMaxGemvTokens) {
    GemvParams chunk = p;
    chunk.n_tokens = std::min(kMaxGemvTokens, p.n_tokens - t0);
    chunk.x = p.x + t0 * p.x_stride;
    for (int i = 0; i < p.n_outputs; ++i) chunk.outputs[i].y = p.outputs[i].y + t0 * p.outputs[i].y_stride;
    absl::Status s = ForDenseType(type, [&]<DenseType kType>() {
      return ForTokenBucket(chunk.n_tokens, [&]<int kTokens>() {
        return LaunchGemvFor<kType, kTokens>(chunk, ctx.gemv_resident_blocks(type, BucketOf(kTokens)), stream);
      });
    });
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------------------
// Widening to f32 (for the SGEMM) and the embedding lookup.

constexpr int kWidenThreads = 256;

// out[r*cols + c] = W[r][c] for r < rows: one chunk of 8 weights per thread.
template <DenseType kType>
__global__ void __launch_bounds__(kWidenThreads)
    WidenKernel(const uint8_t* w, uint64_t row_bytes, int64_t rows, int64_t cols, float* out) {
  const int64_t chunks_per_row = cols / 8;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kWidenThreads + threadIdx.x;
  if (i >= rows * chunks_per_row) return;
  const int64_t row = i / chunks_per_row, k = i % chunks_per_row;
  float v[8];
  detail::WidenChunkExact<kType>(LoadChunk<kType>(w + static_cast<uint64_t>(row) * row_bytes, k), v);
  float4* o = reinterpret_cast<float4*>(out + row * cols + 8 * k);
  o[0] = make_float4(v[0], v[1], v[2], v[3]);
  o[1] = make_float4(v[4], v[5], v[6], v[7]);
}

absl::Status LaunchWiden(DenseType type, const uint8_t* w, int64_t rows, int64_t cols, float* out,
                         cudaStream_t stream) {
  const uint64_t row_bytes = DenseRowBytes(type, cols);
  const int64_t blocks = (rows * (cols / 8) + kWidenThreads - 1) / kWidenThreads;
  if (blocks > INT_MAX) return BadArgument("DenseMatmul", "the widened block", rows * cols, "it is too large");
  const unsigned grid = static_cast<unsigned>(blocks);
  switch (type) {
    case DenseType::kF32:
      WidenKernel<DenseType::kF32><<<grid, kWidenThreads, 0, stream>>>(w, row_bytes, rows, cols, out);
      break;
    case DenseType::kF16:
      WidenKernel<DenseType::kF16><<<grid, kWidenThreads, 0, stream>>>(w, row_bytes, rows, cols, out);
      break;
    case DenseType::kBF16:
      WidenKernel<DenseType::kBF16><<<grid, kWidenThreads, 0, stream>>>(w, row_bytes, rows, cols, out);
      break;
    case DenseType::kQ8_0:
      WidenKernel<DenseType::kQ8_0><<<grid, kWidenThreads, 0, stream>>>(w, row_bytes, rows, cols, out);
      break;
  }
  return LaunchStatus("WidenKernel");
}

// ---------------------------------------------------------------------------------------------------------
// x's TF32 high and low parts (MatmulContext's split products).

constexpr int kSplitThreads = 256;
constexpr uint32_t kTf32Bits = 0xFFFFE000u;  // sign, exponent and the 10 significand bits TF32 keeps

// high = v with the bits TF32 drops cleared, low = v - high (exact). A NaN or an infinity goes whole into
// high (low 0), so it reaches y as the SGEMM would carry it.
__device__ __forceinline__ void SplitTf32(float v, float* high, float* low) {
  if (isfinite(v)) {
    *high = __uint_as_float(__float_as_uint(v) & kTf32Bits);
    *low = __fsub_rn(v, *high);
  } else {
    *high = v;
    *low = 0.0f;
  }
}

// Thread i splits four consecutive elements of a token's row: x[t*x_stride + c] into high and low at t*cols + c.
__global__ void __launch_bounds__(kSplitThreads)
    SplitTf32Kernel(const float* x, int64_t x_stride, int64_t cols, int64_t n_quads, float* high, float* low) {
  WaitForPriorKernels();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kSplitThreads + threadIdx.x;
  if (i >= n_quads) return;
  const int64_t quads_per_row = cols / 4;
  const int64_t t = i / quads_per_row, c = 4 * (i % quads_per_row);
  const float4 v = *reinterpret_cast<const float4*>(x + t * x_stride + c);
  float4 h, l;
  SplitTf32(v.x, &h.x, &l.x);
  SplitTf32(v.y, &h.y, &l.y);
  SplitTf32(v.z, &h.z, &l.z);
  SplitTf32(v.w, &h.w, &l.w);
  *reinterpret_cast<float4*>(high + t * cols + c) = h;
  *reinterpret_cast<float4*>(low + t * cols + c) = l;
}

absl::Status LaunchSplit(const float* x, int64_t x_stride, int64_t cols, int n_tokens, float* high, float* low,
                         cudaStream_t stream) {
  const int64_t quads = n_tokens * (cols / 4);
  const int64_t blocks = (quads + kSplitThreads - 1) / kSplitThreads;
  if (blocks > INT_MAX) return BadArgument("DenseMatmul", "n_tokens * cols", n_tokens * cols, "it is too large");
  return LaunchKernel("SplitTf32Kernel", SplitTf32Kernel, static_cast<unsigned>(blocks), kSplitThreads, 0, stream, x,
                      x_stride, cols, quads, high, low);
}

constexpr int kEmbedThreads = 128;

// Block (x, t) widens chunks [x*128, x*128 + 128) of token t's row.
template <DenseType kType>
__global__ void __launch_bounds__(kEmbedThreads)
    EmbedKernel(const uint8_t* table, uint64_t row_bytes, int64_t n, const TokenSlot* slots, float* x) {
  WaitForPriorKernels();
  const int t = blockIdx.y;
  const int64_t k = static_cast<int64_t>(blockIdx.x) * kEmbedThreads + threadIdx.x;
  if (k >= n / 8) return;
  const int64_t token = slots[t].token;
  float v[8];
  detail::WidenChunkExact<kType>(LoadChunk<kType>(table + static_cast<uint64_t>(token) * row_bytes, k), v);
  float4* o = reinterpret_cast<float4*>(x + t * n + 8 * k);
  o[0] = make_float4(v[0], v[1], v[2], v[3]);
  o[1] = make_float4(v[4], v[5], v[6], v[7]);
}

// ---------------------------------------------------------------------------------------------------------
// Checks shared by DenseMatmul and DenseMatmulGroup.

bool ValidType(DenseType type) {
  return type == DenseType::kF32 || type == DenseType::kF16 || type == DenseType::kBF16 || type == DenseType::kQ8_0;
}

absl::Status CheckProduct(absl::string_view function, DenseType type, int64_t cols, const float* x, int64_t x_stride,
                          int n_tokens) {
  if (!ValidType(type)) return BadArgument(function, "type", static_cast<int>(type), "it is not a DenseType");
  if (absl::Status s = detail::CheckColumns(function, "cols", type, cols); !s.ok()) return s;
  if (n_tokens < 0) return BadArgument(function, "n_tokens", n_tokens, "it must be >= 0");
  if (x == nullptr) return detail::NullArgument(function, "x");
  if (!detail::Aligned16(x)) return detail::Misaligned(function, "x", x);
  if (x_stride < cols || x_stride % 4 != 0) {
    return BadArgument(function, "x_stride", x_stride,
                       absl::StrCat("it must be >= cols (", cols, ") and a multiple of 4"));
  }
  return absl::OkStatus();
}

absl::Status CheckOutput(absl::string_view function, const MatmulOutput& o, int index) {
  const std::string prefix = index < 0 ? std::string() : absl::StrCat("outputs[", index, "].");
  if (o.rows < 1) return BadArgument(function, prefix + "rows", o.rows, "it must be >= 1");
  if (o.w == nullptr) return detail::NullArgument(function, prefix + "w");
  if (!detail::Aligned16(o.w)) return detail::Misaligned(function, prefix + "w", o.w);
  if (o.y == nullptr) return detail::NullArgument(function, prefix + "y");
  if (o.y_stride < o.rows) {
    return BadArgument(function, prefix + "y_stride", o.y_stride, absl::StrCat("it must be >= rows (", o.rows, ")"));
  }
  return absl::OkStatus();
}

// The x operand of a prompt product: the f32 activations, or their TF32 high part in `x` and low part in `low`,
// with one stride.
struct PromptOperand {
  const float* x = nullptr;
  const float* low = nullptr;
  int64_t stride = 0;
};

absl::Status GemmPass(cublasContext* handle, const float* w, int64_t rows, int64_t cols, const float* x,
                      int64_t x_stride, int n_tokens, float* y, int64_t y_stride, float beta, bool tf32) {
  const float alpha = 1.0f;
  // Column-major view: Y^T (rows x n_tokens, ld y_stride) = W (rows x cols, stored as its transpose with
  // ld cols) times X^T (cols x n_tokens, ld x_stride).
  const int m = static_cast<int>(rows), n = n_tokens, k = static_cast<int>(cols);
  if (!tf32) {
    return CublasStatus(cublasSgemm(handle, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &alpha, w, k, x,
                                    static_cast<int>(x_stride), &beta, y, static_cast<int>(y_stride)),
                        "cublasSgemm");
  }
  return CublasStatus(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &alpha, w, CUDA_R_32F, k, x, CUDA_R_32F,
                                   static_cast<int>(x_stride), &beta, y, CUDA_R_32F, static_cast<int>(y_stride),
                                   CUBLAS_COMPUTE_32F_FAST_TF32, CUBLAS_GEMM_DEFAULT),
                      "cublasGemmEx (TF32)");
}

// y (+)= W x for f32 weights: one SGEMM, or the TF32 products of x's two parts.
absl::Status Gemm(cublasContext* handle, const float* w, int64_t rows, int64_t cols, const PromptOperand& x,
                  int n_tokens, float* y, int64_t y_stride, bool accumulate) {
  const float beta = accumulate ? 1.0f : 0.0f;
  const bool split = x.low != nullptr;
  if (absl::Status s = GemmPass(handle, w, rows, cols, x.x, x.stride, n_tokens, y, y_stride, beta, split);
      !s.ok() || !split) {
    return s;
  }
  return GemmPass(handle, w, rows, cols, x.low, x.stride, n_tokens, y, y_stride, 1.0f, true);
}

// One output through cuBLAS: F32 weights directly, others widened a row block at a time.
absl::Status CublasProduct(MatmulContext& ctx, DenseType type, const MatmulOutput& o, bool accumulate, int64_t cols,
                           const PromptOperand& x, int n_tokens, cudaStream_t stream) {
  if (o.rows > INT_MAX || cols > INT_MAX || x.stride > INT_MAX || o.y_stride > INT_MAX) {
    return BadArgument("DenseMatmul", "the largest of rows, cols and strides",
                       std::max({o.rows, cols, x.stride, o.y_stride}), "cuBLAS takes 32-bit sizes");
  }
  absl::StatusOr<cublasContext*> handle = ctx.CublasFor(stream);
  if (!handle.ok()) return handle.status();
  if (type == DenseType::kF32) {
    return Gemm(*handle, reinterpret_cast<const float*>(o.w), o.rows, cols, x, n_tokens, o.y, o.y_stride, accumulate);
  }
  const uint64_t row_bytes = DenseRowBytes(type, cols);
  const int64_t block_rows = std::min(o.rows, ctx.dequant_elements() / cols);
  for (int64_t r0 = 0; r0 < o.rows; r0 += block_rows) {
    const int64_t n = std::min(block_rows, o.rows - r0);
    if (absl::Status s = LaunchWiden(type, o.w + r0 * row_bytes, n, cols, ctx.dequant_workspace(), stream); !s.ok()) {
      return s;
    }
    if (absl::Status s = Gemm(*handle, ctx.dequant_workspace(), n, cols, x, n_tokens, o.y + r0, o.y_stride, accumulate);
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

// Sizes of workspace a context takes, in elements (a larger one is refused, so that no byte count overflows).
constexpr int64_t kMaxWorkspaceElements = int64_t{1} << 40;

// A multiple of 4, so that the low part (split_elements floats in) is 16-byte aligned for the split's float4s.
int64_t SplitElementsRounded(int64_t elements) { return (elements + 3) / 4 * 4; }

// Widened F16 and BF16 weights are TF32 values; F32 and Q8_0 (scale times code) weights need not be.
bool UseSplitTf32(const MatmulContext& ctx, DenseType type, int64_t cols, int n_tokens) {
  return ctx.has_tf32() && (type == DenseType::kF16 || type == DenseType::kBF16) &&
         ctx.split_elements() >= n_tokens * cols;
}

// The cuBLAS path of DenseMatmul and DenseMatmulGroup: x split once for all outputs when the context takes
// split products.
absl::Status PromptProducts(MatmulContext& ctx, DenseType type, std::span<const MatmulOutput> outputs,
                            bool accumulate, int64_t cols, const float* x, int64_t x_stride, int n_tokens,
                            cudaStream_t stream) {
  PromptOperand operand{x, nullptr, x_stride};
  if (UseSplitTf32(ctx, type, cols, n_tokens)) {
    if (absl::Status s = LaunchSplit(x, x_stride, cols, n_tokens, ctx.split_high(), ctx.split_low(), stream);
        !s.ok()) {
      return s;
    }
    operand = PromptOperand{ctx.split_high(), ctx.split_low(), cols};
  }
  for (const MatmulOutput& o : outputs) {
    if (absl::Status s = CublasProduct(ctx, type, o, accumulate, cols, operand, n_tokens, stream); !s.ok()) return s;
  }
  return absl::OkStatus();
}

bool UseCublas(const MatmulContext& ctx, DenseType type, int64_t cols, int n_tokens) {
  return n_tokens > kMaxGemvTokens && (type == DenseType::kF32 || ctx.dequant_elements() >= cols);
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<MatmulContext>> MatmulContext::Create(cudaStream_t stream,
                                                                     int64_t max_dequant_elements,
                                                                     int64_t max_split_elements) {
  if (max_dequant_elements < 0 || max_dequant_elements > kMaxWorkspaceElements) {
    return BadArgument("MatmulContext::Create", "max_dequant_elements", max_dequant_elements,
                       "it must be in [0, 2^40]");
  }
  if (max_split_elements < 0 || max_split_elements > kMaxWorkspaceElements) {
    return BadArgument("MatmulContext::Create", "max_split_elements", max_split_elements, "it must be in [0, 2^40]");
  }
  std::unique_ptr<MatmulContext> ctx(new MatmulContext());
  absl::StatusOr<DeviceBuffer> workspace = DeviceBuffer::Allocate(kCublasWorkspaceBytes);
  if (!workspace.ok()) return workspace.status();
  ctx->cublas_workspace_ = *std::move(workspace);
  absl::StatusOr<DeviceBuffer> dequant =
      DeviceBuffer::Allocate(static_cast<size_t>(max_dequant_elements) * sizeof(float));
  if (!dequant.ok()) return dequant.status();
  ctx->dequant_ = *std::move(dequant);
  ctx->dequant_elements_ = max_dequant_elements;
  const int64_t split_elements = SplitElementsRounded(max_split_elements);
  absl::StatusOr<DeviceBuffer> split = DeviceBuffer::Allocate(2 * static_cast<size_t>(split_elements) * sizeof(float));
  if (!split.ok()) return split.status();
  ctx->split_ = *std::move(split);
  ctx->split_elements_ = split_elements;
  cublasHandle_t handle = nullptr;
  if (absl::Status s = CublasStatus(cublasCreate(&handle), "cublasCreate"); !s.ok()) return s;
  ctx->handle_ = handle;
  // FP32 products unless a call asks for TF32 (the split products).
  if (absl::Status s = CublasStatus(cublasSetMathMode(handle, CUBLAS_DEFAULT_MATH), "cublasSetMathMode"); !s.ok()) {
    return s;
  }
  if (absl::StatusOr<cublasContext*> bound = ctx->CublasFor(stream); !bound.ok()) return bound.status();
  int device = 0, major = 0;
  CUDA_RETURN_IF_ERROR(cudaGetDevice(&device), "cudaGetDevice");
  CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device),
                       "reading the device's compute capability");
  ctx->has_tf32_ = major >= 8;
  for (DenseType type : {DenseType::kF32, DenseType::kF16, DenseType::kBF16, DenseType::kQ8_0}) {
    for (int bucket = 0; bucket < kGemvBuckets; ++bucket) {
      absl::Status s = ForDenseType(type, [&]<DenseType kType>() {
        return ForTokenBucket(1 << bucket, [&]<int kTokens>() -> absl::Status {
          const absl::StatusOr<int64_t> resident = ResidentBlocks(GemvKernel<kType, kTokens>, kGemvThreads);
          if (!resident.ok()) return resident.status();
          ctx->gemv_resident_blocks_[static_cast<int>(type)][bucket] = static_cast<int>(*resident);
          return absl::OkStatus();
        });
      });
      if (!s.ok()) return s;
    }
  }
  return ctx;
}

uint64_t MatmulContext::DeviceBytes(int64_t max_dequant_elements, int64_t max_split_elements) {
  const auto elements = [](int64_t n) {
    return static_cast<uint64_t>(std::clamp<int64_t>(n, 0, kMaxWorkspaceElements));
  };
  return kCublasWorkspaceBytes + elements(max_dequant_elements) * sizeof(float) +
         2 * elements(SplitElementsRounded(max_split_elements)) * sizeof(float);
}

MatmulContext::~MatmulContext() {
  if (handle_ != nullptr) cublasDestroy(handle_);
}

absl::StatusOr<cublasContext*> MatmulContext::CublasFor(cudaStream_t stream) {
  if (!bound_ || stream != stream_) {
    if (absl::Status s = CublasStatus(cublasSetStream(handle_, stream), "cublasSetStream"); !s.ok()) return s;
    // cublasSetStream drops a user workspace; give it back.
    if (absl::Status s = CublasStatus(cublasSetWorkspace(handle_, cublas_workspace_.data(), cublas_workspace_.bytes()),
                                      "cublasSetWorkspace");
        !s.ok()) {
      return s;
    }
    stream_ = stream;
    bound_ = true;
  }
  return handle_;
}

absl::Status DenseMatmul(MatmulContext& ctx, DenseType type, const uint8_t* w, int64_t rows, int64_t cols,
                         const float* x, int64_t x_stride, int n_tokens, float* y, int64_t y_stride, bool accumulate,
                         cudaStream_t stream) {
  if (absl::Status s = CheckProduct("DenseMatmul", type, cols, x, x_stride, n_tokens); !s.ok()) return s;
  const MatmulOutput output{w, rows, y, y_stride};
  if (absl::Status s = CheckOutput("DenseMatmul", output, -1); !s.ok()) return s;
  if (n_tokens == 0) return absl::OkStatus();
  if (UseCublas(ctx, type, cols, n_tokens)) {
    return PromptProducts(ctx, type, std::span<const MatmulOutput>(&output, 1), accumulate, cols, x, x_stride,
                          n_tokens, stream);
  }
  GemvParams p{};
  p.outputs[0] = GemvOutput{w, y, rows, y_stride, 0, accumulate ? 1 : 0};
  p.n_outputs = 1;
  p.cols = cols;
  p.row_bytes = DenseRowBytes(type, cols);
  p.x = x;
  p.x_stride = x_stride;
  p.n_tokens = n_tokens;
  return LaunchGemv(ctx, type, p, stream);
}

absl::Status DenseMatmulGroup(MatmulContext& ctx, DenseType type, int64_t cols, std::span<const MatmulOutput> outputs,
                              const float* x, int64_t x_stride, int n_tokens, cudaStream_t stream) {
  if (outputs.empty() || outputs.size() > kMaxGroupOutputs) {
    return BadArgument("DenseMatmulGroup", "outputs.size()", static_cast<int64_t>(outputs.size()),
                       "it must be 1, 2 or 3");
  }
  if (absl::Status s = CheckProduct("DenseMatmulGroup", type, cols, x, x_stride, n_tokens); !s.ok()) return s;
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (absl::Status s = CheckOutput("DenseMatmulGroup", outputs[i], static_cast<int>(i)); !s.ok()) return s;
  }
  if (n_tokens == 0) return absl::OkStatus();
  if (UseCublas(ctx, type, cols, n_tokens)) {
    return PromptProducts(ctx, type, outputs, /*accumulate=*/false, cols, x, x_stride, n_tokens, stream);
  }
  GemvParams p{};
  for (size_t i = 0; i < outputs.size(); ++i) {
    p.outputs[i] = GemvOutput{outputs[i].w, outputs[i].y, outputs[i].rows, outputs[i].y_stride, 0, 0};
  }
  p.n_outputs = static_cast<int>(outputs.size());
  p.cols = cols;
  p.row_bytes = DenseRowBytes(type, cols);
  p.x = x;
  p.x_stride = x_stride;
  p.n_tokens = n_tokens;
  return LaunchGemv(ctx, type, p, stream);
}

absl::Status EmbedRows(DenseType type, const uint8_t* table, int64_t n, const TokenSlot* slots, int n_tokens, float* x,
                       cudaStream_t stream) {
  constexpr absl::string_view kFn = "EmbedRows";
  if (!ValidType(type)) return BadArgument(kFn, "type", static_cast<int>(type), "it is not a DenseType");
  if (absl::Status s = detail::CheckColumns(kFn, "n", type, n); !s.ok()) return s;
  if (n_tokens < 0 || n_tokens > 65535) return BadArgument(kFn, "n_tokens", n_tokens, "it must be in [0, 65535]");
  if (table == nullptr) return detail::NullArgument(kFn, "table");
  if (slots == nullptr) return detail::NullArgument(kFn, "slots");
  if (x == nullptr) return detail::NullArgument(kFn, "x");
  if (!detail::Aligned16(table)) return detail::Misaligned(kFn, "table", table);
  if (!detail::Aligned16(x)) return detail::Misaligned(kFn, "x", x);
  if (n_tokens == 0) return absl::OkStatus();
  const uint64_t row_bytes = DenseRowBytes(type, n);
  const dim3 grid(static_cast<unsigned>((n / 8 + kEmbedThreads - 1) / kEmbedThreads), static_cast<unsigned>(n_tokens));
  switch (type) {
    case DenseType::kF32:
      return LaunchKernel("EmbedKernel", EmbedKernel<DenseType::kF32>, grid, kEmbedThreads, 0, stream, table, row_bytes,
                          n, slots, x);
    case DenseType::kF16:
      return LaunchKernel("EmbedKernel", EmbedKernel<DenseType::kF16>, grid, kEmbedThreads, 0, stream, table, row_bytes,
                          n, slots, x);
    case DenseType::kBF16:
      return LaunchKernel("EmbedKernel", EmbedKernel<DenseType::kBF16>, grid, kEmbedThreads, 0, stream, table,
                          row_bytes, n, slots, x);
    case DenseType::kQ8_0:
      return LaunchKernel("EmbedKernel", EmbedKernel<DenseType::kQ8_0>, grid, kEmbedThreads, 0, stream, table,
                          row_bytes, n, slots, x);
  }
  return LaunchStatus("EmbedKernel");
}

}  // namespace strata::kernels::cuda
