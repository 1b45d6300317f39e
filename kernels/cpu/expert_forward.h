#ifndef STRATA_KERNELS_CPU_EXPERT_FORWARD_H_
#define STRATA_KERNELS_CPU_EXPERT_FORWARD_H_

// The SwiGLU feed-forward of routed experts on the CPU:
//   h = silu(gate . x) * (up . x)    (f32, ff elements, then quantized like any activation)
//   out = down . h                   (f32, n_embd elements)
// for every token routed to an expert, streaming each expert's weights once for all its tokens. The
// router weight is not applied here.

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "kernels/cpu/scheme.h"
#include "kernels/cpu/thread_pool.h"

namespace strata::kernels {

// Where the roles of one expert sit in its blob: gate and up are ff x n_embd, down is n_embd x ff.
struct ExpertLayout {
  Scheme scheme = Scheme::kF16;
  int64_t n_embd = 0;
  int64_t ff = 0;
  uint64_t gate_offset = 0;
  uint64_t up_offset = 0;
  uint64_t down_offset = 0;
};

// The layout of pack format v1: gate, up, down in that order, each starting at a multiple of 256 bytes.
ExpertLayout PackedExpertLayout(Scheme scheme, int64_t n_embd, int64_t ff);
// Bytes from the blob start to the end of the last role (before any padding of the blob).
uint64_t ExpertLayoutEnd(const ExpertLayout& layout);
// Sum of the three roles' bytes: what one forward pass reads.
uint64_t ExpertWeightBytes(const ExpertLayout& layout);

// OK when the roles have valid shapes and lie inside a blob of blob_bytes; otherwise INVALID_ARGUMENT
// naming the role.
absl::Status CheckExpertLayout(const ExpertLayout& layout, uint64_t blob_bytes);

// One expert's work: its blob and the tokens routed to it.
struct ExpertJob {
  const uint8_t* blob = nullptr;
  const QuantizedActivation* const* xs = nullptr;  // n_tokens activations of n_embd
  int n_tokens = 0;
  float* const* outs = nullptr;  // n_tokens outputs of n_embd floats, overwritten
};

// Buffers ExpertForward reuses between calls (grown as needed). One per calling thread.
class ExpertScratch {
 public:
  ExpertScratch() = default;
  ExpertScratch(const ExpertScratch&) = delete;
  ExpertScratch& operator=(const ExpertScratch&) = delete;

 private:
  friend void ExpertForward(const ExpertLayout&, absl::Span<const ExpertJob>, ThreadPool*, ExpertScratch*);
  std::vector<size_t> first_slot_;  // per job: its first slot
  std::vector<float> gate_;         // per (job, token) slot: ff
  std::vector<float> up_;
  std::vector<QuantizedActivation> h_;
  std::vector<const QuantizedActivation*> h_ptrs_;
  std::vector<float*> gate_ptrs_, up_ptrs_;
};

// Computes every job: gate and up rows of all experts split across the pool's threads, then (after a
// barrier) down rows. All jobs share `layout`, which must pass CheckExpertLayout for their blobs; every
// job has n_tokens >= 1 and activations of n_embd elements. `pool` may be null (runs on the caller).
// Results do not depend on the number of threads.
void ExpertForward(const ExpertLayout& layout, absl::Span<const ExpertJob> jobs, ThreadPool* pool,
                   ExpertScratch* scratch);

}  // namespace strata::kernels

#endif  // STRATA_KERNELS_CPU_EXPERT_FORWARD_H_
