#include "packtool/synth_router_skew.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/exec/thread_pool.h"
#include "engine/gguf/gguf_file.h"
#include "engine/model/kv_cache.h"
#include "engine/model/model.h"
#include "engine/pack/pack.h"
#include "engine/runtime/model_factory.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "packtool/synth.h"
#include "packtool/synth_values.h"
#include "tests/testing/test_util.h"

namespace strata::packtool {
namespace {

using ::strata::testing::ScratchDir;
using ::testing::HasSubstr;

TEST(RouterSkewLawTest, PickProbabilitiesSumToTheExpertsUsedFallWithRankAndRespectTheCap) {
  for (const double skew : {0.0, 0.18, 0.42, 1.0, 3.0}) {
    const std::vector<double> p = RouterSkewPickProbabilities(512, 10, skew);
    ASSERT_EQ(p.size(), 512u);
    EXPECT_NEAR(std::accumulate(p.begin(), p.end(), 0.0), 10.0, 1e-9) << "skew " << skew;
    for (size_t r = 1; r < p.size(); ++r) EXPECT_LE(p[r], p[r - 1] + 1e-15) << "skew " << skew << " rank " << r;
    EXPECT_LE(p[0], kMaxRouterSkewPickProbability + 1e-12) << "skew " << skew;
  }
  // Zero is uniform; past the cap the hottest ranks are held at it.
  for (double v : RouterSkewPickProbabilities(64, 8, 0)) EXPECT_DOUBLE_EQ(v, 8.0 / 64);
  const std::vector<double> steep = RouterSkewPickProbabilities(512, 10, 3.0);
  EXPECT_DOUBLE_EQ(steep[0], kMaxRouterSkewPickProbability);
  EXPECT_DOUBLE_EQ(steep[1], kMaxRouterSkewPickProbability);
  EXPECT_LT(steep[511], 1e-4);
}

TEST(RouterSkewLawTest, TheFlagHelpsCalibrationHoldsForTheSeedGeometry) {
  // strata-pack synth --help: at top-10 of 512, S 0.18, 0.32 and 0.42 aim at about 2.5x, 5x and 8x.
  EXPECT_NEAR(RouterSkewHottestOverMean(512, 10, 0.18), 2.5, 0.1);
  EXPECT_NEAR(RouterSkewHottestOverMean(512, 10, 0.32), 5.0, 0.2);
  EXPECT_NEAR(RouterSkewHottestOverMean(512, 10, 0.42), 8.0, 0.3);
  // The cap: top-4 of 32 reaches at most 0.45 * 32 / 4 = 3.6.
  EXPECT_NEAR(RouterSkewHottestOverMean(32, 4, 5.0), 3.6, 1e-9);
}

TEST(RouterSkewLawTest, RanksAreASeededPermutation) {
  const std::vector<int64_t> a = RouterSkewRanks(SynthStream(1, "blk.0.ffn_gate_inp.weight"), 64);
  std::vector<int64_t> sorted = a;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int64_t> identity(64);
  std::iota(identity.begin(), identity.end(), 0);
  EXPECT_EQ(sorted, identity);
  EXPECT_NE(a, identity);
  EXPECT_EQ(a, RouterSkewRanks(SynthStream(1, "blk.0.ffn_gate_inp.weight"), 64));
  EXPECT_NE(a, RouterSkewRanks(SynthStream(1, "blk.1.ffn_gate_inp.weight"), 64));
}

TEST(RouterSkewCheckTest, RefusesBadSkewsNamingTheFlag) {
  EXPECT_THAT(CheckRouterSkew("qwen3moe", 8, 2, -0.1),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "--router-skew: -0.1 is out of range"));
  EXPECT_THAT(CheckRouterSkew("qwen3moe", 8, 2, std::numeric_limits<double>::quiet_NaN()),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "--router-skew: nan is out of range"));
  EXPECT_THAT(CheckRouterSkew("qwen3moe", 8, 2, std::numeric_limits<double>::infinity()),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "--router-skew: inf is out of range"));
  EXPECT_THAT(CheckRouterSkew("qwen3moe", 8, 2, 9), StatusIsWith(absl::StatusCode::kInvalidArgument, "expected a number from 0 to 8"));
  for (const char* arch : {"gpt-oss", "deepseek2"}) {
    EXPECT_THAT(CheckRouterSkew(arch, 32, 4, 0.5),
                StatusIsWith(absl::StatusCode::kInvalidArgument,
                             absl::StrCat("--router-skew: architecture ", arch, " is not supported")));
    EXPECT_THAT(CheckRouterSkew(arch, 32, 4, 0), IsOk()) << arch;
  }
  EXPECT_THAT(CheckRouterSkew("mixtral", 8, 4, 0.5),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "--router-skew: needs --experts-used (4) below 0.45"));
  for (const char* arch : {"qwen3moe", "mixtral", "qwen2moe", "olmoe", "glm4moe"}) {
    EXPECT_THAT(CheckRouterSkew(arch, 8, 2, 0.5), IsOk()) << arch;
  }
}

TEST(RouterSkewCheckTest, SynthesisRefusesAnUnsupportedArchitectureBeforeWriting) {
  ScratchDir dir;
  SynthOptions o;
  o.geometry = *PresetGeometry("deepseek2", "tiny");
  o.router_skew = 0.3;
  o.output = dir.Join("pack");
  EXPECT_THAT(SynthesizePack(o, nullptr, nullptr).status(),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "--router-skew: architecture deepseek2"));
  o.output = dir.Join("model.gguf");
  EXPECT_THAT(SynthesizeGguf(o), StatusIsWith(absl::StatusCode::kInvalidArgument, "architecture deepseek2"));
  EXPECT_FALSE(std::filesystem::exists(dir.Join("pack")));
  EXPECT_FALSE(std::filesystem::exists(dir.Join("model.gguf")));
}

// The f32 values of tensor `name` of a GGUF file.
std::vector<float> TensorValues(const gguf::GgufFile& file, const std::string& name) {
  const gguf::TensorInfo* t = file.FindTensor(name);
  EXPECT_NE(t, nullptr) << name;
  if (t == nullptr) return {};
  EXPECT_EQ(t->type, gguf::GgmlType::kF32) << name;
  std::vector<float> v(static_cast<size_t>(t->n_elements()));
  std::memcpy(v.data(), t->data, v.size() * sizeof(float));
  return v;
}

SynthOptions SkewPackOptions(const std::string& arch, const std::string& out, double skew) {
  SynthOptions o;
  o.geometry = *PresetGeometry(arch, "tiny");
  o.geometry.n_expert = 32;
  o.geometry.n_expert_used = 2;
  o.geometry.n_vocab = 4096;  // random token ids over many embeddings: router inputs of random direction
  o.pack_scheme = kernels::Scheme::kS4;
  o.exact_quantize = false;  // the fast path the seed pack is made with
  o.router_skew = skew;
  o.output = out;
  o.threads = 2;
  return o;
}

TEST(RouterSkewSynthTest, OnlyTheRouterChangesAndItsRowNormsFollowTheRanks) {
  ScratchDir dir;
  const SynthOptions plain = SkewPackOptions("qwen3moe", dir.Join("plain"), 0);
  SynthOptions skewed = SkewPackOptions("qwen3moe", dir.Join("skewed"), 0.75);
  ASSERT_THAT(SynthesizePack(plain, nullptr, nullptr).status(), IsOk());
  ASSERT_THAT(SynthesizePack(skewed, nullptr, nullptr).status(), IsOk());
  EXPECT_EQ(strata::testing::ReadFileBytes(plain.output + "/experts.bin"),
            strata::testing::ReadFileBytes(skewed.output + "/experts.bin"));
  auto a = gguf::GgufFile::Open(plain.output + "/dense.gguf");
  auto b = gguf::GgufFile::Open(skewed.output + "/dense.gguf");
  ASSERT_THAT(a.status(), IsOk());
  ASSERT_THAT(b.status(), IsOk());
  ASSERT_EQ((*a)->tensors().size(), (*b)->tensors().size());
  int routers = 0;
  for (const gguf::TensorInfo& t : (*a)->tensors()) {
    const gguf::TensorInfo* other = (*b)->FindTensor(t.name);
    ASSERT_NE(other, nullptr) << t.name;
    const bool same = t.bytes == other->bytes && std::memcmp(t.data, other->data, t.bytes) == 0;
    if (t.name.find("ffn_gate_inp.weight") == std::string::npos) {
      EXPECT_TRUE(same) << t.name;
      continue;
    }
    ++routers;
    EXPECT_FALSE(same) << t.name;
    // Each row keeps its direction; its norm follows its expert's rank: hotter, longer.
    const std::vector<float> x = TensorValues(**a, t.name), y = TensorValues(**b, t.name);
    const int64_t n_embd = skewed.geometry.n_embd;
    const std::vector<int64_t> rank = RouterSkewRanks(SynthStream(skewed.seed, t.name), 32);
    std::vector<double> norm_by_rank(32);
    for (int64_t e = 0; e < 32; ++e) {
      double xy = 0, xx = 0, yy = 0;
      for (int64_t i = 0; i < n_embd; ++i) {
        xy += double{x[e * n_embd + i]} * y[e * n_embd + i];
        xx += double{x[e * n_embd + i]} * x[e * n_embd + i];
        yy += double{y[e * n_embd + i]} * y[e * n_embd + i];
      }
      EXPECT_NEAR(xy / std::sqrt(xx * yy), 1.0, 1e-6) << t.name << " expert " << e;
      norm_by_rank[static_cast<size_t>(rank[e])] = std::sqrt(yy);
    }
    for (size_t r = 1; r < 32; ++r) EXPECT_LT(norm_by_rank[r], norm_by_rank[r - 1]) << t.name << " rank " << r;
  }
  EXPECT_EQ(routers, 2);
  EXPECT_EQ(RecordedRouterSkew((*a)->metadata()), 0);
  EXPECT_FALSE((*a)->metadata().Has(kRouterSkewKey));
  EXPECT_FLOAT_EQ(RecordedRouterSkew((*b)->metadata()), 0.75f);
}

TEST(RouterSkewSynthTest, TheGgufAndThePackGetTheSameRouter) {
  ScratchDir dir;
  SynthOptions gguf_options = SkewPackOptions("mixtral", dir.Join("model.gguf"), 0.5);
  const SynthOptions pack_options = SkewPackOptions("mixtral", dir.Join("pack"), 0.5);
  ASSERT_THAT(SynthesizeGguf(gguf_options), IsOk());
  ASSERT_THAT(SynthesizePack(pack_options, nullptr, nullptr).status(), IsOk());
  auto a = gguf::GgufFile::Open(gguf_options.output);
  auto b = gguf::GgufFile::Open(pack_options.output + "/dense.gguf");
  ASSERT_THAT(a.status(), IsOk());
  ASSERT_THAT(b.status(), IsOk());
  EXPECT_EQ(TensorValues(**a, "blk.1.ffn_gate_inp.weight"), TensorValues(**b, "blk.1.ffn_gate_inp.weight"));
}

TEST(RouterSkewSynthTest, TheScoreBiasGlm4moesRouterAddsBeforePickingIsZerosUnderASkew) {
  ScratchDir dir;
  const SynthOptions plain = SkewPackOptions("glm4moe", dir.Join("plain"), 0);
  const SynthOptions skewed = SkewPackOptions("glm4moe", dir.Join("skewed"), 0.5);
  ASSERT_THAT(SynthesizePack(plain, nullptr, nullptr).status(), IsOk());
  ASSERT_THAT(SynthesizePack(skewed, nullptr, nullptr).status(), IsOk());
  auto a = gguf::GgufFile::Open(plain.output + "/dense.gguf");
  auto b = gguf::GgufFile::Open(skewed.output + "/dense.gguf");
  ASSERT_THAT(a.status(), IsOk());
  ASSERT_THAT(b.status(), IsOk());
  const std::vector<float> random = TensorValues(**a, "blk.1.exp_probs_b.bias");
  const std::vector<float> zeros = TensorValues(**b, "blk.1.exp_probs_b.bias");
  EXPECT_EQ(zeros, std::vector<float>(32, 0.0f));
  EXPECT_NE(random, zeros);
  EXPECT_TRUE(IsRouterPickBias("blk.1.exp_probs_b.bias"));
  EXPECT_FALSE(IsRouterPickBias("blk.1.attn_q.bias"));
}

// What the CPU engine's router picks over `sequences` sequences of `length` random token ids (uniform over
// the vocabulary): counts[MoE layer][expert], and each MoE layer's block.
struct Routing {
  std::vector<std::vector<uint64_t>> counts;
  std::vector<int64_t> blocks;
};
Routing MeasureRouting(const std::string& pack_dir, int sequences, int length) {
  Routing routing;
  std::vector<std::vector<uint64_t>>& counts = routing.counts;
  auto pack = pack::Pack::Open(pack_dir, {.ignore_routing_profile = true});
  EXPECT_THAT(pack.status(), IsOk());
  if (!pack.ok()) return {};
  auto pool = exec::ThreadPool::Create(2);
  EXPECT_THAT(pool.status(), IsOk());
  if (!pool.ok()) return {};
  runtime::DeviceOptions device;
  device.device = "cpu";
  auto loaded = runtime::LoadModel(**pack, device, {}, {}, pool->get(), nullptr);
  EXPECT_THAT(loaded.status(), IsOk());
  if (!loaded.ok()) return {};
  model::Model& model = *loaded->model;
  const model::ModelConfig& c = model.config();
  const pack::v1::Geometry& g = (*pack)->manifest().geometry();
  const model::KvShape shape = model::CacheShape(c, length);  // the whole sequence is one step
  model::KvCachePool kv_pool(shape, model::KvCachePool::BytesFor(shape, length), model.backend().kv_memory());
  counts.assign(g.moe_layers_size(), std::vector<uint64_t>(g.n_expert()));
  routing.blocks.assign(g.moe_layers().begin(), g.moe_layers().end());
  std::mt19937 rng(5);
  std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(c.n_vocab) - 1);
  std::vector<float> logits(static_cast<size_t>(c.n_vocab));
  for (int s = 0; s < sequences; ++s) {
    auto cache = kv_pool.Allocate(length);
    EXPECT_THAT(cache.status(), IsOk());
    if (!cache.ok()) return {};
    std::vector<model::ForwardToken> batch;
    for (int i = 0; i < length; ++i) batch.push_back({token(rng), i, cache->get(), i + 1 == length});
    const absl::Status forward = model.Forward(batch, logits.data(), nullptr);
    EXPECT_THAT(forward, IsOk());
    if (!forward.ok()) return {};
    for (int l = 0; l < g.moe_layers_size(); ++l) {
      const int32_t* ids = model.backend().routing(g.moe_layers(l));
      for (int i = 0; i < length * static_cast<int>(g.n_expert_used()); ++i) ++counts[l][ids[i]];
    }
  }
  return routing;
}

double HottestOverMean(const std::vector<uint64_t>& counts) {
  const double mean = std::accumulate(counts.begin(), counts.end(), 0.0) / static_cast<double>(counts.size());
  return static_cast<double>(*std::max_element(counts.begin(), counts.end())) / mean;
}

// The engine's routing over 4096 random tokens (8192 picks over 32 experts: 256 an expert on average).
// The bounds: for skew 0, the random rows' own spread of norms and the sampling noise (measured 1.4-1.5);
// for a skew, the law's ratio (5.24 at 0.75, 2.60 at 0.4; measured within 5% of it) give or take that noise.
struct RoutingCase {
  std::string arch;
  double skew;
  double min_ratio, max_ratio;  // measured hottest over mean, each MoE layer
};

class RouterSkewRoutingTest : public ::testing::TestWithParam<RoutingCase> {};

TEST_P(RouterSkewRoutingTest, TheEnginesRoutingHasTheSkewAimedAt) {
  const RoutingCase& c = GetParam();
  ScratchDir dir;
  const SynthOptions o = SkewPackOptions(c.arch, dir.Join("pack"), c.skew);
  ASSERT_THAT(SynthesizePack(o, nullptr, nullptr).status(), IsOk());
  const Routing routing = MeasureRouting(o.output, 64, 64);
  const std::vector<std::vector<uint64_t>>& counts = routing.counts;
  ASSERT_EQ(counts.size(), static_cast<size_t>(o.geometry.n_layer - o.geometry.n_dense_lead));
  const double aimed = RouterSkewHottestOverMean(32, 2, c.skew);
  for (size_t l = 0; l < counts.size(); ++l) {
    const double ratio = HottestOverMean(counts[l]);
    EXPECT_GE(ratio, c.min_ratio) << "moe layer " << l << ", law " << aimed;
    EXPECT_LE(ratio, c.max_ratio) << "moe layer " << l << ", law " << aimed;
    if (c.skew == 0) continue;
    // The most picked expert is one the law makes hot (rank 0 or 1).
    const std::vector<int64_t> rank =
        RouterSkewRanks(SynthStream(o.seed, "blk." + std::to_string(routing.blocks[l]) + ".ffn_gate_inp.weight"), 32);
    const size_t hottest = std::max_element(counts[l].begin(), counts[l].end()) - counts[l].begin();
    EXPECT_LE(rank[hottest], 1) << "moe layer " << l;
  }
}

INSTANTIATE_TEST_SUITE_P(Architectures, RouterSkewRoutingTest,
                         ::testing::Values(RoutingCase{"qwen3moe", 0.0, 1.0, 1.7}, RoutingCase{"qwen3moe", 0.75, 4.0, 6.5},
                                           RoutingCase{"mixtral", 0.0, 1.0, 1.7}, RoutingCase{"mixtral", 0.4, 2.0, 3.2},
                                           RoutingCase{"qwen2moe", 0.75, 4.0, 6.5}, RoutingCase{"olmoe", 0.75, 4.0, 6.5},
                                           RoutingCase{"glm4moe", 0.75, 4.0, 6.5}),
                         [](const auto& info) {
                           std::string arch = info.param.arch;
                           std::replace(arch.begin(), arch.end(), '-', '_');  // a test name's characters
                           return arch + "_skew" + std::to_string(static_cast<int>(info.param.skew * 100));
                         });

}  // namespace
}  // namespace strata::packtool
