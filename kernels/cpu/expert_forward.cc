#include "kernels/cpu/expert_forward.h"

#include <algorithm>
#include <cmath>

#include "kernels/cpu/role_gemv.h"

namespace strata::kernels {
namespace {

inline float Silu(float g) { return g / (1.0f + std::exp(-g)); }

constexpr float kOaiAlpha = 1.702f;
constexpr float kOaiLimit = 7.0f;

}  // namespace

float ExpertGlu(ExpertActivation activation, float gate, float up) {
  if (activation == ExpertActivation::kSwiGlu) return Silu(gate) * up;
  const float g = std::min(gate, kOaiLimit);
  const float u = std::clamp(up, -kOaiLimit, kOaiLimit);
  return g / (1.0f + std::exp(-kOaiAlpha * g)) * (u + 1.0f);
}

int64_t ExpertRowsPerTask(int64_t rows, size_t n_jobs, int threads, int64_t unit) {
  const int64_t target_tasks = threads == 1 ? static_cast<int64_t>(n_jobs) : 4 * int64_t{threads};
  const int64_t total = rows * static_cast<int64_t>(n_jobs);
  int64_t per = (total + target_tasks - 1) / target_tasks;
  per = (per + unit - 1) / unit * unit;
  return std::clamp(per, unit, rows);
}

void ExpertWork::Prepare(const ExpertLayout& layout, absl::Span<const ExpertJob> jobs, ExpertActivation activation) {
  layout_ = layout;
  activation_ = activation;
  jobs_ = jobs;
  const int64_t ff = layout.expert_ff;
  first_slot_.resize(jobs.size());
  size_t slots = 0;
  for (size_t j = 0; j < jobs.size(); ++j) {
    first_slot_[j] = slots;
    slots += static_cast<size_t>(jobs[j].n_tokens);
  }
  if (gate_.size() < slots * ff) {
    gate_.resize(slots * ff);
    up_.resize(slots * ff);
  }
  if (h_.size() < slots) h_.resize(slots);
  h_ptrs_.resize(slots);
  gate_ptrs_.resize(slots);
  up_ptrs_.resize(slots);
  for (size_t i = 0; i < slots; ++i) {
    if (h_[i].n != ff) ResizeActivation(ff, &h_[i]);
    h_ptrs_[i] = &h_[i];
    gate_ptrs_[i] = gate_.data() + i * ff;
    up_ptrs_[i] = up_.data() + i * ff;
  }
}

void ExpertWork::GateUpRows(size_t j, int64_t r0, int64_t r1) {
  const ExpertLayout& l = layout_;
  const Scheme s = l.scheme;
  const ExpertJob& job = jobs_[j];
  const size_t slot = first_slot_[j];
  RoleGemv(s, job.blob + l.role_offset[kGate], l.expert_ff, l.n_embd, r0, r1, job.xs, job.n_tokens,
           gate_ptrs_.data() + slot);
  RoleGemv(s, job.blob + l.role_offset[kUp], l.expert_ff, l.n_embd, r0, r1, job.xs, job.n_tokens,
           up_ptrs_.data() + slot);
  for (int t = 0; t < job.n_tokens; ++t) {
    const float* g = gate_ptrs_[slot + t];
    const float* u = up_ptrs_[slot + t];
    QuantizedActivation& h = h_[slot + t];
    if (job.gate_bias != nullptr || job.up_bias != nullptr || activation_ != ExpertActivation::kSwiGlu) {
      for (int64_t r = r0; r < r1; ++r) {
        const float gb = job.gate_bias == nullptr ? 0.0f : job.gate_bias[r];
        const float ub = job.up_bias == nullptr ? 0.0f : job.up_bias[r];
        h.f32[r] = ExpertGlu(activation_, g[r] + gb, u[r] + ub);
      }
    } else {
      for (int64_t r = r0; r < r1; ++r) h.f32[r] = Silu(g[r]) * u[r];
    }
    if (ReadsQuantizedActivation(s)) QuantizeActivationBlocks(r0 / kActBlock, r1 / kActBlock, &h);
  }
}

void ExpertWork::DownRows(size_t j, int64_t r0, int64_t r1) {
  const ExpertLayout& l = layout_;
  const ExpertJob& job = jobs_[j];
  RoleGemv(l.scheme, job.blob + l.role_offset[kDown], l.n_embd, l.expert_ff, r0, r1,
           h_ptrs_.data() + first_slot_[j], job.n_tokens, job.outs);
  if (job.down_bias == nullptr) return;
  for (int t = 0; t < job.n_tokens; ++t) {
    for (int64_t r = r0; r < r1; ++r) job.outs[t][r] += job.down_bias[r];
  }
}

}  // namespace strata::kernels
