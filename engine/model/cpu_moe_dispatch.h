#ifndef STRATA_ENGINE_MODEL_CPU_MOE_DISPATCH_H_
#define STRATA_ENGINE_MODEL_CPU_MOE_DISPATCH_H_

// Every routed expert computed on the CPU threads from an ExpertSource (the arena or the mapped file).
// Reads the batch's host views. Every routed pair counts as a miss (nothing is resident in VRAM).

#include <cstdint>
#include <vector>

#include "engine/exec/thread_pool.h"
#include "engine/model/moe_dispatch.h"
#include "engine/model/weights.h"
#include "engine/pack/expert_source.h"
#include "kernels/cpu/expert_forward.h"
#include "kernels/format/expert_layout.h"

namespace strata::model {

// Counts the distinct experts of a layer's routing: a per-expert mark reused between calls.
class RoutingCounter {
 public:
  explicit RoutingCounter(int64_t n_expert) : seen_(static_cast<size_t>(n_expert), 0) {}
  // Distinct valid expert ids among ids[0..n); ids outside [0, n_expert) are skipped.
  uint64_t Distinct(const int32_t* ids, int n);

 private:
  std::vector<uint32_t> seen_;
  uint32_t epoch_ = 0;
};

// Adds a layer's routing to `stats` for a dispatch whose experts are all in one place: every routed pair a
// hit (`in_vram`) or a miss.
void AccountRouting(RoutingCounter& counter, const kernels::ExpertLayout& layout, const int32_t* ids, int n_pairs,
                    bool in_vram, DispatchStats* stats);

// How RunExpertJobs orders the two phases of kernels::ExpertWork over the pool.
enum class ExpertPhases {
  // One ParallelFor: every job's gate/up tasks, then as many down tasks, each taking a chunk of down rows
  // of the first job whose gate/up rows are all done. Threads that finish early go on to the first jobs'
  // down rows instead of idling at a barrier while the last gate/up tasks finish (the tail of a phase is
  // a large part of a decode layer's few hundred microseconds).
  kPipelined,
  // All gate/up rows, a barrier, then all down rows (the baseline the benches compare with).
  kBarrier,
};

// Runs the jobs' experts over the pool (the caller's thread when null). Same results either way.
void RunExpertJobs(const kernels::ExpertLayout& layout, absl::Span<const kernels::ExpertJob> jobs,
                   exec::ThreadPool* pool, kernels::ExpertWork* work,
                   kernels::ExpertActivation activation = kernels::ExpertActivation::kSwiGlu,
                   ExpertPhases phases = ExpertPhases::kPipelined);

// What a model adds to the experts the pack holds (gpt-oss): their activation and, per MoE layer, their
// biases (pointing into the model's weights, which must outlive the dispatch).
struct ExpertExtras {
  kernels::ExpertActivation activation = kernels::ExpertActivation::kSwiGlu;
  std::vector<const ExpertBiases*> biases;  // one per MoE layer, or empty: no biases
};

// The extras `config` needs, from its weights (one MoE layer per block from n_dense_lead on).
ExpertExtras ExpertExtrasOf(const ModelConfig& config, const ModelWeights& weights);

class CpuMoeDispatch : public MoeDispatch {
 public:
  // `source` and `pool` must outlive the dispatch; `pool` may be null. `extras` has no default: a model with
  // biased or clamped experts computed without them would be silently wrong (ExpertExtrasOf gives them).
  CpuMoeDispatch(pack::ExpertSource* source, const kernels::ExpertLayout& layout, int64_t n_expert,
                 exec::ThreadPool* pool, ExpertExtras extras);
  std::string_view device() const override { return "cpu"; }
  absl::Status Run(const MoeBatch& batch) override;
  void Account(int64_t moe_layer, const int32_t* ids, int n_tokens, int k, DispatchStats* stats) const override;

 private:
  pack::ExpertSource* source_;
  kernels::ExpertLayout layout_;
  int64_t n_expert_;
  exec::ThreadPool* pool_;
  ExpertExtras extras_;
  mutable RoutingCounter counter_;
  // Reused between calls so the token path does not allocate once warmed up.
  std::vector<kernels::QuantizedActivation> acts_;
  std::vector<std::vector<int32_t>> routed_;  // per expert: t * k + j
  std::vector<const kernels::QuantizedActivation*> x_ptrs_;
  std::vector<float*> out_ptrs_;
  std::vector<kernels::ExpertJob> jobs_;
  kernels::ExpertWork work_;
};

}  // namespace strata::model

#endif  // STRATA_ENGINE_MODEL_CPU_MOE_DISPATCH_H_
