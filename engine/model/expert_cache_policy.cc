#include "engine/model/expert_cache_policy.h"

#include <algorithm>
#include <limits>
#include <numeric>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace strata::model {

absl::StatusOr<CachePolicy> ParseCachePolicy(const std::string& name) {
  if (name == "lru") return CachePolicy::kLru;
  if (name == "lfu-decay") return CachePolicy::kLfuDecay;
  if (name == "static") return CachePolicy::kStatic;
  return absl::InvalidArgumentError(absl::StrCat("'", name, "' is not a cache policy (lru, lfu-decay, static)"));
}

const char* CachePolicyName(CachePolicy policy) {
  switch (policy) {
    case CachePolicy::kLru:
      return "lru";
    case CachePolicy::kStatic:
      return "static";
    case CachePolicy::kLfuDecay:
      break;
  }
  return "lfu-decay";
}

ExpertCachePolicy::ExpertCachePolicy(const CacheOptions& options, int64_t n_moe_layers, int64_t n_expert)
    : options_(options),
      n_expert_(n_expert),
      n_blobs_(static_cast<uint64_t>(std::max<int64_t>(0, n_moe_layers * n_expert))),
      n_slots_(std::clamp<int64_t>(options.slots, 0, static_cast<int64_t>(n_blobs_))) {
  slot_of_.assign(n_blobs_, -1);
  owner_.assign(static_cast<size_t>(n_slots_), -1);
  state_.assign(n_blobs_, kHost);
  score_.assign(n_blobs_, 0.0);
  last_used_.assign(n_blobs_, 0);
}

absl::StatusOr<std::vector<uint64_t>> ExpertCachePolicy::WarmStart(std::span<const double> counts) const {
  std::vector<uint64_t> blobs;
  if (counts.empty()) {
    const uint64_t n_layers = n_expert_ > 0 ? n_blobs_ / static_cast<uint64_t>(n_expert_) : 0;
    for (int64_t s = 0; s < n_slots_; ++s) {
      blobs.push_back((static_cast<uint64_t>(s) % n_layers) * n_expert_ + static_cast<uint64_t>(s) / n_layers);
    }
    return blobs;
  }
  if (counts.size() != n_blobs_) {
    return absl::InvalidArgumentError(
        absl::StrCat("a routing profile of ", counts.size(), " counts for ", n_blobs_, " experts"));
  }
  blobs.resize(n_blobs_);
  std::iota(blobs.begin(), blobs.end(), uint64_t{0});
  std::stable_sort(blobs.begin(), blobs.end(), [&](uint64_t a, uint64_t b) { return counts[a] > counts[b]; });
  blobs.resize(static_cast<size_t>(n_slots_));
  return blobs;
}

absl::Status ExpertCachePolicy::Place(std::span<const uint64_t> blobs, std::span<const double> counts) {
  if (static_cast<int64_t>(blobs.size()) > n_slots_) {
    return absl::InvalidArgumentError(absl::StrCat(blobs.size(), " experts for ", n_slots_, " slots"));
  }
  if (!counts.empty() && counts.size() != n_blobs_) {
    return absl::InvalidArgumentError(
        absl::StrCat("a routing profile of ", counts.size(), " counts for ", n_blobs_, " experts"));
  }
  for (size_t s = 0; s < blobs.size(); ++s) {
    const uint64_t blob = blobs[s];
    if (blob >= n_blobs_ || slot_of_[blob] >= 0) {
      return absl::InvalidArgumentError(absl::StrCat("expert blob ", blob, " is out of range or placed twice"));
    }
    if (owner_[s] >= 0) return absl::InvalidArgumentError(absl::StrCat("slot ", s, " is taken"));
    slot_of_[blob] = static_cast<int64_t>(s);
    owner_[s] = static_cast<int64_t>(blob);
    state_[blob] = kResident;
  }
  if (!counts.empty()) score_.assign(counts.begin(), counts.end());
  return absl::OkStatus();
}

std::vector<ExpertCachePolicy::Admission> ExpertCachePolicy::Observe(int64_t n_moe_layers, const int32_t* const* ids,
                                                                     int n_tokens, int k,
                                                                     std::vector<uint64_t>* missed_blobs) {
  ++step_;
  std::vector<uint64_t> missed;
  for (int64_t l = 0; l < n_moe_layers; ++l) {
    for (int i = 0; i < n_tokens * k; ++i) {
      const int32_t e = ids[l][i];
      if (e < 0 || e >= n_expert_) continue;
      const uint64_t blob = static_cast<uint64_t>(l) * n_expert_ + e;
      if (blob >= n_blobs_) continue;
      if (state_[blob] != kResident && last_used_[blob] != step_) missed.push_back(blob);
      last_used_[blob] = step_;
      score_[blob] += 1.0;
    }
  }
  if (missed_blobs != nullptr) *missed_blobs = missed;
  tokens_since_decay_ += static_cast<uint64_t>(n_tokens);
  if (options_.policy == CachePolicy::kLfuDecay && tokens_since_decay_ >= static_cast<uint64_t>(options_.decay_tokens)) {
    for (double& s : score_) s *= 0.5;
    tokens_since_decay_ = 0;
  }
  std::vector<Admission> admissions;
  if (options_.policy == CachePolicy::kStatic || n_slots_ == 0) return admissions;

  // Each missed blob takes the slot of the coldest resident blob (a free slot first), if the policy
  // prefers it. Blobs being filled or used by this step are not victims.
  for (uint64_t blob : missed) {
    if (static_cast<int>(admissions.size()) >= options_.max_fills_per_step) break;
    if (state_[blob] != kHost) continue;
    int64_t victim_slot = -1;
    double victim_key = std::numeric_limits<double>::infinity();
    for (int64_t s = 0; s < n_slots_; ++s) {
      const int64_t owner = owner_[s];
      if (owner < 0) {
        victim_slot = s;
        victim_key = -std::numeric_limits<double>::infinity();
        break;
      }
      if (state_[owner] != kResident || last_used_[owner] == step_) continue;
      const double key = options_.policy == CachePolicy::kLru ? static_cast<double>(last_used_[owner]) : score_[owner];
      if (key < victim_key) {
        victim_key = key;
        victim_slot = s;
      }
    }
    if (victim_slot < 0) break;
    const int64_t victim = owner_[victim_slot];
    if (options_.policy == CachePolicy::kLfuDecay && victim >= 0 && !(score_[blob] > victim_key)) continue;
    if (victim >= 0) {
      state_[victim] = kHost;
      slot_of_[victim] = -1;
    }
    owner_[victim_slot] = static_cast<int64_t>(blob);
    slot_of_[blob] = victim_slot;
    state_[blob] = kFilling;
    admissions.push_back(Admission{blob, victim_slot, victim});
  }
  return admissions;
}

void ExpertCachePolicy::Landed(uint64_t blob) {
  if (blob < n_blobs_ && state_[blob] == kFilling) state_[blob] = kResident;
}

}  // namespace strata::model
