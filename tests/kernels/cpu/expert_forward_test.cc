#include "kernels/cpu/expert_forward.h"

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/test_util.h"

namespace strata::kernels {
namespace {

constexpr Scheme kAllSchemes[] = {Scheme::kF16, Scheme::kS8, Scheme::kS4, Scheme::kS2};

std::vector<float> Gaussian(int64_t n, float sigma, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.0f, sigma);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// An expert quantized from float weights, kept with its dequantized weights for the float reference.
struct TestExpert {
  std::vector<uint8_t> blob;
  std::vector<float> gate, up, down;  // dequantized, row-major
};

TestExpert MakeExpert(const ExpertLayout& l, std::mt19937& rng) {
  TestExpert e;
  e.blob.assign(ExpertLayoutEnd(l) + 100, 0xCD);
  const float sg = 1.0f / std::sqrt(static_cast<float>(l.n_embd));
  const float sd = 1.0f / std::sqrt(static_cast<float>(l.ff));
  struct Role {
    int64_t rows, cols;
    uint64_t offset;
    float sigma;
    std::vector<float>* deq;
  };
  for (const Role& r : {Role{l.ff, l.n_embd, l.gate_offset, sg, &e.gate}, Role{l.ff, l.n_embd, l.up_offset, sg, &e.up},
                        Role{l.n_embd, l.ff, l.down_offset, sd, &e.down}}) {
    const std::vector<float> w = Gaussian(r.rows * r.cols, r.sigma, rng);
    QuantizeRole(l.scheme, w.data(), r.rows, r.cols, e.blob.data() + r.offset);
    r.deq->resize(r.rows * r.cols);
    DequantizeRole(l.scheme, e.blob.data() + r.offset, r.rows, r.cols, r.deq->data());
  }
  return e;
}

// The SwiGLU expert in double with the dequantized weights and the unquantized activation.
std::vector<double> FloatExpert(const ExpertLayout& l, const TestExpert& e, const std::vector<float>& x) {
  std::vector<double> h(l.ff), out(l.n_embd);
  for (int64_t r = 0; r < l.ff; ++r) {
    double g = 0, u = 0;
    for (int64_t c = 0; c < l.n_embd; ++c) {
      g += double(e.gate[r * l.n_embd + c]) * x[c];
      u += double(e.up[r * l.n_embd + c]) * x[c];
    }
    h[r] = g / (1 + std::exp(-g)) * u;
  }
  for (int64_t r = 0; r < l.n_embd; ++r) {
    for (int64_t c = 0; c < l.ff; ++c) out[r] += double(e.down[r * l.ff + c]) * h[c];
  }
  return out;
}

double RelativeRms(const std::vector<float>& got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  return std::sqrt(num / den);
}

TEST(ExpertLayoutTest, PackedLayout) {
  const ExpertLayout l = PackedExpertLayout(Scheme::kS2, 2560, 640);
  EXPECT_EQ(l.gate_offset, 0u);
  EXPECT_EQ(l.up_offset, 460800u);
  EXPECT_EQ(l.down_offset, 921600u);
  EXPECT_EQ(ExpertLayoutEnd(l), 1382400u);
  EXPECT_EQ(ExpertWeightBytes(l), 1382400u);
  EXPECT_THAT(CheckExpertLayout(l, 1382400), IsOk());
  // Roles are 256-byte aligned when their sizes are not.
  const ExpertLayout odd = PackedExpertLayout(Scheme::kS4, 96, 32);
  EXPECT_EQ(odd.up_offset % 256, 0u);
  EXPECT_GE(odd.up_offset, RoleBytes(Scheme::kS4, 32, 96));
  EXPECT_EQ(odd.down_offset % 256, 0u);
}

TEST(ExpertLayoutTest, CheckRejectsBadLayouts) {
  ExpertLayout l = PackedExpertLayout(Scheme::kS2, 2560, 640);
  EXPECT_THAT(CheckExpertLayout(l, 1382399), StatusIsWith(absl::StatusCode::kInvalidArgument, "down role"));
  l.up_offset = ~uint64_t{0} - 10;
  EXPECT_THAT(CheckExpertLayout(l, 1382400), StatusIsWith(absl::StatusCode::kInvalidArgument, "up role"));
  ExpertLayout bad = PackedExpertLayout(Scheme::kS2, 2560, 640);
  bad.ff = 600;
  EXPECT_THAT(CheckExpertLayout(bad, 1 << 24), StatusIsWith(absl::StatusCode::kInvalidArgument, "gate role"));
}

TEST(ExpertForwardTest, MatchesFloatSwiGlu) {
  std::mt19937 rng(21);
  for (Scheme s : kAllSchemes) {
    const ExpertLayout l = PackedExpertLayout(s, 256, 128);
    const TestExpert e = MakeExpert(l, rng);
    std::vector<std::vector<float>> xf;
    std::vector<QuantizedActivation> xq(3);
    for (int t = 0; t < 3; ++t) {
      xf.push_back(Gaussian(l.n_embd, 1.0f, rng));
      QuantizeActivation(xf[t].data(), l.n_embd, &xq[t]);
    }
    std::vector<std::vector<float>> out(3, std::vector<float>(l.n_embd));
    const QuantizedActivation* xp[] = {&xq[0], &xq[1], &xq[2]};
    float* op[] = {out[0].data(), out[1].data(), out[2].data()};
    ExpertScratch scratch;
    ExpertForward(l, {ExpertJob{e.blob.data(), xp, 3, op}}, nullptr, &scratch);
    for (int t = 0; t < 3; ++t) {
      // f16 computes in f32 throughout; the integer schemes quantize x and h to int8.
      const double err = RelativeRms(out[t], FloatExpert(l, e, xf[t]));
      EXPECT_LT(err, s == Scheme::kF16 ? 1e-5 : 0.03) << SchemeName(s) << " token " << t;
    }
  }
}

TEST(ExpertForwardTest, SameBitsForAnyThreadsBatchingAndTokenGrouping) {
  std::mt19937 rng(22);
  for (Scheme s : kAllSchemes) {
    const ExpertLayout l = PackedExpertLayout(s, 512, 192);
    std::vector<TestExpert> experts;
    for (int j = 0; j < 3; ++j) experts.push_back(MakeExpert(l, rng));
    const int tokens[] = {1, 5, 2};
    std::vector<QuantizedActivation> xq(8);
    for (QuantizedActivation& x : xq) {
      const std::vector<float> xf = Gaussian(l.n_embd, 1.0f, rng);
      QuantizeActivation(xf.data(), l.n_embd, &x);
    }
    // Job j takes tokens starting at 3*j (overlapping sets are fine: activations are read-only).
    std::vector<std::vector<const QuantizedActivation*>> xp(3);
    for (int j = 0; j < 3; ++j) {
      for (int t = 0; t < tokens[j]; ++t) xp[j].push_back(&xq[(3 * j + t) % 8]);
    }
    auto run = [&](ThreadPool* pool, bool batched) {
      std::vector<std::vector<float>> out(8, std::vector<float>(l.n_embd, -1.0f));
      std::vector<std::vector<float*>> op(3);
      int next = 0;
      std::vector<ExpertJob> jobs;
      for (int j = 0; j < 3; ++j) {
        for (int t = 0; t < tokens[j]; ++t) op[j].push_back(out[next++].data());
        jobs.push_back(ExpertJob{experts[j].blob.data(), xp[j].data(), tokens[j], op[j].data()});
      }
      ExpertScratch scratch;
      if (batched) {
        ExpertForward(l, jobs, pool, &scratch);
      } else {
        for (const ExpertJob& job : jobs) ExpertForward(l, {job}, pool, &scratch);
      }
      return out;
    };
    const std::vector<std::vector<float>> base = run(nullptr, false);
    // Token t of a multi-token job equals that token computed alone.
    {
      std::vector<float> alone(l.n_embd);
      float* op[] = {alone.data()};
      const QuantizedActivation* x1[] = {xp[1][3]};
      ExpertScratch scratch;
      ExpertForward(l, {ExpertJob{experts[1].blob.data(), x1, 1, op}}, nullptr, &scratch);
      EXPECT_EQ(alone, base[1 + 3]) << SchemeName(s);
    }
    for (int threads : {1, 2, 3, 5}) {
      std::unique_ptr<ThreadPool> pool = *ThreadPool::Create(threads);
      for (bool batched : {false, true}) {
        EXPECT_EQ(run(pool.get(), batched), base) << SchemeName(s) << " threads " << threads << " batched "
                                                   << batched;
      }
    }
    for (const std::vector<float>& o : base) {
      for (float v : o) ASSERT_TRUE(std::isfinite(v));
    }
  }
}

}  // namespace
}  // namespace strata::kernels
