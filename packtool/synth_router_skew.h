#ifndef STRATA_PACKTOOL_SYNTH_ROUTER_SKEW_H_
#define STRATA_PACKTOOL_SYNTH_ROUTER_SKEW_H_

// Router skew for synthetic models (strata-pack synth --router-skew S): router weights under which some
// experts are picked far more often than others, as real models' routers do.
//
// Construction. A router picks the top-k of logits w_e . x over experts e. For router inputs x of random
// direction (a synthetic model's hidden states over random token ids), w_e . x is about normal with a spread
// proportional to |w_e|, and with many experts the k-th largest logit sits near a threshold t that every
// expert must pass: expert e is picked with probability Q(t / |w_e|) (Q the normal tail). Each MoE layer's
// experts get a popularity rank from a seeded permutation; rank r (0 = hottest) is to be picked with
// probability p_r proportional to (r + 1)^-S (a Zipf law), capped at kMaxRouterSkewPickProbability (a
// logit symmetric about 0 passes a positive threshold less than half the time) with the excess spread over
// the other ranks, the p_r summing to k. Router row e is then scaled to norm  c / Qinv(p_rank(e)),  c
// chosen so that an expert of the mean popularity k / n keeps the norm the unskewed row has on average.
// Rows are set to that norm exactly (the random rows' own spread of norms, a few percent, is removed).
// The law holds where the router picks the top-k of the logits (or of a monotonic function of them: glm4moe's
// sigmoid). glm4moe's router adds a bias to its scores before picking: with a skew, synth writes it as zeros
// (IsRouterPickBias); its later layers then measure within about 20% of the law. Refused: deepseek2 (it picks
// the best experts of the best groups of experts) and gpt-oss (its experts' large biases give the hidden
// states a common direction, so router inputs are not of random direction: the engine's routing missed the
// law's hottest experts).
//
// Pure functions; thread-safe.

#include <cstdint>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "engine/gguf/gguf_file.h"

namespace strata::packtool {

// The most often a rank may be picked, a probability per token.
inline constexpr double kMaxRouterSkewPickProbability = 0.45;
// The largest --router-skew accepted (beyond about 1.2 the cap holds the hottest ranks anyway).
inline constexpr double kMaxRouterSkew = 8.0;

// The GGUF key (float32) a skewed synthetic model records its skew in (absent for skew 0), so that a
// benchmark can say which skew a pack it did not make was made with.
inline constexpr char kRouterSkewKey[] = "strata.synth.router_skew";

// The skew `metadata` records (kRouterSkewKey); 0 when it records none (an unskewed or a real model).
double RecordedRouterSkew(const gguf::Metadata& metadata);

// Refuses a skew that is negative, not finite or above kMaxRouterSkew, and a skew above 0 for deepseek2 or
// gpt-oss (names it) or for n_expert_used / n_expert of kMaxRouterSkewPickProbability or more. INVALID_ARGUMENT
// naming --router-skew.
absl::Status CheckRouterSkew(std::string_view arch, int64_t n_expert, int64_t n_expert_used, double skew);

// Whether `tensor_name` is a bias a router adds before it picks (glm4moe's blk.N.exp_probs_b.bias), which a
// skewed model has as zeros.
bool IsRouterPickBias(std::string_view tensor_name);

// p_r: the probability per token that rank r (0 = hottest) is picked, for r < n_expert; sums to
// n_expert_used. Uniform for skew 0. Needs the arguments CheckRouterSkew accepts.
std::vector<double> RouterSkewPickProbabilities(int64_t n_expert, int64_t n_expert_used, double skew);

// The hottest rank's pick probability over the mean's (p_0 * n_expert / n_expert_used): the ratio the law
// aims at.
double RouterSkewHottestOverMean(int64_t n_expert, int64_t n_expert_used, double skew);

// rank[e] of each expert of one MoE layer: a permutation of [0, n_expert) drawn from `stream` (the router
// tensor's stream, so each layer has its own).
std::vector<int64_t> RouterSkewRanks(uint64_t stream, int64_t n_expert);

// The norm each expert's router row is scaled to, in units of the unskewed rows' mean norm, indexed by
// expert: rank[e]'s factor c / Qinv(p_rank).
std::vector<double> RouterSkewRowNorms(uint64_t stream, int64_t n_expert, int64_t n_expert_used, double skew);

}  // namespace strata::packtool

#endif  // STRATA_PACKTOOL_SYNTH_ROUTER_SKEW_H_
