#include "engine/model/moe_dispatch.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "engine/status_macros.h"

namespace strata::model {

CpuMoeDispatch::CpuMoeDispatch(pack::ExpertSource* source, kernels::ExpertLayout layout, int64_t n_expert,
                               kernels::ThreadPool* pool)
    : source_(source), layout_(layout), n_expert_(n_expert), pool_(pool), routed_(static_cast<size_t>(n_expert)) {}

absl::Status CpuMoeDispatch::Run(int64_t moe_layer, const float* x, int n_tokens, const int32_t* ids, int k,
                                 float* parts, DispatchStats* stats) {
  const int64_t n_embd = layout_.n_embd;
  // Quantize each token's activation once for this layer (never cached across layers: the buffer is the
  // same address every layer).
  if (acts_.size() < static_cast<size_t>(n_tokens)) acts_.resize(static_cast<size_t>(n_tokens));
  for (int t = 0; t < n_tokens; ++t) {
    kernels::QuantizedActivation& a = acts_[t];
    if (a.n != n_embd) kernels::ResizeActivation(n_embd, &a);
    std::copy_n(x + t * n_embd, n_embd, a.f32.begin());
    if (kernels::ReadsQuantizedActivation(layout_.scheme)) {
      kernels::QuantizeActivationBlocks(0, n_embd / kernels::kActBlock, &a);
    }
  }

  for (auto& r : routed_) r.clear();
  for (int t = 0; t < n_tokens; ++t) {
    for (int j = 0; j < k; ++j) {
      const int32_t e = ids[t * k + j];
      if (e < 0 || e >= n_expert_) {
        return absl::InternalError(absl::StrCat("router chose expert ", e, " of ", n_expert_));
      }
      routed_[e].push_back(t * k + j);
    }
  }
  x_ptrs_.clear();
  out_ptrs_.clear();
  jobs_.clear();
  size_t total = 0;
  for (const auto& r : routed_) total += r.size();
  x_ptrs_.reserve(total);
  out_ptrs_.reserve(total);
  for (int64_t e = 0; e < n_expert_; ++e) {
    const auto& r = routed_[e];
    if (r.empty()) continue;
    // A failed read fails the whole step before anything is computed.
    ASSIGN_OR_RETURN(const uint8_t* blob, source_->Blob(moe_layer, e));
    const size_t first = x_ptrs_.size();
    for (int32_t slot : r) {
      x_ptrs_.push_back(&acts_[slot / k]);
      out_ptrs_.push_back(parts + static_cast<int64_t>(slot) * n_embd);
    }
    jobs_.push_back({blob, x_ptrs_.data() + first, static_cast<int>(r.size()), out_ptrs_.data() + first});
  }
  kernels::ExpertForward(layout_, jobs_, pool_, &scratch_);
  if (stats != nullptr) {
    stats->expert_computations += jobs_.size();
    stats->routed += total;
    stats->expert_bytes += jobs_.size() * kernels::ExpertWeightBytes(layout_);
  }
  return absl::OkStatus();
}

}  // namespace strata::model
