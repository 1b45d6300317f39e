#ifndef STRATA_ENGINE_GPU_CUDA_MODEL_H_
#define STRATA_ENGINE_GPU_CUDA_MODEL_H_

// Builds a model's CUDA backend and GPU expert dispatch: dense weights, every expert and the buffers of a
// step in VRAM. Only built with CUDA; engine/runtime/model_factory.cc is its one caller.

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "engine/exec/thread_pool.h"
#include "engine/model/dense_backend.h"
#include "engine/model/expert_cache_policy.h"
#include "engine/model/model_config.h"
#include "engine/model/moe_dispatch.h"
#include "engine/model/weights.h"
#include "engine/pack/expert_source.h"
#include "engine/pack/pack.h"

namespace strata::gpu {

// Page-locks and maps host memory with cudaHostRegister (for the expert arena the GPU reads misses from).
pack::HostPinner* CudaHostPinner();

// Whether a CUDA device is visible; `why` says what was found (a device name, or why none).
bool CudaDevicePresent(std::string* why);

struct CudaModelOptions {
  uint64_t vram_bytes = 0;   // device memory the model may use; 0 = what is free less a margin
  int max_batch = 64;        // decode tokens a step
  int max_prefill = 512;     // prompt tokens a step
  bool verify = false;       // check each blob's xxh3 as the experts are uploaded
  int64_t vram_experts = -1;  // expert slots in VRAM; -1: every expert when they fit, else as many as fit
  std::string miss_path = "both";          // where experts not in VRAM are computed (model/miss_path.h)
  bool stage_gpu_misses = true;  // OffloadOptions::stage_gpu_misses
  int prefetch_experts = 0;      // OffloadOptions::prefetch_experts
  bool prefetch_after_layer = true;  // OffloadOptions::prefetch_after_layer
  bool split_tf32_prompts = false;   // CudaDenseOptions::split_tf32_prompts
  bool fuse_qk_rope = true;          // CudaDenseOptions::fuse_qk_rope
  // The VRAM cache's options (the policy, and a routing profile's warm counts); its slots come from the plan.
  model::CacheOptions cache;
};

// Where the experts will live, from the sizes alone.
struct VramPlan {
  bool all_experts = false;  // every expert in VRAM (GpuMoeDispatch)
  int64_t slots = 0;         // else: VRAM cache slots, the rest read from the pinned arena
  uint64_t dense_bytes = 0;  // dense weights and step buffers
  uint64_t allowed = 0;      // device memory the model may use
};
// RESOURCE_EXHAUSTED naming both numbers when not even the dense part fits.
absl::StatusOr<VramPlan> PlanVram(const pack::Pack& pack, const model::ModelConfig& config,
                                  const model::ModelWeights& weights, const CudaModelOptions& options);

struct CudaModelParts {
  std::unique_ptr<model::DenseBackend> backend;
  std::unique_ptr<model::MoeDispatch> dispatch;
};

// Uploads the dense weights and, when they all fit, every expert of `pack` (read from experts.bin through
// page-locked staging, filled by `pool`'s threads); DATA_LOSS naming the blob when verification finds a
// bad checksum; UNAVAILABLE without a device.
// `plan` from PlanVram. When not every expert fits, `arena` holds them and the VRAM cache sits in front of
// it; the host's share of the misses runs on as many threads as `pool` has. An arena that is not
// page-locked needs miss path cpu.
absl::StatusOr<CudaModelParts> CreateCudaModelParts(const pack::Pack& pack, const model::ModelConfig& config,
                                                    const model::ModelWeights& weights,
                                                    const CudaModelOptions& options, const VramPlan& plan,
                                                    pack::ExpertSource* arena, exec::ThreadPool* pool);

}  // namespace strata::gpu

#endif  // STRATA_ENGINE_GPU_CUDA_MODEL_H_
