#ifndef STRATA_KERNELS_CUDA_EXPERT_KERNELS_H_
#define STRATA_KERNELS_CUDA_EXPERT_KERNELS_H_

// The routed experts of a MoE layer on the GPU: the SwiGLU expert of kernels/cpu/expert_forward.h
//   h = silu(gate . x) * (up . x),  out = down . h
// over blobs laid out by kernels/format/expert_layout.h, for every scheme (f16, s8, s4, s2, mxfp4: its kernels compiled
// but not yet run on a GPU, so the engine refuses mxfp4 packs on CUDA until ExpertFfnGpuTest/mxfp4 passes). The integer
// schemes quantize x and h exactly as kernels/cpu's QuantizeActivation does and compute each 32-block's integer sum
// exactly as DotRowReference does; only the order of the float accumulation over blocks differs from the CPU (so
// results agree to float rounding, except where that rounding moves an int8 code of h across a rounding boundary). f16
// computes in f32 against the unquantized activations.
//
// Promises of every function here:
//  - Enqueue-only: each call validates its host arguments, enqueues kernels on `stream` and returns. It
//    never synchronizes, allocates, or reads device data on the host, so it may be captured in a CUDA
//    graph; a graph captured at given sizes replays correctly for any device-side contents (routing,
//    activations, weights).
//  - Pointers documented as device memory must be accessible to the kernels (cudaMalloc'd, or mapped
//    page-locked host memory) and, for ExpertFfn, 16-byte aligned (ids: 4). Nothing is read or written
//    outside the shapes given.
//  - Status codes: INVALID_ARGUMENT (naming the argument and the numbers) for a bad size, a null or
//    misaligned pointer, an inconsistent layout, or a workspace smaller than needed; otherwise the status
//    of the launches (kernels/cuda/cuda_status.h: INTERNAL for a failed launch, UNAVAILABLE without a
//    device, ...). A launch error may also be one left by earlier asynchronous work on the device. An OK
//    status means the work was enqueued, not that it completed.
//  - Results are deterministic: the same inputs give the same bits whatever the routing of other tokens.
//  - Thread-safe: calls on different streams with separate workspaces may run concurrently.

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "kernels/format/expert_layout.h"

namespace strata::kernels::cuda {

// What a model adds to the plain SwiGLU experts (gpt-oss), as kernels/cpu's ExpertWork computes it with an
// ExpertJob's biases and ExpertActivation::kClampedSwiGlu:
//   h = act(gate . x + gate_bias[e], up . x + up_bias[e]),  out = down . h + down_bias[e]
// with act silu(g) * u, or the clamped SwiGLU g' / (1 + exp(-1.702 g')) * (u' + 1), g' = min(g, 7),
// u' = clamp(u, -7, 7). The bias tables are device memory, expert e's row at e * expert_ff (gate, up) or
// e * n_embd (down), for the n_expert experts of the call's ids (one MoE layer); a null table: no bias.
// The default (no biases, plain SwiGLU) runs exactly the kernels' plain path.
// One field is a launch hint, not math: mostly_skipped, for a call whose ids are mostly negative (a streamed
// chunk: a few experts' pairs of a long prompt's). The weight kernels of integer schemes in 8-token items then
// run as many blocks as the GPU holds at once, walking the work items the grouping found, instead of a block
// for each item the bound allows (n_tokens * k / 8 + n_expert), most of which would only exit. Slower for a
// call whose pairs are mostly routed (the walk: 20-30% on an H200), so only for such calls. Same bits either way.
struct ExpertFfnExtras {
  const float* gate_bias = nullptr;
  const float* up_bias = nullptr;
  const float* down_bias = nullptr;
  bool clamped_swiglu = false;
  bool mostly_skipped = false;
  bool plain() const { return gate_bias == nullptr && up_bias == nullptr && down_bias == nullptr && !clamped_swiglu; }
};

// Bytes of workspace ExpertFfn needs for up to max_tokens tokens of k experts each, n_expert experts
// (it also suffices for any smaller n_tokens). 0 for arguments ExpertFfn would refuse.
size_t ExpertFfnWorkspaceBytes(const ExpertLayout& layout, int max_tokens, int k, int n_expert);

// The routed experts of one MoE layer for n_tokens tokens, as one grouped launch sequence (three kernels):
//  - layout: as ComputeExpertLayout returns it;
//  - blobs: device array of n_expert pointers, blobs[e] = the blob of expert e (laid out as `layout`), each
//    16-byte aligned, in device memory or mapped page-locked host memory. Only the blobs of routed experts
//    are read; others may be null;
//  - ids: device, n_tokens x k int32 expert ids. An id < 0 means the pair is computed elsewhere (the offload
//    tier computes misses on the CPU): its parts row is left untouched. Ids >= n_expert are a caller bug;
//    they are treated like negative ids (never read out of bounds). A token may name an expert twice;
//  - x: device, n_tokens x n_embd f32, row stride n_embd (the layer's normed activations);
//  - parts: device, n_tokens x k x n_embd f32: parts[t][j] = expert ids[t][j]'s output for token t (no
//    router weight applied). Overwritten for every valid pair, untouched otherwise;
//  - workspace: device, at least ExpertFfnWorkspaceBytes(layout, n_tokens, k, n_expert) bytes, owned by
//    the caller and not used by anything else until the enqueued work completes;
//  - extras: biases and the clamped activation (ExpertFfnExtras), looked up by the pair's expert id.
// Tokens are grouped by expert on the device, in work items of up to 8 tokens (2 when the call has fewer
// than 4 pairs per expert on average) that share each weight load; the items of one expert run side by
// side, so an expert's weights come from HBM once a call and from L2 for its further items. The grids are
// sized from n_tokens, k, n_expert and (mostly_skipped) the device's SM count and occupancy, never from device
// data, so a captured graph replays for any routing. n_tokens == 0 enqueues nothing. A token's result is the
// same bits whatever else is in the call, and with or without mostly_skipped.
// INVALID_ARGUMENT for n_tokens < 0, n_expert outside [1, 8192], k outside [1, n_expert], n_tokens * k > 2^24,
// n_tokens * n_embd or n_tokens * k * expert_ff >= 2^31, a layout whose dimensions or role sizes do not
// follow kernels/format, a null or misaligned pointer (a bias table not 4-byte aligned), or a workspace
// smaller than needed.
absl::Status ExpertFfn(const ExpertLayout& layout, const uint8_t* const* blobs, int n_expert, const int32_t* ids,
                       int n_tokens, int k, const float* x, float* parts, const ExpertFfnExtras& extras,
                       void* workspace, size_t workspace_bytes, cudaStream_t stream);

// Quantizes n_tokens activations of n elements (n a positive multiple of 32) exactly as kernels/cpu's
// QuantizeActivation: q[t*n + i], scale[t*(n/32) + b], sum[t*(n/32) + b]. The codes, scales and sums are
// bit-identical to the CPU's for the same input floats (NaN, infinities and subnormals included).
// ExpertFfn quantizes x and h with the same device code. x, q, scale, sum: device memory, each aligned to
// its element type (the 16-byte rule above does not apply). n_tokens == 0 enqueues nothing.
// INVALID_ARGUMENT for n not a positive multiple of 32, n_tokens < 0, or a null pointer.
absl::Status QuantizeActivations(const float* x, int64_t n, int n_tokens, int8_t* q, float* scale, int32_t* sum,
                                 cudaStream_t stream);

}  // namespace strata::kernels::cuda

#endif  // STRATA_KERNELS_CUDA_EXPERT_KERNELS_H_
