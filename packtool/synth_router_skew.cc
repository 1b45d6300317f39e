#include "packtool/synth_router_skew.h"

#include <cmath>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"

namespace strata::packtool {
namespace {

// The normal distribution's upper tail, P(z > x).
double NormalTail(double x) { return 0.5 * std::erfc(x / std::sqrt(2.0)); }

// x with NormalTail(x) = p, for p in (0, 1); by bisection (the tail is decreasing), to double precision.
double InverseNormalTail(double p) {
  double lo = -40, hi = 40;
  for (int i = 0; i < 200 && hi - lo > 1e-15; ++i) {
    const double mid = 0.5 * (lo + hi);
    (NormalTail(mid) > p ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

// A 64-bit mix (splitmix64's finalizer) of the stream and a counter: the permutation's random numbers.
uint64_t Mix(uint64_t stream, uint64_t i) {
  uint64_t z = (stream ^ 0x5EED5C0FFEEull) + (i + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace

double RecordedRouterSkew(const gguf::Metadata& metadata) { return metadata.GetFloatOr(kRouterSkewKey, 0).value_or(0); }

bool IsRouterPickBias(std::string_view tensor_name) {
  return tensor_name.ends_with(".exp_probs_b.bias");
}

absl::Status CheckRouterSkew(std::string_view arch, int64_t n_expert, int64_t n_expert_used, double skew) {
  if (!std::isfinite(skew) || skew < 0 || skew > kMaxRouterSkew) {
    return absl::InvalidArgumentError(
        absl::StrCat("--router-skew: ", skew, " is out of range (expected a number from 0 to ", kMaxRouterSkew, ")"));
  }
  if (skew == 0) return absl::OkStatus();
  if (arch == "deepseek2" || arch == "gpt-oss") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--router-skew: architecture ", std::string(arch), " is not supported (",
        arch == "deepseek2" ? "its router picks the best experts of the best expert groups"
                            : "its experts' biases give the router's inputs a common direction",
        ", so scaling the router's rows does not give the law; supported: qwen3moe, mixtral, qwen2moe, olmoe, "
        "glm4moe)"));
  }
  if (n_expert <= 0 || n_expert_used <= 0 ||
      static_cast<double>(n_expert_used) >= kMaxRouterSkewPickProbability * static_cast<double>(n_expert)) {
    return absl::InvalidArgumentError(absl::StrCat("--router-skew: needs --experts-used (", n_expert_used,
                                                   ") below ", kMaxRouterSkewPickProbability, " of --experts (",
                                                   n_expert, "), so that an expert can be picked more often than "
                                                   "the mean"));
  }
  return absl::OkStatus();
}

std::vector<double> RouterSkewPickProbabilities(int64_t n_expert, int64_t n_expert_used, double skew) {
  const size_t n = static_cast<size_t>(n_expert);
  std::vector<double> weight(n), p(n);
  for (size_t r = 0; r < n; ++r) weight[r] = std::pow(static_cast<double>(r + 1), -skew);
  // Water-filling: ranks over the cap are held at it and the rest share what is left, in proportion to the
  // law; a share may then pass the cap in turn, so repeat until none does (at most n rounds).
  std::vector<bool> capped(n, false);
  for (size_t round = 0; round < n; ++round) {
    double left = static_cast<double>(n_expert_used), free_weight = 0;
    for (size_t r = 0; r < n; ++r) {
      if (capped[r]) {
        left -= kMaxRouterSkewPickProbability;
      } else {
        free_weight += weight[r];
      }
    }
    bool newly_capped = false;
    for (size_t r = 0; r < n; ++r) {
      if (capped[r]) {
        p[r] = kMaxRouterSkewPickProbability;
        continue;
      }
      p[r] = left * weight[r] / free_weight;
      if (p[r] > kMaxRouterSkewPickProbability) capped[r] = newly_capped = true;
    }
    if (!newly_capped) break;
  }
  return p;
}

double RouterSkewHottestOverMean(int64_t n_expert, int64_t n_expert_used, double skew) {
  return RouterSkewPickProbabilities(n_expert, n_expert_used, skew)[0] * static_cast<double>(n_expert) /
         static_cast<double>(n_expert_used);
}

std::vector<int64_t> RouterSkewRanks(uint64_t stream, int64_t n_expert) {
  std::vector<int64_t> rank(static_cast<size_t>(n_expert));
  std::iota(rank.begin(), rank.end(), 0);
  // Fisher-Yates, with our own random numbers so that every platform draws the same permutation.
  for (int64_t i = n_expert - 1; i > 0; --i) {
    const int64_t j = static_cast<int64_t>(Mix(stream, static_cast<uint64_t>(i)) % static_cast<uint64_t>(i + 1));
    std::swap(rank[static_cast<size_t>(i)], rank[static_cast<size_t>(j)]);
  }
  return rank;
}

std::vector<double> RouterSkewRowNorms(uint64_t stream, int64_t n_expert, int64_t n_expert_used, double skew) {
  const std::vector<double> p = RouterSkewPickProbabilities(n_expert, n_expert_used, skew);
  const std::vector<int64_t> rank = RouterSkewRanks(stream, n_expert);
  // The threshold, in units of the unskewed logits' spread, that a mean-popularity expert passes.
  const double threshold = InverseNormalTail(static_cast<double>(n_expert_used) / static_cast<double>(n_expert));
  std::vector<double> norms(static_cast<size_t>(n_expert));
  for (size_t e = 0; e < norms.size(); ++e) {
    norms[e] = threshold / InverseNormalTail(p[static_cast<size_t>(rank[e])]);
  }
  return norms;
}

}  // namespace strata::packtool
