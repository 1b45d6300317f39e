#ifndef STRATA_ENGINE_GPU_GPU_MOE_DISPATCH_H_
#define STRATA_ENGINE_GPU_GPU_MOE_DISPATCH_H_

// Every expert of the pack resident in VRAM: a layer's routed experts run as one grouped launch
// (kernels/cuda ExpertFfn) over a device table of blob pointers, with the model's expert extras (gpt-oss's
// biases and clamped activation) when it has some. Run only enqueues on the batch's stream,
// so a CUDA graph of a decode step holds it. Every routed pair is a hit. Used by one thread at a time.

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "engine/exec/thread_pool.h"
#include "engine/gpu/device_expert_extras.h"
#include "engine/model/cpu_moe_dispatch.h"
#include "engine/model/moe_dispatch.h"
#include "engine/pack/pack.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/format/expert_layout.h"

namespace strata::gpu {

class GpuMoeDispatch : public model::MoeDispatch {
 public:
  // Uploads experts.bin of `pack` (read through page-locked staging buffers filled by `pool`'s threads;
  // with `verify`, each blob's xxh3 is checked first and a mismatch is DATA_LOSS naming the blob).
  // `max_tokens`: the most tokens of one Run. `extras`: the experts' biases and activation in VRAM
  // (gpt-oss), or null for plain SwiGLU experts; shared with the caller, kept alive by the dispatch.
  static absl::StatusOr<std::unique_ptr<GpuMoeDispatch>> Create(const pack::Pack& pack, int max_tokens,
                                                                bool verify, exec::ThreadPool* pool,
                                                                std::shared_ptr<const DeviceExpertExtras> extras);

  // Device bytes Create takes for `pack` (the experts and the kernels' workspace).
  static uint64_t DeviceBytes(const pack::Pack& pack, int max_tokens);

  std::string_view device() const override { return "cuda"; }
  bool capturable() const override { return true; }
  absl::Status Run(const model::MoeBatch& batch) override;
  void Account(int64_t moe_layer, const int32_t* ids, int n_tokens, int k,
               model::DispatchStats* stats) const override;

  uint64_t device_bytes() const { return experts_.bytes() + table_.bytes() + workspace_.bytes(); }
  double upload_seconds() const { return upload_seconds_; }

 private:
  GpuMoeDispatch(const kernels::ExpertLayout& layout, int64_t n_expert)
      : layout_(layout), n_expert_(n_expert), counter_(n_expert) {}

  kernels::ExpertLayout layout_;
  int64_t n_expert_;
  mutable model::RoutingCounter counter_;
  kernels::cuda::DeviceBuffer experts_;    // experts.bin as it is on disk
  kernels::cuda::DeviceBuffer table_;      // n_moe_layers x n_expert blob pointers
  kernels::cuda::DeviceBuffer workspace_;  // ExpertFfn's
  std::shared_ptr<const DeviceExpertExtras> extras_;  // null: plain SwiGLU experts
  double upload_seconds_ = 0;
};

}  // namespace strata::gpu

#endif  // STRATA_ENGINE_GPU_GPU_MOE_DISPATCH_H_
