#include "engine/gpu/offload_moe_dispatch.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "engine/status_macros.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/expert_kernels.h"
#include "kernels/cuda/offload_kernels.h"

namespace strata::gpu {

using kernels::cuda::CudaStatus;
using kernels::cuda::DeviceBuffer;
using kernels::cuda::PinnedBuffer;

namespace {

constexpr uint64_t kStagingBytes = uint64_t{1} << 30;  // at most, for the ring of staging slots
constexpr float kInitialHostShare = 0.6f;             // both paths: the host's share before balancing
// Both paths: a layer's host share of one expert goes to the GPU instead. A share costs the host about 45 us
// of round trip (posting, waking the threads, answering) plus about 11 us an s2 seed expert; the GPU reads one
// over PCIe in about 25 us (H200 host, bench/RESULTS.md, fifth session). Layers that post nothing give the
// balancer no feedback, so the share stays as it was until a step misses enough experts for it to count again.
constexpr int kMinHostExperts = 2;

struct StagingPlan {
  int chunk_experts = 0;  // 0: no streaming (the steps are never long enough)
  int ring = 0;
};

StagingPlan PlanStaging(const pack::Pack& pack, int max_tokens, bool always = false) {
  const pack::v1::Geometry& g = pack.manifest().geometry();
  const int64_t n_expert = static_cast<int64_t>(g.n_expert());
  StagingPlan p;
  if (!always && int64_t{max_tokens} * static_cast<int64_t>(g.n_expert_used()) <
      OffloadMoeDispatch::kStreamPairsPerExpert * n_expert) {
    return p;
  }
  p.chunk_experts = static_cast<int>(std::clamp<int64_t>(n_expert / 4, 1, 32));
  const uint64_t chunk_bytes = static_cast<uint64_t>(p.chunk_experts) * pack.manifest().blob_bytes();
  p.ring = static_cast<int>(std::max<int64_t>(
      2, std::min<int64_t>(n_expert / p.chunk_experts, static_cast<int64_t>(kStagingBytes / chunk_bytes))));
  return p;
}

// Staging slots for a decode step's GPU misses: one per pair of the largest decode step, at most 64 and
// 256 MiB (misses past them are read in place). 0 when the GPU computes no decode misses, or the step's pairs
// are more than StageMisses takes.
constexpr int kMaxMissSlots = 64;
constexpr uint64_t kMissSlotBytes = uint64_t{256} << 20;
int PlanMissSlots(const pack::Pack& pack, int max_decode, bool gpu_reads_misses) {
  const int64_t pairs = int64_t{max_decode} * static_cast<int64_t>(pack.manifest().geometry().n_expert_used());
  if (!gpu_reads_misses || pairs < 1 || pairs > kernels::cuda::kMaxStagePairs) return 0;
  const uint64_t blob_bytes = pack.manifest().blob_bytes();
  if (blob_bytes % 16 != 0) return 0;
  return static_cast<int>(std::min<int64_t>({pairs, kMaxMissSlots, kernels::cuda::kMaxStageSlots,
                                             static_cast<int64_t>(kMissSlotBytes / blob_bytes)}));
}

// Prefetch slots a set: prefetch_experts, at most kMaxPrefetchSlots; 0 when the GPU cannot read the arena or
// blobs are not whole 16-byte units (the copy kernel's).
int PlanPrefetchSlots(const pack::Pack& pack, int prefetch_experts, bool pinned) {
  if (!pinned || prefetch_experts < 1 || pack.manifest().blob_bytes() % 16 != 0) return 0;
  return std::min(prefetch_experts, kernels::cuda::kMaxPrefetchSlots);
}

// host_state_: gpu ids, host ids (max_pairs int32 each), the request counter, the host's pair count, its
// share.
struct HostState {
  size_t host_ids, sequence, host_pairs, share, total;
};
HostState PlanHostState(int max_pairs) {
  HostState h;
  const size_t ids = (static_cast<size_t>(max_pairs) * sizeof(int32_t) + 15) / 16 * 16;
  h.host_ids = ids;
  h.sequence = 2 * ids;
  h.host_pairs = h.sequence + sizeof(int64_t);
  h.share = h.host_pairs + sizeof(int32_t);
  h.total = h.share + sizeof(float);
  return h;
}

}  // namespace

uint64_t OffloadMoeDispatch::FixedDeviceBytes(const pack::Pack& pack, int max_tokens, int max_decode,
                                              int prefetch_experts) {
  const pack::v1::Geometry& g = pack.manifest().geometry();
  const int k = static_cast<int>(g.n_expert_used()), n_expert = static_cast<int>(g.n_expert());
  const StagingPlan staging = PlanStaging(pack, max_tokens);
  const uint64_t staged_blobs = static_cast<uint64_t>(staging.chunk_experts) * staging.ring;
  return pack.n_blobs() * sizeof(void*) +
         kernels::cuda::ExpertFfnWorkspaceBytes(pack.layout(), max_tokens, k, n_expert) +
         staged_blobs * pack.manifest().blob_bytes() + static_cast<uint64_t>(staging.ring) * n_expert * sizeof(void*) +
         static_cast<uint64_t>(max_tokens) * k * sizeof(int32_t) + PlanHostState(max_tokens * k).total +
         static_cast<uint64_t>(PlanMissSlots(pack, max_decode, true)) * pack.manifest().blob_bytes() +
         static_cast<uint64_t>(n_expert) * sizeof(void*) +
         2 * (static_cast<uint64_t>(PlanPrefetchSlots(pack, prefetch_experts, true)) * pack.manifest().blob_bytes() +
              static_cast<uint64_t>(n_expert) * sizeof(void*) + sizeof(int32_t));
}

absl::StatusOr<std::unique_ptr<OffloadMoeDispatch>> OffloadMoeDispatch::Create(const pack::Pack& pack,
                                                                               pack::ExpertSource* arena,
                                                                               const OffloadOptions& options) {
  if (arena == nullptr) return absl::InvalidArgumentError("the offload dispatch needs the expert arena");
  if (!arena->pinned() && options.miss_path == model::MissPath::kGpu) {
    return absl::FailedPreconditionError(
        "the expert arena is not page-locked, so the GPU cannot read misses in place (miss path gpu)");
  }
  std::unique_ptr<OffloadMoeDispatch> d(new OffloadMoeDispatch());
  const pack::v1::Geometry& g = pack.manifest().geometry();
  const int max_tokens = std::max(options.max_tokens, options.max_decode);
  d->options_ = options;
  d->pinned_ = arena->pinned();
  if (!d->pinned_) d->options_.miss_path = model::MissPath::kCpu;
  d->pack_ = &pack;
  d->layout_ = pack.layout();
  d->n_expert_ = g.n_expert();
  d->n_blobs_ = pack.n_blobs();
  d->policy_ = std::make_unique<model::ExpertCachePolicy>(options.cache, static_cast<int64_t>(g.n_moe_layers()),
                                                        d->n_expert_);
  d->n_slots_ = d->policy_->n_slots();
  d->counter_ = model::RoutingCounter(d->n_expert_);
  ASSIGN_OR_RETURN(const uint8_t* first, arena->Blob(0, 0));
  // Unpinned, the table's miss entries hold host addresses: they only mark misses, never read by the GPU.
  void* device_arena = const_cast<uint8_t*>(first);
  if (d->pinned_) {
    CUDA_RETURN_IF_ERROR(cudaHostGetDevicePointer(&device_arena, const_cast<uint8_t*>(first), 0),
                         "mapping the expert arena for the GPU");
  }
  const uint64_t blob_bytes = pack.manifest().blob_bytes();
  d->arena_ = static_cast<const uint8_t*>(device_arena);
  d->arena_end_ = d->arena_ + d->n_blobs_ * blob_bytes;
  d->arena_host_ = first;
  ASSIGN_OR_RETURN(d->slots_, DeviceBuffer::Allocate(static_cast<size_t>(d->n_slots_) * blob_bytes));
  ASSIGN_OR_RETURN(d->table_, DeviceBuffer::Allocate(d->n_blobs_ * sizeof(void*)));
  ASSIGN_OR_RETURN(d->table_host_, PinnedBuffer::Allocate(d->n_blobs_ * sizeof(void*)));
  const int k = static_cast<int>(g.n_expert_used());
  ASSIGN_OR_RETURN(d->workspace_, DeviceBuffer::Allocate(kernels::cuda::ExpertFfnWorkspaceBytes(
                                      d->layout_, max_tokens, k, static_cast<int>(d->n_expert_))));
  ASSIGN_OR_RETURN(d->select_ids_, DeviceBuffer::Allocate(static_cast<size_t>(max_tokens) * k * sizeof(int32_t)));
  CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&d->copy_stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&d->compute_done_, cudaEventDisableTiming), "cudaEventCreate");

  const StagingPlan staging = PlanStaging(pack, max_tokens, /*always=*/!d->pinned_);
  d->chunk_experts_ = staging.chunk_experts;
  d->ring_ = staging.ring;
  if (d->ring_ > 0) {
    ASSIGN_OR_RETURN(d->staging_, DeviceBuffer::Allocate(static_cast<size_t>(d->ring_) * d->chunk_experts_ *
                                                         blob_bytes));
    const size_t tables_bytes = static_cast<size_t>(d->ring_) * d->n_expert_ * sizeof(void*);
    ASSIGN_OR_RETURN(d->stage_tables_, DeviceBuffer::Allocate(tables_bytes));
    CUDA_RETURN_IF_ERROR(cudaMemset(d->stage_tables_.data(), 0, tables_bytes), "clearing the staging tables");
    for (int r = 0; r < d->ring_; ++r) {
      cudaEvent_t staged = nullptr, freed = nullptr;
      CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&staged, cudaEventDisableTiming), "cudaEventCreate");
      d->staged_.push_back(staged);
      CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&freed, cudaEventDisableTiming), "cudaEventCreate");
      d->freed_.push_back(freed);
    }
  }

  d->n_miss_slots_ = options.stage_gpu_misses
                        ? PlanMissSlots(pack, options.max_decode, d->pinned_ && d->options_.miss_path != model::MissPath::kCpu)
                        : 0;
  if (d->n_miss_slots_ > 0) {
    ASSIGN_OR_RETURN(d->miss_slots_, DeviceBuffer::Allocate(static_cast<size_t>(d->n_miss_slots_) * blob_bytes));
    ASSIGN_OR_RETURN(d->miss_table_, DeviceBuffer::Allocate(static_cast<size_t>(d->n_expert_) * sizeof(void*)));
  }

  if (d->options_.miss_path != model::MissPath::kGpu && options.max_decode > 0) {
    ASSIGN_OR_RETURN(d->host_, HostExpertServer::Create(arena, d->layout_, d->n_expert_, options.max_decode, k,
                                                        std::max(1, options.host_threads), options.extras));
    const HostState h = PlanHostState(options.max_decode * k);
    ASSIGN_OR_RETURN(d->host_state_, DeviceBuffer::Allocate(h.total));
    CUDA_RETURN_IF_ERROR(cudaMemset(d->host_state_.data(), 0, h.total), "clearing the host path's state");
    ASSIGN_OR_RETURN(d->host_share_host_, PinnedBuffer::Allocate(sizeof(float)));
    d->host_share_ = d->options_.miss_path == model::MissPath::kCpu ? 1.0f : kInitialHostShare;
    *d->host_share_host_.as<float>() = d->host_share_;
    CUDA_RETURN_IF_ERROR(cudaMemcpy(d->host_state_.as<uint8_t>() + h.share, d->host_share_host_.data(),
                                    sizeof(float), cudaMemcpyHostToDevice),
                         "setting the host's share");
  }

  d->n_prefetch_ = options.max_decode > 0 ? PlanPrefetchSlots(pack, options.prefetch_experts, d->pinned_) : 0;
  if (d->n_prefetch_ > 0) {
    const int64_t n_moe = static_cast<int64_t>(g.n_moe_layers());
    ASSIGN_OR_RETURN(d->prefetch_slots_, DeviceBuffer::Allocate(2 * static_cast<size_t>(d->n_prefetch_) * blob_bytes));
    ASSIGN_OR_RETURN(d->prefetch_tables_, DeviceBuffer::Allocate(2 * static_cast<size_t>(d->n_expert_) * sizeof(void*)));
    ASSIGN_OR_RETURN(d->prefetch_control_, DeviceBuffer::Allocate(2 * sizeof(int32_t)));
    CUDA_RETURN_IF_ERROR(cudaMemset(d->prefetch_control_.data(), 0, 2 * sizeof(int32_t)), "clearing the prefetch control");
    ASSIGN_OR_RETURN(d->prefetch_control_host_, PinnedBuffer::Allocate(2 * sizeof(int32_t)));
    const size_t record_bytes = static_cast<size_t>(n_moe) * (2 + d->n_prefetch_) * sizeof(int32_t);
    ASSIGN_OR_RETURN(d->prefetch_records_, PinnedBuffer::Allocate(record_bytes));
    std::fill_n(d->prefetch_records_.as<uint8_t>(), record_bytes, uint8_t{0});
    CUDA_RETURN_IF_ERROR(cudaHostGetDevicePointer(reinterpret_cast<void**>(&d->prefetch_records_device_),
                                                  d->prefetch_records_.data(), 0),
                         "mapping the prefetch records");
    for (cudaEvent_t* e : {&d->prefetch_done_[0], &d->prefetch_done_[1], &d->layer_done_}) {
      CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(e, cudaEventDisableTiming), "cudaEventCreate");
    }
    d->prefetch_set_.assign(static_cast<size_t>(n_moe), -1);
    d->gate_ = model::PrefetchGate(d->n_prefetch_);
  }

  const uint8_t** table = d->table_host_.as<const uint8_t*>();
  for (uint64_t b = 0; b < d->n_blobs_; ++b) table[b] = d->arena_ + b * blob_bytes;
  ASSIGN_OR_RETURN(const std::vector<uint64_t> warm, d->policy_->WarmStart(options.cache.warm_counts));
  for (size_t s = 0; s < warm.size(); ++s) {
    const uint8_t* dst = d->slots_.as<uint8_t>() + s * blob_bytes;
    CUDA_RETURN_IF_ERROR(cudaMemcpy(const_cast<uint8_t*>(dst), first + warm[s] * blob_bytes, blob_bytes,
                                    cudaMemcpyHostToDevice),
                         "filling the VRAM expert cache");
    table[warm[s]] = dst;
  }
  RETURN_IF_ERROR(d->policy_->Place(warm, options.cache.warm_counts));
  CUDA_RETURN_IF_ERROR(cudaMemcpy(d->table_.data(), table, d->n_blobs_ * sizeof(void*), cudaMemcpyHostToDevice),
                       "uploading the blob table");
  // The memsets and pageable copies above are on the legacy stream, which the compute stream does not wait for.
  CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize(), "setting up the VRAM expert cache");
  return d;
}

OffloadMoeDispatch::~OffloadMoeDispatch() {
  if (copy_stream_ != nullptr) cudaStreamSynchronize(copy_stream_);
  for (const PendingFill& f : pending_) cudaEventDestroy(f.done);
  for (cudaEvent_t e : spare_events_) cudaEventDestroy(e);
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  host_.reset();
  for (cudaEvent_t e : staged_) cudaEventDestroy(e);
  for (cudaEvent_t e : freed_) cudaEventDestroy(e);
  for (cudaEvent_t e : {prefetch_done_[0], prefetch_done_[1], layer_done_}) {
    if (e != nullptr) cudaEventDestroy(e);
  }
  if (compute_done_ != nullptr) cudaEventDestroy(compute_done_);
  if (copy_stream_ != nullptr) cudaStreamDestroy(copy_stream_);
}

absl::Status OffloadMoeDispatch::Run(const model::MoeBatch& batch) {
  if (batch.x_device == nullptr || batch.ids_device == nullptr || batch.parts_device == nullptr) {
    return absl::InternalError("the GPU expert dispatch needs device views of the batch");
  }
  stream_ = static_cast<cudaStream_t>(batch.stream);
  const auto* table = table_.as<const uint8_t* const>() + batch.moe_layer * n_expert_;
  if (n_prefetch_ > 0 && prefetch_set_[batch.moe_layer] >= 0) {
    // The layer's table with the experts copied ahead, once the copies have landed.
    const int set = prefetch_set_[batch.moe_layer];
    prefetch_set_[batch.moe_layer] = -1;
    CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream_, prefetch_done_[set], 0), "waiting for the experts copied ahead");
    table = prefetch_tables_.as<const uint8_t* const>() + static_cast<int64_t>(set) * n_expert_;
  }
  if (Streams(batch)) return RunStreamed(batch, table);
  if (host_ != nullptr && batch.n_tokens <= host_->max_tokens()) {
    RETURN_IF_ERROR(RunWithHost(batch, table));
  } else {
    if (!pinned_) return absl::InternalError("a step the unpinned arena's paths do not cover reached the GPU path");
    RETURN_IF_ERROR(RunDecodeOnGpu(batch, table, batch.ids_device));
  }
  return LaunchPrefetch(/*after_layer=*/true);
}

absl::Status OffloadMoeDispatch::RunDecodeOnGpu(const model::MoeBatch& batch, const uint8_t* const* table,
                                                const int32_t* ids) {
  const int n_pairs = batch.n_tokens * batch.k;
  if (n_miss_slots_ > 0 && batch.n_tokens <= options_.max_decode && n_pairs <= kernels::cuda::kMaxStagePairs) {
    kernels::cuda::StageMissesArgs s;
    s.ids = ids;
    s.n_pairs = n_pairs;
    s.table = table;
    s.n_expert = static_cast<int>(n_expert_);
    s.host_begin = arena_;
    s.host_end = arena_end_;
    s.staging = miss_slots_.as<uint8_t>();
    s.max_slots = n_miss_slots_;
    s.blob_bytes = pack_->manifest().blob_bytes();
    s.out_table = miss_table_.as<const uint8_t*>();
    RETURN_IF_ERROR(kernels::cuda::StageMisses(s, stream_));
    table = s.out_table;
  }
  return kernels::cuda::ExpertFfn(layout_, table, static_cast<int>(n_expert_), ids, batch.n_tokens, batch.k,
                                  batch.x_device, batch.parts_device,
                                  ExtrasForLayer(options_.device_extras.get(), batch.moe_layer), workspace_.data(),
                                  workspace_.bytes(), stream_);
}

bool OffloadMoeDispatch::StreamsPairs(int n_tokens, int k) const {
  if (ring_ == 0) return false;
  // Unpinned, every step the host path does not take streams.
  return int64_t{n_tokens} * k >= kStreamPairsPerExpert * n_expert_ ||
         (!pinned_ && (host_ == nullptr || n_tokens > host_->max_tokens()));
}

bool OffloadMoeDispatch::WantsRoutingGuess(int n_tokens) const {
  const int k = static_cast<int>(pack_->manifest().geometry().n_expert_used());
  return n_prefetch_ > 0 && n_tokens >= 1 && n_tokens <= options_.max_decode &&
         int64_t{n_tokens} * k <= kernels::cuda::kMaxStagePairs && !StreamsPairs(n_tokens, k);
}

absl::Status OffloadMoeDispatch::Prefetch(const model::RoutingGuess& guess) {
  if (n_prefetch_ == 0 || guess.moe_layer < 0 || guess.moe_layer >= static_cast<int64_t>(prefetch_set_.size()) ||
      guess.ids_device == nullptr || guess.stream == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("Prefetch: a guess of moe layer ", guess.moe_layer,
                                                   " the dispatch did not ask for (", prefetch_set_.size(),
                                                   " layers, ", n_prefetch_, " prefetch slots)"));
  }
  const uint64_t blob_bytes = pack_->manifest().blob_bytes();
  const int set = static_cast<int>(guess.moe_layer % 2);
  kernels::cuda::PrefetchArgs a;
  a.guess = guess.ids_device;
  a.n_tokens = guess.n_tokens;
  a.k = guess.k;
  a.table = table_.as<const uint8_t* const>() + guess.moe_layer * n_expert_;
  a.n_expert = static_cast<int>(n_expert_);
  a.host_begin = arena_;
  a.host_end = arena_end_;
  a.control = prefetch_control_.as<int32_t>();
  a.slots = prefetch_slots_.as<uint8_t>() + static_cast<uint64_t>(set) * n_prefetch_ * blob_bytes;
  a.max_slots = n_prefetch_;
  a.blob_bytes = blob_bytes;
  a.out_table = prefetch_tables_.as<const uint8_t*>() + static_cast<int64_t>(set) * n_expert_;
  a.record = prefetch_records_device_ + guess.moe_layer * (2 + n_prefetch_);
  pending_prefetch_ = a;
  pending_stream_ = static_cast<cudaStream_t>(guess.stream);
  pending_set_ = set;
  prefetch_set_[guess.moe_layer] = set;
  return LaunchPrefetch(/*after_layer=*/false);
}

absl::Status OffloadMoeDispatch::LaunchPrefetch(bool after_layer) {
  if (pending_stream_ == nullptr || after_layer != options_.prefetch_after_layer) return absl::OkStatus();
  const cudaStream_t side = pending_stream_;
  pending_stream_ = nullptr;
  if (after_layer) {
    // The copies start once the layer before is done with the host's memory and PCIe, which then idle
    // through the dense part of the step until the guessed layer's Run.
    CUDA_RETURN_IF_ERROR(cudaEventRecord(layer_done_, stream_), "cudaEventRecord");
    CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(side, layer_done_, 0), "ordering the copies ahead");
  }
  RETURN_IF_ERROR(kernels::cuda::PrefetchGuessed(pending_prefetch_, side));
  CUDA_RETURN_IF_ERROR(cudaEventRecord(prefetch_done_[pending_set_], side), "cudaEventRecord");
  return absl::OkStatus();
}

void OffloadMoeDispatch::ObserveGuesses(int64_t n_moe_layers, const int32_t* const* ids, int n_tokens, int k) {
  uint64_t guessed = 0, right = 0, copied = 0, used = 0;
  const int32_t* records = prefetch_records_.as<int32_t>();
  for (int64_t m = 0; m < n_moe_layers && m < static_cast<int64_t>(prefetch_set_.size()); ++m) {
    const int32_t* record = records + m * (2 + n_prefetch_);
    if (record[0] != step_stamp_) continue;  // no guess of this layer in this step
    const int count = std::clamp(record[1], 0, n_prefetch_);
    const int copies = std::min(step_limit_, count);
    for (int j = 0; j < count; ++j) {
      const bool routed = std::find(ids[m], ids[m] + n_tokens * k, record[2 + j]) != ids[m] + n_tokens * k;
      right += routed;
      used += routed && j < copies;
    }
    guessed += static_cast<uint64_t>(count);
    copied += static_cast<uint64_t>(copies);
  }
  guessed_.fetch_add(guessed, std::memory_order_relaxed);
  guessed_right_.fetch_add(right, std::memory_order_relaxed);
  prefetched_.fetch_add(copied, std::memory_order_relaxed);
  prefetch_used_.fetch_add(used, std::memory_order_relaxed);
  // A used copy is a miss the step's accounting counts as read over PCIe; an unused one crossed it in vain.
  pcie_bytes_.fetch_add((copied - used) * pack_->manifest().blob_bytes(), std::memory_order_relaxed);
  gate_.Observe(guessed, right);
}

bool OffloadMoeDispatch::Streams(const model::MoeBatch& batch) const {
  if (!StreamsPairs(batch.n_tokens, batch.k)) return false;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  // A graph holds a fixed set of copies; long prompts are never captured, so this only guards the rule.
  return cudaStreamIsCapturing(stream_, &capture) == cudaSuccess && capture == cudaStreamCaptureStatusNone;
}

absl::Status OffloadMoeDispatch::RunStreamed(const model::MoeBatch& batch, const uint8_t* const* table) {
  const uint64_t blob_bytes = pack_->manifest().blob_bytes();
  const uint64_t first_blob = static_cast<uint64_t>(batch.moe_layer) * n_expert_;
  const uint8_t* const* mirror = table_host_.as<const uint8_t* const>() + first_blob;
  misses_.clear();
  for (int64_t e = 0; e < n_expert_; ++e) {
    if (mirror[e] >= arena_ && mirror[e] < arena_end_) misses_.push_back(static_cast<int32_t>(e));
  }
  const int n_pairs = batch.n_tokens * batch.k;
  const int n_expert = static_cast<int>(n_expert_);
  int32_t* ids = select_ids_.as<int32_t>();
  // mostly_skipped: a chunk of c of the layer's n experts holds about c / n of the step's pairs (the seed: 32 of
  // 512); at a quarter or less, most blocks of the bound would only exit, so the kernels walk the items.
  auto compute = [&](const uint8_t* const* blobs, const int32_t* pair_ids, bool mostly_skipped) {
    kernels::cuda::ExpertFfnExtras extras = ExtrasForLayer(options_.device_extras.get(), batch.moe_layer);
    extras.mostly_skipped = mostly_skipped;
    return kernels::cuda::ExpertFfn(layout_, blobs, n_expert, pair_ids, batch.n_tokens, batch.k, batch.x_device,
                                    batch.parts_device, extras, workspace_.data(), workspace_.bytes(), stream_);
  };
  if (misses_.size() < static_cast<size_t>(n_expert_)) {  // some experts are in VRAM
    RETURN_IF_ERROR(
        kernels::cuda::SelectResidentPairs(batch.ids_device, n_pairs, table, n_expert, arena_, arena_end_, ids, stream_));
    RETURN_IF_ERROR(compute(table, ids, /*mostly_skipped=*/false));
  }
  for (size_t c0 = 0; c0 < misses_.size(); c0 += static_cast<size_t>(chunk_experts_)) {
    kernels::cuda::StagedChunk chunk;
    chunk.count = static_cast<int>(std::min(misses_.size() - c0, static_cast<size_t>(chunk_experts_)));
    std::copy_n(misses_.begin() + static_cast<std::ptrdiff_t>(c0), chunk.count, chunk.experts);
    const int r = static_cast<int>(ring_next_++ % ring_);
    uint8_t* staging = staging_.as<uint8_t>() + static_cast<uint64_t>(r) * chunk_experts_ * blob_bytes;
    CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(copy_stream_, freed_[r], 0), "ordering a staging copy");
    for (int j = 0; j < chunk.count;) {  // runs of consecutive experts are one copy
      int run = 1;
      while (j + run < chunk.count && chunk.experts[j + run] == chunk.experts[j] + run) ++run;
      CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(staging + static_cast<uint64_t>(j) * blob_bytes,
                                           arena_host_ + (first_blob + chunk.experts[j]) * blob_bytes,
                                           static_cast<uint64_t>(run) * blob_bytes, cudaMemcpyHostToDevice,
                                           copy_stream_),
                           "staging experts in VRAM");
      j += run;
    }
    CUDA_RETURN_IF_ERROR(cudaEventRecord(staged_[r], copy_stream_), "cudaEventRecord");
    CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream_, staged_[r], 0), "waiting for staged experts");
    const uint8_t** stage_table = stage_tables_.as<const uint8_t*>() + static_cast<int64_t>(r) * n_expert_;
    RETURN_IF_ERROR(kernels::cuda::SelectStagedPairs(batch.ids_device, n_pairs, chunk, staging, blob_bytes,
                                                     stage_table, n_expert, ids, stream_));
    RETURN_IF_ERROR(compute(stage_table, ids, /*mostly_skipped=*/4 * chunk.count <= n_expert));
    CUDA_RETURN_IF_ERROR(cudaEventRecord(freed_[r], stream_), "cudaEventRecord");
  }
  pcie_bytes_.fetch_add(misses_.size() * blob_bytes, std::memory_order_relaxed);
  streamed_step_ = true;
  return absl::OkStatus();
}

absl::Status OffloadMoeDispatch::RunWithHost(const model::MoeBatch& batch, const uint8_t* const* table) {
  const int n_pairs = batch.n_tokens * batch.k;
  const HostState h = PlanHostState(host_->max_tokens() * batch.k);
  uint8_t* state = host_state_.as<uint8_t>();
  kernels::cuda::HostSplitArgs a;
  a.ids = batch.ids_device;
  a.n_tokens = batch.n_tokens;
  a.k = batch.k;
  a.blobs = table;
  a.n_expert = static_cast<int>(n_expert_);
  a.host_begin = arena_;
  a.host_end = arena_end_;
  a.moe_layer = static_cast<int>(batch.moe_layer);
  a.x = batch.x_device;
  a.n_embd = layout_.n_embd;
  a.host_share = reinterpret_cast<const float*>(state + h.share);
  if (options_.miss_path == model::MissPath::kBoth) a.min_host_experts = kMinHostExperts;
  a.gpu_ids = reinterpret_cast<int32_t*>(state);
  a.host_ids = reinterpret_cast<int32_t*>(state + h.host_ids);
  a.sequence = reinterpret_cast<int64_t*>(state + h.sequence);
  a.host_pairs = reinterpret_cast<int32_t*>(state + h.host_pairs);
  a.mailbox = host_->mailbox();
  a.mailbox_ids = host_->ids();
  a.mailbox_x = host_->x();
  RETURN_IF_ERROR(kernels::cuda::SplitForHost(a, stream_));
  RETURN_IF_ERROR(RunDecodeOnGpu(batch, table, a.gpu_ids));
  return kernels::cuda::CollectFromHost(a.host_ids, n_pairs, a.sequence, a.host_pairs, host_->mailbox(),
                                        host_->parts(), layout_.n_embd, options_.host_timeout_ns,
                                        batch.parts_device, stream_);
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
  r.host_share = host_share_;
  r.guessed = guessed_.load(std::memory_order_relaxed);
  r.guessed_right = guessed_right_.load(std::memory_order_relaxed);
  r.prefetched = prefetched_.load(std::memory_order_relaxed);
  r.prefetch_used = prefetch_used_.load(std::memory_order_relaxed);
  if (host_ != nullptr) {
    const HostExpertServer::Stats h = host_->stats();
    r.host_experts = h.experts;
    r.host_requests = h.requests;
    r.host_busy_seconds = h.busy_seconds;
    r.gpu_waited_for_host = static_cast<uint64_t>(host_->mailbox()->waited);
  }
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
  // A step that failed between a guess and its layer's Run leaves neither a table nor copies for this one.
  std::fill(prefetch_set_.begin(), prefetch_set_.end(), -1);
  pending_stream_ = nullptr;
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
  streamed_step_ = false;
  if (n_prefetch_ > 0 && stream_ != nullptr) {
    // The last step's copy of the control has run: every step ends with a sync.
    step_limit_ = gate_.limit();
    step_stamp_ = static_cast<int32_t>(static_cast<uint32_t>(step_stamp_) + 1u);  // wraps
    int32_t* control = prefetch_control_host_.as<int32_t>();
    control[0] = step_limit_;
    control[1] = step_stamp_;
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(prefetch_control_.data(), control, 2 * sizeof(int32_t), cudaMemcpyHostToDevice,
                                         stream_),
                         "setting the prefetch control");
  }
  if (host_ != nullptr) {
    if (stream_ != nullptr) {
      *host_share_host_.as<float>() = host_share_;  // the last step's copy has run: every step ends with a sync
      const HostState h = PlanHostState(host_->max_tokens() * static_cast<int>(pack_->manifest().geometry().n_expert_used()));
      CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host_state_.as<uint8_t>() + h.share, host_share_host_.data(), sizeof(float),
                                           cudaMemcpyHostToDevice, stream_),
                           "setting the host's share");
    }
    host_->Arm();
  }
  return absl::OkStatus();
}

void OffloadMoeDispatch::BalanceHostShare() {
  const kernels::cuda::HostMailbox* m = host_->mailbox();
  const int64_t posted = m->posted, waited = m->waited;
  const int64_t new_posts = posted - last_posted_, new_waits = waited - last_waited_;
  last_posted_ = posted;
  last_waited_ = waited;
  if (options_.miss_path != model::MissPath::kBoth) return;
  host_share_ = model::NextHostShare(host_share_, new_posts, new_waits);
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

absl::Status OffloadMoeDispatch::AfterStep(int64_t n_moe_layers, const int32_t* const* ids, int n_tokens, int k) {
  if (stream_ == nullptr) return absl::OkStatus();
  uint64_t host_bytes = 0;
  if (host_ != nullptr) {
    host_->Disarm();
    RETURN_IF_ERROR(host_->TakeError());
    BalanceHostShare();
    const uint64_t total = host_->stats().bytes;
    host_bytes = total - last_host_bytes_;
    last_host_bytes_ = total;
  }
  if (n_prefetch_ > 0) ObserveGuesses(n_moe_layers, ids, n_tokens, k);
  const uint64_t blob_bytes = pack_->manifest().blob_bytes();
  std::vector<uint64_t> missed;
  const std::vector<model::ExpertCachePolicy::Admission> admissions =
      policy_->Observe(n_moe_layers, ids, n_tokens, k, &missed);
  // A missed expert's weights crossed PCIe once this step, unless the host computed it or the step streamed
  // (counted in RunStreamed).
  const uint64_t missed_bytes = missed.size() * layout_.weight_bytes();
  if (!streamed_step_ && missed_bytes > host_bytes) {
    pcie_bytes_.fetch_add(missed_bytes - host_bytes, std::memory_order_relaxed);
  }
  for (const model::ExpertCachePolicy::Admission& a : admissions) Fill(a);
  const int fills = static_cast<int>(admissions.size());
  if (fills == 0) return absl::OkStatus();
  // The fills wait for the victims' entries to point at the arena (and for the step that read them).
  cudaEventRecord(compute_done_, stream_);
  cudaStreamWaitEvent(copy_stream_, compute_done_, 0);
  for (size_t i = pending_.size() - static_cast<size_t>(fills); i < pending_.size(); ++i) {
    const PendingFill& f = pending_[i];
    cudaMemcpyAsync(slots_.as<uint8_t>() + static_cast<uint64_t>(f.slot) * blob_bytes,
                    arena_host_ + f.blob * blob_bytes, blob_bytes, cudaMemcpyHostToDevice, copy_stream_);
    cudaEventRecord(f.done, copy_stream_);
  }
  return absl::OkStatus();
}

}  // namespace strata::gpu
