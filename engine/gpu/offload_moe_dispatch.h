#ifndef STRATA_ENGINE_GPU_OFFLOAD_MOE_DISPATCH_H_
#define STRATA_ENGINE_GPU_OFFLOAD_MOE_DISPATCH_H_

// Experts that do not all fit in VRAM: a VRAM cache of expert slots in front of the page-locked, mapped
// arena (the only host copy). A layer's experts in VRAM (hits) run as one grouped launch (kernels/cuda
// ExpertFfn) over a device table of blob pointers; the others (misses) take one of three paths:
//  - a long prompt (at least kStreamPairsPerExpert routed pairs per expert) streams the layer's misses
//    through VRAM: chunks of blobs copied by the copy engine into a ring of staging slots, each chunk
//    computed by the same kernel once its copy landed while the next chunks' copies run;
//  - a decode step's likely misses may be copied into VRAM ahead, from a guess of the layer's routing made one
//    layer early (Prefetch; OffloadOptions::prefetch_experts): those the layer does route are then hits;
//  - a decode step's misses are read in place over PCIe by the same kernel (zero-copy; miss path gpu), or
//    computed by host threads from the arena (cpu), or shared between both at once (both), the host's share
//    balanced step by step so that neither waits long for the other (HostExpertServer; the split and the
//    answer go through mapped memory, so a decode step stays one CUDA graph without a host round trip).
// Results: a GPU-computed expert gives the same bits from VRAM, staging or the arena; host-computed ones
// agree with them as the CPU engine does.
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
#include "engine/gpu/device_expert_extras.h"
#include "engine/gpu/host_expert_server.h"
#include "engine/model/expert_cache_policy.h"
#include "engine/model/miss_path.h"
#include "engine/model/moe_dispatch.h"
#include "engine/model/prefetch_gate.h"
#include "engine/pack/expert_source.h"
#include "engine/pack/pack.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/offload_kernels.h"
#include "kernels/format/expert_layout.h"

namespace strata::gpu {

using model::CacheOptions;
using model::CachePolicy;

struct OffloadOptions {
  CacheOptions cache;
  model::MissPath miss_path = model::MissPath::kBoth;
  int max_tokens = 1;       // tokens a step at most (prefill included)
  int max_decode = 1;       // tokens of a decode step at most (the host's mailbox holds that many)
  int host_threads = 1;     // the host's expert threads, its serving thread included (paths cpu and both)
  uint64_t host_timeout_ns = 10'000'000'000;  // how long the GPU waits for the host's share of a layer
  // Decode steps (paths gpu and both): the GPU's misses are first copied into VRAM staging slots by the SMs
  // (kernels/cuda StageMisses), then computed there; false reads them in place over PCIe inside the
  // grouped kernel (slower: kept for comparison in the benches).
  bool stage_gpu_misses = true;
  // Decode steps: a layer's routing is guessed one layer early (model::RoutingGuess) and up to this many of
  // the experts it names that are not in VRAM are copied into VRAM slots ahead, while the GPU works on the
  // layer before; 0: no guesses. The copies stop while guesses are right less often than half the time
  // (model::PrefetchGate; the guesses go on being counted).
  int prefetch_experts = 0;
  // When the copies ahead start: once the layer before the guessed one has finished its experts (true: they
  // take PCIe and DRAM time that would otherwise idle through the dense blocks), or as soon as the guess
  // is made, during that layer's experts (false).
  bool prefetch_after_layer = true;
  // The model's expert extras (gpt-oss's biases and clamped activation): `extras` for the host's misses
  // (its biases point into the model's weights, which outlive the dispatch), `device_extras` for the GPU's
  // (null: plain SwiGLU experts).
  model::ExpertExtras extras;
  std::shared_ptr<const DeviceExpertExtras> device_extras;
};

class OffloadMoeDispatch : public model::MoeDispatch {
 public:
  // Pairs per expert from which a step streams its layers' misses through VRAM.
  static constexpr int kStreamPairsPerExpert = 4;

  // `arena` must outlive the dispatch. Unless it is pinned (page-locked and mapped; ExpertSource::pinned),
  // the miss path is cpu whatever the options say, and every step too long for the host's mailbox streams.
  // The slots start filled round-robin over the layers (expert 0 of every layer, then expert 1, ...).
  // FAILED_PRECONDITION when the arena is not pinned and the miss path is gpu; RESOURCE_EXHAUSTED when the
  // slots do not fit.
  static absl::StatusOr<std::unique_ptr<OffloadMoeDispatch>> Create(const pack::Pack& pack, pack::ExpertSource* arena,
                                                                    const OffloadOptions& options);
  ~OffloadMoeDispatch() override;

  // Device bytes Create takes besides the slots, for steps of max_tokens tokens and decode steps of
  // max_decode, with prefetch_experts (OffloadOptions).
  static uint64_t FixedDeviceBytes(const pack::Pack& pack, int max_tokens, int max_decode, int prefetch_experts);

  std::string_view device() const override { return "cuda"; }
  bool capturable() const override { return true; }
  absl::Status Run(const model::MoeBatch& batch) override;
  bool WantsRoutingGuess(int n_tokens) const override;
  absl::Status Prefetch(const model::RoutingGuess& guess) override;
  void Account(int64_t moe_layer, const int32_t* ids, int n_tokens, int k,
               model::DispatchStats* stats) const override;
  absl::Status BeforeStep() override;
  absl::Status AfterStep(int64_t n_moe_layers, const int32_t* const* ids, int n_tokens, int k) override;

  model::CacheReport cache() const override;
  uint64_t device_bytes() const {
    return slots_.bytes() + table_.bytes() + workspace_.bytes() + staging_.bytes() + stage_tables_.bytes() +
           select_ids_.bytes() + host_state_.bytes() + miss_slots_.bytes() + miss_table_.bytes() +
           prefetch_slots_.bytes() + prefetch_tables_.bytes() + prefetch_control_.bytes();
  }
  int64_t n_slots() const { return n_slots_; }
  // Whether a blob is in VRAM for the next step (tests).
  bool resident(uint64_t blob) const { return policy_->resident(blob); }

 private:
  OffloadMoeDispatch() = default;
  void SetEntry(uint64_t blob, const uint8_t* ptr);  // mirror and enqueue the 8-byte update on stream_
  void Fill(const model::ExpertCachePolicy::Admission& admission);
  bool Streams(const model::MoeBatch& batch) const;
  // Whether a step of n_tokens x k pairs streams its misses through VRAM (long prompts; unpinned arenas).
  bool StreamsPairs(int n_tokens, int k) const;
  // A step's guesses against its routing: counts, the gate, the bytes of unused copies.
  // Enqueues the pending guess's copies if they start at this point (after_layer: the end of a Run).
  absl::Status LaunchPrefetch(bool after_layer);
  void ObserveGuesses(int64_t n_moe_layers, const int32_t* const* ids, int n_tokens, int k);
  absl::Status RunStreamed(const model::MoeBatch& batch, const uint8_t* const* table);
  absl::Status RunWithHost(const model::MoeBatch& batch, const uint8_t* const* table);
  // ExpertFfn over `ids` (device, n_tokens x k) of a decode step, its misses staged in VRAM first when there
  // are slots for them.
  absl::Status RunDecodeOnGpu(const model::MoeBatch& batch, const uint8_t* const* table, const int32_t* ids);
  void BalanceHostShare();

  const pack::Pack* pack_ = nullptr;
  kernels::ExpertLayout layout_;
  int64_t n_expert_ = 0;
  uint64_t n_blobs_ = 0;
  const uint8_t* arena_ = nullptr;       // device address of the mapped arena
  const uint8_t* arena_end_ = nullptr;   // the end of the mapped arena's device range
  const uint8_t* arena_host_ = nullptr;  // its host address (the source of fills)
  OffloadOptions options_;
  bool pinned_ = true;  // else the host computes every decode miss and other steps stream
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

  // Streaming: a ring of ring_ chunks of chunk_experts_ staging slots, each with its own blob table; the
  // copy of chunk r waits for freed_[r] (its last compute), its compute for staged_[r].
  int chunk_experts_ = 0;
  int ring_ = 0;
  int64_t ring_next_ = 0;
  kernels::cuda::DeviceBuffer staging_;
  kernels::cuda::DeviceBuffer stage_tables_;
  kernels::cuda::DeviceBuffer select_ids_;  // max_tokens x k: the pairs of one call
  std::vector<cudaEvent_t> staged_, freed_;
  std::vector<int32_t> misses_;  // scratch: a layer's experts not in VRAM
  // Decode steps: staging slots for the GPU's misses and the layer's table pointing at them.
  int n_miss_slots_ = 0;
  kernels::cuda::DeviceBuffer miss_slots_;
  kernels::cuda::DeviceBuffer miss_table_;
  bool streamed_step_ = false;

  // The host path: its server, and on the device the gpu/host ids of the layer, the request counter, the
  // host's pair count and its share (host_state_), the share's pinned mirror.
  std::unique_ptr<HostExpertServer> host_;
  kernels::cuda::DeviceBuffer host_state_;
  kernels::cuda::PinnedBuffer host_share_host_;
  float host_share_ = 0;
  int64_t last_posted_ = 0, last_waited_ = 0;
  uint64_t last_host_bytes_ = 0;
  // Prefetch: two sets (by the guessed layer's parity, so that a layer's copies never overwrite the slots
  // the layer before is reading) of n_prefetch_ slots and a table of the layer with them; the control the
  // kernel reads ({experts to copy, the step's stamp}) and its pinned mirror; per MoE layer the guess's
  // record (mapped: stamp, count, experts); which set a layer's Run reads (-1: none), and the event of
  // that set's copies. A step's guesses are recognised by their stamp.
  int n_prefetch_ = 0;
  kernels::cuda::DeviceBuffer prefetch_slots_, prefetch_tables_, prefetch_control_;
  kernels::cuda::PinnedBuffer prefetch_control_host_, prefetch_records_;
  int32_t* prefetch_records_device_ = nullptr;
  std::vector<int> prefetch_set_;
  cudaEvent_t prefetch_done_[2] = {nullptr, nullptr};
  cudaEvent_t layer_done_ = nullptr;
  // The guess whose copies are not enqueued yet, on pending_stream_ (null: none).
  kernels::cuda::PrefetchArgs pending_prefetch_;
  cudaStream_t pending_stream_ = nullptr;
  int pending_set_ = 0;
  int32_t step_stamp_ = 0;
  int step_limit_ = 0;  // the copies a layer made this step
  model::PrefetchGate gate_{0};

  // Read by cache() from any thread.
  std::atomic<uint64_t> admissions_{0}, evictions_{0}, pcie_bytes_{0};
  std::atomic<uint64_t> guessed_{0}, guessed_right_{0}, prefetched_{0}, prefetch_used_{0};
};

}  // namespace strata::gpu

#endif  // STRATA_ENGINE_GPU_OFFLOAD_MOE_DISPATCH_H_
