#ifndef STRATA_KERNELS_CUDA_OFFLOAD_KERNELS_H_
#define STRATA_KERNELS_CUDA_OFFLOAD_KERNELS_H_

// The offload tier's per-layer split of routed (token, expert) pairs, for ExpertFfn calls that each compute
// a subset of a layer's pairs (ExpertFfn leaves pairs with id -1 untouched):
//  - SelectResidentPairs / SelectStagedPairs: a long prompt's layer as one call for the experts in VRAM and
//    one per chunk of experts staged through VRAM by the copy engine;
//  - SplitForHost / CollectFromHost: a decode step's misses shared with host threads through a mailbox in
//    mapped page-locked memory, so that the whole step stays one CUDA graph with no host round trip.
//
// A blob is "on the host" when its table entry lies in [host_begin, host_end) (the device address range of
// the mapped arena), else it is in VRAM. All functions are enqueue-only (they may be captured in a graph),
// validate their host arguments (INVALID_ARGUMENT naming the argument) and return the launch status.
// Pointers are device memory unless said to be mapped host memory. n_pairs == 0 enqueues nothing.

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"

namespace strata::kernels::cuda {

// out[p] = ids[p] when expert ids[p] is in VRAM, else -1 (also for ids outside [0, n_expert)).
absl::Status SelectResidentPairs(const int32_t* ids, int n_pairs, const uint8_t* const* blobs, int n_expert,
                                 const uint8_t* host_begin, const uint8_t* host_end, int32_t* out,
                                 cudaStream_t stream);

inline constexpr int kMaxStagedExperts = 64;

// A chunk of experts copied to consecutive staging slots: experts[j] is at staging + j * blob_bytes.
struct StagedChunk {
  int count = 0;  // 1 .. kMaxStagedExperts
  int32_t experts[kMaxStagedExperts] = {};
};

// table[experts[j]] = staging + j * blob_bytes for the chunk's experts (table: n_expert entries; the others
// are left as they are), and out[p] = ids[p] when it is one of the chunk's experts, else -1.
absl::Status SelectStagedPairs(const int32_t* ids, int n_pairs, const StagedChunk& chunk, const uint8_t* staging,
                               uint64_t blob_bytes, const uint8_t** table, int n_expert, int32_t* out,
                               cudaStream_t stream);

// A decode step's GPU misses moved into VRAM before they are computed: the distinct experts routed by `ids`
// (-1 skipped) whose table entry is on the host, in expert order, the first max_slots of them, are copied
// into consecutive staging slots of blob_bytes by the SMs (16-byte reads over PCIe, many in flight: about
// the copy engine's rate, where the grouped kernel reading them in place gets a fraction of it); then
// out_table[e], for every expert e routed by `ids`, is its slot or table[e] (misses past max_slots are read
// in place). Entries of experts not routed are left as they were. One launch of a fixed grid.
struct StageMissesArgs {
  const int32_t* ids = nullptr;  // n_pairs
  int n_pairs = 0;               // <= kMaxStagePairs
  const uint8_t* const* table = nullptr;  // n_expert entries
  int n_expert = 0;
  const uint8_t* host_begin = nullptr;
  const uint8_t* host_end = nullptr;
  uint8_t* staging = nullptr;  // max_slots x blob_bytes, 16-byte aligned
  int max_slots = 0;           // 1 .. kMaxStageSlots
  uint64_t blob_bytes = 0;     // a multiple of 16
  const uint8_t** out_table = nullptr;  // n_expert entries
};
inline constexpr int kMaxStagePairs = 2048;
inline constexpr int kMaxStageSlots = 256;
absl::Status StageMisses(const StageMissesArgs& args, cudaStream_t stream);

// A guess of a decode layer's routing (made one layer early) acted on ahead: the distinct experts it names
// whose table entry is on the host, taken rank by rank (every token's first choice, then every token's
// second, ...; a token's choices are in descending score), the first max_slots of them, are recorded in
// `record` (control[1] as the step's stamp, the count, then the experts, -1 past the count); the first
// control[0] of those (clamped to [0, max_slots]) are copied into consecutive slots by the SMs, and out_table
// receives the layer's table with those experts pointing at their slots. With control[0] == 0 the guess is
// only recorded (out_table is still written). One launch of a small fixed grid, to leave the SMs to the
// step's own kernels.
struct PrefetchArgs {
  const int32_t* guess = nullptr;  // n_tokens x k expert ids (-1 or out of range: skipped)
  int n_tokens = 0;
  int k = 0;                       // n_tokens * k <= kMaxStagePairs
  const uint8_t* const* table = nullptr;  // the layer's n_expert entries
  int n_expert = 0;
  const uint8_t* host_begin = nullptr;
  const uint8_t* host_end = nullptr;
  const int32_t* control = nullptr;  // device: {experts to copy, the step's stamp}
  uint8_t* slots = nullptr;          // max_slots x blob_bytes, 16-byte aligned
  int max_slots = 0;                 // 1 .. kMaxPrefetchSlots
  uint64_t blob_bytes = 0;           // a multiple of 16
  const uint8_t** out_table = nullptr;  // n_expert entries
  int32_t* record = nullptr;         // 2 + max_slots int32 (mapped host memory or device)
};
inline constexpr int kMaxPrefetchSlots = 64;
absl::Status PrefetchGuessed(const PrefetchArgs& args, cudaStream_t stream);

// The mailbox header, in mapped page-locked host memory. The GPU writes a request's fields and arrays, then
// (after a system-wide fence) `request`; the host computes the pairs and stores their rows, then `done` =
// request. Every counter only grows. `waited` and `posted` count, over the mailbox's life, the requests
// whose results the GPU had to wait for and all requests (the host balances its share from them).
struct HostMailbox {
  volatile int64_t request;
  volatile int64_t done;
  volatile int32_t moe_layer;
  volatile int32_t n_tokens;
  volatile int32_t k;
  volatile int32_t timed_out;  // set by the GPU when the host did not answer within the timeout
  volatile int64_t waited;
  volatile int64_t posted;
};

struct HostSplitArgs {
  // The layer's routing and table.
  const int32_t* ids = nullptr;  // n_tokens x k
  int n_tokens = 0;
  int k = 0;
  const uint8_t* const* blobs = nullptr;  // n_expert entries
  int n_expert = 0;
  const uint8_t* host_begin = nullptr;
  const uint8_t* host_end = nullptr;
  int moe_layer = 0;
  const float* x = nullptr;  // n_tokens x n_embd, the layer's normed activations
  int64_t n_embd = 0;
  // The share of the layer's missed experts the host computes, in [0, 1]: the first round(share * misses)
  // of them in expert order.
  const float* host_share = nullptr;
  // A share that comes to fewer experts than this goes to the GPU whole (1: every share stands).
  int min_host_experts = 1;
  // Device outputs and state.
  int32_t* gpu_ids = nullptr;    // n_tokens x k: ids with the host's pairs (and invalid ids) set to -1
  int32_t* host_ids = nullptr;   // n_tokens x k: the host's pairs' ids, -1 for the others
  int64_t* sequence = nullptr;   // one counter: requests posted; the request this layer waits for
  int32_t* host_pairs = nullptr; // one int: the layer's pairs given to the host (0: nothing posted)
  // Mapped host memory.
  HostMailbox* mailbox = nullptr;
  int32_t* mailbox_ids = nullptr;  // n_tokens x k: host_ids
  float* mailbox_x = nullptr;      // n_tokens x n_embd
};

// Splits a layer's pairs: hits and the GPU's share of misses into gpu_ids, the host's share into host_ids;
// when the host has any, posts a request (the activations, the ids, then the request number). One block;
// n_expert <= 8192, n_tokens * k <= 65536.
absl::Status SplitForHost(const HostSplitArgs& args, cudaStream_t stream);

// Waits until the host has answered the request SplitForHost posted for this layer (if any) and copies
// its result rows mailbox_parts[p] (mapped host memory, n_tokens x k x n_embd) into parts[p] for the
// host's pairs. Gives up after timeout_ns (mailbox->timed_out = 1, parts rows left as they were).
absl::Status CollectFromHost(const int32_t* host_ids, int n_pairs, const int64_t* sequence,
                             const int32_t* host_pairs, HostMailbox* mailbox, const float* mailbox_parts,
                             int64_t n_embd, uint64_t timeout_ns, float* parts, cudaStream_t stream);

}  // namespace strata::kernels::cuda

#endif  // STRATA_KERNELS_CUDA_OFFLOAD_KERNELS_H_
