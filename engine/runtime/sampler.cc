#include "engine/runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_format.h"

namespace strata::runtime {

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kFloatMax = std::numeric_limits<float>::max();

// Kept sets at most this large are sorted and drawn from in rank order; larger ones are drawn from in
// id order by a pass over the vocabulary, which avoids sorting most of it.
constexpr size_t kSortLimit = 4096;

// First chunk that top-p sorts when the candidates are not sorted yet; each next chunk is 4x larger.
constexpr size_t kTopPFirstChunk = 256;

// Top-k up to this size selects with a heap in one pass; larger k collects everything and selects.
constexpr size_t kHeapTopK = 1024;

uint64_t SplitMix64(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t Rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

}  // namespace

Xoshiro256::Xoshiro256(uint64_t seed) {
  for (uint64_t& word : s_) word = SplitMix64(seed);
}

uint64_t Xoshiro256::Next() {
  const uint64_t result = Rotl(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = Rotl(s_[3], 45);
  return result;
}

double Xoshiro256::NextDouble() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }

namespace {

// Params as the sampler uses them: anything ValidateSamplingParams would refuse becomes the nearest
// harmless value, so a caller that skipped validation still gets defined behaviour.
SamplingParams Sanitize(SamplingParams p) {
  if (!(p.temperature >= 0) || !std::isfinite(p.temperature)) p.temperature = 0;
  if (!std::isfinite(1.0f / p.temperature)) p.temperature = 0;  // so small it is greedy in the limit
  if (p.top_k < 0) p.top_k = 0;
  if (!(p.top_p > 0 && p.top_p <= 1)) p.top_p = 1;
  if (!(p.min_p >= 0)) p.min_p = 0;
  if (p.min_p > 1) p.min_p = 1;
  if (!(p.repetition_penalty > 0) || !std::isfinite(p.repetition_penalty)) p.repetition_penalty = 1;
  if (!std::isfinite(p.presence_penalty)) p.presence_penalty = 0;
  if (!std::isfinite(p.frequency_penalty)) p.frequency_penalty = 0;
  if (p.penalty_last_n < -1) p.penalty_last_n = 0;
  p.top_logprobs = std::clamp(p.top_logprobs, 0, kMaxTopLogprobs);
  return p;
}

}  // namespace

Sampler::Sampler(const SamplingParams& params, int n_vocab)
    : params_(Sanitize(params)), n_vocab_(std::max(n_vocab, 0)), rng_(params.seed.value_or(0)) {}

bool Sampler::penalties_on() const {
  return params_.penalty_last_n != 0 &&
         (params_.repetition_penalty != 1 || params_.presence_penalty != 0 || params_.frequency_penalty != 0);
}

void Sampler::Accept(int32_t token) {
  if (!penalties_on() || token < 0 || token >= n_vocab_) return;
  ++counts_[token];
  if (params_.penalty_last_n < 0) return;  // the whole context counts
  const size_t window = static_cast<size_t>(params_.penalty_last_n);
  if (window_.size() < window) {
    window_.push_back(token);
    return;
  }
  int32_t& slot = window_[window_next_];
  auto it = counts_.find(slot);
  if (--it->second == 0) counts_.erase(it);
  slot = token;
  window_next_ = (window_next_ + 1) % window;
}

void Sampler::ApplyPenalties() {
  const float rep = params_.repetition_penalty;
  for (const auto& [token, count] : counts_) {
    float& l = work_[token];
    if (l == -kInf) continue;
    if (rep != 1) l = l > 0 ? l / rep : l * rep;
    l -= params_.presence_penalty * (count > 0 ? 1.0f : 0.0f) + params_.frequency_penalty * count;
    // An extreme penalty may overflow; keep the logit finite so the softmax stays defined.
    if (!std::isfinite(l)) l = l > 0 ? kFloatMax : -kFloatMax;
  }
}

int32_t Sampler::Greedy() const {
  int32_t best = -1;
  float best_logit = -kInf;
  for (int32_t i = 0; i < n_vocab_; ++i) {
    if (work_[i] > best_logit) {
      best_logit = work_[i];
      best = i;
    }
  }
  return best;  // -1 when every logit is -inf
}

bool Sampler::SortIfSmall(size_t n) {
  if (n > kSortLimit) return false;
  std::sort(candidates_.begin(), candidates_.begin() + n, Better);
  return true;
}

bool Sampler::CollectTopK(size_t k) {
  candidates_.clear();
  if (k > kHeapTopK) {
    for (int32_t i = 0; i < n_vocab_; ++i) {
      if (work_[i] != -kInf) candidates_.push_back({work_[i], i});
    }
    if (k < candidates_.size()) {
      std::nth_element(candidates_.begin(), candidates_.begin() + (k - 1), candidates_.end(), Better);
      candidates_.resize(k);
    }
    return SortIfSmall(candidates_.size());
  }
  // A heap of the best k so far with the worst on top. Ids rise during the scan, so a later token that
  // only ties the worst logit ranks below it and can be rejected with one comparison.
  candidates_.reserve(k);
  float worst = -kInf;
  for (int32_t i = 0; i < n_vocab_; ++i) {
    const float l = work_[i];
    if (l <= worst) continue;
    if (candidates_.size() < k) {
      candidates_.push_back({l, i});
      std::push_heap(candidates_.begin(), candidates_.end(), Better);
      if (candidates_.size() == k) worst = candidates_.front().logit;
      continue;
    }
    std::pop_heap(candidates_.begin(), candidates_.end(), Better);
    candidates_.back() = {l, i};
    std::push_heap(candidates_.begin(), candidates_.end(), Better);
    worst = candidates_.front().logit;
  }
  std::sort(candidates_.begin(), candidates_.end(), Better);
  return true;
}

bool Sampler::CollectAbove(float threshold) {
  candidates_.clear();
  for (int32_t i = 0; i < n_vocab_; ++i) {
    if (work_[i] >= threshold && work_[i] != -kInf) candidates_.push_back({work_[i], i});
  }
  return SortIfSmall(candidates_.size());
}

namespace {

// Top-p's histogram: bucket b holds logits in (max - (b + 1) / kBucketsPerLogit, max - b / kBucketsPerLogit];
// the last bucket also takes everything lower. Higher logits never land in a later bucket.
constexpr int kBuckets = 256;
constexpr float kBucketsPerLogit = 8.0f;

int Bucket(float max_logit, float logit) {
  const float d = (max_logit - logit) * kBucketsPerLogit;
  return d < static_cast<float>(kBuckets - 1) ? static_cast<int>(d) : kBuckets - 1;
}

}  // namespace

bool Sampler::CollectNucleusCandidates(float max_logit, float threshold, double& z) {
  double mass[kBuckets] = {};
  for (int32_t i = 0; i < n_vocab_; ++i) {
    const float l = work_[i];
    if (l == -kInf) continue;
    mass[Bucket(max_logit, l)] += std::exp(l - max_logit);
  }
  z = 0;
  for (double m : mass) z += m;
  // The nucleus ends in the first bucket where the mass from the top reaches top_p.
  const double target = static_cast<double>(params_.top_p) * z;
  int last = kBuckets - 1;
  double cum = 0;
  for (int b = 0; b < kBuckets; ++b) {
    cum += mass[b];
    if (cum >= target) {
      last = b;
      break;
    }
  }
  candidates_.clear();
  for (int32_t i = 0; i < n_vocab_; ++i) {
    const float l = work_[i];
    if (l != -kInf && l >= threshold && Bucket(max_logit, l) <= last) candidates_.push_back({l, i});
  }
  return SortIfSmall(candidates_.size());
}

size_t Sampler::TopPPrefix(size_t n, float max_logit, double z, bool sorted) {
  const double target = static_cast<double>(params_.top_p) * z;
  const auto begin = candidates_.begin();
  double cum = 0;
  size_t done = 0;
  size_t chunk = kTopPFirstChunk;
  while (done < n) {
    const size_t end = sorted ? n : std::min(n, done + chunk);
    if (!sorted) {
      if (end < n) std::nth_element(begin + done, begin + (end - 1), begin + n, Better);
      std::sort(begin + done, begin + end, Better);
    }
    for (size_t i = done; i < end; ++i) {
      cum += std::exp(candidates_[i].logit - max_logit);
      if (cum >= target) return i + 1;
    }
    done = end;
    chunk *= 4;
  }
  return n;
}

int32_t Sampler::DrawFromCandidates(size_t n, float max_logit) {
  const float inv_t = 1.0f / params_.temperature;
  double sum = 0;
  for (size_t i = 0; i < n; ++i) {
    const float w = std::exp((candidates_[i].logit - max_logit) * inv_t);
    work_[i] = w;  // the logits are no longer needed on this path
    sum += w;
  }
  const double target = rng_.NextDouble() * sum;
  double cum = 0;
  int32_t last_positive = -1;
  for (size_t i = 0; i < n; ++i) {
    if (work_[i] <= 0) continue;
    cum += work_[i];
    last_positive = candidates_[i].id;
    if (cum > target) return candidates_[i].id;
  }
  return last_positive;  // rounding left target at the very top
}

int32_t Sampler::DrawFromVocab(const Candidate& cut, float max_logit) {
  const float inv_t = 1.0f / params_.temperature;
  double sum = 0;
  for (int32_t i = 0; i < n_vocab_; ++i) {
    const bool kept = !Better(cut, Candidate{work_[i], i});
    const float w = kept ? std::exp((work_[i] - max_logit) * inv_t) : 0.0f;
    work_[i] = w;
    sum += w;
  }
  const double target = rng_.NextDouble() * sum;
  double cum = 0;
  int32_t last_positive = -1;
  for (int32_t i = 0; i < n_vocab_; ++i) {
    if (work_[i] <= 0) continue;
    cum += work_[i];
    last_positive = i;
    if (cum > target) return i;
  }
  return last_positive;
}

int32_t Sampler::SampleFiltered(float max_logit) {
  const bool top_k_on = params_.top_k > 0 && params_.top_k < n_vocab_;
  const bool top_p_on = params_.top_p < 1;
  const bool min_p_on = params_.min_p > 0;
  if (!top_k_on && !top_p_on && !min_p_on) {
    return DrawFromVocab(Candidate{-kInf, std::numeric_limits<int32_t>::max()}, max_logit);
  }
  // Every filter keeps a prefix of the Better order, so the kept set is candidates_[0, kept) once the
  // filters have run, and membership can also be tested against its worst element.
  const float min_p_threshold = min_p_on ? max_logit + std::log(params_.min_p) : -kInf;
  double z = 0;
  bool sorted;
  bool min_p_applied = false;
  if (top_k_on) {
    sorted = CollectTopK(static_cast<size_t>(params_.top_k));
    // Top-p measures mass within the top-k set, so it normalizes before min-p shrinks the set.
    if (top_p_on) {
      for (const Candidate& c : candidates_) z += std::exp(c.logit - max_logit);
    }
  } else if (top_p_on) {
    sorted = CollectNucleusCandidates(max_logit, min_p_threshold, z);
    min_p_applied = true;
  } else {
    sorted = CollectAbove(min_p_threshold);
    min_p_applied = true;
  }
  if (candidates_.empty()) return -1;

  const auto begin = candidates_.begin();
  size_t kept = candidates_.size();
  if (min_p_on && !min_p_applied) {
    const auto above = [min_p_threshold](const Candidate& c) { return c.logit >= min_p_threshold; };
    kept = sorted ? static_cast<size_t>(std::partition_point(begin, begin + kept, above) - begin)
                  : static_cast<size_t>(std::partition(begin, begin + kept, above) - begin);
  }
  if (top_p_on) {
    kept = TopPPrefix(kept, max_logit, z, sorted);
    sorted = true;  // TopPPrefix sorts what it keeps
  }
  if (!sorted) sorted = SortIfSmall(kept);
  if (sorted) return DrawFromCandidates(kept, max_logit);
  return DrawFromVocab(*std::max_element(begin, begin + kept, Better), max_logit);
}

void Sampler::FillTopLogprobs(std::span<const float> logits, double log_z, SampleResult& result) const {
  const size_t want = std::min<size_t>(static_cast<size_t>(params_.top_logprobs), logits.size());
  if (want == 0) return;
  // Insertion into a short sorted list: one pass, and inserts become rare once the list is full.
  Candidate best[kMaxTopLogprobs];
  size_t have = 0;
  for (int32_t i = 0; i < static_cast<int32_t>(logits.size()); ++i) {
    const Candidate c{logits[i], i};
    if (have == want && !Better(c, best[have - 1])) continue;
    size_t pos = have < want ? have++ : want - 1;
    while (pos > 0 && Better(c, best[pos - 1])) {
      best[pos] = best[pos - 1];
      --pos;
    }
    best[pos] = c;
  }
  result.top.resize(have);
  for (size_t i = 0; i < have; ++i) {
    result.top[i] = {best[i].id, static_cast<float>(best[i].logit - log_z)};
  }
}

absl::Status Sampler::LoadLogits(std::span<const float> logits) {
  if (logits.size() != static_cast<size_t>(n_vocab_)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("logits: %d values, expected n_vocab = %d", logits.size(), n_vocab_));
  }
  if (n_vocab_ == 0) return absl::InvalidArgumentError("logits: the vocabulary is empty");
  work_.resize(n_vocab_);
  std::memcpy(work_.data(), logits.data(), logits.size() * sizeof(float));
  bool bad = false;
  float max = -kInf;
  for (float v : work_) {  // no early exit, so this can vectorize
    bad |= !(v < kInf);    // NaN or +inf
    max = std::max(max, v);
  }
  raw_max_ = max;
  if (bad) {
    for (size_t i = 0; i < logits.size(); ++i) {
      if (!(logits[i] < kInf)) {
        return absl::InvalidArgumentError(absl::StrFormat("logits[%d] is %f", i, logits[i]));
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<SampleResult> Sampler::Sample(std::span<const float> logits) {
  if (absl::Status s = LoadLogits(logits); !s.ok()) return s;

  SampleResult result;
  double log_z = 0;
  if (params_.logprobs) {
    double z = 0;
    for (float v : logits) z += std::exp(v - raw_max_);
    log_z = static_cast<double>(raw_max_) + std::log(z);
  }

  if (penalties_on()) ApplyPenalties();

  if (params_.temperature == 0) {
    result.token = Greedy();
  } else {
    float max_logit = raw_max_;
    if (penalties_on()) {
      max_logit = -kInf;
      for (float v : work_) max_logit = std::max(max_logit, v);
    }
    if (max_logit != -kInf) result.token = SampleFiltered(max_logit);
  }
  if (result.token < 0) {
    return absl::InvalidArgumentError("logits: no token has a finite logit after penalties");
  }

  if (params_.logprobs) {
    result.logprob = static_cast<float>(logits[result.token] - log_z);
    FillTopLogprobs(logits, log_z, result);
  }
  return result;
}

}  // namespace strata::runtime
