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

absl::StatusOr<CachePolicy> ParseCachePolicy(const std::string& name) {
  if (name == "lru") return CachePolicy::kLru;
  if (name == "lfu-decay") return CachePolicy::kLfuDecay;
  if (name == "static") return CachePolicy::kStatic;
  return absl::InvalidArgumentError(
      absl::StrCat("cache policy '", name, "' is not one of lru, lfu-decay, static"));
}

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
  d->options_ = options;
  d->n_slots_ = std::clamp<int64_t>(options.slots, 0, static_cast<int64_t>(d->n_blobs_));
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

  d->slot_of_.assign(d->n_blobs_, -1);
  d->owner_.assign(static_cast<size_t>(d->n_slots_), -1);
  d->entry_state_.assign(d->n_blobs_, kHost);
  d->score_.assign(d->n_blobs_, 0.0);
  d->last_used_.assign(d->n_blobs_, 0);
  const uint8_t** table = d->table_host_.as<const uint8_t*>();
  for (uint64_t b = 0; b < d->n_blobs_; ++b) table[b] = d->arena_ + b * blob_bytes;
  // Warm start: expert e of every layer for e = 0, 1, ... until the slots are full.
  const uint64_t n_layers = g.n_moe_layers();
  for (int64_t s = 0; s < d->n_slots_; ++s) {
    const uint64_t blob = (static_cast<uint64_t>(s) % n_layers) * d->n_expert_ + static_cast<uint64_t>(s) / n_layers;
    const uint8_t* dst = d->slots_.as<uint8_t>() + static_cast<uint64_t>(s) * blob_bytes;
    CUDA_RETURN_IF_ERROR(cudaMemcpy(const_cast<uint8_t*>(dst), first + blob * blob_bytes, blob_bytes,
                                    cudaMemcpyHostToDevice),
                         "filling the VRAM expert cache");
    d->slot_of_[blob] = s;
    d->owner_[s] = static_cast<int64_t>(blob);
    d->entry_state_[blob] = kResident;
    table[blob] = dst;
  }
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
    (entry_state_[blob] == kResident ? stats->hits : stats->misses) += 1;
  }
}

model::CacheReport OffloadMoeDispatch::cache() const {
  model::CacheReport r;
  r.slots = n_slots_;
  r.policy = options_.policy == CachePolicy::kLru ? "lru" : options_.policy == CachePolicy::kStatic ? "static" : "lfu-decay";
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
    entry_state_[f.blob] = kResident;
    SetEntry(f.blob, slots_.as<uint8_t>() + static_cast<uint64_t>(f.slot) * pack_->manifest().blob_bytes());
    spare_events_.push_back(f.done);
    pending_[i] = pending_.back();
    pending_.pop_back();
  }
  return absl::OkStatus();
}

void OffloadMoeDispatch::Fill(uint64_t blob, int64_t slot) {
  const uint64_t blob_bytes = pack_->manifest().blob_bytes();
  const int64_t victim = owner_[slot];
  if (victim >= 0) {
    // Point the victim back at the arena before anything can overwrite its slot.
    entry_state_[victim] = kHost;
    slot_of_[victim] = -1;
    SetEntry(static_cast<uint64_t>(victim), arena_ + static_cast<uint64_t>(victim) * blob_bytes);
    evictions_.fetch_add(1, std::memory_order_relaxed);
  }
  owner_[slot] = static_cast<int64_t>(blob);
  slot_of_[blob] = slot;
  entry_state_[blob] = kFilling;
  cudaEvent_t done = nullptr;
  if (!spare_events_.empty()) {
    done = spare_events_.back();
    spare_events_.pop_back();
  } else {
    cudaEventCreateWithFlags(&done, cudaEventDisableTiming);
  }
  pending_.push_back({blob, slot, done});
  admissions_.fetch_add(1, std::memory_order_relaxed);
  pcie_bytes_.fetch_add(blob_bytes, std::memory_order_relaxed);
}

void OffloadMoeDispatch::AfterStep(int64_t n_moe_layers, const int32_t* const* ids, int n_tokens, int k) {
  if (stream_ == nullptr) return;
  ++step_;
  const uint64_t blob_bytes = pack_->manifest().blob_bytes();
  // Usage, and the misses of this step in order of first use.
  std::vector<uint64_t> missed;
  for (int64_t l = 0; l < n_moe_layers; ++l) {
    for (int i = 0; i < n_tokens * k; ++i) {
      const int32_t e = ids[l][i];
      if (e < 0 || e >= n_expert_) continue;
      const uint64_t blob = static_cast<uint64_t>(l) * n_expert_ + e;
      if (entry_state_[blob] != kResident) {
        if (last_used_[blob] != step_) {
          missed.push_back(blob);
          pcie_bytes_.fetch_add(layout_.weight_bytes(), std::memory_order_relaxed);  // read once a step
        }
      }
      last_used_[blob] = step_;
      score_[blob] += 1.0;
    }
  }
  tokens_since_decay_ += static_cast<uint64_t>(n_tokens);
  if (options_.policy == CachePolicy::kLfuDecay && tokens_since_decay_ >= static_cast<uint64_t>(options_.decay_tokens)) {
    for (double& s : score_) s *= 0.5;
    tokens_since_decay_ = 0;
  }
  if (options_.policy == CachePolicy::kStatic || n_slots_ == 0 || missed.empty()) return;

  // Admissions: each missed expert takes the slot of the coldest resident one (a free slot first), if the
  // policy prefers it. Slots being filled are not victims.
  int fills = 0;
  for (uint64_t blob : missed) {
    if (fills >= options_.max_fills_per_step) break;
    if (entry_state_[blob] != kHost) continue;
    int64_t victim_slot = -1;
    double victim_key = std::numeric_limits<double>::infinity();
    for (int64_t s = 0; s < n_slots_; ++s) {
      const int64_t owner = owner_[s];
      if (owner < 0) {
        victim_slot = s;
        break;
      }
      if (entry_state_[owner] != kResident || last_used_[owner] == step_) continue;  // in flight or just used
      const double key = options_.policy == CachePolicy::kLru ? static_cast<double>(last_used_[owner]) : score_[owner];
      if (key < victim_key) {
        victim_key = key;
        victim_slot = s;
      }
    }
    if (victim_slot < 0) break;
    if (options_.policy == CachePolicy::kLfuDecay && owner_[victim_slot] >= 0 && !(score_[blob] > victim_key)) continue;
    Fill(blob, victim_slot);
    ++fills;
  }
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
