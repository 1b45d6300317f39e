#include "engine/model/cpu_moe_dispatch.h"

#include <algorithm>
#include <atomic>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/status_macros.h"

namespace strata::model {

uint64_t RoutingCounter::Distinct(const int32_t* ids, int n) {
  if (++epoch_ == 0) {  // wrapped: clear the marks once every 2^32 calls
    std::fill(seen_.begin(), seen_.end(), 0);
    epoch_ = 1;
  }
  uint64_t distinct = 0;
  for (int i = 0; i < n; ++i) {
    const int32_t e = ids[i];
    if (e < 0 || static_cast<size_t>(e) >= seen_.size() || seen_[e] == epoch_) continue;
    seen_[e] = epoch_;
    ++distinct;
  }
  return distinct;
}

void AccountRouting(RoutingCounter& counter, const kernels::ExpertLayout& layout, const int32_t* ids, int n_pairs,
                    bool in_vram, DispatchStats* stats) {
  const uint64_t distinct = counter.Distinct(ids, n_pairs);
  stats->expert_computations += distinct;
  stats->routed += static_cast<uint64_t>(n_pairs);
  stats->expert_bytes += distinct * layout.weight_bytes();
  (in_vram ? stats->hits : stats->misses) += static_cast<uint64_t>(n_pairs);
}

void RunExpertJobs(const kernels::ExpertLayout& layout, absl::Span<const kernels::ExpertJob> jobs,
                   exec::ThreadPool* pool, kernels::ExpertWork* work, kernels::ExpertActivation activation,
                   ExpertPhases phases) {
  if (jobs.empty()) return;
  work->Prepare(layout, jobs, activation);
  const int threads = pool == nullptr ? 1 : pool->num_threads();
  const int64_t ff = layout.expert_ff, n_embd = layout.n_embd;
  const int64_t n_jobs = static_cast<int64_t>(jobs.size());
  const int64_t rows1 = kernels::ExpertRowsPerTask(ff, jobs.size(), threads, kernels::kActBlock);
  const int64_t chunks1 = (ff + rows1 - 1) / rows1;
  const int64_t rows2 = kernels::ExpertRowsPerTask(n_embd, jobs.size(), threads, kernels::kRowTile);
  const int64_t chunks2 = (n_embd + rows2 - 1) / rows2;
  auto gate_up = [&](int64_t task) {
    const int64_t r0 = task % chunks1 * rows1;
    work->GateUpRows(static_cast<size_t>(task / chunks1), r0, std::min(ff, r0 + rows1));
  };
  auto down = [&](int64_t task) {
    const int64_t r0 = task % chunks2 * rows2;
    work->DownRows(static_cast<size_t>(task / chunks2), r0, std::min(n_embd, r0 + rows2));
  };
  if (phases == ExpertPhases::kBarrier) {
    exec::ParallelFor(pool, n_jobs * chunks1, gate_up);
    exec::ParallelFor(pool, n_jobs * chunks2, down);
    return;
  }
  // Tasks are claimed in index order, so every gate/up task is claimed (and runs to its end on some
  // thread) before any down task. A down task is a ticket for one down item (a job's chunk of rows): it takes
  // the first untaken item of a job whose gate/up rows are all done, so a thread waits only when no such
  // job is left (never for one job held up by a preempted thread while others are ready). Tickets and
  // items are as many, so every ticket finds one.
  std::vector<std::atomic<int64_t>> gate_up_done(static_cast<size_t>(n_jobs));
  std::vector<std::atomic<int64_t>> down_taken(static_cast<size_t>(n_jobs));
  std::atomic<int64_t> first_open{0};  // the jobs before it have had all their down items taken
  const int64_t n_gate_up = n_jobs * chunks1;
  exec::ParallelFor(pool, n_gate_up + n_jobs * chunks2, [&](int64_t task) {
    if (task < n_gate_up) {
      gate_up(task);
      gate_up_done[static_cast<size_t>(task / chunks1)].fetch_add(1, std::memory_order_release);
      return;
    }
    // Yielding now and then: on a loaded host the thread finishing those rows may be waiting for this core.
    for (uint32_t spins = 1;; ++spins) {
      for (int64_t j = first_open.load(std::memory_order_relaxed); j < n_jobs; ++j) {
        std::atomic<int64_t>& taken = down_taken[static_cast<size_t>(j)];
        if (taken.load(std::memory_order_relaxed) >= chunks2) {
          int64_t expected = j;  // j is used up: move the scan's start past it if nothing else has
          first_open.compare_exchange_strong(expected, j + 1, std::memory_order_relaxed);
          continue;
        }
        if (gate_up_done[static_cast<size_t>(j)].load(std::memory_order_acquire) < chunks1) continue;
        const int64_t chunk = taken.fetch_add(1, std::memory_order_relaxed);
        if (chunk < chunks2) {
          down(j * chunks2 + chunk);
          return;
        }
      }
      if (spins % 64 == 0) std::this_thread::yield();
      exec::CpuRelax();
    }
  });
}

ExpertExtras ExpertExtrasOf(const ModelConfig& config, const ModelWeights& weights) {
  ExpertExtras extras;
  if (config.clamped_swiglu) extras.activation = kernels::ExpertActivation::kClampedSwiGlu;
  if (config.expert_biases) {
    for (int64_t l = config.n_dense_lead; l < config.n_layer; ++l) {
      extras.biases.push_back(&weights.layers[l].expert_biases);
    }
  }
  return extras;
}

CpuMoeDispatch::CpuMoeDispatch(pack::ExpertSource* source, const kernels::ExpertLayout& layout, int64_t n_expert,
                               exec::ThreadPool* pool, ExpertExtras extras)
    : source_(source),
      layout_(layout),
      n_expert_(n_expert),
      pool_(pool),
      extras_(std::move(extras)),
      counter_(n_expert),
      routed_(static_cast<size_t>(n_expert)) {}

absl::Status CpuMoeDispatch::Run(const MoeBatch& batch) {
  if (batch.x == nullptr || batch.ids == nullptr || batch.parts == nullptr) {
    return absl::InternalError("the CPU expert dispatch needs host views of the batch");
  }
  const int64_t n_embd = layout_.n_embd;
  const int n_tokens = batch.n_tokens, k = batch.k;
  // Quantize each token's activation once for this layer (never cached across layers: the buffer is the
  // same address every layer).
  if (acts_.size() < static_cast<size_t>(n_tokens)) acts_.resize(static_cast<size_t>(n_tokens));
  for (int t = 0; t < n_tokens; ++t) {
    kernels::QuantizedActivation& a = acts_[t];
    if (a.n != n_embd) kernels::ResizeActivation(n_embd, &a);
    std::copy_n(batch.x + t * n_embd, n_embd, a.f32.begin());
    if (kernels::ReadsQuantizedActivation(layout_.scheme)) {
      kernels::QuantizeActivationBlocks(0, n_embd / kernels::kActBlock, &a);
    }
  }

  for (auto& r : routed_) r.clear();
  for (int t = 0; t < n_tokens; ++t) {
    for (int j = 0; j < k; ++j) {
      const int32_t e = batch.ids[t * k + j];
      if (e < 0) continue;  // computed elsewhere (the offload tier's GPU share)
      if (e >= n_expert_) {
        return absl::InternalError(absl::StrCat("router chose expert ", e, " of ", n_expert_));
      }
      routed_[e].push_back(t * k + j);
    }
  }
  x_ptrs_.clear();
  out_ptrs_.clear();
  jobs_.clear();
  x_ptrs_.reserve(static_cast<size_t>(n_tokens) * k);
  out_ptrs_.reserve(static_cast<size_t>(n_tokens) * k);
  for (int64_t e = 0; e < n_expert_; ++e) {
    const auto& r = routed_[e];
    if (r.empty()) continue;
    // A failed read fails the whole step before anything is computed.
    ASSIGN_OR_RETURN(const uint8_t* blob, source_->Blob(batch.moe_layer, e));
    const size_t first = x_ptrs_.size();
    for (int32_t slot : r) {
      x_ptrs_.push_back(&acts_[slot / k]);
      out_ptrs_.push_back(batch.parts + static_cast<int64_t>(slot) * n_embd);
    }
    jobs_.push_back({blob, x_ptrs_.data() + first, static_cast<int>(r.size()), out_ptrs_.data() + first});
    kernels::ExpertJob& job = jobs_.back();
    if (!extras_.biases.empty()) {
      if (batch.moe_layer < 0 || batch.moe_layer >= static_cast<int64_t>(extras_.biases.size())) {
        return absl::InternalError(absl::StrCat("no expert biases for MoE layer ", batch.moe_layer));
      }
      const ExpertBiases& b = *extras_.biases[batch.moe_layer];
      job.gate_bias = b.gate.data() + e * layout_.expert_ff;
      job.up_bias = b.up.data() + e * layout_.expert_ff;
      job.down_bias = b.down.data() + e * layout_.n_embd;
    }
  }
  RunExpertJobs(layout_, jobs_, pool_, &work_, extras_.activation);
  return absl::OkStatus();
}

void CpuMoeDispatch::Account(int64_t moe_layer, const int32_t* ids, int n_tokens, int k,
                             DispatchStats* stats) const {
  AccountRouting(counter_, layout_, ids, n_tokens * k, /*in_vram=*/false, stats);
}

}  // namespace strata::model
