// strata-cache-policy-bench: hit rates of the VRAM expert cache policies (model::ExpertCachePolicy, the
// decisions the GPU offload dispatch executes) on routing with the skew of real MoE routers, beside the
// bound: the hit rate of an oracle that keeps the hottest experts of the true popularity resident.
//
//   strata-cache-policy-bench [--counts tests/data/routing/olmoe_expert_counts.txt] [--cache 0.25]
//                             [--tokens 20000] [--layers 16] [--seed 1]
//                             [--synth-skew 0.18,0.32,0.42 [--experts 512] [--experts-used 10]]
//
// Routing is simulated, not traced: each of --layers layers takes the popularity of one (model, domain,
// layer) line of the counts file (real aggregate counts from OLMoE and Mixtral runs), and every token picks
// top_k distinct experts of a layer with probability proportional to it. Hit rates count the steps after
// the first 10% (warm-up). static starts from the profile (the hottest experts by the counts);
// static-rr from the engine's default warm start (expert 0 of every layer, then 1, ...).
//
// --synth-skew adds a row per exponent S for the routing `strata-pack synth --router-skew S` makes: each
// layer's popularity is the law that synthesis aims its router at (packtool/synth_router_skew.h: rank r
// picked with probability ~ (r+1)^-S, capped), over the same seeded order of the experts synth uses, for
// --experts experts of which --experts-used are picked (default: the seed geometry, top-10 of 512).

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "bench/bench_util.h"
#include "engine/model/expert_cache_policy.h"
#include "packtool/synth_router_skew.h"
#include "packtool/synth_values.h"

namespace strata::bench {
namespace {

struct Popularity {
  std::string name;  // model/domain/layer
  int top_k = 0;
  std::vector<double> counts;
};

std::vector<Popularity> ReadCounts(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    std::fprintf(stderr, "cannot read %s (run from the repository root or pass --counts)\n", path.c_str());
    std::exit(1);
  }
  std::vector<Popularity> out;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream s(line);
    std::string model, domain, layer;
    int n = 0;
    Popularity p;
    s >> model >> domain >> layer >> p.top_k >> n;
    p.counts.resize(static_cast<size_t>(std::max(n, 0)));
    for (double& c : p.counts) s >> c;
    if (!s || n <= 0 || p.top_k <= 0 || p.top_k > n) {
      std::fprintf(stderr, "%s: a malformed line: %s\n", path.c_str(), line.c_str());
      std::exit(1);
    }
    p.name = model + "/" + domain + "/L" + layer;
    out.push_back(std::move(p));
  }
  return out;
}

// k distinct experts drawn with probability proportional to counts (successive draws without replacement).
void Route(const std::vector<double>& counts, int k, std::mt19937_64& rng, int32_t* out) {
  std::vector<double> w = counts;
  for (int j = 0; j < k; ++j) {
    std::discrete_distribution<int> pick(w.begin(), w.end());
    const int e = pick(rng);
    out[j] = e;
    w[e] = 0;
  }
}

// The oracle: the share of picks that the hottest `slots` experts of each layer take (slots spread evenly
// over the layers, as the policies may not do).
double OracleHitRate(const std::vector<const Popularity*>& layers, int64_t slots) {
  double hits = 0, total = 0;
  std::vector<std::pair<double, int>> all;  // (share of that layer's picks, layer)
  for (size_t l = 0; l < layers.size(); ++l) {
    const std::vector<double>& c = layers[l]->counts;
    const double sum = std::accumulate(c.begin(), c.end(), 0.0);
    for (double v : c) all.push_back({v / sum, static_cast<int>(l)});
    total += 1.0;
  }
  std::sort(all.begin(), all.end(), [](auto& a, auto& b) { return a.first > b.first; });
  for (int64_t i = 0; i < slots && i < static_cast<int64_t>(all.size()); ++i) hits += all[i].first;
  return hits / total;
}

// The popularity strata-pack synth --router-skew `skew` aims MoE layer `layer`'s router at (seed 1, synth's
// default): the law's pick probability of each expert's rank.
Popularity SynthesizedPopularity(double skew, int64_t layer, int64_t n_expert, int top_k) {
  Popularity p;
  p.name = absl::StrCat("synth/S=", skew, "/L", layer);
  p.top_k = top_k;
  const std::vector<double> by_rank = packtool::RouterSkewPickProbabilities(n_expert, top_k, skew);
  const std::vector<int64_t> rank =
      packtool::RouterSkewRanks(packtool::SynthStream(1, absl::StrCat("blk.", layer, ".ffn_gate_inp.weight")), n_expert);
  for (int64_t e = 0; e < n_expert; ++e) p.counts.push_back(by_rank[static_cast<size_t>(rank[e])]);
  return p;
}

// Hit rates of lru, lfu-decay, static (from the true popularity) and static-rr over `tokens` simulated
// tokens routed through `layers`, with `slots` of the experts cached; false when a warm start fails.
bool SimulatePolicies(const std::vector<const Popularity*>& layers, int64_t slots, int64_t tokens, int64_t seed,
                      double rates[4]) {
  const int64_t n_layers = static_cast<int64_t>(layers.size());
  const int64_t n_expert = static_cast<int64_t>(layers[0]->counts.size());
  const int k = layers[0]->top_k;
  std::vector<double> profile;
  for (const auto* p : layers) profile.insert(profile.end(), p->counts.begin(), p->counts.end());

  struct Run {
    const char* name;
    model::CachePolicy policy;
    bool from_profile;
  };
  const Run runs[] = {{"lru", model::CachePolicy::kLru, false},
                      {"lfu-decay", model::CachePolicy::kLfuDecay, false},
                      {"static", model::CachePolicy::kStatic, true},
                      {"static-rr", model::CachePolicy::kStatic, false}};
  for (int r = 0; r < 4; ++r) {
    model::CacheOptions o;
    o.slots = slots;
    o.policy = runs[r].policy;
    model::ExpertCachePolicy policy(o, n_layers, n_expert);
    const std::vector<double> counts = runs[r].from_profile ? profile : std::vector<double>{};
    const auto warm = policy.WarmStart(counts);
    if (!warm.ok() || !policy.Place(*warm, counts).ok()) return false;
    std::mt19937_64 rng(static_cast<uint64_t>(seed));
    std::vector<std::vector<int32_t>> ids(static_cast<size_t>(n_layers), std::vector<int32_t>(k));
    std::vector<const int32_t*> ptrs;
    for (auto& v : ids) ptrs.push_back(v.data());
    uint64_t hits = 0, picks = 0;
    for (int64_t t = 0; t < tokens; ++t) {
      for (int64_t l = 0; l < n_layers; ++l) Route(layers[l]->counts, k, rng, ids[l].data());
      if (t >= tokens / 10) {
        for (int64_t l = 0; l < n_layers; ++l) {
          for (int j = 0; j < k; ++j) hits += policy.resident(static_cast<uint64_t>(l * n_expert + ids[l][j]));
        }
        picks += static_cast<uint64_t>(n_layers) * k;
      }
      // Copies land by the next step (one decode step is far longer than a blob copy).
      for (const auto& a : policy.Observe(n_layers, ptrs.data(), 1, k)) policy.Landed(a.blob);
    }
    rates[r] = static_cast<double>(hits) / static_cast<double>(picks);
  }
  return true;
}

// Simulates `layers` and prints their row of the table.
bool PrintRow(const std::string& model, const std::string& domain, const std::vector<const Popularity*>& layers,
              double cache, int64_t tokens, int64_t seed) {
  const int64_t n_expert = static_cast<int64_t>(layers[0]->counts.size());
  const int64_t slots = static_cast<int64_t>(cache * static_cast<double>(layers.size() * n_expert) + 0.5);
  double rates[4];
  if (!SimulatePolicies(layers, slots, tokens, seed, rates)) {
    std::fprintf(stderr, "warm start failed\n");
    return false;
  }
  std::printf("%-12s %-10s %8lld %8.3f %8.3f %8.3f %8.3f %9.3f\n", model.c_str(), domain.c_str(),
              static_cast<long long>(n_expert), rates[0], rates[1], rates[2], rates[3], OracleHitRate(layers, slots));
  return true;
}

}  // namespace
}  // namespace strata::bench

int main(int argc, char** argv) {
  using namespace strata;
  bench::Flags flags(argc, argv,
                     "usage: strata-cache-policy-bench [--counts FILE] [--cache FRACTION] [--tokens N] [--layers N] "
                     "[--seed N] [--synth-skew S,S,... [--experts N] [--experts-used K]]");
  const std::string path = flags.String("counts", "tests/data/routing/olmoe_expert_counts.txt");
  const double cache = flags.Double("cache", 0.25);
  const int64_t tokens = flags.Int("tokens", 20000);
  const int64_t n_layers = flags.Int("layers", 16);
  const int64_t seed = flags.Int("seed", 1);
  // Rows for strata-pack synth --router-skew S, one per S.
  const std::vector<std::string> skew_names = flags.StringList("synth-skew", {});
  const int64_t synth_experts = flags.Int("experts", 512);
  const int64_t synth_used = flags.Int("experts-used", 10);
  flags.CheckNoUnknown();
  if (!(cache >= 0 && cache <= 1) || tokens < 10 || n_layers < 1) {
    std::fprintf(stderr, "--cache must be in [0, 1], --tokens >= 10, --layers >= 1\n");
    return 2;
  }
  if (synth_experts < 1 || synth_used < 1 || synth_used > synth_experts) {
    std::fprintf(stderr, "--experts must be at least 1 and --experts-used in 1 .. --experts\n");
    return 2;
  }
  std::vector<double> skews;
  for (const std::string& name : skew_names) {
    double skew = 0;
    if (!absl::SimpleAtod(name, &skew)) {
      std::fprintf(stderr, "--synth-skew: '%s' is not a number\n", name.c_str());
      return 2;
    }
    if (absl::Status s = packtool::CheckRouterSkew("qwen3moe", synth_experts, synth_used, skew); !s.ok()) {
      std::fprintf(stderr, "--synth-skew, as strata-pack synth's %s\n", std::string(s.message()).c_str());
      return 2;
    }
    skews.push_back(skew);
  }
  const std::vector<bench::Popularity> all = bench::ReadCounts(path);

  // Groups of lines with the same model and expert count: each simulated model cycles its layers over them.
  std::vector<std::string> models;
  for (const auto& p : all) {
    const std::string m = p.name.substr(0, p.name.find('/'));
    if (std::find(models.begin(), models.end(), m) == models.end()) models.push_back(m);
  }
  std::printf("routing: %s, %lld tokens, %lld layers a model, cache %.0f%% of the experts (hit rates after a 10%% "
              "warm-up)\n",
              path.c_str(), static_cast<long long>(tokens), static_cast<long long>(n_layers), 100 * cache);
  std::printf("%-12s %-10s %8s %8s %8s %8s %8s %9s\n", "model", "domain", "experts", "lru", "lfu-dec", "static",
              "static-rr", "oracle");
  for (const std::string& model : models) {
    std::vector<std::string> domains;
    for (const auto& p : all) {
      if (p.name.rfind(model + "/", 0) != 0) continue;
      const std::string d = p.name.substr(model.size() + 1, p.name.rfind('/') - model.size() - 1);
      if (std::find(domains.begin(), domains.end(), d) == domains.end()) domains.push_back(d);
    }
    for (const std::string& domain : domains) {
      std::vector<const bench::Popularity*> source;
      for (const auto& p : all) {
        if (p.name.rfind(model + "/" + domain + "/", 0) == 0) source.push_back(&p);
      }
      std::vector<const bench::Popularity*> layers;
      for (int64_t l = 0; l < n_layers; ++l) layers.push_back(source[static_cast<size_t>(l) % source.size()]);
      if (!bench::PrintRow(model, domain, layers, cache, tokens, seed)) return 1;
    }
  }
  for (const double skew : skews) {
    std::vector<bench::Popularity> synthesized;
    for (int64_t l = 0; l < n_layers; ++l) {
      synthesized.push_back(bench::SynthesizedPopularity(skew, l, synth_experts, static_cast<int>(synth_used)));
    }
    std::vector<const bench::Popularity*> layers;
    for (const auto& p : synthesized) layers.push_back(&p);
    if (!bench::PrintRow("synth", absl::StrCat("S=", skew), layers, cache, tokens, seed)) return 1;
  }
  return 0;
}
