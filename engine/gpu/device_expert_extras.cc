#include "engine/gpu/device_expert_extras.h"

#include <cuda_runtime.h>

#include <string_view>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/status_macros.h"
#include "kernels/cuda/cuda_status.h"

namespace strata::gpu {
namespace {

// Each table starts at a multiple of this many bytes.
constexpr uint64_t kAlign = 256;
uint64_t AlignUp(uint64_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

uint64_t TableBytes(const std::vector<float>& v) { return AlignUp(v.size() * sizeof(float)); }

}  // namespace

uint64_t DeviceExpertExtras::DeviceBytes(const model::ExpertExtras& extras) {
  uint64_t bytes = 0;
  for (const model::ExpertBiases* b : extras.biases) {
    if (b != nullptr) bytes += TableBytes(b->gate) + TableBytes(b->up) + TableBytes(b->down);
  }
  return bytes;
}

absl::StatusOr<std::unique_ptr<DeviceExpertExtras>> DeviceExpertExtras::Upload(const model::ExpertExtras& extras,
                                                                                const kernels::ExpertLayout& layout,
                                                                                int64_t n_expert) {
  std::unique_ptr<DeviceExpertExtras> d(new DeviceExpertExtras());
  d->clamped_swiglu_ = extras.activation == kernels::ExpertActivation::kClampedSwiGlu;
  struct Table {
    const std::vector<float>* host;
    const float** device;
  };
  std::vector<Table> tables;
  d->layers_.assign(extras.biases.size(), kernels::cuda::ExpertFfnExtras{});
  for (size_t l = 0; l < extras.biases.size(); ++l) {
    const model::ExpertBiases* b = extras.biases[l];
    if (b == nullptr) continue;
    kernels::cuda::ExpertFfnExtras& layer = d->layers_[l];
    const std::pair<const char*, Table> named[] = {{"gate", {&b->gate, &layer.gate_bias}},
                                                   {"up", {&b->up, &layer.up_bias}},
                                                   {"down", {&b->down, &layer.down_bias}}};
    for (const auto& [name, table] : named) {
      if (table.host->empty()) continue;
      const int64_t width = std::string_view(name) == "down" ? layout.n_embd : layout.expert_ff;
      if (static_cast<int64_t>(table.host->size()) != n_expert * width) {
        return absl::InvalidArgumentError(absl::StrCat("MoE layer ", l, ": the experts' ", name, " biases hold ",
                                                       table.host->size(), " floats, expected n_expert ", n_expert,
                                                       " x ", width));
      }
      tables.push_back(table);
    }
  }
  const uint64_t total = DeviceBytes(extras);
  if (total == 0) return d;
  ASSIGN_OR_RETURN(d->buffer_, kernels::cuda::DeviceBuffer::Allocate(total));
  uint64_t offset = 0;
  for (const Table& t : tables) {
    uint8_t* at = d->buffer_.as<uint8_t>() + offset;
    CUDA_RETURN_IF_ERROR(cudaMemcpy(at, t.host->data(), t.host->size() * sizeof(float), cudaMemcpyHostToDevice),
                         "uploading the experts' biases");
    *t.device = reinterpret_cast<const float*>(at);
    offset += TableBytes(*t.host);
  }
  // A pageable upload may return before its DMA lands; the compute stream does not wait for it.
  CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize(), "uploading the experts' biases");
  return d;
}

kernels::cuda::ExpertFfnExtras DeviceExpertExtras::ForLayer(int64_t moe_layer) const {
  kernels::cuda::ExpertFfnExtras e;
  if (moe_layer >= 0 && moe_layer < static_cast<int64_t>(layers_.size())) e = layers_[moe_layer];
  e.clamped_swiglu = clamped_swiglu_;
  return e;
}

}  // namespace strata::gpu
