#include "tests/testing/reference_model.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <memory>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "packtool/convert.h"
#include "packtool/synth.h"
#include "tests/testing/test_util.h"

namespace strata::testing {
namespace {

using ::testing::HasSubstr;
using Model = ReferenceModel;

// Tiny synthetic models, written once per (arch, expert type) into the binary's shared scratch directory
// and kept while it lasts.
class TinyModels {
 public:
  static std::string Gguf(const std::string& arch, gguf::GgmlType expert_type) {
    const std::string path =
        SharedScratchDir().Join(absl::StrCat("reference-model-", arch, "-", static_cast<int>(expert_type), ".gguf"));
    if (std::filesystem::exists(path)) return path;
    packtool::SynthOptions o;
    o.geometry = *packtool::PresetGeometry(arch, "tiny");
    o.dense_type = gguf::GgmlType::kF32;
    o.expert_type = expert_type;
    o.seed = 11;
    o.threads = 2;
    o.output = path;
    const absl::Status s = packtool::SynthesizeGguf(o);
    EXPECT_TRUE(s.ok()) << s;
    return path;
  }
};

// Converts `gguf_path` into a fresh pack directory under `dir`.
std::string Convert(const std::string& gguf_path, kernels::Scheme scheme, const ScratchDir& dir) {
  packtool::ConvertOptions c;
  c.input = gguf_path;
  c.output_dir = dir.Join(absl::StrCat("pack-", std::string(kernels::SchemeName(scheme))));
  c.scheme = scheme;
  c.threads = 2;
  const auto manifest = packtool::ConvertGguf(c, nullptr, nullptr);
  EXPECT_TRUE(manifest.ok()) << manifest.status();
  return c.output_dir;
}

// max |a - b| / max |a|.
double MaxRelDiff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double diff = 0, scale = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    diff = std::max(diff, std::fabs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(a[i])));
  }
  return diff / scale;
}

std::vector<float> Row(const std::vector<float>& logits, int64_t n_vocab, int64_t pos) {
  return std::vector<float>(logits.begin() + pos * n_vocab, logits.begin() + (pos + 1) * n_vocab);
}

const std::vector<int32_t> kPrompt = {72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108, 100, 33, 10};

class ReferenceModelTest : public ::testing::TestWithParam<std::string> {
 protected:
  std::unique_ptr<Model> Load(gguf::GgmlType expert_type = gguf::GgmlType::kF32) {
    auto model = Model::FromGguf(TinyModels::Gguf(GetParam(), expert_type));
    EXPECT_TRUE(model.ok()) << model.status();
    return model.ok() ? std::move(*model) : nullptr;
  }
};

TEST_P(ReferenceModelTest, HyperParametersComeFromMetadata) {
  auto model = Load();
  ASSERT_NE(model, nullptr);
  const packtool::SynthGeometry g = *packtool::PresetGeometry(GetParam(), "tiny");
  const Model::Hparams& hp = model->hparams();
  const std::string& arch = GetParam();
  EXPECT_EQ(hp.arch, arch == "mixtral" ? "llama" : arch);
  EXPECT_EQ(hp.rope_style, arch == "mixtral" ? RopeStyle::kNormal : RopeStyle::kNeox);
  EXPECT_EQ(hp.qk_norm, arch == "qwen3moe");
  EXPECT_EQ(hp.qk_norm_whole, arch == "olmoe");
  EXPECT_EQ(hp.renormalize_top_k, arch != "qwen2moe" && arch != "olmoe");
  EXPECT_EQ(hp.shared_ff, arch == "qwen2moe" || arch == "glm4moe" ? g.shared_ff : 0);
  EXPECT_EQ(hp.qkv_bias, arch == "qwen2moe" || arch == "glm4moe");
  EXPECT_EQ(hp.sigmoid_router, arch == "glm4moe");
  EXPECT_EQ(hp.n_dense_lead, g.n_dense_lead);
  EXPECT_EQ(hp.rope_dim, g.rope_dim == 0 ? g.head_dim : g.rope_dim);
  EXPECT_DOUBLE_EQ(hp.routed_scale, arch == "glm4moe" ? 2.5 : 1.0);
  EXPECT_EQ(hp.n_layer, g.n_layer);
  EXPECT_EQ(hp.n_embd, g.n_embd);
  EXPECT_EQ(hp.n_head, g.n_head);
  EXPECT_EQ(hp.n_head_kv, g.n_head_kv);
  EXPECT_EQ(hp.head_dim, g.head_dim);
  EXPECT_EQ(hp.n_expert, g.n_expert);
  EXPECT_EQ(hp.n_expert_used, g.n_expert_used);
  EXPECT_EQ(hp.expert_ff, g.expert_ff);
  EXPECT_FLOAT_EQ(hp.rope_freq_base, g.rope_freq_base);
  EXPECT_FLOAT_EQ(hp.rms_eps, g.rms_norm_eps);
  EXPECT_GT(model->n_vocab(), 256);
}

TEST_P(ReferenceModelTest, LogitsAreFiniteAndVaryAcrossPositionsAndTokens) {
  auto model = Load();
  ASSERT_NE(model, nullptr);
  const int64_t v = model->n_vocab();
  const std::vector<float> logits = model->Logits(kPrompt);
  ASSERT_EQ(logits.size(), kPrompt.size() * v);
  for (float x : logits) ASSERT_TRUE(std::isfinite(x));
  for (size_t pos = 0; pos < kPrompt.size(); ++pos) {
    const std::vector<float> row = Row(logits, v, pos);
    const auto [lo, hi] = std::minmax_element(row.begin(), row.end());
    EXPECT_GT(*hi - *lo, 1.0f) << "position " << pos;
  }
  // Positions 2 and 3 hold the same token (108) but differ in context and position.
  EXPECT_GT(MaxRelDiff(Row(logits, v, 2), Row(logits, v, 3)), 1e-3);
  EXPECT_GT(MaxRelDiff(Row(logits, v, 0), Row(logits, v, 1)), 1e-3);
  const std::vector<int32_t> other = {73};
  EXPECT_GT(MaxRelDiff(Row(logits, v, 0), model->Logits(other)), 1e-3);
}

TEST_P(ReferenceModelTest, AttentionIsCausal) {
  auto model = Load();
  ASSERT_NE(model, nullptr);
  const int64_t v = model->n_vocab();
  const std::vector<float> full = model->Logits(kPrompt);
  const std::span<const int32_t> prefix(kPrompt.data(), 5);
  const std::vector<float> head = model->Logits(prefix);
  ASSERT_EQ(head.size(), 5 * v);
  EXPECT_TRUE(std::equal(head.begin(), head.end(), full.begin()));
  // Changing the last token changes only the last position.
  std::vector<int32_t> changed = kPrompt;
  changed.back() = 65;
  const std::vector<float> other = model->Logits(changed);
  const size_t last = (kPrompt.size() - 1) * v;
  EXPECT_TRUE(std::equal(other.begin(), other.begin() + last, full.begin()));
  EXPECT_GT(MaxRelDiff(Row(full, v, kPrompt.size() - 1), Row(other, v, kPrompt.size() - 1)), 1e-3);
}

TEST_P(ReferenceModelTest, GreedyContinuationIsNotOneTokenForever) {
  auto model = Load();
  ASSERT_NE(model, nullptr);
  const int64_t v = model->n_vocab();
  std::vector<int32_t> tokens(kPrompt.begin(), kPrompt.begin() + 4);
  std::set<int32_t> generated;
  for (int step = 0; step < 16; ++step) {
    const std::vector<float> logits = model->Logits(tokens);
    ASSERT_EQ(logits.size(), tokens.size() * v);
    const auto last = logits.end() - v;
    const int32_t next = static_cast<int32_t>(std::max_element(last, logits.end()) - last);
    generated.insert(next);
    tokens.push_back(next);
  }
  EXPECT_GE(generated.size(), 3u);
}

TEST_P(ReferenceModelTest, F16PackOfF16ExpertsEqualsTheGguf) {
  // The GGUF's experts are already halves, so converting them to the f16 scheme loses nothing.
  auto model = Load(gguf::GgmlType::kF16);
  ASSERT_NE(model, nullptr);
  ScratchDir dir;
  auto pack = Model::FromPack(Convert(TinyModels::Gguf(GetParam(), gguf::GgmlType::kF16), kernels::Scheme::kF16, dir));
  ASSERT_TRUE(pack.ok()) << pack.status();
  EXPECT_EQ((*pack)->hparams().expert_ff, model->hparams().expert_ff);
  const std::vector<float> expected = model->Logits(kPrompt);
  EXPECT_EQ(MaxRelDiff(expected, (*pack)->Logits(kPrompt)), 0.0);
}

TEST_P(ReferenceModelTest, QuantizedPacksStayCloseToTheF32Model) {
  auto model = Load();
  ASSERT_NE(model, nullptr);
  const std::vector<float> expected = model->Logits(kPrompt);
  ScratchDir dir;
  auto f16 = Model::FromPack(Convert(TinyModels::Gguf(GetParam(), gguf::GgmlType::kF32), kernels::Scheme::kF16, dir));
  ASSERT_TRUE(f16.ok()) << f16.status();
  const double f16_diff = MaxRelDiff(expected, (*f16)->Logits(kPrompt));
  EXPECT_GT(f16_diff, 0.0);  // the experts really come from experts.bin
  EXPECT_LT(f16_diff, 1e-3);
  auto s8 = Model::FromPack(Convert(TinyModels::Gguf(GetParam(), gguf::GgmlType::kF32), kernels::Scheme::kS8, dir));
  ASSERT_TRUE(s8.ok()) << s8.status();
  const double s8_diff = MaxRelDiff(expected, (*s8)->Logits(kPrompt));
  EXPECT_GT(s8_diff, f16_diff);
  EXPECT_LT(s8_diff, 0.05);
}

TEST_P(ReferenceModelTest, ALastLayerExpertChangesExactlyThePositionsRoutedToIt) {
  auto model = Load();
  ASSERT_NE(model, nullptr);
  const int64_t v = model->n_vocab(), last = model->hparams().n_layer - 1;
  std::vector<std::vector<Model::Route>> routes;
  const std::vector<float> before = model->Logits(kPrompt, &routes);
  ASSERT_EQ(routes.size(), static_cast<size_t>(model->hparams().n_layer));
  // Pick an expert of the last layer that some positions use and others do not.
  auto uses = [&](size_t pos, int e) {
    const std::vector<int>& picked = routes[last][pos].experts;
    return std::find(picked.begin(), picked.end(), e) != picked.end();
  };
  int expert = -1;
  size_t users = 0;
  for (int e = 0; e < model->hparams().n_expert && expert < 0; ++e) {
    users = 0;
    for (size_t pos = 0; pos < kPrompt.size(); ++pos) users += uses(pos, e);
    if (users > 0 && users < kPrompt.size()) expert = e;
  }
  ASSERT_GE(expert, 0) << "every expert is used by all positions or none";
  for (float& w : model->mutable_weights().layers[last].experts[expert].down.w) w *= 2.0f;
  const std::vector<float> after = model->Logits(kPrompt);
  for (size_t pos = 0; pos < kPrompt.size(); ++pos) {
    const bool changed = MaxRelDiff(Row(before, v, pos), Row(after, v, pos)) > 0;
    EXPECT_EQ(changed, uses(pos, expert)) << "position " << pos;
  }
}

// Renormalized (qwen3moe, mixtral, glm4moe): the weights sum to 1, times glm4moe's routed scale. Not
// renormalized (qwen2moe, olmoe): they are probabilities of a softmax over more experts than k, so they sum
// to less than 1. Dense blocks (glm4moe's first) route nothing.
TEST_P(ReferenceModelTest, RouteWeightsAreTheTopKProbabilitiesRenormalizedWhereTheArchitectureDoes) {
  auto model = Load();
  ASSERT_NE(model, nullptr);
  std::vector<std::vector<Model::Route>> routes;
  model->Logits(kPrompt, &routes);
  std::set<int> seen;
  for (const auto& layer : routes) {
    for (const Model::Route& r : layer) {
      if (&layer - &routes[0] < model->hparams().n_dense_lead) {
        EXPECT_TRUE(r.experts.empty());
        continue;
      }
      ASSERT_EQ(r.experts.size(), static_cast<size_t>(model->hparams().n_expert_used));
      const double sum = std::accumulate(r.weights.begin(), r.weights.end(), 0.0);
      if (model->hparams().renormalize_top_k) {
        EXPECT_NEAR(sum, model->hparams().routed_scale, 1e-6);
      } else {
        EXPECT_LT(sum, 1.0 - 1e-3);
        EXPECT_GT(sum, 0.0);
      }
      // Picked best first (by score plus the correction bias where there is one, so not checked there).
      if (!model->hparams().sigmoid_router) {
        EXPECT_TRUE(std::is_sorted(r.weights.rbegin(), r.weights.rend()));
      }
      EXPECT_EQ(std::set<int>(r.experts.begin(), r.experts.end()).size(), r.experts.size());
      seen.insert(r.experts.begin(), r.experts.end());
    }
  }
  EXPECT_GT(seen.size(), 2u);  // routing depends on the token
}

// An independent computation of one token's logits. With a single position, attention returns v (softmax
// over one score is 1), so q, k, their norms, biases and RoPE drop out; the router is written as Mixtral's
// softmax over the top-k logits, times the top-k's share of a softmax over all logits where the
// architecture does not renormalize; the shared expert is scaled by 1 / (1 + exp(-gate . h)) where gated.
// glm4moe: a dense FFN in the leading blocks; elsewhere experts picked by 1 / (1 + exp(-logit)) + bias, weighed
// by 1 / (1 + exp(-logit)) over the picked ones' sum, times the routed scale.
std::vector<float> OneTokenByHand(const Model& model, int32_t token) {
  const Model::Hparams& hp = model.hparams();
  const Model::Weights& w = model.weights();
  auto matvec = [](const Model::Matrix& m, const std::vector<float>& x) {
    std::vector<float> y(m.rows, 0.0f);
    for (int64_t r = 0; r < m.rows; ++r) {
      for (int64_t c = 0; c < m.cols; ++c) y[r] += m.w[r * m.cols + c] * x[c];
    }
    return y;
  };
  auto norm = [&](const std::vector<float>& x, const std::vector<float>& g) {
    float ms = 0;
    for (float e : x) ms += e * e / x.size();
    std::vector<float> y(x.size());
    for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] / std::sqrt(ms + static_cast<float>(hp.rms_eps)) * g[i];
    return y;
  };
  std::vector<float> x(w.token_embd.w.begin() + token * hp.n_embd, w.token_embd.w.begin() + (token + 1) * hp.n_embd);
  for (const Model::Layer& layer : w.layers) {
    std::vector<float> v = matvec(layer.wv, norm(x, layer.attn_norm));
    for (size_t i = 0; i < layer.bv.size(); ++i) v[i] += layer.bv[i];
    std::vector<float> attn;
    for (int64_t head = 0; head < hp.n_head; ++head) {
      const int64_t kv = head * hp.n_head_kv / hp.n_head;
      attn.insert(attn.end(), v.begin() + kv * hp.head_dim, v.begin() + (kv + 1) * hp.head_dim);
    }
    const std::vector<float> o = matvec(layer.wo, attn);
    for (int64_t i = 0; i < hp.n_embd; ++i) x[i] += o[i];

    const std::vector<float> h = norm(x, layer.ffn_norm);
    auto ffn = [&](const Model::Expert& ex) {
      const std::vector<float> g = matvec(ex.gate, h), u = matvec(ex.up, h);
      std::vector<float> a(g.size());
      for (size_t i = 0; i < a.size(); ++i) a[i] = g[i] / (1 + std::exp(-g[i])) * u[i];
      return matvec(ex.down, a);
    };
    if (layer.experts.empty()) {  // a dense leading block
      const std::vector<float> d = ffn(layer.dense_ffn);
      for (int64_t i = 0; i < hp.n_embd; ++i) x[i] += d[i];
      continue;
    }
    const std::vector<float> logit = matvec(layer.router, h);
    std::vector<float> rank(logit);
    std::vector<float> sigmoid(logit.size());
    for (size_t e = 0; e < logit.size(); ++e) sigmoid[e] = 1 / (1 + std::exp(-logit[e]));
    if (hp.sigmoid_router) {
      for (size_t e = 0; e < logit.size(); ++e) rank[e] = sigmoid[e] + layer.router_bias[e];
    }
    std::vector<int> order(hp.n_expert);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return rank[a] > rank[b]; });
    order.resize(hp.n_expert_used);
    float denom = 0, all = 0, sigmoid_sum = 0;
    for (int e : order) denom += std::exp(logit[e] - logit[order[0]]);
    for (float l : logit) all += std::exp(l - logit[order[0]]);
    for (int e : order) sigmoid_sum += sigmoid[e];
    const float share = hp.renormalize_top_k ? 1.0f : denom / all;
    for (int e : order) {
      const float weight = hp.sigmoid_router ? sigmoid[e] / sigmoid_sum * static_cast<float>(hp.routed_scale)
                                             : std::exp(logit[e] - logit[order[0]]) / denom * share;
      const std::vector<float> d = ffn(layer.experts[e]);
      for (int64_t i = 0; i < hp.n_embd; ++i) x[i] += weight * d[i];
    }
    if (hp.shared_ff > 0) {
      float gate = 0;
      for (size_t i = 0; i < layer.shared_gate.size(); ++i) gate += layer.shared_gate[i] * h[i];
      const float scale = layer.shared_gate.empty() ? 1.0f : 1 / (1 + std::exp(-gate));
      const std::vector<float> d = ffn(layer.shared);
      for (int64_t i = 0; i < hp.n_embd; ++i) x[i] += d[i] * scale;
    }
  }
  return matvec(w.output, norm(x, w.output_norm));
}

TEST_P(ReferenceModelTest, OneTokenMatchesAnIndependentComputation) {
  auto model = Load();
  ASSERT_NE(model, nullptr);
  for (int32_t token : {0, 104, static_cast<int32_t>(model->n_vocab() - 1)}) {
    const std::vector<int32_t> one = {token};
    EXPECT_LT(MaxRelDiff(OneTokenByHand(*model, token), model->Logits(one)), 1e-4) << "token " << token;
  }
}

TEST_P(ReferenceModelTest, TokensOutsideTheVocabularyGiveNoLogits) {
  auto model = Load();
  ASSERT_NE(model, nullptr);
  const std::vector<int32_t> too_big = {1, static_cast<int32_t>(model->n_vocab())};
  const std::vector<int32_t> negative = {-1};
  EXPECT_TRUE(model->Logits(too_big).empty());
  EXPECT_TRUE(model->Logits(negative).empty());
}

INSTANTIATE_TEST_SUITE_P(Archs, ReferenceModelTest,
                         ::testing::Values("qwen3moe", "mixtral", "qwen2moe", "olmoe", "glm4moe"));

// max over positions >= 1 of the relative change of the logits, and that of position 0.
std::pair<double, double> LaterAndFirstChange(const Model& model, const std::vector<float>& before) {
  const std::vector<float> after = model.Logits(kPrompt);
  const int64_t v = model.n_vocab();
  double later = 0;
  for (size_t pos = 1; pos < kPrompt.size(); ++pos) later = std::max(later, MaxRelDiff(Row(before, v, pos), Row(after, v, pos)));
  return {later, MaxRelDiff(Row(before, v, 0), Row(after, v, 0))};
}

// qwen2moe's q and k biases act through attention scores only, which a single position does not have; the
// v bias reaches every position.
TEST(ReferenceModelArchTest, Qwen2MoeBiasesReachTheLogitsWhereAttentionSaysTheyShould) {
  auto model = Model::FromGguf(TinyModels::Gguf("qwen2moe", gguf::GgmlType::kF32));
  ASSERT_TRUE(model.ok()) << model.status();
  const std::vector<float> before = (*model)->Logits(kPrompt);
  for (auto& layer : (*model)->mutable_weights().layers) std::fill(layer.bq.begin(), layer.bq.end(), 0.0f);
  auto [later, first] = LaterAndFirstChange(**model, before);
  EXPECT_GT(later, 1e-4);
  EXPECT_EQ(first, 0.0);
  const std::vector<float> no_bq = (*model)->Logits(kPrompt);
  for (auto& layer : (*model)->mutable_weights().layers) std::fill(layer.bv.begin(), layer.bv.end(), 0.0f);
  std::tie(later, first) = LaterAndFirstChange(**model, no_bq);
  EXPECT_GT(first, 1e-4);
}

// OLMoE normalizes the whole q projection at once: scaling all of it changes nothing (up to eps), scaling
// one head's rows changes the other heads' share and so the logits. Per-head norms (qwen3moe) would make
// both invisible.
TEST(ReferenceModelArchTest, OlmoeQkNormIsOverTheWholeProjection) {
  auto model = Model::FromGguf(TinyModels::Gguf("olmoe", gguf::GgmlType::kF32));
  ASSERT_TRUE(model.ok()) << model.status();
  const std::vector<float> before = (*model)->Logits(kPrompt);
  Model::Matrix& wq = (*model)->mutable_weights().layers[0].wq;
  for (float& w : wq.w) w *= 3.0f;
  auto [later, first] = LaterAndFirstChange(**model, before);
  EXPECT_LT(later, 1e-4);
  const int64_t head_dim = (*model)->hparams().head_dim;
  for (int64_t i = 0; i < head_dim * wq.cols; ++i) wq.w[i] *= 3.0f;  // head 0 only: 9 times the others
  std::tie(later, first) = LaterAndFirstChange(**model, before);
  EXPECT_GT(later, 1e-3);
  EXPECT_LT(first, 1e-6);  // one position attends to itself only
}

// glm4moe's score-correction bias moves the choice, not the weights: a large bias on one expert makes every
// position pick it, and the weights stay the sigmoid scores renormalized times the routed scale.
TEST(ReferenceModelArchTest, Glm4MoeExpertBiasChoosesButDoesNotWeigh) {
  auto model = Model::FromGguf(TinyModels::Gguf("glm4moe", gguf::GgmlType::kF32));
  ASSERT_TRUE(model.ok()) << model.status();
  const int64_t last = (*model)->hparams().n_layer - 1;
  // synth's own biases already change some choices, so the engine-vs-reference tests see the bias at work.
  std::vector<std::vector<Model::Route>> biased, unbiased;
  (*model)->Logits(kPrompt, &biased);
  const std::vector<float> synth_bias = (*model)->mutable_weights().layers[last].router_bias;
  std::fill((*model)->mutable_weights().layers[last].router_bias.begin(),
            (*model)->mutable_weights().layers[last].router_bias.end(), 0.0f);
  (*model)->Logits(kPrompt, &unbiased);
  int changed = 0;
  for (size_t pos = 0; pos < kPrompt.size(); ++pos) changed += biased[last][pos].experts != unbiased[last][pos].experts;
  EXPECT_GT(changed, 0);
  (*model)->mutable_weights().layers[last].router_bias = synth_bias;
  std::vector<float>& bias = (*model)->mutable_weights().layers[last].router_bias;
  ASSERT_FALSE(bias.empty());
  bias[3] = 10.0f;
  std::vector<std::vector<Model::Route>> routes;
  (*model)->Logits(kPrompt, &routes);
  for (const Model::Route& r : routes[last]) {
    ASSERT_EQ(r.experts[0], 3);
    EXPECT_NEAR(std::accumulate(r.weights.begin(), r.weights.end(), 0.0), 2.5, 1e-5);
    EXPECT_LT(r.weights[0], 2.5 - 1e-3);  // not the bias: 10 would take (almost) all of it
  }
}

TEST(ApplyRopeTest, NormalRotatesAdjacentPairsAndNeoxRotatesHalves) {
  // head_dim 4, base 100, position 2: pair 0 turns by 2 radians, pair 1 by 2 * 100^(-1/2) = 0.2.
  const double a = 2.0, b = 0.2;
  std::vector<float> normal = {1, 2, 3, 4};
  ApplyRope(RopeStyle::kNormal, 100.0, 2, normal);
  EXPECT_NEAR(normal[0], 1 * std::cos(a) - 2 * std::sin(a), 1e-6);
  EXPECT_NEAR(normal[1], 1 * std::sin(a) + 2 * std::cos(a), 1e-6);
  EXPECT_NEAR(normal[2], 3 * std::cos(b) - 4 * std::sin(b), 1e-6);
  EXPECT_NEAR(normal[3], 3 * std::sin(b) + 4 * std::cos(b), 1e-6);
  std::vector<float> neox = {1, 2, 3, 4};
  ApplyRope(RopeStyle::kNeox, 100.0, 2, neox);
  EXPECT_NEAR(neox[0], 1 * std::cos(a) - 3 * std::sin(a), 1e-6);
  EXPECT_NEAR(neox[2], 1 * std::sin(a) + 3 * std::cos(a), 1e-6);
  EXPECT_NEAR(neox[1], 2 * std::cos(b) - 4 * std::sin(b), 1e-6);
  EXPECT_NEAR(neox[3], 2 * std::sin(b) + 4 * std::cos(b), 1e-6);
  std::vector<float> at_zero = {1, 2, 3, 4};
  ApplyRope(RopeStyle::kNeox, 100.0, 0, at_zero);
  EXPECT_EQ(at_zero, (std::vector<float>{1, 2, 3, 4}));
}

TEST(ReferenceModelLoadTest, BadInputsGiveErrorsNamingTheProblem) {
  const std::string gguf = TinyModels::Gguf("qwen3moe", gguf::GgmlType::kF32);
  ScratchDir dir;
  EXPECT_FALSE(Model::FromGguf(dir.Join("missing.gguf")).ok());
  const std::string pack = Convert(gguf, kernels::Scheme::kS8, dir);
  // dense.gguf has no experts.
  EXPECT_THAT(Model::FromGguf(pack + "/dense.gguf").status(),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "ffn_gate_exps"));
  EXPECT_FALSE(Model::FromPack(dir.Join("no-such-pack")).ok());
  // A truncated experts.bin.
  std::vector<uint8_t> experts = ReadFileBytes(pack + "/experts.bin");
  experts.resize(experts.size() - 4096);
  WriteFileBytes(pack + "/experts.bin", experts);
  EXPECT_THAT(Model::FromPack(pack).status(), StatusIsWith(absl::StatusCode::kInvalidArgument, "experts.bin"));
}

}  // namespace
}  // namespace strata::testing
