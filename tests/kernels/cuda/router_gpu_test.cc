// RouterTopK against the CPU's router (engine/model/ops.h: softmax or sigmoid, the choice bias, the grouped
// choice, top-k and the weights), on real MoE shapes and odd ones, its decode and prompt paths, exact ties,
// and a token's result independent of the batch it is routed in. Poison and guard checks as
// dense_kernels_gpu_test.cc.

#include <bit>
#include <cstring>
#include <string>
#include <utility>

#include "tests/kernels/cuda/dense_test_support.h"

namespace strata::kernels::cuda {
namespace {

using namespace dense_test;  // the shared helpers of this test binary

// A router workspace of `bytes`, zeroed as RouterTopK needs it before its first call.
DeviceArray<uint8_t> ZeroedWorkspace(size_t bytes) {
  DeviceArray<uint8_t> workspace(bytes);
  Check(cudaMemset(workspace.get(), 0, bytes), "memset");
  return workspace;
}

struct RouterCase {
  int n_expert;
  int64_t n;
  int k;
};

// Random router inputs whose top k + 1 logits are at least 1e-4 apart (no near-ties for the selection
// to resolve differently), the CPU's ids and weights.
struct RouterInputs {
  std::vector<float> w, x;
  std::vector<float> norm, h;  // with a norm: its weight and the CPU's normed rows
  std::vector<int32_t> ids;
  std::vector<float> weights;
};

constexpr float kRouterEps = 1e-6f;

RouterInputs MakeRouterInputs(const RouterCase& c, int n_tokens, bool with_norm, Random& rng) {
  RouterInputs in;
  const float w_scale = 1.0f / std::sqrt(static_cast<float>(c.n));
  in.w = RandomFloats(static_cast<size_t>(c.n_expert) * c.n, -w_scale, w_scale, rng);
  if (with_norm) in.norm = RandomFloats(c.n, 0.5f, 1.5f, rng);
  in.x.resize(static_cast<size_t>(n_tokens) * c.n);
  in.h.resize(with_norm ? in.x.size() : 0);
  in.ids.resize(static_cast<size_t>(n_tokens) * c.k);
  in.weights.resize(in.ids.size());
  std::vector<float> logits(c.n_expert);
  for (int t = 0; t < n_tokens; ++t) {
    float* xt = &in.x[t * c.n];
    for (int attempt = 0;; ++attempt) {
      if (attempt == 1000) throw std::runtime_error("no router input without near-ties");
      for (int64_t i = 0; i < c.n; ++i) xt[i] = rng.Uniform(-1.0f, 1.0f);
      const float* ht = xt;
      if (with_norm) {
        model::RmsNorm(xt, in.norm.data(), c.n, kRouterEps, &in.h[t * c.n]);
        ht = &in.h[t * c.n];
      }
      DenseGemvReference(DenseType::kF32, reinterpret_cast<const uint8_t*>(in.w.data()), c.n, 0, c.n_expert, ht, c.n, 1,
                         logits.data(), c.n_expert);
      std::vector<float> sorted = logits;
      std::sort(sorted.begin(), sorted.end(), std::greater<float>());
      bool separated = true;
      for (int j = 0; j + 1 < std::min(c.k + 1, c.n_expert); ++j) separated &= sorted[j] - sorted[j + 1] >= 1e-4f;
      if (separated) break;
    }
    model::Softmax(logits.data(), c.n_expert);
    int32_t* ids = &in.ids[t * c.k];
    model::TopK(logits.data(), c.n_expert, c.k, ids);
    double sum = 0;
    for (int j = 0; j < c.k; ++j) sum += logits[ids[j]];
    for (int j = 0; j < c.k; ++j) in.weights[t * c.k + j] = static_cast<float>(logits[ids[j]] / sum);
  }
  return in;
}

TEST_F(DenseKernelsTest, RouterTopKMatchesTheCpu) {
  // Every bucket of the top-k warp's entries a lane (4, 8, 16, 32), at their edges and the seed's 512 top-10.
  const RouterCase cases[] = {{128, 2048, 8}, {8, 4096, 2},    {64, 2560, 6},   {1024, 256, 32}, {3, 64, 3},
                              {40, 128, 1},   {512, 2560, 10}, {200, 512, 8},   {129, 256, 4},   {513, 256, 5},
                              {256, 256, 6},  {257, 256, 6}};
  for (const RouterCase& c : cases) {
    // One workspace for every call of a case, sized for the most tokens and zeroed once: each call must
    // leave its counters at zero for the next.
    const int kMostTokens = 300;
    const size_t ws_bytes = RouterWorkspaceBytes(kMostTokens, c.n_expert);
    DeviceArray<uint8_t> workspace = ZeroedWorkspace(ws_bytes);
    for (int n_tokens : {1, 7, 8, 9, 300, 16, 1}) {
      for (bool with_norm : {false, true}) {
        const uint64_t seed = NextSeed();
        SCOPED_TRACE(absl::StrCat(c.n_expert, " experts, n ", c.n, ", k ", c.k, ", ", n_tokens, " tokens, ",
                                  with_norm ? "normed" : "no norm", ", seed ", seed));
        Random rng(seed);
        const RouterInputs in = MakeRouterInputs(c, n_tokens, with_norm, rng);
        DeviceArray<float> dw(in.w.size()), dx(in.x.size()), dweights(in.weights.size()), dnorm(c.n),
            dh(in.x.size());
        DeviceArray<int32_t> dids(in.ids.size());
        dw.Upload(in.w);
        dx.Upload(in.x);
        RouterNorm norm;
        if (with_norm) {
          dnorm.Upload(in.norm);
          norm = RouterNorm{dnorm.get(), kRouterEps, dh.get()};
        }
        const absl::Status s = RouterTopK(dw.get(), c.n_expert, c.n, dx.get(), norm, RouterGate{}, n_tokens, c.k,
                                          dids.get(), dweights.get(), workspace.get(), ws_bytes, stream_);
        ASSERT_TRUE(s.ok()) << s;
        Sync();
        EXPECT_EQ(dids.Download(), in.ids);
        const std::vector<float> weights = dweights.Download();
        int wrong = 0;
        for (size_t i = 0; i < weights.size(); ++i) {
          if (!(std::fabs(weights[i] - in.weights[i]) <= 1e-6f) && ++wrong <= 5) {
            ADD_FAILURE() << "weight " << i << " is " << weights[i] << ", the CPU's " << in.weights[i];
          }
        }
        EXPECT_EQ(wrong, 0);
        if (with_norm) {
          // The normed rows: the CPU's, but for the rounding of a double sum in another order (one ulp).
          ExpectRows(dh.Download(), in.h, n_tokens, c.n, c.n, 2e-7, "h");
          ExpectGuards(dh, "h");
        }
        ExpectGuards(dids, "ids");
        ExpectGuards(dweights, "weights");
        ExpectGuards(workspace, "workspace");
      }
    }
  }
  DeviceArray<float> w(4096), x(4096), weights(64);
  DeviceArray<int32_t> ids(64);
  DeviceArray<uint8_t> workspace(RouterWorkspaceBytes(1, 8));
  EXPECT_THAT(RouterTopK(w.get(), 8, 64, x.get(), RouterNorm{}, RouterGate{}, 1, 9, ids.get(), weights.get(),
                         workspace.get(), RouterWorkspaceBytes(1, 8), stream_),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "k is 9"));
  EXPECT_THAT(RouterTopK(w.get(), 8, 64, x.get(), RouterNorm{}, RouterGate{}, 1, 2, ids.get(), weights.get(),
                         workspace.get(), 4, stream_),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "workspace_bytes is 4"));
}

// Experts 2j and 2j + 1 share a row, so their logits and probs are the same bits: the lower id must come
// first, as model::TopK picks it, and the pair is never split (k even), for a decode block and a batch.
TEST_F(DenseKernelsTest, RouterTopKBreaksExactTiesTowardTheLowerId) {
  constexpr int kExperts = 64, kN = 256, kK = 6, kMostTokens = 9;
  const uint64_t seed = NextSeed();
  SCOPED_TRACE(absl::StrCat("seed ", seed));
  Random rng(seed);
  std::vector<float> w = RandomFloats(static_cast<size_t>(kExperts) * kN, -0.0625f, 0.0625f, rng);
  for (int e = 1; e < kExperts; e += 2) std::copy_n(&w[(e - 1) * kN], kN, &w[e * kN]);
  DeviceArray<float> dw(w.size()), dx(static_cast<size_t>(kMostTokens) * kN), dweights(kMostTokens * kK);
  DeviceArray<int32_t> dids(kMostTokens * kK);
  const size_t ws_bytes = RouterWorkspaceBytes(kMostTokens, kExperts);
  DeviceArray<uint8_t> workspace = ZeroedWorkspace(ws_bytes);
  dw.Upload(w);
  for (int n_tokens : {1, kMostTokens}) {
    std::vector<float> x = RandomFloats(static_cast<size_t>(kMostTokens) * kN, -1.0f, 1.0f, rng);
    dx.Upload(x);
    const absl::Status s = RouterTopK(dw.get(), kExperts, kN, dx.get(), RouterNorm{}, RouterGate{}, n_tokens, kK,
                                      dids.get(), dweights.get(), workspace.get(), ws_bytes, stream_);
    ASSERT_TRUE(s.ok()) << s;
    Sync();
    const std::vector<int32_t> ids = dids.Download();
    const std::vector<float> weights = dweights.Download();
    for (int t = 0; t < n_tokens; ++t) {
      for (int j = 0; j < kK; j += 2) {
        const int i = t * kK + j;
        EXPECT_EQ(ids[i] % 2, 0) << "token " << t << " choice " << j;
        EXPECT_EQ(ids[i + 1], ids[i] + 1) << "token " << t << " choice " << j;
        EXPECT_EQ(weights[i + 1], weights[i]) << "token " << t << " choice " << j;
        if (j > 0) {
          EXPECT_GE(weights[i - 1], weights[i]) << "token " << t << " choice " << j;
        }
      }
    }
  }
}

// Experts e and e + 32 m share a row (sixteen to a row of 512 experts), so a token's ten best are ten experts
// of one row, in different warps of the one-token top-k (BlockTopK) and in the same thread's two entries
// (e and e + 256): they must come as the ten lowest ids of that row, in order, with equal weights, for a lone
// token, a full token block, and the lone token of the last block of nine.
TEST_F(DenseKernelsTest, RouterTopKBreaksTiesAcrossWarpsTowardTheLowerIds) {
  constexpr int kExperts = 512, kN = 256, kK = 10, kMostTokens = 9;
  const uint64_t seed = NextSeed();
  SCOPED_TRACE(absl::StrCat("seed ", seed));
  Random rng(seed);
  std::vector<float> w = RandomFloats(static_cast<size_t>(kExperts) * kN, -0.0625f, 0.0625f, rng);
  for (int e = 32; e < kExperts; ++e) std::copy_n(&w[(e % 32) * kN], kN, &w[e * kN]);
  DeviceArray<float> dw(w.size()), dx(static_cast<size_t>(kMostTokens) * kN), dweights(kMostTokens * kK);
  DeviceArray<int32_t> dids(kMostTokens * kK);
  const size_t ws_bytes = RouterWorkspaceBytes(kMostTokens, kExperts);
  DeviceArray<uint8_t> workspace = ZeroedWorkspace(ws_bytes);
  dw.Upload(w);
  for (int n_tokens : {1, 8, kMostTokens}) {
    dx.Upload(RandomFloats(static_cast<size_t>(kMostTokens) * kN, -1.0f, 1.0f, rng));
    const absl::Status s = RouterTopK(dw.get(), kExperts, kN, dx.get(), RouterNorm{}, RouterGate{}, n_tokens, kK,
                                      dids.get(), dweights.get(), workspace.get(), ws_bytes, stream_);
    ASSERT_TRUE(s.ok()) << s;
    Sync();
    const std::vector<int32_t> ids = dids.Download();
    const std::vector<float> weights = dweights.Download();
    for (int t = 0; t < n_tokens; ++t) {
      const int base = ids[t * kK];
      ASSERT_LT(base, 32) << "token " << t << " of " << n_tokens;
      for (int j = 0; j < kK; ++j) {
        EXPECT_EQ(ids[t * kK + j], base + 32 * j) << "token " << t << " of " << n_tokens << ", choice " << j;
        EXPECT_EQ(weights[t * kK + j], weights[t * kK]) << "token " << t << " of " << n_tokens << ", choice " << j;
      }
    }
  }
}

// A token's ids, weights and normed row are the same bits wherever it sits in a batch: alone (the one-token
// top-k, BlockTopK), as token 3 of 8 (one warp's top-k in the decode kernel), or in a prompt step (the tiled
// logits and the top-k launch) as the lone token of a last block, a first, middle or last token: a
// sequence's routing must not change with the batch it is stepped in. For each gating kernel (the default,
// sigmoid with a choice bias, gpt-oss's logit bias and softmax over the chosen k), with and without a norm.
TEST_F(DenseKernelsTest, RouterTopKOfATokenDoesNotDependOnItsBlock) {
  const RouterCase cases[] = {{512, 2560, 10}, {128, 2048, 8}, {1024, 256, 32}, {257, 256, 6}, {13, 4100, 4}};
  const std::pair<int, int> placements[] = {{1, 0}, {8, 3}, {9, 8}, {33, 32}, {300, 157}, {300, 299}, {300, 0}};
  constexpr int kMostTokens = 300;
  for (const RouterCase& c : cases) {
    const size_t ws_bytes = RouterWorkspaceBytes(kMostTokens, c.n_expert);
    DeviceArray<uint8_t> workspace = ZeroedWorkspace(ws_bytes);
    const uint64_t seed = NextSeed();
    SCOPED_TRACE(absl::StrCat(c.n_expert, " experts, n ", c.n, ", k ", c.k, ", seed ", seed));
    Random rng(seed);
    const float w_scale = 1.0f / std::sqrt(static_cast<float>(c.n));
    DeviceArray<float> dw(static_cast<size_t>(c.n_expert) * c.n), dx(static_cast<size_t>(kMostTokens) * c.n),
        dh(static_cast<size_t>(kMostTokens) * c.n), dweights(kMostTokens * c.k), dnorm(c.n), dbias(c.n_expert);
    DeviceArray<int32_t> dids(kMostTokens * c.k);
    dw.Upload(RandomFloats(static_cast<size_t>(c.n_expert) * c.n, -w_scale, w_scale, rng));
    dnorm.Upload(RandomFloats(c.n, 0.5f, 1.5f, rng));
    dbias.Upload(RandomFloats(c.n_expert, -0.05f, 0.05f, rng));
    RouterGate gates[3];
    gates[1].sigmoid = true;
    gates[1].choice_bias = dbias.get();
    gates[1].renorm = false;
    gates[1].scale = 2.5f;
    gates[2].logit_bias = dbias.get();
    gates[2].softmax_top_k = true;
    for (int trial = 0; trial < 6; ++trial) {
      const int gating = trial % 3;
      const bool with_norm = trial >= 3;
      const RouterNorm norm = with_norm ? RouterNorm{dnorm.get(), kRouterEps, dh.get()} : RouterNorm{};
      const std::vector<float> token = RandomFloats(c.n, -1.0f, 1.0f, rng);
      std::vector<int32_t> first_ids;
      std::vector<float> first_weights, first_h;
      for (const auto& [n_tokens, slot] : placements) {
        const std::string where = absl::StrCat("gating ", gating, with_norm ? ", normed" : "", ", token ", slot,
                                               " of ", n_tokens);
        std::vector<float> x = RandomFloats(static_cast<size_t>(n_tokens) * c.n, -1.0f, 1.0f, rng);
        std::copy(token.begin(), token.end(), x.begin() + static_cast<size_t>(slot) * c.n);
        dx.UploadAt(0, x.data(), x.size());
        // Outputs start as NaN bits (ids -1), so that a placement cannot pass on the previous call's values.
        Check(cudaMemsetAsync(dids.get(), 0xFF, dids.size() * sizeof(int32_t), stream_), "poison");
        Check(cudaMemsetAsync(dweights.get(), 0xFF, dweights.size() * sizeof(float), stream_), "poison");
        Check(cudaMemsetAsync(dh.get(), 0xFF, dh.size() * sizeof(float), stream_), "poison");
        const absl::Status s = RouterTopK(dw.get(), c.n_expert, c.n, dx.get(), norm, gates[gating], n_tokens, c.k,
                                          dids.get(), dweights.get(), workspace.get(), ws_bytes, stream_);
        ASSERT_TRUE(s.ok()) << s << " (" << where << ")";
        Sync();
        const std::vector<int32_t> all_ids = dids.Download();
        const std::vector<float> all_weights = dweights.Download();
        const std::vector<int32_t> ids(all_ids.begin() + slot * c.k, all_ids.begin() + (slot + 1) * c.k);
        const std::vector<float> weights(all_weights.begin() + slot * c.k, all_weights.begin() + (slot + 1) * c.k);
        std::vector<float> h;
        if (with_norm) {
          const std::vector<float> all_h = dh.Download();
          h.assign(all_h.begin() + static_cast<size_t>(slot) * c.n, all_h.begin() + static_cast<size_t>(slot + 1) * c.n);
        }
        if (first_ids.empty()) {
          first_ids = ids;
          first_weights = weights;
          first_h = h;
          continue;
        }
        EXPECT_EQ(ids, first_ids) << where;
        for (int j = 0; j < c.k; ++j) {
          EXPECT_EQ(std::bit_cast<uint32_t>(weights[j]), std::bit_cast<uint32_t>(first_weights[j]))
              << where << ", choice " << j << ": " << weights[j] << " against " << first_weights[j] << " alone";
        }
        EXPECT_EQ(std::memcmp(h.data(), first_h.data(), h.size() * sizeof(float)), 0) << where << ": normed row";
      }
    }
  }
}

// The grouped choice (DeepSeek's RouterGate::n_group) against the CPU's router (engine/model/cpu_dense_backend.cc:
// probs, probs + bias masked by model::MaskAllButBestGroups, model::TopK, the weights renormalised and scaled).
// Each token's logits are exact (x one-hot, so a logit is one weight), which lets the cases hold exact ties:
// two groups with the same score (the lower must win), a group whose two best scores are equal (both count),
// and probabilities of 0; the decode path (up to 8 tokens, one launch) and the prompt path (tiles, then the top-k).
TEST_F(DenseKernelsTest, RouterTopKChoosesWithinTheBestGroupsAsTheCpu) {
  struct GroupCase {
    int n_expert, k, n_group, n_group_used;
    bool top_two, sigmoid;
  };
  const GroupCase cases[] = {{64, 6, 8, 3, true, true},    {256, 8, 8, 4, true, true}, {160, 6, 8, 3, false, false},
                             {1024, 8, 32, 4, true, true}, {96, 4, 4, 2, false, true}};
  constexpr int64_t kN = 64;
  for (const GroupCase& c : cases) {
    for (int n_tokens : {5, 20}) {
      const uint64_t seed = NextSeed();
      SCOPED_TRACE(absl::StrCat(c.n_expert, " experts in ", c.n_group, " groups, ", n_tokens, " tokens, seed ", seed));
      Random rng(seed);
      const int per_group = c.n_expert / c.n_group;
      // W's column t holds token t's logits (token t's x is one-hot at t); the other columns are 0.
      std::vector<float> w(static_cast<size_t>(c.n_expert) * kN, 0.0f), x(static_cast<size_t>(n_tokens) * kN, 0.0f);
      std::vector<std::vector<float>> logits(n_tokens, std::vector<float>(c.n_expert));
      for (int t = 0; t < n_tokens; ++t) {
        x[t * kN + t] = 1.0f;
        for (int e = 0; e < c.n_expert; ++e) logits[t][e] = static_cast<float>(rng.UniformInt(-4000, 4000)) / 1000.0f;
        if (t % 4 == 1) {
          // Groups u - 1 and u + 1 (u = n_group_used) tie for the last group chosen, after the u - 1 best.
          const int u = c.n_group_used;
          for (int g = 0; g <= u + 1; ++g) {
            if (g == u) continue;
            const float top = g < u - 1 ? 8.0f : 6.0f;
            for (int i = 0; i < per_group; ++i) logits[t][g * per_group + i] = i < 2 ? top : -5.0f;
          }
        }
        // Probabilities of 0 (not -infinity: W holds every token's logits, and -inf times another token's 0 input
        // would make these experts' logits NaN for all tokens).
        if (t % 4 == 2) logits[t][0] = logits[t][per_group + 1] = -1e30f;
        if (t % 4 == 3) logits[t][2 * per_group] = logits[t][2 * per_group + 1] = 7.0f;  // a group's two best equal
        for (int e = 0; e < c.n_expert; ++e) w[static_cast<size_t>(e) * kN + t] = logits[t][e];
      }
      std::vector<float> bias(c.n_expert, 0.0f);
      if (c.sigmoid) {  // none on the groups set up above (the tie exact), small beside their margins elsewhere
        for (int e = 0; e < c.n_expert; ++e) {
          const int g = e / per_group;
          if (g == c.n_group_used || g > c.n_group_used + 1) {
            bias[e] = static_cast<float>(rng.UniformInt(-100, 100)) / 20000.0f;
          }
        }
      }
      RouterGate gate;
      gate.sigmoid = c.sigmoid;
      gate.renorm = true;
      gate.scale = 2.5f;
      gate.n_group = c.n_group;
      gate.n_group_used = c.n_group_used;
      gate.group_top_two = c.top_two;
      DeviceArray<float> dw(w.size()), dx(x.size()), dbias(bias.size()), dweights(static_cast<size_t>(n_tokens) * c.k);
      DeviceArray<int32_t> dids(static_cast<size_t>(n_tokens) * c.k);
      dw.Upload(w);
      dx.Upload(x);
      dbias.Upload(bias);
      if (c.sigmoid) gate.choice_bias = dbias.get();
      const size_t ws_bytes = RouterWorkspaceBytes(n_tokens, c.n_expert);
      DeviceArray<uint8_t> workspace = ZeroedWorkspace(ws_bytes);
      const absl::Status s = RouterTopK(dw.get(), c.n_expert, kN, dx.get(), RouterNorm{}, gate, n_tokens, c.k,
                                        dids.get(), dweights.get(), workspace.get(), ws_bytes, stream_);
      ASSERT_TRUE(s.ok()) << s;
      Sync();
      const std::vector<int32_t> ids = dids.Download();
      const std::vector<float> weights = dweights.Download();
      for (int t = 0; t < n_tokens; ++t) {
        std::vector<float> probs = logits[t];
        if (c.sigmoid) {
          for (float& p : probs) p = model::Sigmoid(p);
        } else {
          model::Softmax(probs.data(), c.n_expert);
        }
        std::vector<float> choice(c.n_expert);
        for (int e = 0; e < c.n_expert; ++e) choice[e] = probs[e] + bias[e];
        model::MaskAllButBestGroups(choice.data(), c.n_expert, c.n_group, c.n_group_used,
                                    c.top_two ? model::GroupScore::kTopTwoSum : model::GroupScore::kMax);
        std::vector<int32_t> want(c.k);
        model::TopK(choice.data(), c.n_expert, c.k, want.data());
        double sum = 0;
        for (int j = 0; j < c.k; ++j) sum += probs[want[j]];
        const std::vector<int32_t> got(ids.begin() + t * c.k, ids.begin() + (t + 1) * c.k);
        EXPECT_EQ(got, want) << "token " << t;
        for (int j = 0; j < c.k; ++j) {
          const float want_weight = static_cast<float>(probs[want[j]] / sum * 2.5);
          // The device's expf is within 2 ulp of the CPU's: the weights agree to a few ulp, a wrong choice is off by
          // far more.
          EXPECT_NEAR(weights[t * c.k + j], want_weight, 4e-6f * std::fabs(want_weight)) << "token " << t;
        }
      }
      if (c.n_group == 4) {  // refusals: groups that do not divide the experts, or hold fewer than k
        RouterGate bad = gate;
        bad.n_group = 5;
        EXPECT_THAT(RouterTopK(dw.get(), c.n_expert, kN, dx.get(), RouterNorm{}, bad, n_tokens, c.k, dids.get(),
                               dweights.get(), workspace.get(), ws_bytes, stream_),
                    StatusIsWith(absl::StatusCode::kInvalidArgument, "gate.n_group is 5"));
        bad = gate;
        bad.n_group = 32;
        bad.n_group_used = 1;
        EXPECT_THAT(RouterTopK(dw.get(), c.n_expert, kN, dx.get(), RouterNorm{}, bad, n_tokens, c.k, dids.get(),
                               dweights.get(), workspace.get(), ws_bytes, stream_),
                    StatusIsWith(absl::StatusCode::kInvalidArgument, "gate.n_group_used is 1"));
      }
    }
  }
}

}  // namespace
}  // namespace strata::kernels::cuda
