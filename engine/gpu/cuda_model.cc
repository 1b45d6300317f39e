#include "engine/gpu/cuda_model.h"

#include <cuda_runtime.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/gpu/cuda_dense_backend.h"
#include "engine/gpu/gpu_moe_dispatch.h"
#include "engine/status_macros.h"
#include "kernels/cuda/cuda_status.h"

namespace strata::gpu {
namespace {

// Left free for the CUDA context, cuBLAS and the KV caches' first allocations when no budget is given.
constexpr uint64_t kMargin = uint64_t{2} << 30;

std::string Gib(uint64_t bytes) { return absl::StrFormat("%.2f GiB", static_cast<double>(bytes) / (1ull << 30)); }

}  // namespace

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

absl::StatusOr<CudaModelParts> CreateCudaModelParts(const pack::Pack& pack, const model::ModelConfig& config,
                                                    const model::ModelWeights& weights,
                                                    const CudaModelOptions& options, exec::ThreadPool* pool) {
  size_t free_bytes = 0, total_bytes = 0;
  CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_bytes, &total_bytes), "reading the device's free memory");
  const int max_tokens = std::max(options.max_batch, options.max_prefill);
  const uint64_t dense = CudaDenseBackend::DeviceBytes(config, weights, options.max_batch, options.max_prefill);
  const uint64_t experts = GpuMoeDispatch::DeviceBytes(pack, max_tokens);
  const uint64_t allowed = options.vram_bytes > 0 ? options.vram_bytes
                                                  : (free_bytes > kMargin ? free_bytes - kMargin : 0);
  if (dense + experts > allowed) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the model needs ", Gib(dense + experts), " of device memory (", Gib(experts), " of experts, ", Gib(dense),
        " of dense weights and buffers) but ", options.vram_bytes > 0 ? "--vram-gib allows " : "the device has ",
        Gib(allowed), options.vram_bytes > 0 ? "" : " free (less a 2 GiB margin)",
        "; every expert must fit until the offload tier lands: use --device cpu"));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<CudaDenseBackend> backend,
                   CudaDenseBackend::Create(config, weights, options.max_batch, options.max_prefill));
  ASSIGN_OR_RETURN(std::unique_ptr<GpuMoeDispatch> dispatch,
                   GpuMoeDispatch::Create(pack, max_tokens, options.verify, pool));
  backend->add_memory_used(dispatch->device_bytes());
  backend->set_graphs(dispatch->capturable());
  CudaModelParts parts;
  parts.backend = std::move(backend);
  parts.dispatch = std::move(dispatch);
  return parts;
}

}  // namespace strata::gpu
