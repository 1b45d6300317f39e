#ifndef STRATA_ENGINE_GPU_OFFLOAD_MOE_DISPATCH_H_
#define STRATA_ENGINE_GPU_OFFLOAD_MOE_DISPATCH_H_

// Experts that do not all fit in VRAM: a VRAM cache of expert slots in front of the page-locked, mapped
// arena (the only host copy). A layer's routed experts run as one grouped launch (kernels/cuda ExpertFfn)
// over a device table of blob pointers: a hit's entry points at its VRAM slot, a miss's at the arena, which
// the kernel reads in place over PCIe (zero-copy). The same kernel reads both, so an expert's output is the
// same bits whether it was a hit or a miss. Run only enqueues, so a decode step stays one CUDA graph.
//
// The cache learns between steps (AfterStep, from the step's routing on the host); which experts it holds
// is decided by model::ExpertCachePolicy (lru, lfu-decay, static), which this class executes.
// Fills are copies from the arena on a copy stream of their own, off the token's critical path. Ordering:
// a victim's table entry is pointed back at the arena on the compute stream before its slot is refilled
// (the copy waits for that), and a filled slot's entry is switched to VRAM only once its copy has been
// seen complete (BeforeStep), so a slot being filled is never read and a slot being read is never
// overwritten. Used by one thread at a time (the scheduler).

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/cpu_moe_dispatch.h"
#include "engine/model/expert_cache_policy.h"
#include "engine/model/moe_dispatch.h"
#include "engine/pack/expert_source.h"
#include "engine/pack/pack.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/format/expert_layout.h"

namespace strata::gpu {

using model::CacheOptions;
using model::CachePolicy;
using model::ParseCachePolicy;

class OffloadMoeDispatch : public model::MoeDispatch {
 public:
  // `arena` must be pinned (page-locked and mapped; ExpertSource::pinned) and outlive the dispatch.
  // The slots start filled round-robin over the layers (expert 0 of every layer, then expert 1, ...).
  // FAILED_PRECONDITION when the arena is not pinned; RESOURCE_EXHAUSTED when the slots do not fit.
  static absl::StatusOr<std::unique_ptr<OffloadMoeDispatch>> Create(const pack::Pack& pack, pack::ExpertSource* arena,
                                                                    const CacheOptions& options, int max_tokens);
  ~OffloadMoeDispatch() override;

  // Device bytes Create takes besides the slots.
  static uint64_t FixedDeviceBytes(const pack::Pack& pack, int max_tokens);

  std::string_view device() const override { return "cuda"; }
  bool capturable() const override { return true; }
  absl::Status Run(const model::MoeBatch& batch) override;
  void Account(int64_t moe_layer, const int32_t* ids, int n_tokens, int k,
               model::DispatchStats* stats) const override;
  absl::Status BeforeStep() override;
  void AfterStep(int64_t n_moe_layers, const int32_t* const* ids, int n_tokens, int k) override;

  model::CacheReport cache() const override;
  uint64_t device_bytes() const { return slots_.bytes() + table_.bytes() + workspace_.bytes(); }
  int64_t n_slots() const { return n_slots_; }
  // Whether a blob is in VRAM for the next step (tests).
  bool resident(uint64_t blob) const { return policy_->resident(blob); }

 private:
  OffloadMoeDispatch() = default;
  void SetEntry(uint64_t blob, const uint8_t* ptr);  // mirror and enqueue the 8-byte update on stream_
  void Fill(const model::ExpertCachePolicy::Admission& admission);

  const pack::Pack* pack_ = nullptr;
  kernels::ExpertLayout layout_;
  int64_t n_expert_ = 0;
  uint64_t n_blobs_ = 0;
  const uint8_t* arena_ = nullptr;       // device address of the mapped arena
  const uint8_t* arena_host_ = nullptr;  // its host address (the source of fills)
  std::unique_ptr<model::ExpertCachePolicy> policy_;
  int64_t n_slots_ = 0;
  mutable model::RoutingCounter counter_{1};

  kernels::cuda::DeviceBuffer slots_;
  kernels::cuda::DeviceBuffer table_;       // n_blobs pointers, read by the kernels
  kernels::cuda::PinnedBuffer table_host_;  // its mirror, the source of every entry update
  kernels::cuda::DeviceBuffer workspace_;
  cudaStream_t stream_ = nullptr;       // the compute stream (the backend's), learnt at the first Run
  cudaStream_t copy_stream_ = nullptr;
  cudaEvent_t compute_done_ = nullptr;  // recorded on stream_ after victims were pointed back at the arena

  struct PendingFill {
    uint64_t blob;
    int64_t slot;
    cudaEvent_t done;
  };
  std::vector<PendingFill> pending_;
  std::vector<cudaEvent_t> spare_events_;
  // Read by cache() from any thread.
  std::atomic<uint64_t> admissions_{0}, evictions_{0}, pcie_bytes_{0};
};

}  // namespace strata::gpu

#endif  // STRATA_ENGINE_GPU_OFFLOAD_MOE_DISPATCH_H_
