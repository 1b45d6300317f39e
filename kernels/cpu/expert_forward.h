#ifndef STRATA_KERNELS_CPU_EXPERT_FORWARD_H_
#define STRATA_KERNELS_CPU_EXPERT_FORWARD_H_

// The SwiGLU feed-forward of routed experts on the CPU:
//   h = silu(gate . x) * (up . x)    (f32, ff elements, then quantized like any activation)
//   out = down . h                   (f32, n_embd elements)
// for every token routed to an expert, streaming each expert's weights once for all its tokens. The
// router weight is not applied here. An expert may add biases (gate . x + b_gate, up . x + b_up, down . h +
// b_down) and use gpt-oss's clamped SwiGLU instead (ExpertActivation::kClampedSwiGlu).
//
// The work comes in two phases of row ranges, which a caller spreads over its threads (the engine's
// thread pool does): every GateUpRows of a set of jobs, then, after all of them finished, every DownRows.
// Distinct row ranges of one phase may run on different threads at once. Results do not depend on how the
// rows are split.

#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "kernels/cpu/quantize.h"
#include "kernels/format/expert_layout.h"

namespace strata::kernels {

enum class ExpertActivation : uint8_t {
  kSwiGlu,         // silu(g) * u
  // gpt-oss (llama.cpp ggml_swiglu_oai, alpha 1.702, limit 7): g' = min(g, 7), u' = clamp(u, -7, 7),
  // h = g' * sigmoid(1.702 g') * (u' + 1).
  kClampedSwiGlu,
};

// h[r] of one gate value and one up value.
float ExpertGlu(ExpertActivation activation, float gate, float up);

// One expert's work: its blob and the tokens routed to it.
struct ExpertJob {
  const uint8_t* blob = nullptr;
  const QuantizedActivation* const* xs = nullptr;  // n_tokens activations of n_embd
  int n_tokens = 0;
  float* const* outs = nullptr;  // n_tokens outputs of n_embd floats, overwritten
  // The expert's biases (expert_ff, expert_ff and n_embd floats), or null: none.
  const float* gate_bias = nullptr;
  const float* up_bias = nullptr;
  const float* down_bias = nullptr;
};

// The hidden states of a set of jobs between the two phases. Owned by one caller; reused between calls.
class ExpertWork {
 public:
  ExpertWork() = default;
  ExpertWork(const ExpertWork&) = delete;
  ExpertWork& operator=(const ExpertWork&) = delete;

  // Sizes the scratch for `jobs` (each with n_tokens >= 1 and activations of n_embd elements; blobs laid
  // out as `layout`). `jobs` must stay valid until the last phase call.
  void Prepare(const ExpertLayout& layout, absl::Span<const ExpertJob> jobs,
               ExpertActivation activation = ExpertActivation::kSwiGlu);

  size_t n_jobs() const { return jobs_.size(); }
  // Rows [row_begin, row_end) of gate and up of job `job`, and h for those rows. The bounds are multiples
  // of kActBlock (32) or expert_ff.
  void GateUpRows(size_t job, int64_t row_begin, int64_t row_end);
  // Rows [row_begin, row_end) of down of job `job`, into its outs.
  void DownRows(size_t job, int64_t row_begin, int64_t row_end);

 private:
  ExpertLayout layout_;
  ExpertActivation activation_ = ExpertActivation::kSwiGlu;
  absl::Span<const ExpertJob> jobs_;
  std::vector<size_t> first_slot_;  // per job: its first slot
  std::vector<float> gate_;         // per (job, token) slot: ff
  std::vector<float> up_;
  std::vector<QuantizedActivation> h_;
  std::vector<const QuantizedActivation*> h_ptrs_;
  std::vector<float*> gate_ptrs_, up_ptrs_;
};

// Rows per task for a phase over `rows` rows of n_jobs jobs on `threads` threads: about four tasks a thread
// in all, a multiple of `unit` (kActBlock for GateUpRows, kRowTile for DownRows).
int64_t ExpertRowsPerTask(int64_t rows, size_t n_jobs, int threads, int64_t unit);

}  // namespace strata::kernels

#endif  // STRATA_KERNELS_CPU_EXPERT_FORWARD_H_
