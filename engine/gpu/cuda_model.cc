#include "engine/gpu/cuda_model.h"

#include <algorithm>
#include <bit>

#include <cuda_runtime.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/gpu/cuda_dense_backend.h"
#include "engine/gpu/device_expert_extras.h"
#include "engine/gpu/gpu_moe_dispatch.h"
#include "engine/gpu/offload_moe_dispatch.h"
#include "engine/status_macros.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/host_memory.h"

namespace strata::gpu {
namespace {

// Left free for the CUDA context, cuBLAS and the KV caches' first allocations when no budget is given.
constexpr uint64_t kMargin = uint64_t{2} << 30;

std::string Gib(uint64_t bytes) { return absl::StrFormat("%.2f GiB", static_cast<double>(bytes) / (1ull << 30)); }

}  // namespace

namespace {

class RegisteringPinner : public pack::HostPinner {
 public:
  absl::Status Pin(void* data, size_t bytes) override { return kernels::cuda::RegisterHostMemory(data, bytes); }
  void Unpin(void* data) override { kernels::cuda::UnregisterHostMemory(data); }
};

}  // namespace

pack::HostPinner* CudaHostPinner() {
  static RegisteringPinner* pinner = new RegisteringPinner();
  return pinner;
}

bool CudaDevicePresent(std::string* why) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    cudaGetLastError();
    if (why != nullptr) {
      *why = e != cudaSuccess ? absl::StrCat("no CUDA device is usable (", cudaGetErrorString(e), ")")
                              : std::string("no CUDA device is visible");
    }
    return false;
  }
  cudaDeviceProp prop{};
  if (why != nullptr && cudaGetDeviceProperties(&prop, 0) == cudaSuccess) *why = prop.name;
  return true;
}

// Tokens of a decode step at most, as the offload tier sizes its buffers: the batch rounded up to a power of
// two (the graph buckets).
int MaxDecode(const CudaModelOptions& options) {
  return static_cast<int>(std::bit_ceil(static_cast<unsigned>(std::max(1, options.max_batch))));
}

namespace {

CudaDenseOptions DenseOptions(const CudaModelOptions& options) {
  return CudaDenseOptions{options.max_batch, options.max_prefill, options.split_tf32_prompts, options.fuse_qk_rope};
}

}  // namespace

absl::StatusOr<VramPlan> PlanVram(const pack::Pack& pack, const model::ModelConfig& config,
                                  const model::ModelWeights& weights, const CudaModelOptions& options) {
  size_t free_bytes = 0, total_bytes = 0;
  CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_bytes, &total_bytes), "reading the device's free memory");
  const int max_tokens = std::max(options.max_batch, options.max_prefill);
  VramPlan plan;
  plan.dense_bytes = CudaDenseBackend::DeviceBytes(config, weights, DenseOptions(options)) +
                     DeviceExpertExtras::DeviceBytes(model::ExpertExtrasOf(config, weights));
  plan.allowed = options.vram_bytes > 0 ? options.vram_bytes : (free_bytes > kMargin ? free_bytes - kMargin : 0);
  const uint64_t all = GpuMoeDispatch::DeviceBytes(pack, max_tokens);
  const uint64_t fixed = OffloadMoeDispatch::FixedDeviceBytes(pack, max_tokens, MaxDecode(options),
                                                                 options.prefetch_experts);
  if (plan.dense_bytes + fixed > plan.allowed) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the dense weights and buffers need ", Gib(plan.dense_bytes + fixed), " of device memory but ",
        options.vram_bytes > 0 ? "--vram-gib allows " : "the device has ", Gib(plan.allowed),
        options.vram_bytes > 0 ? "" : " free (less a 2 GiB margin)", "; use --device cpu"));
  }
  const int64_t fit = static_cast<int64_t>((plan.allowed - plan.dense_bytes - fixed) / pack.manifest().blob_bytes());
  if (options.vram_experts < 0 && plan.dense_bytes + all <= plan.allowed) {
    plan.all_experts = true;
    return plan;
  }
  if (options.vram_experts > fit) {
    return absl::ResourceExhaustedError(absl::StrCat("--vram-experts ", options.vram_experts, " needs ",
                                                     Gib(options.vram_experts * pack.manifest().blob_bytes()),
                                                     " but ", fit, " expert slots fit in ", Gib(plan.allowed),
                                                     " beside the dense part"));
  }
  plan.slots = options.vram_experts >= 0 ? options.vram_experts : fit;
  return plan;
}

absl::StatusOr<CudaModelParts> CreateCudaModelParts(const pack::Pack& pack, const model::ModelConfig& config,
                                                    const model::ModelWeights& weights,
                                                    const CudaModelOptions& options, const VramPlan& plan,
                                                    pack::ExpertSource* arena, exec::ThreadPool* pool) {
  const int max_tokens = std::max(options.max_batch, options.max_prefill);
  ASSIGN_OR_RETURN(std::unique_ptr<CudaDenseBackend> backend,
                   CudaDenseBackend::Create(config, weights, DenseOptions(options)));
  // gpt-oss's expert biases and clamped activation, for the experts on the GPU and on the host alike.
  const model::ExpertExtras extras = model::ExpertExtrasOf(config, weights);
  ASSIGN_OR_RETURN(std::shared_ptr<const DeviceExpertExtras> device_extras,
                   DeviceExpertExtras::Upload(extras, pack.layout(), pack.manifest().geometry().n_expert()));
  backend->add_memory_used(device_extras->device_bytes());
  CudaModelParts parts;
  if (plan.all_experts) {
    ASSIGN_OR_RETURN(std::unique_ptr<GpuMoeDispatch> dispatch,
                     GpuMoeDispatch::Create(pack, max_tokens, options.verify, pool, device_extras));
    backend->add_memory_used(dispatch->device_bytes());
    backend->set_graphs(dispatch->capturable());
    parts.dispatch = std::move(dispatch);
  } else {
    OffloadOptions offload;
    offload.cache = options.cache;
    offload.cache.slots = plan.slots;
    ASSIGN_OR_RETURN(offload.miss_path, model::ParseMissPath(options.miss_path));
    offload.max_tokens = max_tokens;
    offload.max_decode = MaxDecode(options);
    offload.stage_gpu_misses = options.stage_gpu_misses;
    offload.prefetch_experts = options.prefetch_experts;
    offload.prefetch_after_layer = options.prefetch_after_layer;
    offload.extras = extras;
    offload.device_extras = device_extras;
    // The scheduler thread sleeps through a step (below), so the host's expert threads take every core.
    offload.host_threads = pool != nullptr ? pool->num_threads() : 1;
    ASSIGN_OR_RETURN(std::unique_ptr<OffloadMoeDispatch> dispatch, OffloadMoeDispatch::Create(pack, arena, offload));
    backend->add_memory_used(dispatch->device_bytes());
    backend->set_graphs(dispatch->capturable());
    if (offload.miss_path != model::MissPath::kGpu) RETURN_IF_ERROR(backend->SleepWhileWaiting());
    parts.dispatch = std::move(dispatch);
  }
  parts.backend = std::move(backend);
  return parts;
}

}  // namespace strata::gpu
