#ifndef STRATA_ENGINE_MODEL_MOE_DISPATCH_H_
#define STRATA_ENGINE_MODEL_MOE_DISPATCH_H_

// The dispatch step of a MoE layer: given the layer's normed activations, the router's expert ids per
// token, it fills parts[t][j][n_embd] with expert ids[t][j]'s output for token t, at the router's index j.
// It does not apply the router weights (combine does, once). Each routed expert is computed once for all
// the tokens routed to it.
//
// CpuMoeDispatch computes every expert on the CPU from an ExpertSource. A GPU tier implements the same
// interface (hits on the GPU, misses on the CPU or over PCIe). Run is called by one thread at a time.

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "engine/pack/expert_source.h"
#include "kernels/cpu/expert_forward.h"
#include "kernels/cpu/thread_pool.h"

namespace strata::model {

struct DispatchStats {
  uint64_t expert_computations = 0;  // unique (layer, expert) pairs computed
  uint64_t routed = 0;               // (token, slot) pairs
  uint64_t expert_bytes = 0;         // weight bytes streamed
};

class MoeDispatch {
 public:
  virtual ~MoeDispatch() = default;
  // x: n_tokens x n_embd; ids: n_tokens x k; parts: n_tokens x k x n_embd (overwritten). On error nothing
  // in parts may be used.
  virtual absl::Status Run(int64_t moe_layer, const float* x, int n_tokens, const int32_t* ids, int k,
                           float* parts, DispatchStats* stats) = 0;
};

class CpuMoeDispatch : public MoeDispatch {
 public:
  // `source` and `pool` must outlive the dispatch; `pool` may be null.
  CpuMoeDispatch(pack::ExpertSource* source, kernels::ExpertLayout layout, int64_t n_expert,
                 kernels::ThreadPool* pool);
  absl::Status Run(int64_t moe_layer, const float* x, int n_tokens, const int32_t* ids, int k, float* parts,
                   DispatchStats* stats) override;

 private:
  pack::ExpertSource* source_;
  kernels::ExpertLayout layout_;
  int64_t n_expert_;
  kernels::ThreadPool* pool_;
  // Reused between calls so the token path does not allocate once warmed up.
  std::vector<kernels::QuantizedActivation> acts_;
  std::vector<std::vector<int32_t>> routed_;  // per expert: t * k + j
  std::vector<const kernels::QuantizedActivation*> x_ptrs_;
  std::vector<float*> out_ptrs_;
  std::vector<kernels::ExpertJob> jobs_;
  kernels::ExpertScratch scratch_;
};

}  // namespace strata::model

#endif  // STRATA_ENGINE_MODEL_MOE_DISPATCH_H_
