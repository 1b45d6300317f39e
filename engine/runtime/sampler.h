#ifndef STRATA_ENGINE_RUNTIME_SAMPLER_H_
#define STRATA_ENGINE_RUNTIME_SAMPLER_H_

// Turns one position's logits into a token, following a request's SamplingParams.

#include <cstdint>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "engine/runtime/sampling_params.h"

namespace strata::runtime {

// xoshiro256** seeded through splitmix64: a fixed, documented generator, so a seed gives the same
// stream on every platform and standard library.
class Xoshiro256 {
 public:
  explicit Xoshiro256(uint64_t seed);
  uint64_t Next();
  double NextDouble();  // uniform in [0, 1), 53 random bits

 private:
  uint64_t s_[4];
};

struct TokenLogprob {
  int32_t token = -1;
  float logprob = 0;
};

struct SampleResult {
  int32_t token = -1;
  // Only when params.logprobs: log-softmax of the logits as given to Sample, before penalties,
  // suppression and temperature (the model's own distribution, as OpenAI-style APIs report it).
  float logprob = 0;
  // Only when params.top_logprobs > 0: the most likely tokens under that same distribution, at most
  // top_logprobs of them, by descending logprob (ties: lower id first). May or may not include `token`.
  std::vector<TokenLogprob> top;
};

// Chooses tokens for one sequence. The chain is llama.cpp's default order: penalties over the accepted
// history -> top-k -> top-p -> min-p -> temperature -> draw. Temperature 0 is greedy: the argmax after
// penalties, lowest id on ties; it consumes no random numbers. Every other Sample consumes exactly one
// draw, so the same seed, history and logits reproduce the same tokens. Tokens with logit -inf are never
// chosen.
//
// Costs per call, for a vocabulary of n: a copy of the logits into a reused buffer and a few passes over
// it. No full sort: top-k up to 1024 keeps a heap in one pass (larger k uses nth_element), top-p finds its
// boundary from a histogram of probability mass and sorts only the tokens above it, min-p is a threshold,
// and a kept set larger than 4096 is drawn from by a pass in id order instead of being sorted. No
// allocation once the buffers have grown, except the `top` vector of the result.
//
// One Sampler per sequence; not thread-safe. Params are expected to have passed ValidateSamplingParams;
// out-of-range values are clamped rather than trusted.
class Sampler {
 public:
  Sampler(const SamplingParams& params, int n_vocab);

  // Records a token of the sequence (prompt tokens too) for the penalties. Sample does not record the
  // token it returns: the caller accepts the tokens it keeps. Ids outside [0, n_vocab) are ignored.
  void Accept(int32_t token);

  // INVALID_ARGUMENT when logits.size() != n_vocab, a logit is NaN or +inf, or no token can be chosen
  // (every logit -inf, before or after penalties).
  absl::StatusOr<SampleResult> Sample(std::span<const float> logits);

  const SamplingParams& params() const { return params_; }
  int n_vocab() const { return n_vocab_; }

 private:
  struct Candidate {
    float logit;
    int32_t id;
  };
  // The total order every filter uses: higher logit first, then lower id. Each filter keeps a prefix of
  // this order, so the kept set is a prefix too, whatever the selection algorithm's internal order.
  static bool Better(const Candidate& a, const Candidate& b) {
    return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
  }

  bool penalties_on() const;
  absl::Status LoadLogits(std::span<const float> logits);
  void ApplyPenalties();
  void FillTopLogprobs(std::span<const float> logits, double log_z, SampleResult& result) const;
  int32_t Greedy() const;
  int32_t SampleFiltered(float max_logit);
  // Each Collect* fills candidates_ from work_ and returns whether candidates_ is sorted (Better order).
  bool CollectTopK(size_t k);
  bool CollectAbove(float threshold);
  // Collects the tokens that may lie in the top-p nucleus (and reach `threshold`): a superset found by
  // a histogram of probability mass over logit buckets. Sets `z` to the mass of all tokens.
  bool CollectNucleusCandidates(float max_logit, float threshold, double& z);
  bool SortIfSmall(size_t n);
  // Over candidates_[0, n), which are the best n of the set (sorted already when `sorted`): returns how
  // many of them top-p keeps, leaving that prefix sorted. `z` is the sum of exp(logit - max) over the
  // set top-p normalizes by.
  size_t TopPPrefix(size_t n, float max_logit, double z, bool sorted);
  int32_t DrawFromCandidates(size_t n, float max_logit);
  int32_t DrawFromVocab(const Candidate& cut, float max_logit);

  SamplingParams params_;
  int n_vocab_;
  Xoshiro256 rng_;

  // Penalty window: the last params_.penalty_last_n accepted tokens in a ring (empty when the window
  // is the whole context), and how often each token occurs in the window.
  std::vector<int32_t> window_;
  size_t window_next_ = 0;
  absl::flat_hash_map<int32_t, int32_t> counts_;

  // Buffers reused across calls.
  std::vector<float> work_;  // logits after penalties, then draw weights
  float raw_max_ = 0;        // the largest logit as given, found while LoadLogits checks them
  std::vector<Candidate> candidates_;
};

}  // namespace strata::runtime

#endif  // STRATA_ENGINE_RUNTIME_SAMPLER_H_
