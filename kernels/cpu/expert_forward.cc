#include "kernels/cpu/expert_forward.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/role_gemv.h"

namespace strata::kernels {
namespace {

constexpr uint64_t kRoleAlign = 256;

uint64_t AlignUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

absl::Status CheckRole(const char* name, Scheme scheme, int64_t rows, int64_t cols, uint64_t offset,
                       uint64_t blob_bytes) {
  if (absl::Status s = CheckRoleShape(scheme, rows, cols); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("expert ", name, " role: ", s.message()));
  }
  const uint64_t bytes = RoleBytes(scheme, rows, cols);
  if (offset > blob_bytes || bytes > blob_bytes - offset) {
    return absl::InvalidArgumentError(absl::StrCat("expert ", name, " role at offset ", offset, " with ",
                                                   bytes, " bytes extends past the blob's ", blob_bytes,
                                                   " bytes"));
  }
  return absl::OkStatus();
}

// Rows per task: about four tasks a thread across all jobs, in multiples of `unit`.
int64_t RowsPerTask(int64_t rows, size_t n_jobs, int threads, int64_t unit) {
  const int64_t target_tasks = threads == 1 ? static_cast<int64_t>(n_jobs) : 4 * int64_t{threads};
  const int64_t total = rows * static_cast<int64_t>(n_jobs);
  int64_t per = (total + target_tasks - 1) / target_tasks;
  per = (per + unit - 1) / unit * unit;
  return std::clamp(per, unit, rows);
}

inline float Silu(float g) { return g / (1.0f + std::exp(-g)); }

}  // namespace

ExpertLayout PackedExpertLayout(Scheme scheme, int64_t n_embd, int64_t ff) {
  ExpertLayout l;
  l.scheme = scheme;
  l.n_embd = n_embd;
  l.ff = ff;
  const uint64_t gate = AlignUp(RoleBytes(scheme, ff, n_embd), kRoleAlign);
  l.gate_offset = 0;
  l.up_offset = gate;
  l.down_offset = 2 * gate;
  return l;
}

uint64_t ExpertLayoutEnd(const ExpertLayout& l) {
  const uint64_t gate = RoleBytes(l.scheme, l.ff, l.n_embd);
  const uint64_t down = RoleBytes(l.scheme, l.n_embd, l.ff);
  return std::max({l.gate_offset + gate, l.up_offset + gate, l.down_offset + down});
}

uint64_t ExpertWeightBytes(const ExpertLayout& l) {
  return 2 * RoleBytes(l.scheme, l.ff, l.n_embd) + RoleBytes(l.scheme, l.n_embd, l.ff);
}

absl::Status CheckExpertLayout(const ExpertLayout& l, uint64_t blob_bytes) {
  if (absl::Status s = CheckRole("gate", l.scheme, l.ff, l.n_embd, l.gate_offset, blob_bytes); !s.ok()) return s;
  if (absl::Status s = CheckRole("up", l.scheme, l.ff, l.n_embd, l.up_offset, blob_bytes); !s.ok()) return s;
  return CheckRole("down", l.scheme, l.n_embd, l.ff, l.down_offset, blob_bytes);
}

void ExpertForward(const ExpertLayout& layout, absl::Span<const ExpertJob> jobs, ThreadPool* pool,
                   ExpertScratch* scratch) {
  if (jobs.empty()) return;
  const Scheme s = layout.scheme;
  const int64_t n_embd = layout.n_embd, ff = layout.ff;

  // One scratch slot per (job, token).
  ExpertScratch& sc = *scratch;
  std::vector<size_t>& first_slot = sc.first_slot_;
  first_slot.resize(jobs.size());
  size_t slots = 0;
  for (size_t j = 0; j < jobs.size(); ++j) {
    first_slot[j] = slots;
    slots += static_cast<size_t>(jobs[j].n_tokens);
  }
  if (sc.gate_.size() < slots * ff) {
    sc.gate_.resize(slots * ff);
    sc.up_.resize(slots * ff);
  }
  if (sc.h_.size() < slots) sc.h_.resize(slots);
  sc.h_ptrs_.resize(slots);
  sc.gate_ptrs_.resize(slots);
  sc.up_ptrs_.resize(slots);
  for (size_t i = 0; i < slots; ++i) {
    if (sc.h_[i].n != ff) ResizeActivation(ff, &sc.h_[i]);
    sc.h_ptrs_[i] = &sc.h_[i];
    sc.gate_ptrs_[i] = sc.gate_.data() + i * ff;
    sc.up_ptrs_[i] = sc.up_.data() + i * ff;
  }

  const int threads = pool == nullptr ? 1 : pool->num_threads();

  // Gate and up rows, then h = silu(gate) * up for those rows, quantized block by block.
  const int64_t rows1 = RowsPerTask(ff, jobs.size(), threads, kActBlock);
  const int64_t chunks1 = (ff + rows1 - 1) / rows1;
  ParallelFor(pool, static_cast<int64_t>(jobs.size()) * chunks1, [&](int64_t task) {
    const size_t j = static_cast<size_t>(task / chunks1);
    const ExpertJob& job = jobs[j];
    const int64_t r0 = task % chunks1 * rows1, r1 = std::min(ff, r0 + rows1);
    const size_t slot = first_slot[j];
    RoleGemv(s, job.blob + layout.gate_offset, ff, n_embd, r0, r1, job.xs, job.n_tokens,
             sc.gate_ptrs_.data() + slot);
    RoleGemv(s, job.blob + layout.up_offset, ff, n_embd, r0, r1, job.xs, job.n_tokens,
             sc.up_ptrs_.data() + slot);
    for (int t = 0; t < job.n_tokens; ++t) {
      const float* g = sc.gate_ptrs_[slot + t];
      const float* u = sc.up_ptrs_[slot + t];
      QuantizedActivation& h = sc.h_[slot + t];
      for (int64_t r = r0; r < r1; ++r) h.f32[r] = Silu(g[r]) * u[r];
      if (ReadsQuantizedActivation(s)) QuantizeActivationBlocks(r0 / kActBlock, r1 / kActBlock, &h);
    }
  });

  // Down rows.
  const int64_t rows2 = RowsPerTask(n_embd, jobs.size(), threads, kRowTile);
  const int64_t chunks2 = (n_embd + rows2 - 1) / rows2;
  ParallelFor(pool, static_cast<int64_t>(jobs.size()) * chunks2, [&](int64_t task) {
    const size_t j = static_cast<size_t>(task / chunks2);
    const ExpertJob& job = jobs[j];
    const int64_t r0 = task % chunks2 * rows2, r1 = std::min(n_embd, r0 + rows2);
    RoleGemv(s, job.blob + layout.down_offset, n_embd, ff, r0, r1, sc.h_ptrs_.data() + first_slot[j],
             job.n_tokens, job.outs);
  });
}

}  // namespace strata::kernels
