#include "engine/runtime/model_factory.h"

#include "absl/strings/str_cat.h"
#include "engine/model/cpu_dense_backend.h"
#include "engine/model/cpu_moe_dispatch.h"
#include "engine/model/expert_cache_policy.h"
#include "engine/model/miss_path.h"
#include "engine/status_macros.h"
#if STRATA_HAVE_CUDA
#include "engine/gpu/cuda_model.h"
#endif

namespace strata::runtime {

bool CudaDeviceAvailable(std::string* why) {
#if STRATA_HAVE_CUDA
  return gpu::CudaDevicePresent(why);
#else
  if (why != nullptr) *why = "this build has no CUDA support";
  return false;
#endif
}

absl::Status CheckDeviceBlocks(const model::ModelConfig& config, std::string_view device) {
  using model::Block;
  if (device == "cpu") {
    return model::CheckBackendBlocks(config, "CPU",
                                     {Block::kQkvBias, Block::kWholeQkNorm, Block::kRouterWithoutRenorm,
                                      Block::kSharedExpert, Block::kSharedExpertGate, Block::kPartialRope,
                                      Block::kSigmoidRouter, Block::kRoutedScale, Block::kDenseLeadingBlocks,
                                      Block::kSinkWindowAttention, Block::kYarnRope, Block::kSoftmaxTopKRouter,
                                      Block::kBiasedClampedExperts, Block::kGroupedRouter, Block::kLatentAttention,
                                      Block::kHeadQkNormPartialRope});
  }
  // engine/gpu's blocks (CudaDenseBackend); add each block here as its CUDA twin lands.
  return model::CheckBackendBlocks(config, "CUDA",
                                   {Block::kQkvBias, Block::kWholeQkNorm, Block::kRouterWithoutRenorm,
                                    Block::kSharedExpert, Block::kSharedExpertGate, Block::kPartialRope,
                                    Block::kSigmoidRouter, Block::kRoutedScale, Block::kDenseLeadingBlocks,
                                    Block::kSinkWindowAttention, Block::kYarnRope, Block::kSoftmaxTopKRouter,
                                    Block::kBiasedClampedExperts, Block::kGroupedRouter, Block::kLatentAttention,
                                    Block::kHeadQkNormPartialRope});
}

absl::StatusOr<PromptMath> ParsePromptMath(absl::string_view name) {
  if (name == "fp32") return PromptMath::kFp32;
  if (name == "split-tf32") return PromptMath::kSplitTf32;
  return absl::InvalidArgumentError(absl::StrCat("'", name, "' is not a prompt math (fp32 or split-tf32)"));
}

absl::Status CheckDeviceOptions(const DeviceOptions& options) {
  if (options.device != "auto" && options.device != "cpu" && options.device != "cuda") {
    return absl::InvalidArgumentError(
        absl::StrCat("device: '", options.device, "' is not one of auto, cpu, cuda"));
  }
  if (!(options.vram_gib >= 0 && options.vram_gib <= double{1 << 20})) {
    return absl::InvalidArgumentError(
        absl::StrCat("vram_gib: ", options.vram_gib, " is not a size in GiB (0 .. 2^20; 0 = what is free)"));
  }
  if (options.vram_experts < -1) {
    return absl::InvalidArgumentError(
        absl::StrCat("vram_experts: ", options.vram_experts, " is not a count (-1 = as many as fit)"));
  }
  if (options.prefetch_experts < 0 || options.prefetch_experts > kMaxPrefetchExperts) {
    return absl::InvalidArgumentError(absl::StrCat("prefetch_experts: ", options.prefetch_experts,
                                                   " is not a count of experts a layer in [0, ", kMaxPrefetchExperts,
                                                   "]"));
  }
  if (absl::StatusOr<model::CachePolicy> policy = model::ParseCachePolicy(options.cache_policy); !policy.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("cache_policy: ", policy.status().message()));
  }
  if (absl::StatusOr<model::MissPath> path = model::ParseMissPath(options.miss_path); !path.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("miss_path: ", path.status().message()));
  }
  if (absl::StatusOr<PromptMath> math = ParsePromptMath(options.prompt_math); !math.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("prompt_math: ", math.status().message()));
  }
  return absl::OkStatus();
}

absl::StatusOr<model::CacheOptions> ExpertCacheOptions(const pack::Pack& pack, const DeviceOptions& options,
                                                       int64_t slots) {
  model::CacheOptions cache;
  cache.slots = slots;
  absl::StatusOr<model::CachePolicy> policy = model::ParseCachePolicy(options.cache_policy);
  if (!policy.ok()) return absl::InvalidArgumentError(absl::StrCat("cache_policy: ", policy.status().message()));
  cache.policy = *policy;
  if (const pack::RoutingProfile* profile = pack.routing_profile(); profile != nullptr) {
    // Pack::Open checked the profile: tokens > 0 and one count per blob.
    const double scale = static_cast<double>(cache.decay_tokens) / static_cast<double>(profile->tokens);
    cache.warm_counts.reserve(profile->counts.size());
    for (uint64_t count : profile->counts) cache.warm_counts.push_back(static_cast<double>(count) * scale);
  }
  return cache;
}

absl::StatusOr<LoadedModel> LoadModel(
    const pack::Pack& pack, const DeviceOptions& options, const pack::ExpertSourceOptions& experts,
    const std::function<std::unique_ptr<pack::ExpertSource>(const pack::Pack&)>& source_factory,
    exec::ThreadPool* pool, pack::ExpertSourceStats* source_stats) {
  RETURN_IF_ERROR(CheckDeviceOptions(options));
  std::string why;
  const bool cuda = !source_factory && (options.device == "cuda" ||
                                        (options.device == "auto" && CudaDeviceAvailable(&why)));
  if (options.device == "cuda" && !CudaDeviceAvailable(&why)) {
    return absl::UnavailableError(absl::StrCat("device: cuda was asked for, but ", why));
  }
  LoadedModel loaded;
  ASSIGN_OR_RETURN(loaded.model, model::Model::Create(pack));
  model::Model& m = *loaded.model;
  auto attach_cpu = [&] {
    m.Attach(std::make_unique<model::CpuDenseBackend>(m.config(), m.weights(), pool),
             std::make_unique<model::CpuMoeDispatch>(loaded.source.get(), pack.layout(),
                                                     pack.manifest().geometry().n_expert(), pool,
                                                     model::ExpertExtrasOf(m.config(), m.weights())));
    loaded.device = "cpu";
  };
  if (cuda) {
#if STRATA_HAVE_CUDA
    absl::Status s = CheckDeviceBlocks(m.config(), "cuda");
    if (!s.ok()) {
      if (options.device == "cuda") return s;
      loaded.note = absl::StrCat(s.message(), ": running on the CPU");
      ASSIGN_OR_RETURN(loaded.source, pack::OpenExpertSource(pack, experts, source_stats));
      attach_cpu();
      return loaded;
    }
    gpu::CudaModelOptions o;
    o.vram_bytes = static_cast<uint64_t>(options.vram_gib * (1ull << 30));
    o.max_batch = options.max_batch;
    o.max_prefill = options.max_prefill;
    o.verify = experts.verify;
    o.vram_experts = options.vram_experts;
    o.miss_path = options.miss_path;
    o.stage_gpu_misses = options.stage_gpu_misses;
    o.prefetch_experts = options.prefetch_experts;
    o.prefetch_after_layer = options.prefetch_after_layer;
    o.fuse_qk_rope = options.fuse_qk_rope;
    o.split_tf32_prompts = ParsePromptMath(options.prompt_math).value_or(PromptMath::kFp32) == PromptMath::kSplitTf32;
    ASSIGN_OR_RETURN(const gpu::VramPlan plan, gpu::PlanVram(pack, m.config(), m.weights(), o));
    ASSIGN_OR_RETURN(o.cache, ExpertCacheOptions(pack, options, plan.slots));
    if (!plan.all_experts) {
      // The experts stay in the arena, page-locked and mapped; the VRAM cache sits in front of it.
      pack::ExpertSourceOptions arena = experts;
      arena.kind = "arena";
      arena.pinner = options.pin_arena ? gpu::CudaHostPinner() : nullptr;
      ASSIGN_OR_RETURN(loaded.source, pack::OpenExpertSource(pack, arena, source_stats));
      if (!loaded.source->pinned()) {
        // The GPU cannot read misses in place: the host computes them and long prompts are copied through
        // VRAM from pageable memory (slower). Say why.
        const std::string why = !options.pin_arena ? std::string("page-locking is turned off")
                                : source_stats != nullptr ? source_stats->pin_note
                                                          : std::string("unknown");
        if (options.miss_path == "gpu") {
          return absl::FailedPreconditionError(absl::StrCat(
              "miss path gpu needs the expert arena page-locked, which failed (", why, "); use --miss-path cpu"));
        }
        o.miss_path = "cpu";
        loaded.note = absl::StrCat("the expert arena could not be page-locked (", why,
                                   "): experts not in VRAM are computed by the CPU, long prompts copied from "
                                   "pageable memory");
      }
    }
    ASSIGN_OR_RETURN(gpu::CudaModelParts parts,
                     gpu::CreateCudaModelParts(pack, m.config(), m.weights(), o, plan, loaded.source.get(), pool));
    m.Attach(std::move(parts.backend), std::move(parts.dispatch));
    loaded.device = "cuda";
    return loaded;
#endif
  }
  if (source_factory) {
    loaded.source = source_factory(pack);
    if (loaded.source == nullptr) return absl::InternalError("the expert source factory returned null");
  } else {
    ASSIGN_OR_RETURN(loaded.source, pack::OpenExpertSource(pack, experts, source_stats));
  }
  attach_cpu();
  return loaded;
}

}  // namespace strata::runtime
