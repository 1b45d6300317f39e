#ifndef STRATA_ENGINE_RUNTIME_MODEL_FACTORY_H_
#define STRATA_ENGINE_RUNTIME_MODEL_FACTORY_H_

// The one place that picks where a model runs: the device (CPU or CUDA), its dense backend, its MoE
// dispatch and where the experts are read from. Nothing else in the project tests STRATA_HAVE_CUDA.

#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/exec/thread_pool.h"
#include "engine/model/expert_cache_policy.h"
#include "engine/model/model.h"
#include "engine/pack/expert_source.h"
#include "engine/pack/pack.h"

namespace strata::runtime {

inline constexpr int kMaxPrefetchExperts = 64;

struct DeviceOptions {
  std::string device = "auto";  // "auto" (cuda when a CUDA device is present), "cpu" or "cuda"
  double vram_gib = 0;          // device memory the model may use; 0 = what is free, less a margin
  int max_batch = 64;           // tokens of one decode step the device sizes its buffers for (prefill is chunked)
  int max_prefill = 512;        // tokens of one prefill step
  int64_t vram_experts = -1;    // expert slots in VRAM; -1: every expert when they fit, else as many as fit
  std::string cache_policy = "lfu-decay";  // the VRAM expert cache's: lru, lfu-decay or static
  std::string miss_path = "both";  // where experts not in VRAM are computed: gpu, cpu or both (model/miss_path.h)
  bool pin_arena = true;           // page-lock the expert arena for the GPU (false: as if locking were refused)
  // Decode misses the GPU computes are copied into VRAM first (false: read in place inside the expert
  // kernel, the earlier and slower way; for the benches' comparison).
  bool stage_gpu_misses = true;
  // Decode experts not in VRAM copied ahead per layer from a guess of its routing made one layer early
  // (gpu::OffloadOptions::prefetch_experts); 0: none. At most kMaxPrefetchExperts.
  int prefetch_experts = 0;
  bool prefetch_after_layer = true;  // gpu::OffloadOptions::prefetch_after_layer
  // How CUDA prompt steps multiply F16/BF16 dense weights: "fp32" (cuBLAS SGEMM, the CPU's numbers up to the
  // order of the additions) or "split-tf32" (TF32 tensor cores on x's two TF32 parts: prompt steps 11-16% faster
  // on an H200, the logits a little further from the CPU's; kernels::cuda::MatmulContext). The CPU ignores it.
  std::string prompt_math = "fp32";
  // Decode steps norm and rotate q and k inside the CUDA decode attention (gpu::CudaDenseOptions::fuse_qk_rope;
  // the same bits either way): false only for the benches' comparison.
  bool fuse_qk_rope = true;
};

// How CUDA prompt steps multiply F16/BF16 dense weights (DeviceOptions::prompt_math).
enum class PromptMath { kFp32, kSplitTf32 };
// "fp32" or "split-tf32"; INVALID_ARGUMENT naming any other name.
absl::StatusOr<PromptMath> ParsePromptMath(absl::string_view name);

// OK when the options name a known device, cache policy, miss path and prompt math, vram_gib is a finite number
// >= 0 (at most 2^20), vram_experts is -1 or a count and prefetch_experts in [0, 64]; otherwise INVALID_ARGUMENT
// naming the field. LoadModel checks them first; the engine checks them before it opens the pack.
absl::Status CheckDeviceOptions(const DeviceOptions& options);

// The VRAM expert cache's options for `pack` with `slots` slots: the policy `options.cache_policy` names
// and, when the pack has a routing profile, its counts as warm_counts, scaled to picks per decay_tokens
// tokens (the scale of lfu-decay's scores, so that the profile orders the warm start without outweighing
// the routing seen while serving for long). INVALID_ARGUMENT naming cache_policy for an unknown policy.
absl::StatusOr<model::CacheOptions> ExpertCacheOptions(const pack::Pack& pack, const DeviceOptions& options,
                                                       int64_t slots);

// OK when the backend of `device` ("cpu" or "cuda") implements every block the configuration needs;
// UNIMPLEMENTED naming the architecture and the missing block otherwise. LoadModel refuses --device cuda
// for such a model and runs --device auto on the CPU, saying why in LoadedModel::note.
absl::Status CheckDeviceBlocks(const model::ModelConfig& config, std::string_view device);

// Whether this build has CUDA and a device is visible; `why` says what was found, for logs.
bool CudaDeviceAvailable(std::string* why);

struct LoadedModel {
  std::unique_ptr<pack::ExpertSource> source;  // null when the experts live elsewhere (all in VRAM)
  std::unique_ptr<model::Model> model;         // reads `source`, so destroy the model first
  std::string device;                          // "cpu" or "cuda"
  std::string note;                            // why the device is not the one asked for, when it is not
};

// Loads the pack's model for the device `options.device` asks for. `experts` says how the CPU reads
// experts; `source_factory`, when set, replaces it (tests inject failures) and forces the CPU. `pool` must
// outlive the model. Errors: INVALID_ARGUMENT for an unknown device name; UNAVAILABLE for --device cuda
// without a CUDA build or device; RESOURCE_EXHAUSTED when the model does not fit in the VRAM allowed
// (with both numbers); the pack's own errors.
absl::StatusOr<LoadedModel> LoadModel(
    const pack::Pack& pack, const DeviceOptions& options, const pack::ExpertSourceOptions& experts,
    const std::function<std::unique_ptr<pack::ExpertSource>(const pack::Pack&)>& source_factory,
    exec::ThreadPool* pool, pack::ExpertSourceStats* source_stats);

}  // namespace strata::runtime

#endif  // STRATA_ENGINE_RUNTIME_MODEL_FACTORY_H_
