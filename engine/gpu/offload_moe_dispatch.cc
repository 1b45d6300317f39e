#include "engine/gpu/offload_moe_dispatch.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "engine/status_macros.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/expert_kernels.h"

namespace strata::gpu {

using kernels::cuda::CudaStatus;
using kernels::cuda::DeviceBuffer;
using kernels::cuda::PinnedBuffer;

uint64_t OffloadMoeDispatch::FixedDeviceBytes(const pack::Pack& pack, int max_tokens) {
  const pack::v1::Geometry& g = pack.manifest().geometry();
  return pack.n_blobs() * sizeof(void*) +
         kernels::cuda::ExpertFfnWorkspaceBytes(pack.layout(), max_tokens, static_cast<int>(g.n_expert_used()),
                                                static_cast<int>(g.n_expert()));
}

absl::StatusOr<std::unique_ptr<OffloadMoeDispatch>> OffloadMoeDispatch::Create(const pack::Pack& pack,
                                                                               pack::ExpertSource* arena,
                                                                               const CacheOptions& options,
                                                                               int max_tokens) {
  if (arena == nullptr || !arena->pinned()) {
    return absl::FailedPreconditionError(
        "the expert arena is not page-locked, so the GPU cannot read misses in place");
  }
  std::unique_ptr<OffloadMoeDispatch> d(new OffloadMoeDispatch());
  const pack::v1::Geometry& g = pack.manifest().geometry();
  d->pack_ = &pack;
  d->layout_ = pack.layout();
  d->n_expert_ = g.n_expert();
  d->n_blobs_ = pack.n_blobs();
  d->policy_ = std::make_unique<model::ExpertCachePolicy>(options, static_cast<int64_t>(g.n_moe_layers()),
                                                        d->n_expert_);
  d->n_slots_ = d->policy_->n_slots();
  d->counter_ = model::RoutingCounter(d->n_expert_);
  ASSIGN_OR_RETURN(const uint8_t* first, arena->Blob(0, 0));
  void* device_arena = nullptr;
  CUDA_RETURN_IF_ERROR(cudaHostGetDevicePointer(&device_arena, const_cast<uint8_t*>(first), 0),
                       "mapping the expert arena for the GPU");
  d->arena_ = static_cast<const uint8_t*>(device_arena);
  d->arena_host_ = first;
  const uint64_t blob_bytes = pack.manifest().blob_bytes();
  ASSIGN_OR_RETURN(d->slots_, DeviceBuffer::Allocate(static_cast<size_t>(d->n_slots_) * blob_bytes));
  ASSIGN_OR_RETURN(d->table_, DeviceBuffer::Allocate(d->n_blobs_ * sizeof(void*)));
  ASSIGN_OR_RETURN(d->table_host_, PinnedBuffer::Allocate(d->n_blobs_ * sizeof(void*)));
  const int k = static_cast<int>(g.n_expert_used());
  ASSIGN_OR_RETURN(d->workspace_, DeviceBuffer::Allocate(kernels::cuda::ExpertFfnWorkspaceBytes(
                                      d->layout_, max_tokens, k, static_cast<int>(d->n_expert_))));
  CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&d->copy_stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&d->compute_done_, cudaEventDisableTiming), "cudaEventCreate");

  const uint8_t** table = d->table_host_.as<const uint8_t*>();
  for (uint64_t b = 0; b < d->n_blobs_; ++b) table[b] = d->arena_ + b * blob_bytes;
  ASSIGN_OR_RETURN(const std::vector<uint64_t> warm, d->policy_->WarmStart({}));
  for (size_t s = 0; s < warm.size(); ++s) {
    const uint8_t* dst = d->slots_.as<uint8_t>() + s * blob_bytes;
    CUDA_RETURN_IF_ERROR(cudaMemcpy(const_cast<uint8_t*>(dst), first + warm[s] * blob_bytes, blob_bytes,
                                    cudaMemcpyHostToDevice),
                         "filling the VRAM expert cache");
    table[warm[s]] = dst;
  }
  RETURN_IF_ERROR(d->policy_->Place(warm, {}));
  CUDA_RETURN_IF_ERROR(cudaMemcpy(d->table_.data(), table, d->n_blobs_ * sizeof(void*), cudaMemcpyHostToDevice),
                       "uploading the blob table");
  return d;
}

OffloadMoeDispatch::~OffloadMoeDispatch() {
  if (copy_stream_ != nullptr) cudaStreamSynchronize(copy_stream_);
  for (const PendingFill& f : pending_) cudaEventDestroy(f.done);
  for (cudaEvent_t e : spare_events_) cudaEventDestroy(e);
  if (compute_done_ != nullptr) cudaEventDestroy(compute_done_);
  if (copy_stream_ != nullptr) cudaStreamDestroy(copy_stream_);
}

absl::Status OffloadMoeDispatch::Run(const model::MoeBatch& batch) {
  if (batch.x_device == nullptr || batch.ids_device == nullptr || batch.parts_device == nullptr) {
    return absl::InternalError("the GPU expert dispatch needs device views of the batch");
  }
  stream_ = static_cast<cudaStream_t>(batch.stream);
  const auto* table = table_.as<const uint8_t* const>() + batch.moe_layer * n_expert_;
  return kernels::cuda::ExpertFfn(layout_, table, static_cast<int>(n_expert_), batch.ids_device, batch.n_tokens,
                                  batch.k, batch.x_device, batch.parts_device, workspace_.data(), workspace_.bytes(),
                                  stream_);
}

void OffloadMoeDispatch::Account(int64_t moe_layer, const int32_t* ids, int n_tokens, int k,
                                 model::DispatchStats* stats) const {
  const uint64_t distinct = counter_.Distinct(ids, n_tokens * k);
  stats->expert_computations += distinct;
  stats->routed += static_cast<uint64_t>(n_tokens) * k;
  stats->expert_bytes += distinct * layout_.weight_bytes();
  for (int i = 0; i < n_tokens * k; ++i) {
    if (ids[i] < 0 || ids[i] >= n_expert_) continue;
    const uint64_t blob = static_cast<uint64_t>(moe_layer) * n_expert_ + ids[i];
    (policy_->resident(blob) ? stats->hits : stats->misses) += 1;
  }
}

model::CacheReport OffloadMoeDispatch::cache() const {
  model::CacheReport r;
  r.slots = n_slots_;
  r.policy = model::CachePolicyName(policy_->options().policy);
  r.admissions = admissions_.load(std::memory_order_relaxed);
  r.evictions = evictions_.load(std::memory_order_relaxed);
  r.pcie_bytes = pcie_bytes_.load(std::memory_order_relaxed);
  return r;
}

void OffloadMoeDispatch::SetEntry(uint64_t blob, const uint8_t* ptr) {
  const uint8_t** mirror = table_host_.as<const uint8_t*>();
  mirror[blob] = ptr;
  // The mirror entry is not written again before this copy has run: every step ends with a sync.
  cudaMemcpyAsync(table_.as<const uint8_t*>() + blob, mirror + blob, sizeof(void*), cudaMemcpyHostToDevice,
                  stream_);
}

absl::Status OffloadMoeDispatch::BeforeStep() {
  // Publish the fills that have landed; later ones stay misses until they do.
  for (size_t i = 0; i < pending_.size();) {
    const cudaError_t q = cudaEventQuery(pending_[i].done);
    if (q == cudaErrorNotReady) {
      ++i;
      continue;
    }
    RETURN_IF_ERROR(CudaStatus(q, "filling the VRAM expert cache"));
    const PendingFill f = pending_[i];
    policy_->Landed(f.blob);
    SetEntry(f.blob, slots_.as<uint8_t>() + static_cast<uint64_t>(f.slot) * pack_->manifest().blob_bytes());
    spare_events_.push_back(f.done);
    pending_[i] = pending_.back();
    pending_.pop_back();
  }
  return absl::OkStatus();
}

void OffloadMoeDispatch::Fill(const model::ExpertCachePolicy::Admission& admission) {
  const uint64_t blob_bytes = pack_->manifest().blob_bytes();
  if (admission.victim >= 0) {
    // Point the victim back at the arena before anything can overwrite its slot.
    const uint64_t victim = static_cast<uint64_t>(admission.victim);
    SetEntry(victim, arena_ + victim * blob_bytes);
    evictions_.fetch_add(1, std::memory_order_relaxed);
  }
  cudaEvent_t done = nullptr;
  if (!spare_events_.empty()) {
    done = spare_events_.back();
    spare_events_.pop_back();
  } else {
    cudaEventCreateWithFlags(&done, cudaEventDisableTiming);
  }
  pending_.push_back({admission.blob, admission.slot, done});
  admissions_.fetch_add(1, std::memory_order_relaxed);
  pcie_bytes_.fetch_add(blob_bytes, std::memory_order_relaxed);
}

void OffloadMoeDispatch::AfterStep(int64_t n_moe_layers, const int32_t* const* ids, int n_tokens, int k) {
  if (stream_ == nullptr) return;
  const uint64_t blob_bytes = pack_->manifest().blob_bytes();
  std::vector<uint64_t> missed;
  const std::vector<model::ExpertCachePolicy::Admission> admissions =
      policy_->Observe(n_moe_layers, ids, n_tokens, k, &missed);
  // A missed expert's weights crossed PCIe once this step.
  pcie_bytes_.fetch_add(missed.size() * layout_.weight_bytes(), std::memory_order_relaxed);
  for (const model::ExpertCachePolicy::Admission& a : admissions) Fill(a);
  const int fills = static_cast<int>(admissions.size());
  if (fills == 0) return;
  // The fills wait for the victims' entries to point at the arena (and for the step that read them).
  cudaEventRecord(compute_done_, stream_);
  cudaStreamWaitEvent(copy_stream_, compute_done_, 0);
  for (size_t i = pending_.size() - static_cast<size_t>(fills); i < pending_.size(); ++i) {
    const PendingFill& f = pending_[i];
    cudaMemcpyAsync(slots_.as<uint8_t>() + static_cast<uint64_t>(f.slot) * blob_bytes,
                    arena_host_ + f.blob * blob_bytes, blob_bytes, cudaMemcpyHostToDevice, copy_stream_);
    cudaEventRecord(f.done, copy_stream_);
  }
}

}  // namespace strata::gpu
