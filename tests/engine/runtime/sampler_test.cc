// Sampler behaviour checked against distributions and penalty formulas computed independently here.
// Every random test uses a fixed seed, so its outcome is reproducible; statistical bounds are wide
// (>= 4.5 sigma) so that no seed choice is needed to make them pass.

#include "engine/runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/test_util.h"

namespace strata::runtime {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

std::vector<float> RandomLogits(std::mt19937& gen, int n, float scale = 4.0f) {
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> logits(n);
  for (float& l : logits) l = dist(gen);
  return logits;
}

// Log-softmax in long double, independent of the sampler's code.
std::vector<double> LogSoftmax(const std::vector<float>& logits, double temperature = 1.0) {
  long double max = -INFINITY;
  for (float l : logits) max = std::max<long double>(max, l / temperature);
  long double z = 0;
  for (float l : logits) z += std::exp(l / temperature - max);
  std::vector<double> out;
  for (float l : logits) out.push_back(static_cast<double>(l / temperature - max - std::log(z)));
  return out;
}

int32_t Argmax(const std::vector<float>& logits) {
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

int32_t SampleOne(Sampler& sampler, const std::vector<float>& logits) {
  absl::StatusOr<SampleResult> r = sampler.Sample(logits);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? r->token : -1;
}

std::map<int32_t, int> Histogram(Sampler& sampler, const std::vector<float>& logits, int draws) {
  std::map<int32_t, int> counts;
  for (int i = 0; i < draws; ++i) ++counts[SampleOne(sampler, logits)];
  return counts;
}

// Checks that observed frequencies match `probs` within 4.5 standard deviations of a binomial count;
// tokens absent from `probs` must never appear.
void ExpectFrequencies(const std::map<int32_t, int>& counts, const std::map<int32_t, double>& probs,
                       int draws) {
  for (const auto& [token, count] : counts) {
    EXPECT_TRUE(probs.count(token)) << "token " << token << " drawn " << count << " times";
  }
  for (const auto& [token, p] : probs) {
    const auto it = counts.find(token);
    const double observed = it == counts.end() ? 0 : it->second;
    const double sigma = std::sqrt(draws * p * (1 - p));
    EXPECT_NEAR(observed, draws * p, 4.5 * sigma + 1) << "token " << token << " p=" << p;
  }
}

std::map<int32_t, double> Softmax(const std::vector<float>& logits, const std::vector<int32_t>& keep,
                                  double temperature) {
  double max = -INFINITY;
  for (int32_t t : keep) max = std::max(max, logits[t] / temperature);
  double z = 0;
  for (int32_t t : keep) z += std::exp(logits[t] / temperature - max);
  std::map<int32_t, double> probs;
  for (int32_t t : keep) probs[t] = std::exp(logits[t] / temperature - max) / z;
  return probs;
}

// Logits whose softmax is exactly `probs` (up to float rounding) at the given ids; other tokens share
// what is left evenly.
std::vector<float> LogitsFor(int n_vocab, const std::map<int32_t, double>& probs) {
  double rest = 1;
  for (const auto& [t, p] : probs) rest -= p;
  const int others = n_vocab - static_cast<int>(probs.size());
  std::vector<float> logits(n_vocab, others > 0 && rest > 0 ? std::log(rest / others) : -kInf);
  for (const auto& [t, p] : probs) logits[t] = std::log(p);
  return logits;
}

SamplingParams Greedy() {
  SamplingParams p;
  p.temperature = 0;
  return p;
}

TEST(Sampler, GreedyPicksArgmax) {
  std::mt19937 gen(1);
  Sampler sampler(Greedy(), 5000);
  for (int i = 0; i < 50; ++i) {
    const std::vector<float> logits = RandomLogits(gen, 5000);
    EXPECT_EQ(SampleOne(sampler, logits), Argmax(logits));
  }
}

TEST(Sampler, GreedyTiesGoToLowestId) {
  std::vector<float> logits(100, 0.0f);
  logits[42] = 3.0f;
  logits[17] = 3.0f;
  logits[80] = 3.0f;
  Sampler sampler(Greedy(), 100);
  EXPECT_EQ(SampleOne(sampler, logits), 17);
}

TEST(Sampler, SameSeedSameTokens) {
  SamplingParams params;
  params.seed = 1234;
  params.top_p = 0.95f;
  Sampler a(params, 3000);
  Sampler b(params, 3000);
  std::mt19937 gen(2);
  std::set<int32_t> distinct;
  for (int i = 0; i < 300; ++i) {
    const std::vector<float> logits = RandomLogits(gen, 3000, 1.0f);
    const int32_t ta = SampleOne(a, logits);
    ASSERT_EQ(ta, SampleOne(b, logits)) << "step " << i;
    a.Accept(ta);
    b.Accept(ta);
    distinct.insert(ta);
  }
  EXPECT_GT(distinct.size(), 100u);  // the draws really were random
}

TEST(Sampler, DifferentSeedsDiffer) {
  SamplingParams params;
  params.seed = 1;
  Sampler a(params, 1000);
  params.seed = 2;
  Sampler b(params, 1000);
  const std::vector<float> flat(1000, 0.0f);
  int same = 0;
  for (int i = 0; i < 200; ++i) same += SampleOne(a, flat) == SampleOne(b, flat);
  EXPECT_LT(same, 20);  // 1 in 1000 per step by chance
}

TEST(Sampler, EachDrawUsesOneRandomNumber) {
  // Whatever the first call's logits kept, the second call sees the same generator state.
  SamplingParams params;
  params.seed = 99;
  params.top_k = 50;
  Sampler a(params, 2000);
  Sampler b(params, 2000);
  std::mt19937 gen(3);
  const std::vector<float> first_a = RandomLogits(gen, 2000);
  std::vector<float> first_b(2000, -kInf);
  first_b[7] = 0;  // only one token possible
  const std::vector<float> second = RandomLogits(gen, 2000, 0.5f);
  SampleOne(a, first_a);
  EXPECT_EQ(SampleOne(b, first_b), 7);
  EXPECT_EQ(SampleOne(a, second), SampleOne(b, second));
}

TEST(Sampler, TopKOneEqualsGreedy) {
  SamplingParams params;
  params.top_k = 1;
  params.temperature = 1.5f;
  Sampler sampler(params, 4000);
  Sampler greedy(Greedy(), 4000);
  std::mt19937 gen(4);
  for (int i = 0; i < 50; ++i) {
    std::vector<float> logits = RandomLogits(gen, 4000, 0.3f);
    logits[i * 13] = logits[Argmax(logits)];  // a tie: both must take the lower id
    EXPECT_EQ(SampleOne(sampler, logits), SampleOne(greedy, logits));
  }
}

TEST(Sampler, TopKKeepsKAndRenormalizes) {
  const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 1.5f, 1.0f, 0.0f, 1.8f, -3.0f};
  SamplingParams params;
  params.top_k = 3;
  params.temperature = 0.8f;
  params.seed = 5;
  Sampler sampler(params, 8);
  const int draws = 20000;
  ExpectFrequencies(Histogram(sampler, logits, draws), Softmax(logits, {1, 6, 3}, 0.8), draws);
}

TEST(Sampler, TopKBreaksTiesByLowerId) {
  // Logits take three values, so the k-th place is always inside a tie. The kept set must be the
  // first k in (logit descending, id ascending) order, both for small k (heap) and large k (selection).
  const int n = 3000;
  std::mt19937 gen(22);
  std::vector<float> logits(n);
  for (float& l : logits) l = static_cast<float>(gen() % 3);
  std::vector<int32_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  for (int k : {37, 1500}) {
    SCOPED_TRACE(k);
    const std::set<int32_t> expected(order.begin(), order.begin() + k);
    SamplingParams params;
    params.top_k = k;
    params.temperature = 50.0f;  // nearly flat, so every kept token shows up
    params.seed = 23;
    Sampler sampler(params, n);
    std::set<int32_t> drawn;
    for (int i = 0; i < 4 * k; ++i) {
      const int32_t t = SampleOne(sampler, logits);
      ASSERT_TRUE(expected.count(t)) << "token " << t;
      drawn.insert(t);
    }
    EXPECT_GT(drawn.size(), expected.size() * 9 / 10);
  }
}

TEST(Sampler, TopPKeepsSmallestSetReachingP) {
  // Probabilities 0.3 and 0.25 reach 0.5 together; 0.3 alone does not.
  const std::map<int32_t, double> probs = {{17, 0.3}, {3, 0.25}, {512, 0.2}, {90, 0.15}, {250, 0.05}};
  const std::vector<float> logits = LogitsFor(1000, probs);
  SamplingParams params;
  params.top_p = 0.5f;
  params.seed = 6;
  Sampler sampler(params, 1000);
  const int draws = 2000;
  ExpectFrequencies(Histogram(sampler, logits, draws), {{17, 0.3 / 0.55}, {3, 0.25 / 0.55}}, draws);

  params.top_p = 0.25f;  // the best token alone suffices
  Sampler narrow(params, 1000);
  EXPECT_EQ(Histogram(narrow, logits, 200), (std::map<int32_t, int>{{17, 200}}));
}

TEST(Sampler, TopPOnALargeVocabulary) {
  // No top-k: the sampler finds the nucleus among 20k candidates without sorting them all. The flatter
  // distribution leaves more candidates than the sampler sorts at once.
  const int n = 20000;
  for (float scale : {2.5f, 0.7f}) {
    SCOPED_TRACE(scale);
    std::mt19937 gen(7);
    const std::vector<float> logits = RandomLogits(gen, n, scale);
    std::vector<int32_t> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
    const std::vector<double> logp = LogSoftmax(logits);
    const double p = 0.9;
    double cum = 0;
    std::set<int32_t> nucleus;
    for (int32_t t : order) {
      nucleus.insert(t);
      cum += std::exp(logp[t]);
      if (cum >= p) break;
    }
    SamplingParams params;
    params.top_p = static_cast<float>(p);
    params.seed = 8;
    Sampler sampler(params, n);
    std::set<int32_t> drawn;
    double drawn_logit = 0;
    const int draws = 500;
    for (int i = 0; i < draws; ++i) {
      const int32_t t = SampleOne(sampler, logits);
      ASSERT_TRUE(nucleus.count(t)) << "token " << t << " is outside the nucleus of " << nucleus.size();
      drawn.insert(t);
      drawn_logit += logits[t] / draws;
    }
    // The draws spread over the nucleus, weighted towards its top.
    EXPECT_GT(drawn.size(), std::min<size_t>(nucleus.size() / 4, 100));
    double nucleus_logit = 0;
    for (int32_t t : nucleus) nucleus_logit += logits[t] / nucleus.size();
    EXPECT_GT(drawn_logit, nucleus_logit);
  }
}

TEST(Sampler, MinPExcludesTokensBelowThreshold) {
  // Best token 0.4, so min_p 0.25 keeps probabilities >= 0.1: tokens 1, 2 and 3.
  const std::map<int32_t, double> probs = {{1, 0.4}, {2, 0.2}, {3, 0.1001}, {4, 0.0999}, {5, 0.05}};
  const std::vector<float> logits = LogitsFor(500, probs);
  SamplingParams params;
  params.min_p = 0.25f;
  params.seed = 9;
  Sampler sampler(params, 500);
  const int draws = 2000;
  const double kept = 0.4 + 0.2 + 0.1001;
  ExpectFrequencies(Histogram(sampler, logits, draws), {{1, 0.4 / kept}, {2, 0.2 / kept}, {3, 0.1001 / kept}},
                    draws);
}

TEST(Sampler, MinPOnALargeKeptSet) {
  // About half of 12k uniform logits survive, more than the sampler sorts: it draws in id order.
  const int n = 12000;
  std::mt19937 gen(10);
  std::uniform_real_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> logits(n);
  for (float& l : logits) l = dist(gen);
  const float max = *std::max_element(logits.begin(), logits.end());
  const double threshold = max + std::log(0.6);
  SamplingParams params;
  params.min_p = 0.6f;
  params.seed = 11;
  Sampler sampler(params, n);
  double mean_logit = 0;
  for (int i = 0; i < 1000; ++i) {
    const int32_t t = SampleOne(sampler, logits);
    ASSERT_GE(logits[t], threshold - 1e-6) << "token " << t;
    mean_logit += logits[t] / 1000.0;
  }
  // Weighted by exp(l) over [threshold, max], the mean logit sits above the interval's midpoint.
  EXPECT_GT(mean_logit, (threshold + max) / 2);
}

TEST(Sampler, TemperatureMatchesSoftmax) {
  const std::vector<float> logits = {1.0f, 0.2f, -0.5f, 2.0f, 1.4f, -2.0f, 0.7f, 0.0f};
  const std::vector<int32_t> all = {0, 1, 2, 3, 4, 5, 6, 7};
  for (double t : {0.5, 1.0, 2.0}) {
    SamplingParams params;
    params.temperature = static_cast<float>(t);
    params.seed = 12;
    Sampler sampler(params, 8);
    const int draws = 20000;
    SCOPED_TRACE(t);
    ExpectFrequencies(Histogram(sampler, logits, draws), Softmax(logits, all, t), draws);
  }
}

TEST(Sampler, TemperatureOnALargeVocabulary) {
  // No filters: the draw walks the whole vocabulary. Ten strong tokens and a tail that carries the rest.
  const int n = 8000;
  std::vector<float> logits(n, -2.0f);
  for (int i = 0; i < 10; ++i) logits[i * 799] = 3.0f + 0.25f * i;
  SamplingParams params;
  params.temperature = 0.7f;
  params.seed = 13;
  Sampler sampler(params, n);
  const int draws = 10000;
  std::map<int32_t, int> counts;
  for (int i = 0; i < draws; ++i) {
    const int32_t t = SampleOne(sampler, logits);
    ++counts[logits[t] > 0 ? t : -1];
  }
  std::vector<int32_t> all(n);
  std::iota(all.begin(), all.end(), 0);
  const std::map<int32_t, double> p = Softmax(logits, all, 0.7);
  std::map<int32_t, double> expected;
  double tail = 1;
  for (int i = 0; i < 10; ++i) {
    expected[i * 799] = p.at(i * 799);
    tail -= p.at(i * 799);
  }
  expected[-1] = tail;
  ExpectFrequencies(counts, expected, draws);
}

TEST(Sampler, NegativeInfinityIsNeverDrawn) {
  std::vector<float> logits(300, -kInf);
  logits[10] = 0.0f;
  logits[200] = 0.0f;
  SamplingParams params;
  params.seed = 14;
  Sampler sampler(params, 300);
  const std::map<int32_t, int> counts = Histogram(sampler, logits, 1000);
  EXPECT_EQ(counts.size(), 2u);
  EXPECT_GT(counts.at(10), 400);
  EXPECT_GT(counts.at(200), 400);
}

// Greedy on logits where token 0 leads token 1 before penalties, with token 0 accepted `times` times.
int32_t GreedyAfterPenalty(const SamplingParams& params, float l0, float l1, int times) {
  std::vector<float> logits(50, -20.0f);
  logits[0] = l0;
  logits[1] = l1;
  Sampler sampler(params, 50);
  for (int i = 0; i < times; ++i) sampler.Accept(0);
  return SampleOne(sampler, logits);
}

TEST(SamplerPenalties, RepetitionDividesPositiveLogits) {
  SamplingParams params = Greedy();
  params.repetition_penalty = 1.5f;  // 2.0 -> 1.333 < 1.5
  EXPECT_EQ(GreedyAfterPenalty(params, 2.0f, 1.5f, 1), 1);
  params.repetition_penalty = 1.2f;  // 2.0 -> 1.667 > 1.5
  EXPECT_EQ(GreedyAfterPenalty(params, 2.0f, 1.5f, 1), 0);
  EXPECT_EQ(GreedyAfterPenalty(params, 2.0f, 1.5f, 0), 0);  // unseen tokens are not penalized
}

TEST(SamplerPenalties, RepetitionMultipliesNegativeLogits) {
  SamplingParams params = Greedy();
  params.repetition_penalty = 1.5f;  // -1.0 -> -1.5 < -1.4
  EXPECT_EQ(GreedyAfterPenalty(params, -1.0f, -1.4f, 1), 1);
  params.repetition_penalty = 1.3f;  // -1.0 -> -1.3 > -1.4
  EXPECT_EQ(GreedyAfterPenalty(params, -1.0f, -1.4f, 1), 0);
  // Independent of the count.
  EXPECT_EQ(GreedyAfterPenalty(params, -1.0f, -1.4f, 5), 0);
}

TEST(SamplerPenalties, PresenceSubtractsOnce) {
  SamplingParams params = Greedy();
  params.presence_penalty = 0.3f;  // 1.0 - 0.3 < 0.8, however often seen
  EXPECT_EQ(GreedyAfterPenalty(params, 1.0f, 0.8f, 3), 1);
  params.presence_penalty = 0.1f;  // 0.9 > 0.8 even after three occurrences
  EXPECT_EQ(GreedyAfterPenalty(params, 1.0f, 0.8f, 3), 0);
}

TEST(SamplerPenalties, FrequencySubtractsPerOccurrence) {
  SamplingParams params = Greedy();
  params.frequency_penalty = 0.1f;
  EXPECT_EQ(GreedyAfterPenalty(params, 1.0f, 0.8f, 1), 0);  // 0.9
  EXPECT_EQ(GreedyAfterPenalty(params, 1.0f, 0.8f, 3), 1);  // 0.7
  params.frequency_penalty = -0.5f;                         // negative values encourage repeats
  EXPECT_EQ(GreedyAfterPenalty(params, 0.5f, 0.8f, 1), 0);
}

TEST(SamplerPenalties, RepetitionComesBeforeSubtraction) {
  SamplingParams params = Greedy();
  params.repetition_penalty = 2.0f;
  params.presence_penalty = 0.1f;
  // (2.0 / 2) - 0.1 = 0.9 < 0.92; the other order would give (2.0 - 0.1) / 2 = 0.95.
  EXPECT_EQ(GreedyAfterPenalty(params, 2.0f, 0.92f, 1), 1);
}

TEST(SamplerPenalties, WindowForgetsOldTokens) {
  std::vector<float> logits(50, -20.0f);
  logits[0] = 1.0f;
  logits[1] = 0.8f;
  SamplingParams params = Greedy();
  params.presence_penalty = 0.5f;
  params.penalty_last_n = 2;
  Sampler windowed(params, 50);
  windowed.Accept(0);
  EXPECT_EQ(SampleOne(windowed, logits), 1);
  windowed.Accept(5);
  EXPECT_EQ(SampleOne(windowed, logits), 1);  // 0 is still in the last two
  windowed.Accept(6);
  EXPECT_EQ(SampleOne(windowed, logits), 0);  // and now it is not
  windowed.Accept(0);
  windowed.Accept(0);
  windowed.Accept(7);
  EXPECT_EQ(SampleOne(windowed, logits), 1);  // one occurrence of 0 left in the window

  params.penalty_last_n = -1;
  Sampler whole(params, 50);
  whole.Accept(0);
  for (int i = 0; i < 500; ++i) whole.Accept(10 + i % 30);
  EXPECT_EQ(SampleOne(whole, logits), 1);

  params.penalty_last_n = 0;
  Sampler none(params, 50);
  none.Accept(0);
  EXPECT_EQ(SampleOne(none, logits), 0);
}

TEST(SamplerPenalties, ChangeTheDistributionNotOnlyGreedy) {
  // A frequency penalty of ln 3 after one occurrence divides token 0's weight by 3.
  const std::vector<float> logits = {0.0f, 0.0f, -kInf};
  SamplingParams params;
  params.frequency_penalty = std::log(3.0f);
  params.seed = 15;
  Sampler sampler(params, 3);
  sampler.Accept(0);
  const int draws = 10000;
  ExpectFrequencies(Histogram(sampler, logits, draws), {{0, 0.25}, {1, 0.75}}, draws);
}

TEST(SamplerLogprobs, MatchLogSoftmaxOfOriginalLogits) {
  const int n = 2000;
  std::mt19937 gen(17);
  SamplingParams params;
  params.logprobs = true;
  params.top_logprobs = 5;
  params.temperature = 0.5f;         // neither temperature ...
  params.repetition_penalty = 1.3f;  // ... nor penalties change the reported numbers
  params.seed = 18;
  Sampler sampler(params, n);
  for (int step = 0; step < 20; ++step) {
    const std::vector<float> logits = RandomLogits(gen, n);
    const std::vector<double> logp = LogSoftmax(logits);
    absl::StatusOr<SampleResult> r = sampler.Sample(logits);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_NEAR(r->logprob, logp[r->token], 1e-4);
    std::vector<int32_t> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return logp[a] > logp[b]; });
    ASSERT_EQ(r->top.size(), 5u);
    for (int i = 0; i < 5; ++i) {
      EXPECT_EQ(r->top[i].token, order[i]);
      EXPECT_NEAR(r->top[i].logprob, logp[order[i]], 1e-4);
      if (i > 0) {
        EXPECT_GE(r->top[i - 1].logprob, r->top[i].logprob);
      }
    }
    sampler.Accept(r->token);
  }
}

TEST(SamplerLogprobs, TopListSortedWithTiesByIdAndCappedByVocabulary) {
  const std::vector<float> logits = {1.0f, 3.0f, 2.0f, 3.0f, -kInf, 2.0f};
  SamplingParams params = Greedy();
  params.logprobs = true;
  params.top_logprobs = 20;
  Sampler sampler(params, 6);
  absl::StatusOr<SampleResult> r = sampler.Sample(logits);
  ASSERT_TRUE(r.ok()) << r.status();
  std::vector<int32_t> tokens;
  for (const TokenLogprob& t : r->top) tokens.push_back(t.token);
  EXPECT_EQ(tokens, (std::vector<int32_t>{1, 3, 2, 5, 0, 4}));
  EXPECT_EQ(r->top.back().logprob, -kInf);
  EXPECT_EQ(r->token, 1);
  double total = 0;
  for (const TokenLogprob& t : r->top) total += std::exp(t.logprob);
  EXPECT_NEAR(total, 1.0, 1e-6);
}

TEST(SamplerLogprobs, OffByDefault) {
  Sampler sampler(SamplingParams{}, 10);
  absl::StatusOr<SampleResult> r = sampler.Sample(std::vector<float>(10, 1.0f));
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->top.empty());
}

TEST(SamplerErrors, BadLogits) {
  Sampler sampler(SamplingParams{}, 10);
  EXPECT_THAT(sampler.Sample(std::vector<float>(9, 0.0f)).status(),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "expected n_vocab = 10"));
  std::vector<float> logits(10, 0.0f);
  logits[4] = std::nanf("");
  EXPECT_THAT(sampler.Sample(logits).status(), StatusIsWith(absl::StatusCode::kInvalidArgument, "logits[4]"));
  logits[4] = kInf;
  EXPECT_THAT(sampler.Sample(logits).status(), StatusIsWith(absl::StatusCode::kInvalidArgument, "logits[4]"));
  const std::vector<float> dead(10, -kInf);
  EXPECT_THAT(sampler.Sample(dead).status(), StatusIsWith(absl::StatusCode::kInvalidArgument, "no token"));
  Sampler greedy(Greedy(), 10);
  EXPECT_THAT(greedy.Sample(dead).status(), StatusIsWith(absl::StatusCode::kInvalidArgument, "no token"));
}

TEST(SamplerErrors, ExtremePenaltiesStayFinite) {
  SamplingParams params;
  params.repetition_penalty = 1e-38f;  // divides a positive logit past FLT_MAX
  params.seed = 19;
  params.logprobs = true;
  Sampler sampler(params, 4);
  sampler.Accept(0);
  absl::StatusOr<SampleResult> r = sampler.Sample(std::vector<float>{10.0f, 0.0f, 0.0f, 0.0f});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->token, 0);
  EXPECT_TRUE(std::isfinite(r->logprob));
}

TEST(Xoshiro256, UniformDoublesInRange) {
  Xoshiro256 a(42);
  Xoshiro256 b(42);
  double sum = 0;
  for (int i = 0; i < 100000; ++i) {
    const double u = a.NextDouble();
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    ASSERT_EQ(u, b.NextDouble());
    sum += u;
  }
  EXPECT_NEAR(sum / 100000, 0.5, 0.005);
  EXPECT_NE(Xoshiro256(1).Next(), Xoshiro256(2).Next());
}

// Validation: each case breaks one field and expects its name in the message.
struct BadParams {
  const char* name;
  void (*mutate)(SamplingParams&);
  const char* expected;
};

TEST(ValidateSamplingParams, DefaultsAreValid) {
  EXPECT_TRUE(ValidateSamplingParams(SamplingParams{}, 1000).ok());
  SamplingParams p;
  p.temperature = 0;
  p.top_k = 5000;  // larger than the vocabulary: keeps everything
  p.top_p = 1;
  p.min_p = 1;
  p.penalty_last_n = -1;
  p.presence_penalty = -2;
  p.stop = {"\n\n", "</s>"};
  p.stop_token_ids = {0, 999};
  p.logprobs = true;
  p.top_logprobs = 20;
  EXPECT_TRUE(ValidateSamplingParams(p, 1000).ok());
}

TEST(ValidateSamplingParams, EachErrorNamesItsField) {
  const BadParams cases[] = {
      {"negative temperature", [](SamplingParams& p) { p.temperature = -0.5f; }, "temperature: -0.5 is negative"},
      {"nan temperature", [](SamplingParams& p) { p.temperature = std::nanf(""); }, "temperature"},
      {"top_k", [](SamplingParams& p) { p.top_k = -1; }, "top_k: -1 is negative"},
      {"top_p high", [](SamplingParams& p) { p.top_p = 1.5f; }, "top_p: 1.5 is not in (0, 1]"},
      {"top_p zero", [](SamplingParams& p) { p.top_p = 0; }, "top_p: 0 is not in (0, 1]"},
      {"min_p", [](SamplingParams& p) { p.min_p = -0.1f; }, "min_p"},
      {"min_p high", [](SamplingParams& p) { p.min_p = 2; }, "min_p: 2 is not in [0, 1]"},
      {"repetition", [](SamplingParams& p) { p.repetition_penalty = 0; }, "repetition_penalty: 0 must be > 0"},
      {"presence", [](SamplingParams& p) { p.presence_penalty = INFINITY; }, "presence_penalty"},
      {"frequency", [](SamplingParams& p) { p.frequency_penalty = std::nanf(""); }, "frequency_penalty"},
      {"last_n", [](SamplingParams& p) { p.penalty_last_n = -2; }, "penalty_last_n: -2"},
      {"max_tokens", [](SamplingParams& p) { p.max_tokens = 0; }, "max_tokens: 0 must be >= 1"},
      {"empty stop", [](SamplingParams& p) { p.stop = {"a", ""}; }, "stop[1] is empty"},
      {"stop not UTF-8", [](SamplingParams& p) { p.stop = {"\xBF"}; }, "stop[0] is not valid UTF-8"},
      {"long stop", [](SamplingParams& p) { p.stop = {std::string(600, 'x')}; }, "stop[0]: 600 bytes"},
      {"many stops", [](SamplingParams& p) { p.stop.assign(17, "x"); }, "stop: 17 strings"},
      {"stop id", [](SamplingParams& p) { p.stop_token_ids = {1, 2, 999999}; },
       "stop_token_ids[2]: 999999 is not a token id (vocabulary has 1000)"},
      {"negative stop id", [](SamplingParams& p) { p.stop_token_ids = {-1}; }, "stop_token_ids[0]: -1"},
      {"top_logprobs", [](SamplingParams& p) { p.logprobs = true; p.top_logprobs = 25; },
       "top_logprobs: 25 exceeds 20"},
      {"negative top_logprobs", [](SamplingParams& p) { p.logprobs = true; p.top_logprobs = -1; },
       "top_logprobs: -1 is negative"},
      {"top_logprobs alone", [](SamplingParams& p) { p.top_logprobs = 3; }, "top_logprobs: 3 requires logprobs"},
  };
  for (const BadParams& c : cases) {
    SamplingParams p;
    c.mutate(p);
    EXPECT_THAT(ValidateSamplingParams(p, 1000), StatusIsWith(absl::StatusCode::kInvalidArgument, c.expected))
        << c.name;
  }
  EXPECT_THAT(ValidateSamplingParams(SamplingParams{}, 0),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "n_vocab"));
}

TEST(FinishReason, Names) {
  EXPECT_EQ(FinishReasonName(FinishReason::kNone), "none");
  EXPECT_EQ(FinishReasonName(FinishReason::kStop), "stop");
  EXPECT_EQ(FinishReasonName(FinishReason::kLength), "length");
  EXPECT_EQ(FinishReasonName(FinishReason::kEos), "eos");
  EXPECT_EQ(FinishReasonName(FinishReason::kCancelled), "cancelled");
  EXPECT_EQ(FinishReasonName(FinishReason::kError), "error");
}

}  // namespace
}  // namespace strata::runtime
