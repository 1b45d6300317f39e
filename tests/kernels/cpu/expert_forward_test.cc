#include "kernels/cpu/expert_forward.h"

#include <cmath>
#include <cstring>
#include <utility>
#include <algorithm>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/test_util.h"

namespace strata::kernels {
namespace {

constexpr Scheme kAllSchemes[] = {Scheme::kF16, Scheme::kS8, Scheme::kS4, Scheme::kS2, Scheme::kMxfp4};

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

ExpertLayout Layout(Scheme s, int64_t n_embd, int64_t ff) { return *ComputeExpertLayout(s, n_embd, ff); }

TestExpert MakeExpert(const ExpertLayout& l, std::mt19937& rng) {
  TestExpert e;
  e.blob.assign(l.blob_bytes + 100, 0xCD);
  const float sg = 1.0f / std::sqrt(static_cast<float>(l.n_embd));
  const float sd = 1.0f / std::sqrt(static_cast<float>(l.expert_ff));
  struct Role {
    int64_t rows, cols;
    uint64_t offset;
    float sigma;
    std::vector<float>* deq;
  };
  for (const Role& r : {Role{l.expert_ff, l.n_embd, l.role_offset[kGate], sg, &e.gate},
                        Role{l.expert_ff, l.n_embd, l.role_offset[kUp], sg, &e.up},
                        Role{l.n_embd, l.expert_ff, l.role_offset[kDown], sd, &e.down}}) {
    const std::vector<float> w = Gaussian(r.rows * r.cols, r.sigma, rng);
    QuantizeRole(l.scheme, w.data(), r.rows, r.cols, e.blob.data() + r.offset);
    r.deq->resize(r.rows * r.cols);
    DequantizeRole(l.scheme, e.blob.data() + r.offset, r.rows, r.cols, r.deq->data());
  }
  return e;
}

// The SwiGLU expert in double with the dequantized weights and the unquantized activation.
std::vector<double> FloatExpert(const ExpertLayout& l, const TestExpert& e, const std::vector<float>& x) {
  const int64_t ff = l.expert_ff;
  std::vector<double> h(ff), out(l.n_embd);
  for (int64_t r = 0; r < ff; ++r) {
    double g = 0, u = 0;
    for (int64_t c = 0; c < l.n_embd; ++c) {
      g += double(e.gate[r * l.n_embd + c]) * x[c];
      u += double(e.up[r * l.n_embd + c]) * x[c];
    }
    h[r] = g / (1 + std::exp(-g)) * u;
  }
  for (int64_t r = 0; r < l.n_embd; ++r) {
    for (int64_t c = 0; c < ff; ++c) out[r] += double(e.down[r * ff + c]) * h[c];
  }
  return out;
}

// Runs both phases of `jobs`, cutting each role's rows into pieces of `gate_rows` (a multiple of 32) and
// `down_rows` (a multiple of 16).
void RunJobs(const ExpertLayout& l, const std::vector<ExpertJob>& jobs, int64_t gate_rows, int64_t down_rows,
             ExpertWork* work) {
  work->Prepare(l, jobs);
  for (size_t j = 0; j < jobs.size(); ++j) {
    for (int64_t r = 0; r < l.expert_ff; r += gate_rows) work->GateUpRows(j, r, std::min(l.expert_ff, r + gate_rows));
  }
  for (size_t j = 0; j < jobs.size(); ++j) {
    for (int64_t r = 0; r < l.n_embd; r += down_rows) work->DownRows(j, r, std::min(l.n_embd, r + down_rows));
  }
}

double RelativeRms(const std::vector<float>& got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  return std::sqrt(num / den);
}

TEST(ExpertForwardTest, MatchesFloatSwiGlu) {
  std::mt19937 rng(21);
  for (Scheme s : kAllSchemes) {
    const ExpertLayout l = Layout(s, 256, 128);
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
    ExpertWork work;
    RunJobs(l, {ExpertJob{e.blob.data(), xp, 3, op}}, l.expert_ff, l.n_embd, &work);
    for (int t = 0; t < 3; ++t) {
      // f16 computes in f32 throughout; the integer schemes quantize x and h to int8.
      const double err = RelativeRms(out[t], FloatExpert(l, e, xf[t]));
      EXPECT_LT(err, s == Scheme::kF16 ? 1e-5 : 0.03) << SchemeName(s) << " token " << t;
    }
  }
}

TEST(ExpertForwardTest, SameBitsForAnyRowSplitBatchingAndTokenGrouping) {
  std::mt19937 rng(22);
  for (Scheme s : kAllSchemes) {
    const ExpertLayout l = Layout(s, 512, 192);
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
    auto run = [&](int64_t gate_rows, int64_t down_rows, bool batched) {
      std::vector<std::vector<float>> out(8, std::vector<float>(l.n_embd, -1.0f));
      std::vector<std::vector<float*>> op(3);
      int next = 0;
      std::vector<ExpertJob> jobs;
      for (int j = 0; j < 3; ++j) {
        for (int t = 0; t < tokens[j]; ++t) op[j].push_back(out[next++].data());
        jobs.push_back(ExpertJob{experts[j].blob.data(), xp[j].data(), tokens[j], op[j].data()});
      }
      ExpertWork work;
      if (batched) {
        RunJobs(l, jobs, gate_rows, down_rows, &work);
      } else {
        for (const ExpertJob& job : jobs) RunJobs(l, {job}, gate_rows, down_rows, &work);
      }
      return out;
    };
    const std::vector<std::vector<float>> base = run(l.expert_ff, l.n_embd, false);
    // Token t of a multi-token job equals that token computed alone.
    {
      std::vector<float> alone(l.n_embd);
      float* op[] = {alone.data()};
      const QuantizedActivation* x1[] = {xp[1][3]};
      ExpertWork work;
      RunJobs(l, {ExpertJob{experts[1].blob.data(), x1, 1, op}}, l.expert_ff, l.n_embd, &work);
      EXPECT_EQ(alone, base[1 + 3]) << SchemeName(s);
    }
    for (const auto& [gate_rows, down_rows] : {std::pair<int64_t, int64_t>{32, 16}, {64, 48}, {96, 512}}) {
      for (bool batched : {false, true}) {
        EXPECT_EQ(run(gate_rows, down_rows, batched), base)
            << SchemeName(s) << " rows " << gate_rows << "/" << down_rows << " batched " << batched;
      }
    }
    for (const std::vector<float>& o : base) {
      for (float v : o) ASSERT_TRUE(std::isfinite(v));
    }
  }
}

}  // namespace
}  // namespace strata::kernels

namespace strata::kernels {
namespace {

// gpt-oss's clamped SwiGLU at values worked out by hand: g' = min(g, 7), u' = clamp(u, -7, 7),
// g' sigmoid(1.702 g') (u' + 1).
TEST(ExpertGluTest, ClampedSwiGluClampsGateAboveAndUpBothSides) {
  EXPECT_NEAR(ExpertGlu(ExpertActivation::kClampedSwiGlu, 1.0f, 1.0f), 1.69159, 1e-5);
  EXPECT_NEAR(ExpertGlu(ExpertActivation::kClampedSwiGlu, 10.0f, 0.0f), 6.99995, 1e-5);   // gate clamped to 7
  EXPECT_NEAR(ExpertGlu(ExpertActivation::kClampedSwiGlu, 1.0f, -10.0f), -5.07477, 1e-5); // up clamped to -7
  EXPECT_NEAR(ExpertGlu(ExpertActivation::kClampedSwiGlu, 2.0f, 9.0f), 15.48527, 1e-4);   // up clamped to 7
  EXPECT_NEAR(ExpertGlu(ExpertActivation::kClampedSwiGlu, -10.0f, 2.0f), -1.21739e-6, 1e-9);  // not below
  EXPECT_NEAR(ExpertGlu(ExpertActivation::kSwiGlu, 1.0f, 2.0f), 2.0 / (1.0 + std::exp(-1.0)), 1e-6);
}

// An f16 expert with biases wide enough to pass the clamp, its rows cut in pieces, against the same
// expert in double: the biases land on the right rows of each piece.
TEST(ExpertGluTest, BiasedClampedExpertMatchesItsFloatForm) {
  std::mt19937 rng(23);
  const ExpertLayout l = Layout(Scheme::kF16, 256, 128);
  const TestExpert e = MakeExpert(l, rng);
  const std::vector<float> gate_bias = Gaussian(l.expert_ff, 4.0f, rng), up_bias = Gaussian(l.expert_ff, 4.0f, rng);
  const std::vector<float> down_bias = Gaussian(l.n_embd, 1.0f, rng);
  const std::vector<float> xf = Gaussian(l.n_embd, 1.0f, rng);
  QuantizedActivation xq;
  QuantizeActivation(xf.data(), l.n_embd, &xq);
  std::vector<double> want(l.n_embd, 0.0), h(l.expert_ff);
  int clamped = 0;
  for (int64_t r = 0; r < l.expert_ff; ++r) {
    double g = gate_bias[r], u = up_bias[r];
    for (int64_t c = 0; c < l.n_embd; ++c) {
      g += double(e.gate[r * l.n_embd + c]) * xf[c];
      u += double(e.up[r * l.n_embd + c]) * xf[c];
    }
    clamped += g > 7 || std::abs(u) > 7;
    const double gc = std::min(g, 7.0), uc = std::clamp(u, -7.0, 7.0);
    h[r] = gc / (1 + std::exp(-1.702 * gc)) * (uc + 1);
  }
  for (int64_t r = 0; r < l.n_embd; ++r) {
    want[r] = down_bias[r];
    for (int64_t c = 0; c < l.expert_ff; ++c) want[r] += double(e.down[r * l.expert_ff + c]) * h[c];
  }
  ASSERT_GE(clamped, 3);  // the clamp is exercised
  std::vector<float> out(l.n_embd);
  const QuantizedActivation* xp[] = {&xq};
  float* op[] = {out.data()};
  ExpertJob job{e.blob.data(), xp, 1, op, gate_bias.data(), up_bias.data(), down_bias.data()};
  ExpertWork work;
  work.Prepare(l, {&job, 1}, ExpertActivation::kClampedSwiGlu);
  for (int64_t r = 0; r < l.expert_ff; r += 32) work.GateUpRows(0, r, r + 32);
  for (int64_t r = 0; r < l.n_embd; r += 16) work.DownRows(0, r, r + 16);
  EXPECT_LT(RelativeRms(out, want), 1e-5);
}

}  // namespace
}  // namespace strata::kernels
