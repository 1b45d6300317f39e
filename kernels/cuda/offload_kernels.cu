// Pair selection and the host mailbox of the offload tier (offload_kernels.h).

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/dependent_launch.cuh"
#include "kernels/cuda/offload_kernels.h"

namespace strata::kernels::cuda {
namespace {

constexpr int kSelectThreads = 256;
constexpr int kSplitThreads = 1024;
constexpr int kCollectThreads = 256;
constexpr int kMaxSplitExperts = 8192;
constexpr int kMaxSplitPairs = 65536;

__device__ __forceinline__ bool OnHost(const uint8_t* blob, const uint8_t* begin, const uint8_t* end) {
  return blob >= begin && blob < end;
}

__device__ __forceinline__ uint64_t GlobalNanoseconds() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void SelectResidentKernel(const int32_t* ids, int n_pairs, const uint8_t* const* blobs, int n_expert,
                                     const uint8_t* host_begin, const uint8_t* host_end, int32_t* out) {
  WaitForPriorKernels();
  const int p = blockIdx.x * blockDim.x + threadIdx.x;
  if (p >= n_pairs) return;
  const int32_t e = ids[p];
  out[p] = e >= 0 && e < n_expert && !OnHost(blobs[e], host_begin, host_end) ? e : -1;
}

__global__ void SelectStagedKernel(const int32_t* ids, int n_pairs, const StagedChunk chunk, const uint8_t* staging,
                                   uint64_t blob_bytes, const uint8_t** table, int32_t* out) {
  WaitForPriorKernels();
  const int p = blockIdx.x * blockDim.x + threadIdx.x;
  if (blockIdx.x == 0 && threadIdx.x < chunk.count) {
    table[chunk.experts[threadIdx.x]] = staging + threadIdx.x * blob_bytes;
  }
  if (p >= n_pairs) return;
  const int32_t e = ids[p];
  bool staged = false;
  for (int j = 0; j < chunk.count; ++j) staged |= chunk.experts[j] == e;
  out[p] = staged ? e : -1;
}

// One block. flag[e] (shared): 0 for experts not missed by this layer's pairs, else 1 + the expert's rank
// among the missed experts in expert order.
__global__ void __launch_bounds__(kSplitThreads) SplitForHostKernel(const HostSplitArgs a) {
  WaitForPriorKernels();
  extern __shared__ int32_t flag[];
  __shared__ int32_t scan[kSplitThreads];
  __shared__ int32_t s_host_pairs;
  const int tid = threadIdx.x;
  const int n_pairs = a.n_tokens * a.k;
  for (int e = tid; e < a.n_expert; e += kSplitThreads) flag[e] = 0;
  if (tid == 0) s_host_pairs = 0;
  __syncthreads();
  for (int p = tid; p < n_pairs; p += kSplitThreads) {
    const int32_t e = a.ids[p];
    if (e >= 0 && e < a.n_expert && OnHost(a.blobs[e], a.host_begin, a.host_end)) flag[e] = 1;
  }
  __syncthreads();
  // Ranks: each thread owns a contiguous range of experts; an inclusive scan over the threads' counts.
  const int per_thread = (a.n_expert + kSplitThreads - 1) / kSplitThreads;
  const int e_begin = min(tid * per_thread, a.n_expert), e_end = min(e_begin + per_thread, a.n_expert);
  int mine = 0;
  for (int e = e_begin; e < e_end; ++e) mine += flag[e];
  scan[tid] = mine;
  __syncthreads();
  for (int offset = 1; offset < kSplitThreads; offset <<= 1) {
    const int add = tid >= offset ? scan[tid - offset] : 0;
    __syncthreads();
    scan[tid] += add;
    __syncthreads();
  }
  const int misses = scan[kSplitThreads - 1];
  int rank = scan[tid] - mine;
  for (int e = e_begin; e < e_end; ++e) {
    if (flag[e] != 0) flag[e] = 1 + rank++;
  }
  __syncthreads();
  const float share = fminf(fmaxf(*a.host_share, 0.0f), 1.0f);
  int host_experts = static_cast<int>(share * static_cast<float>(misses) + 0.5f);
  if (host_experts < a.min_host_experts) host_experts = 0;
  for (int p = tid; p < n_pairs; p += kSplitThreads) {
    const int32_t e = a.ids[p];
    const bool valid = e >= 0 && e < a.n_expert;
    const bool to_host = valid && flag[e] != 0 && flag[e] <= host_experts;
    a.gpu_ids[p] = valid && !to_host ? e : -1;
    a.host_ids[p] = to_host ? e : -1;
    a.mailbox_ids[p] = to_host ? e : -1;
    if (to_host) atomicAdd(&s_host_pairs, 1);
  }
  __syncthreads();
  const int host_pairs = s_host_pairs;
  if (tid == 0) *a.host_pairs = host_pairs;
  if (host_pairs == 0) return;
  const int64_t n_x = static_cast<int64_t>(a.n_tokens) * a.n_embd;
  for (int64_t i = tid; i < n_x; i += kSplitThreads) a.mailbox_x[i] = a.x[i];
  // Every thread's mailbox writes are visible to the host before the request number is.
  __threadfence_system();
  __syncthreads();
  if (tid == 0) {
    a.mailbox->moe_layer = a.moe_layer;
    a.mailbox->n_tokens = a.n_tokens;
    a.mailbox->k = a.k;
    a.mailbox->posted = a.mailbox->posted + 1;
    const int64_t request = *a.sequence + 1;
    *a.sequence = request;
    __threadfence_system();
    a.mailbox->request = request;
  }
}

// A block per pair; the host's pairs' blocks wait for the answer and copy their row.
__global__ void __launch_bounds__(kCollectThreads)
    CollectFromHostKernel(const int32_t* host_ids, int n_pairs, const int64_t* sequence, const int32_t* host_pairs,
                          HostMailbox* mailbox, const float* mailbox_parts, int64_t n_embd, uint64_t timeout_ns,
                          float* parts) {
  WaitForPriorKernels();
  __shared__ bool s_answered;
  const int p = blockIdx.x;
  if (*host_pairs == 0 || host_ids[p] < 0) return;
  if (threadIdx.x == 0) {
    const int64_t request = *sequence;
    bool waited = false;
    const uint64_t start = GlobalNanoseconds();
    bool answered = true;
    while (mailbox->done < request) {
      waited = true;
      if (mailbox->timed_out != 0 || GlobalNanoseconds() - start > timeout_ns) {
        mailbox->timed_out = 1;
        answered = false;
        break;
      }
      __nanosleep(200);
    }
    // The first of the host's pairs keeps the count of requests the GPU waited for.
    bool first = true;
    for (int q = 0; q < p && first; ++q) first = host_ids[q] < 0;
    if (first && waited) mailbox->waited = mailbox->waited + 1;
    s_answered = answered;
    __threadfence_system();
  }
  __syncthreads();
  if (!s_answered) return;
  const float* row = mailbox_parts + static_cast<int64_t>(p) * n_embd;
  float* out = parts + static_cast<int64_t>(p) * n_embd;
  // Each read crosses PCIe (about a microsecond): a thread issues all of its reads before it stores, 16
  // bytes each where the row allows it, so a row costs a round trip or two instead of one per element.
  constexpr int kInFlight = 4;
  if (n_embd % 4 == 0 && reinterpret_cast<uintptr_t>(row) % 16 == 0 && reinterpret_cast<uintptr_t>(out) % 16 == 0) {
    const int64_t n4 = n_embd / 4;
    for (int64_t base = threadIdx.x; base < n4; base += kInFlight * kCollectThreads) {
      float4 v[kInFlight];
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) {
        if (base + u * kCollectThreads < n4) v[u] = __ldcv(reinterpret_cast<const float4*>(row) + base + u * kCollectThreads);
      }
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) {
        if (base + u * kCollectThreads < n4) reinterpret_cast<float4*>(out)[base + u * kCollectThreads] = v[u];
      }
    }
    return;
  }
  for (int64_t base = threadIdx.x; base < n_embd; base += kInFlight * kCollectThreads) {
    float v[kInFlight];
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) {
      if (base + u * kCollectThreads < n_embd) v[u] = __ldcv(row + base + u * kCollectThreads);
    }
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) {
      if (base + u * kCollectThreads < n_embd) out[base + u * kCollectThreads] = v[u];
    }
  }
}

constexpr int kStageThreads = 256;
constexpr int kStageBlocks = 528;  // four per SM of an H100/H200; the copy loop strides over the grid
constexpr int kStageInFlight = 8;  // 16-byte reads a thread issues before it stores them

// The whole grid copies blobs table[slot_expert[j]] (each blob_bytes, a multiple of 16) into consecutive slots
// of `slots`, j < count: 16-byte read-only loads (the arena does not change while serving), kStageInFlight of
// them a thread before it stores, striding over the grid.
__device__ void CopyBlobsToSlots(const uint8_t* const* table, const int32_t* slot_expert, int count,
                                 uint64_t blob_bytes, uint8_t* slots) {
  const int64_t blob16 = static_cast<int64_t>(blob_bytes / 16);
  const int64_t total = static_cast<int64_t>(count) * blob16;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  int4* dst = reinterpret_cast<int4*>(slots);  // slot-major: element i of the copy is dst[i]
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; base < total;
       base += kStageInFlight * stride) {
    int4 v[kStageInFlight];
#pragma unroll
    for (int u = 0; u < kStageInFlight; ++u) {
      const int64_t i = base + u * stride;
      if (i < total) {
        const int64_t slot = i / blob16;
        v[u] = __ldg(reinterpret_cast<const int4*>(table[slot_expert[slot]]) + (i - slot * blob16));
      }
    }
#pragma unroll
    for (int u = 0; u < kStageInFlight; ++u) {
      const int64_t i = base + u * stride;
      if (i < total) dst[i] = v[u];
    }
  }
}

// Every block finds the staged experts (a few hundred pairs at most: quadratic scans in shared memory);
// block 0 writes the table; all blocks copy.
__global__ void __launch_bounds__(kStageThreads) StageMissesKernel(const StageMissesArgs a) {
  WaitForPriorKernels();
  __shared__ int32_t s_first[kMaxStagePairs];  // the pair's expert if it is that missed expert's first pair, else -1
  __shared__ int32_t s_slot_expert[kMaxStageSlots];
  __shared__ int s_missed;
  const int tid = threadIdx.x;
  if (tid == 0) s_missed = 0;
  __syncthreads();
  auto missed = [&](int32_t e) { return e >= 0 && e < a.n_expert && OnHost(a.table[e], a.host_begin, a.host_end); };
  for (int p = tid; p < a.n_pairs; p += kStageThreads) {
    const int32_t e = a.ids[p];
    bool first = missed(e);
    for (int q = 0; q < p && first; ++q) first = a.ids[q] != e;
    s_first[p] = first ? e : -1;
    if (first) atomicAdd(&s_missed, 1);
  }
  __syncthreads();
  // An expert's slot: how many missed experts have a lower id.
  auto slot_of = [&](int32_t e) {
    int rank = 0;
    for (int q = 0; q < a.n_pairs; ++q) rank += s_first[q] >= 0 && s_first[q] < e;
    return rank;
  };
  for (int p = tid; p < a.n_pairs; p += kStageThreads) {
    if (s_first[p] < 0) continue;
    const int slot = slot_of(s_first[p]);
    if (slot < a.max_slots) s_slot_expert[slot] = s_first[p];
  }
  if (blockIdx.x == 0) {
    for (int p = tid; p < a.n_pairs; p += kStageThreads) {
      const int32_t e = a.ids[p];
      if (e < 0 || e >= a.n_expert) continue;
      const int slot = missed(e) ? slot_of(e) : a.max_slots;
      // Pairs of one expert write the same value.
      a.out_table[e] = slot < a.max_slots ? a.staging + static_cast<uint64_t>(slot) * a.blob_bytes : a.table[e];
    }
  }
  __syncthreads();
  CopyBlobsToSlots(a.table, s_slot_expert, min(s_missed, a.max_slots), a.blob_bytes, a.staging);
}

constexpr int kPrefetchThreads = 256;
// Few blocks: the copies run beside the step's own latency-bound kernels, and more blocks slowed those more
// than they sped the copies (132, 264 and 528 blocks measured slower decoding than 32; bench/RESULTS.md).
constexpr int kPrefetchBlocks = 32;

// Every block finds the recorded experts; block 0 writes the table and the record; all blocks copy.
__global__ void __launch_bounds__(kPrefetchThreads) PrefetchGuessedKernel(const PrefetchArgs a) {
  WaitForPriorKernels();
  __shared__ int32_t s_new[kMaxStagePairs];  // by rank-major index: the expert if it is a new miss there, else -1
  __shared__ int32_t s_slot_expert[kMaxPrefetchSlots];
  __shared__ int s_count, s_copy;
  const int tid = threadIdx.x;
  const int n_pairs = a.n_tokens * a.k;
  // Rank-major index i: choice i / n_tokens of token i % n_tokens.
  auto expert_at = [&](int i) { return a.guess[(i % a.n_tokens) * a.k + i / a.n_tokens]; };
  for (int i = tid; i < n_pairs; i += kPrefetchThreads) {
    const int32_t e = expert_at(i);
    bool fresh = e >= 0 && e < a.n_expert && OnHost(a.table[e], a.host_begin, a.host_end);
    for (int j = 0; j < i && fresh; ++j) fresh = expert_at(j) != e;
    s_new[i] = fresh ? e : -1;
  }
  __syncthreads();
  if (tid == 0) {
    int count = 0;
    for (int i = 0; i < n_pairs && count < a.max_slots; ++i) {
      if (s_new[i] >= 0) s_slot_expert[count++] = s_new[i];
    }
    s_count = count;
    s_copy = min(max(a.control[0], 0), count);
  }
  __syncthreads();
  const int count = s_count, copy = s_copy;
  if (blockIdx.x == 0) {
    for (int e = tid; e < a.n_expert; e += kPrefetchThreads) a.out_table[e] = a.table[e];
    for (int j = tid; j < a.max_slots; j += kPrefetchThreads) a.record[2 + j] = j < count ? s_slot_expert[j] : -1;
    if (tid == 0) {
      a.record[0] = a.control[1];
      a.record[1] = count;
    }
    __syncthreads();
    for (int j = tid; j < copy; j += kPrefetchThreads) {
      a.out_table[s_slot_expert[j]] = a.slots + static_cast<uint64_t>(j) * a.blob_bytes;
    }
  }
  CopyBlobsToSlots(a.table, s_slot_expert, copy, a.blob_bytes, a.slots);
}

unsigned Blocks(int64_t n, int threads) { return static_cast<unsigned>((n + threads - 1) / threads); }

}  // namespace

absl::Status SelectResidentPairs(const int32_t* ids, int n_pairs, const uint8_t* const* blobs, int n_expert,
                                 const uint8_t* host_begin, const uint8_t* host_end, int32_t* out,
                                 cudaStream_t stream) {
  if (ids == nullptr || blobs == nullptr || out == nullptr) {
    return absl::InvalidArgumentError("SelectResidentPairs: ids, blobs and out must be device pointers");
  }
  if (n_pairs < 0 || n_expert < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("SelectResidentPairs: n_pairs ", n_pairs, " and n_expert ", n_expert, " must be >= 0 and >= 1"));
  }
  if (n_pairs == 0) return absl::OkStatus();
  return LaunchKernel("SelectResidentKernel", SelectResidentKernel, Blocks(n_pairs, kSelectThreads), kSelectThreads, 0,
                      stream, ids, n_pairs, blobs, n_expert, host_begin, host_end, out);
}

absl::Status SelectStagedPairs(const int32_t* ids, int n_pairs, const StagedChunk& chunk, const uint8_t* staging,
                               uint64_t blob_bytes, const uint8_t** table, int n_expert, int32_t* out,
                               cudaStream_t stream) {
  if (ids == nullptr || staging == nullptr || table == nullptr || out == nullptr) {
    return absl::InvalidArgumentError("SelectStagedPairs: ids, staging, table and out must be device pointers");
  }
  if (chunk.count < 1 || chunk.count > kMaxStagedExperts || n_pairs < 0) {
    return absl::InvalidArgumentError(absl::StrCat("SelectStagedPairs: chunk.count ", chunk.count, " must be in [1, ",
                                                   kMaxStagedExperts, "] and n_pairs ", n_pairs, " >= 0"));
  }
  for (int j = 0; j < chunk.count; ++j) {
    if (chunk.experts[j] < 0 || chunk.experts[j] >= n_expert) {
      return absl::InvalidArgumentError(absl::StrCat("SelectStagedPairs: chunk.experts[", j, "] = ", chunk.experts[j],
                                                     " is not an expert of ", n_expert));
    }
  }
  const unsigned blocks = n_pairs == 0 ? 1 : Blocks(n_pairs, kSelectThreads);
  return LaunchKernel("SelectStagedKernel", SelectStagedKernel, blocks, kSelectThreads, 0, stream, ids, n_pairs, chunk,
                      staging, blob_bytes, table, out);
}

absl::Status SplitForHost(const HostSplitArgs& a, cudaStream_t stream) {
  const void* required[] = {a.ids,     a.blobs,    a.x,          a.host_share, a.gpu_ids,     a.host_ids,
                            a.sequence, a.host_pairs, a.mailbox, a.mailbox_ids, a.mailbox_x};
  for (const void* p : required) {
    if (p == nullptr) return absl::InvalidArgumentError("SplitForHost: a required pointer is null");
  }
  if (a.n_expert < 1 || a.n_expert > kMaxSplitExperts || a.n_tokens < 0 || a.k < 1 ||
      int64_t{a.n_tokens} * a.k > kMaxSplitPairs || a.n_embd < 1) {
    return absl::InvalidArgumentError(absl::StrCat("SplitForHost: n_expert ", a.n_expert, " (1..", kMaxSplitExperts,
                                                   "), n_tokens ", a.n_tokens, " x k ", a.k, " (at most ",
                                                   kMaxSplitPairs, " pairs) or n_embd ", a.n_embd, " out of range"));
  }
  if (a.n_tokens == 0) return absl::OkStatus();
  return LaunchKernel("SplitForHostKernel", SplitForHostKernel, 1, kSplitThreads,
                      static_cast<size_t>(a.n_expert) * sizeof(int32_t), stream, a);
}

absl::Status CollectFromHost(const int32_t* host_ids, int n_pairs, const int64_t* sequence,
                             const int32_t* host_pairs, HostMailbox* mailbox, const float* mailbox_parts,
                             int64_t n_embd, uint64_t timeout_ns, float* parts, cudaStream_t stream) {
  if (host_ids == nullptr || sequence == nullptr || host_pairs == nullptr || mailbox == nullptr ||
      mailbox_parts == nullptr || parts == nullptr) {
    return absl::InvalidArgumentError("CollectFromHost: a required pointer is null");
  }
  if (n_pairs < 0 || n_pairs > kMaxSplitPairs || n_embd < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("CollectFromHost: n_pairs ", n_pairs, " or n_embd ", n_embd, " out of range"));
  }
  if (n_pairs == 0) return absl::OkStatus();
  return LaunchKernel("CollectFromHostKernel", CollectFromHostKernel, static_cast<unsigned>(n_pairs), kCollectThreads,
                      0, stream, host_ids, n_pairs, sequence, host_pairs, mailbox, mailbox_parts, n_embd, timeout_ns,
                      parts);
}

absl::Status StageMisses(const StageMissesArgs& a, cudaStream_t stream) {
  if (a.ids == nullptr || a.table == nullptr || a.staging == nullptr || a.out_table == nullptr) {
    return absl::InvalidArgumentError("StageMisses: ids, table, staging and out_table must be device pointers");
  }
  if (a.n_pairs < 0 || a.n_pairs > kMaxStagePairs || a.n_expert < 1 || a.max_slots < 1 ||
      a.max_slots > kMaxStageSlots) {
    return absl::InvalidArgumentError(absl::StrCat("StageMisses: n_pairs ", a.n_pairs, " (0..", kMaxStagePairs,
                                                   "), n_expert ", a.n_expert, " (>= 1) or max_slots ", a.max_slots,
                                                   " (1..", kMaxStageSlots, ") out of range"));
  }
  if (a.blob_bytes == 0 || a.blob_bytes % 16 != 0 || reinterpret_cast<uintptr_t>(a.staging) % 16 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("StageMisses: blob_bytes ", a.blob_bytes,
                                                   " must be a positive multiple of 16 and staging 16-byte aligned"));
  }
  if (a.n_pairs == 0) return absl::OkStatus();
  return LaunchKernel("StageMissesKernel", StageMissesKernel, kStageBlocks, kStageThreads, 0, stream, a);
}

absl::Status PrefetchGuessed(const PrefetchArgs& a, cudaStream_t stream) {
  if (a.guess == nullptr || a.table == nullptr || a.control == nullptr || a.slots == nullptr ||
      a.out_table == nullptr || a.record == nullptr) {
    return absl::InvalidArgumentError(
        "PrefetchGuessed: guess, table, control, slots, out_table and record must be device-visible pointers");
  }
  if (a.n_tokens < 0 || a.k < 1 || int64_t{a.n_tokens} * a.k > kMaxStagePairs || a.n_expert < 1 || a.max_slots < 1 ||
      a.max_slots > kMaxPrefetchSlots) {
    return absl::InvalidArgumentError(absl::StrCat("PrefetchGuessed: n_tokens ", a.n_tokens, " x k ", a.k, " (at most ",
                                                   kMaxStagePairs, " pairs), n_expert ", a.n_expert,
                                                   " (>= 1) or max_slots ", a.max_slots, " (1..", kMaxPrefetchSlots,
                                                   ") out of range"));
  }
  if (a.blob_bytes == 0 || a.blob_bytes % 16 != 0 || reinterpret_cast<uintptr_t>(a.slots) % 16 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("PrefetchGuessed: blob_bytes ", a.blob_bytes,
                                                   " must be a positive multiple of 16 and slots 16-byte aligned"));
  }
  return LaunchKernel("PrefetchGuessedKernel", PrefetchGuessedKernel, kPrefetchBlocks, kPrefetchThreads, 0, stream, a);
}

}  // namespace strata::kernels::cuda
