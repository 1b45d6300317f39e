#include "engine/gpu/gpu_moe_dispatch.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/status_macros.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/expert_kernels.h"

namespace strata::gpu {
namespace {

using kernels::cuda::DeviceBuffer;
using kernels::cuda::PinnedBuffer;

constexpr uint64_t kStagingBytes = uint64_t{256} << 20;
constexpr int kStagingBuffers = 2;
constexpr uint64_t kReadPiece = uint64_t{8} << 20;

// Reads [offset, offset + bytes) of `fd` into dst with the pool's threads.
absl::Status ReadRange(int fd, const std::string& path, uint64_t offset, uint64_t bytes, uint8_t* dst,
                       exec::ThreadPool* pool) {
  const int64_t pieces = static_cast<int64_t>((bytes + kReadPiece - 1) / kReadPiece);
  std::atomic<bool> failed{false};
  std::atomic<uint64_t> failed_at{0};
  exec::ParallelFor(pool, pieces, [&](int64_t i) {
    uint64_t off = static_cast<uint64_t>(i) * kReadPiece;
    const uint64_t end = std::min(bytes, off + kReadPiece);
    while (off < end && !failed.load(std::memory_order_relaxed)) {
      const ssize_t n = pread(fd, dst + off, end - off, static_cast<off_t>(offset + off));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        failed_at = offset + off;
        failed = true;
        return;
      }
      off += static_cast<uint64_t>(n);
    }
  });
  if (failed) return absl::DataLossError(absl::StrCat(path, ": short read at offset ", failed_at.load()));
  return absl::OkStatus();
}

}  // namespace

uint64_t GpuMoeDispatch::DeviceBytes(const pack::Pack& pack, int max_tokens) {
  const pack::v1::Manifest& m = pack.manifest();
  const int k = static_cast<int>(m.geometry().n_expert_used());
  return m.experts_bytes() + pack.n_blobs() * sizeof(void*) +
         kernels::cuda::ExpertFfnWorkspaceBytes(pack.layout(), max_tokens, k, static_cast<int>(m.geometry().n_expert()));
}

absl::StatusOr<std::unique_ptr<GpuMoeDispatch>> GpuMoeDispatch::Create(
    const pack::Pack& pack, int max_tokens, bool verify, exec::ThreadPool* pool,
    std::shared_ptr<const DeviceExpertExtras> extras) {
  const auto start = std::chrono::steady_clock::now();
  const pack::v1::Manifest& m = pack.manifest();
  const int64_t n_expert = m.geometry().n_expert();
  std::unique_ptr<GpuMoeDispatch> d(new GpuMoeDispatch(pack.layout(), n_expert));
  d->extras_ = std::move(extras);
  const uint64_t total = m.experts_bytes();
  const uint64_t blob_bytes = m.blob_bytes();
  ASSIGN_OR_RETURN(d->experts_, DeviceBuffer::Allocate(total));

  // Staging chunks hold whole blobs, so each blob can be checked where it lands.
  const uint64_t chunk = std::max<uint64_t>(1, kStagingBytes / blob_bytes) * blob_bytes;
  PinnedBuffer staging[kStagingBuffers];
  cudaEvent_t copied[kStagingBuffers] = {};
  cudaStream_t stream = nullptr;
  CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  for (int i = 0; i < kStagingBuffers; ++i) {
    ASSIGN_OR_RETURN(staging[i], PinnedBuffer::Allocate(std::min(chunk, total)));
    CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&copied[i], cudaEventDisableTiming), "cudaEventCreate");
  }
  const std::string path = pack.experts_path();
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  absl::Status status =
      fd < 0 ? absl::NotFoundError(absl::StrCat(path, ": ", std::strerror(errno))) : absl::OkStatus();
  for (uint64_t offset = 0, i = 0; status.ok() && offset < total; offset += chunk, ++i) {
    const int b = static_cast<int>(i % kStagingBuffers);
    const uint64_t bytes = std::min(chunk, total - offset);
    // The copy that used this buffer two chunks ago must be done before it is refilled.
    status = kernels::cuda::CudaStatus(cudaEventSynchronize(copied[b]), "uploading experts");
    if (!status.ok()) break;
    uint8_t* host = staging[b].as<uint8_t>();
    status = ReadRange(fd, path, offset, bytes, host, pool);
    if (!status.ok()) break;
    if (verify) {
      const uint64_t first = offset / blob_bytes, count = bytes / blob_bytes;
      std::atomic<int64_t> bad{-1};
      exec::ParallelFor(pool, static_cast<int64_t>(count), [&](int64_t j) {
        if (!pack.CheckBlob(first + j, host + j * blob_bytes).ok()) bad = static_cast<int64_t>(first + j);
      });
      if (bad >= 0) {
        status = pack.CheckBlob(static_cast<uint64_t>(bad.load()), host + (bad.load() - first) * blob_bytes);
        break;
      }
    }
    status = kernels::cuda::CudaStatus(
        cudaMemcpyAsync(d->experts_.as<uint8_t>() + offset, host, bytes, cudaMemcpyHostToDevice, stream),
        "uploading experts");
    if (status.ok()) status = kernels::cuda::CudaStatus(cudaEventRecord(copied[b], stream), "uploading experts");
  }
  if (fd >= 0) close(fd);
  const cudaError_t synced = cudaStreamSynchronize(stream);
  if (status.ok()) status = kernels::cuda::CudaStatus(synced, "uploading experts");
  for (cudaEvent_t e : copied) cudaEventDestroy(e);
  cudaStreamDestroy(stream);
  RETURN_IF_ERROR(status);

  std::vector<const uint8_t*> table(pack.n_blobs());
  for (uint64_t i = 0; i < table.size(); ++i) table[i] = d->experts_.as<uint8_t>() + i * blob_bytes;
  ASSIGN_OR_RETURN(d->table_, DeviceBuffer::Allocate(table.size() * sizeof(void*)));
  CUDA_RETURN_IF_ERROR(cudaMemcpy(d->table_.data(), table.data(), table.size() * sizeof(void*), cudaMemcpyHostToDevice),
                       "uploading the blob table");
  // A pageable upload may return before its DMA lands; the compute stream does not wait for it.
  CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize(), "uploading the blob table");
  const int k = static_cast<int>(m.geometry().n_expert_used());
  ASSIGN_OR_RETURN(d->workspace_, DeviceBuffer::Allocate(kernels::cuda::ExpertFfnWorkspaceBytes(
                                      d->layout_, max_tokens, k, static_cast<int>(n_expert))));
  d->upload_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return d;
}

absl::Status GpuMoeDispatch::Run(const model::MoeBatch& batch) {
  if (batch.x_device == nullptr || batch.ids_device == nullptr || batch.parts_device == nullptr) {
    return absl::InternalError("the GPU expert dispatch needs device views of the batch");
  }
  const auto* table = table_.as<const uint8_t* const>() + batch.moe_layer * n_expert_;
  return kernels::cuda::ExpertFfn(layout_, table, static_cast<int>(n_expert_), batch.ids_device, batch.n_tokens,
                                  batch.k, batch.x_device, batch.parts_device,
                                  ExtrasForLayer(extras_.get(), batch.moe_layer), workspace_.data(), workspace_.bytes(),
                                  static_cast<cudaStream_t>(batch.stream));
}

void GpuMoeDispatch::Account(int64_t moe_layer, const int32_t* ids, int n_tokens, int k,
                             model::DispatchStats* stats) const {
  model::AccountRouting(counter_, layout_, ids, n_tokens * k, /*in_vram=*/true, stats);
}

}  // namespace strata::gpu
