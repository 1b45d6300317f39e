#ifndef STRATA_ENGINE_GPU_DEVICE_EXPERT_EXTRAS_H_
#define STRATA_ENGINE_GPU_DEVICE_EXPERT_EXTRAS_H_

// gpt-oss's expert extras in VRAM: each MoE layer's gate, up and down biases (model::ExpertBiases) as the
// device tables kernels::cuda::ExpertFfn reads, and the activation. Built once at load, read-only after, so
// any thread may call its const methods; the GPU expert dispatches hold one (GpuMoeDispatch owns its own,
// OffloadMoeDispatch gets one shared through OffloadOptions).

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/cpu_moe_dispatch.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/expert_kernels.h"
#include "kernels/format/expert_layout.h"

namespace strata::gpu {

class DeviceExpertExtras {
 public:
  // Uploads the biases of `extras` (one entry per MoE layer, or none) for experts of `layout` and n_expert
  // experts. INVALID_ARGUMENT naming the layer and the table when a bias has another size than
  // n_expert x expert_ff (gate, up) or n_expert x n_embd (down); the device's errors otherwise.
  static absl::StatusOr<std::unique_ptr<DeviceExpertExtras>> Upload(const model::ExpertExtras& extras,
                                                                    const kernels::ExpertLayout& layout,
                                                                    int64_t n_expert);

  // Device bytes Upload takes for `extras`.
  static uint64_t DeviceBytes(const model::ExpertExtras& extras);

  // What ExpertFfn needs for MoE layer `moe_layer` (no biases for a layer past the extras' layers).
  kernels::cuda::ExpertFfnExtras ForLayer(int64_t moe_layer) const;
  uint64_t device_bytes() const { return buffer_.bytes(); }

 private:
  DeviceExpertExtras() = default;

  kernels::cuda::DeviceBuffer buffer_;                  // every layer's tables
  std::vector<kernels::cuda::ExpertFfnExtras> layers_;  // pointing into buffer_
  bool clamped_swiglu_ = false;
};

// ExpertFfn's extras of `moe_layer` from `extras` when there are some (gpt-oss), else the plain default.
inline kernels::cuda::ExpertFfnExtras ExtrasForLayer(const DeviceExpertExtras* extras, int64_t moe_layer) {
  return extras != nullptr ? extras->ForLayer(moe_layer) : kernels::cuda::ExpertFfnExtras{};
}

}  // namespace strata::gpu

#endif  // STRATA_ENGINE_GPU_DEVICE_EXPERT_EXTRAS_H_
