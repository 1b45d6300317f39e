// The small dense blocks of qwen2moe, olmoe, glm4moe and gpt-oss on the GPU (kernels/cuda/dense_blocks.cu)
// and the router's other gatings (RouterGate, gpt-oss's softmax over the chosen k included), against the CPU
// code they must reproduce: engine/model's ops and the CPU backend's router written out here. Outputs start
// poisoned, with guard bands around every buffer.

#include <numeric>

#include "tests/kernels/cuda/dense_test_support.h"

namespace strata::kernels::cuda {
namespace {

using namespace dense_test;  // the shared helpers of this test binary

constexpr float kEps = 1e-5f;

bool AllPoison(const std::vector<float>& v) { return std::all_of(v.begin(), v.end(), IsPoison); }

// ---------------------------------------------------------------------------------------------------------
// AddRowBias (gpt-oss's attention output bias): the CPU's float sums, bit for bit, and nothing past the rows.

TEST_F(DenseKernelsTest, AddRowBiasAddsTheBiasToEveryRow) {
  for (int64_t n : {int64_t{2880}, int64_t{128}, int64_t{7}}) {
    for (int n_tokens : {0, 1, 300}) {
      const uint64_t seed = NextSeed();
      SCOPED_TRACE(absl::StrCat("n ", n, " tokens ", n_tokens, " seed ", seed));
      Random rng(seed);
      const std::vector<float> x = RandomFloats(static_cast<size_t>(n_tokens) * n, -2.0f, 2.0f, rng);
      const std::vector<float> bias = RandomFloats(n, -0.5f, 0.5f, rng);
      DeviceArray<float> dx(x.size()), dbias(bias.size());
      dx.Upload(x);
      dbias.Upload(bias);
      ASSERT_TRUE(AddRowBias(dx.get(), dbias.get(), n, n_tokens, stream_).ok());
      Sync();
      std::vector<float> want = x;
      for (int t = 0; t < n_tokens; ++t) model::AddBias(&want[t * n], bias.data(), n);
      EXPECT_EQ(dx.Download(), want);
      ExpectGuards(dx, "x");
    }
  }
  DeviceArray<float> x(8);
  EXPECT_THAT(AddRowBias(x.get(), nullptr, 8, 1, stream_), StatusIsWith(absl::StatusCode::kInvalidArgument, "bias"));
  EXPECT_THAT(AddRowBias(x.get(), x.get(), 0, 1, stream_), StatusIsWith(absl::StatusCode::kInvalidArgument, "n is 0"));
}

// ---------------------------------------------------------------------------------------------------------
// QkvBiasAndNorm.

struct QkvCase {
  int64_t q_dim, kv_dim;
  bool bias, whole_norm;
};

TEST_F(DenseKernelsTest, QkvBiasAndNormMatchesTheCpu) {
  const QkvCase cases[] = {
      {2048, 2048, false, true},   // OLMoE
      {2048, 256, true, false},    // Qwen1.5-MoE
      {12288, 1024, true, false},  // GLM-4.5
      {96, 32, true, true},        // both, rows shorter than the block
      {72, 24, true, true},
  };
  for (const QkvCase& c : cases) {
    for (int n_tokens : {1, 5, 300}) {
      const uint64_t seed = NextSeed();
      SCOPED_TRACE(absl::StrCat("q_dim ", c.q_dim, " kv_dim ", c.kv_dim, " bias ", c.bias, " whole norm ", c.whole_norm,
                                " tokens ", n_tokens, " seed ", seed));
      Random rng(seed);
      const std::vector<float> q = RandomFloats(n_tokens * c.q_dim, -2.0f, 2.0f, rng);
      const std::vector<float> k = RandomFloats(n_tokens * c.kv_dim, -2.0f, 2.0f, rng);
      const std::vector<float> v = RandomFloats(n_tokens * c.kv_dim, -2.0f, 2.0f, rng);
      const std::vector<float> bq = RandomFloats(c.q_dim, -0.5f, 0.5f, rng);
      const std::vector<float> bk = RandomFloats(c.kv_dim, -0.5f, 0.5f, rng);
      const std::vector<float> bv = RandomFloats(c.kv_dim, -0.5f, 0.5f, rng);
      const std::vector<float> qn = RandomFloats(c.q_dim, 0.5f, 1.5f, rng);
      const std::vector<float> kn = RandomFloats(c.kv_dim, 0.5f, 1.5f, rng);
      DeviceArray<float> dq(q.size()), dk(k.size()), dv(v.size()), dbq(bq.size()), dbk(bk.size()), dbv(bv.size()),
          dqn(qn.size()), dkn(kn.size());
      dq.Upload(q);
      dk.Upload(k);
      dv.Upload(v);
      dbq.Upload(bq);
      dbk.Upload(bk);
      dbv.Upload(bv);
      dqn.Upload(qn);
      dkn.Upload(kn);
      const absl::Status s =
          QkvBiasAndNorm(dq.get(), dk.get(), dv.get(), n_tokens, c.q_dim, c.kv_dim, c.bias ? dbq.get() : nullptr,
                         c.bias ? dbk.get() : nullptr, c.bias ? dbv.get() : nullptr, c.whole_norm ? dqn.get() : nullptr,
                         c.whole_norm ? dkn.get() : nullptr, kEps, stream_);
      ASSERT_TRUE(s.ok()) << s;
      Sync();
      // The CPU backend's order: the three biases, then the norms over the whole rows.
      std::vector<float> want_q = q, want_k = k, want_v = v;
      for (int t = 0; t < n_tokens; ++t) {
        float* qt = &want_q[t * c.q_dim];
        float* kt = &want_k[t * c.kv_dim];
        if (c.bias) {
          model::AddBias(qt, bq.data(), c.q_dim);
          model::AddBias(kt, bk.data(), c.kv_dim);
          model::AddBias(&want_v[t * c.kv_dim], bv.data(), c.kv_dim);
        }
        if (c.whole_norm) {
          model::RmsNorm(qt, qn.data(), c.q_dim, kEps, qt);
          model::RmsNorm(kt, kn.data(), c.kv_dim, kEps, kt);
        }
      }
      // A bias alone is the same float sum; a norm may differ by an ulp (a double sum in another order).
      const double tol = c.whole_norm ? 2e-7 : 0.0;
      ExpectRows(dq.Download(), want_q, n_tokens, c.q_dim, c.q_dim, tol, "q");
      ExpectRows(dk.Download(), want_k, n_tokens, c.kv_dim, c.kv_dim, tol, "k");
      EXPECT_EQ(dv.Download(), want_v) << "v";
      for (const DeviceArray<float>* a : {&dq, &dk, &dv}) ExpectGuards(*a, "q, k or v");
    }
  }
}

TEST_F(DenseKernelsTest, QkvBiasAndNormRejectsBadArguments) {
  DeviceArray<float> q(64), k(64), v(64), norm(64);
  EXPECT_THAT(
      QkvBiasAndNorm(q.get(), k.get(), v.get(), 1, 0, 64, nullptr, nullptr, nullptr, nullptr, nullptr, kEps, stream_),
      StatusIsWith(absl::StatusCode::kInvalidArgument, "q_dim is 0"));
  EXPECT_THAT(
      QkvBiasAndNorm(q.get(), k.get(), nullptr, 1, 64, 64, nullptr, nullptr, nullptr, nullptr, nullptr, kEps, stream_),
      StatusIsWith(absl::StatusCode::kInvalidArgument, "v is null"));
  EXPECT_THAT(QkvBiasAndNorm(q.get(), k.get(), v.get(), 1, 64, 64, nullptr, nullptr, nullptr, norm.get(), nullptr, kEps,
                             stream_),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "q_norm and k_norm must both be given"));
  Sync();
  EXPECT_TRUE(AllPoison(q.Download())) << "a refused call enqueued work";
}

// Partial RoPE is QkNormRopeStore's rope_dim (tested against the CPU with the attention kernels); its bounds:
TEST_F(DenseKernelsTest, QkNormRopeStoreRejectsAnOddOrTooLargeRopeDim) {
  DeviceArray<float> q(256), k(256), v(256);
  DeviceArray<TokenSlot> slots(1);
  DeviceArray<double> freq(64);
  for (int rope_dim : {0, 33, 130}) {
    EXPECT_THAT(QkNormRopeStore(q.get(), k.get(), v.get(), slots.get(), 1, 0, 2, 2, 64, rope_dim, nullptr, nullptr,
                                kEps, freq.get(), 1.0f, 1, stream_),
                StatusIsWith(absl::StatusCode::kInvalidArgument, absl::StrCat("rope_dim is ", rope_dim)));
  }
}

// ---------------------------------------------------------------------------------------------------------
// SwiGlu.

TEST_F(DenseKernelsTest, SwiGluMatchesTheCpuWithAndWithoutTheSharedExpertGate) {
  constexpr int64_t kN = 2048;
  for (int64_t ff : {int64_t{128}, int64_t{5632}, int64_t{100}}) {
    for (int n_tokens : {1, 9, 64}) {
      for (bool gated : {false, true}) {
        for (bool in_place : {false, true}) {
          const uint64_t seed = NextSeed();
          SCOPED_TRACE(
              absl::StrCat("ff ", ff, " tokens ", n_tokens, " gated ", gated, " in place ", in_place, " seed ", seed));
          Random rng(seed);
          const std::vector<float> gate = RandomFloats(n_tokens * ff, -6.0f, 6.0f, rng);
          const std::vector<float> up = RandomFloats(n_tokens * ff, -2.0f, 2.0f, rng);
          const std::vector<float> gate_inp = RandomFloats(kN, -0.05f, 0.05f, rng);
          const std::vector<float> h = RandomFloats(n_tokens * kN, -2.0f, 2.0f, rng);
          DeviceArray<float> dgate(gate.size()), dup(up.size()), dgi(kN), dh(h.size()), dout(gate.size());
          dgate.Upload(gate);
          dup.Upload(up);
          dgi.Upload(gate_inp);
          dh.Upload(h);
          float* out = in_place ? dgate.get() : dout.get();
          const absl::Status s =
              SwiGlu(dgate.get(), dup.get(), ff, n_tokens, gated ? dgi.get() : nullptr, dh.get(), kN, out, stream_);
          ASSERT_TRUE(s.ok()) << s;
          Sync();
          std::vector<float> want(gate.size());
          model::SwiGlu(gate.data(), up.data(), n_tokens * ff, want.data());
          if (gated) {
            for (int t = 0; t < n_tokens; ++t) {
              const float scale = model::Sigmoid(model::Dot(gate_inp.data(), &h[t * kN], kN));
              for (int64_t i = 0; i < ff; ++i) want[t * ff + i] *= scale;
            }
          }
          // expf on the device and the host may differ by an ulp or two.
          ExpectRows((in_place ? dgate : dout).Download(), want, n_tokens, ff, ff, 1e-6, "out");
          ExpectGuards(dgate, "gate");
          ExpectGuards(dout, "out");
          if (in_place) {
            EXPECT_TRUE(AllPoison(dout.Download())) << "out was written";
          }
        }
      }
    }
  }
}

TEST_F(DenseKernelsTest, SwiGluRejectsBadArguments) {
  DeviceArray<float> a(64), b(64), out(64);
  EXPECT_THAT(SwiGlu(a.get(), b.get(), 0, 1, nullptr, nullptr, 0, out.get(), stream_),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "ff is 0"));
  EXPECT_THAT(SwiGlu(a.get(), b.get(), 64, 1, a.get(), nullptr, 64, out.get(), stream_),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "h (with a gate_inp) is null"));
  EXPECT_THAT(SwiGlu(a.get(), nullptr, 64, 1, nullptr, nullptr, 0, out.get(), stream_),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "up is null"));
}

// ---------------------------------------------------------------------------------------------------------
// RouterTopK with another RouterGate.

struct GateCase {
  std::string name;
  int n_expert;
  int64_t n;
  int k;
  bool sigmoid, bias, renorm;
  float scale;
};

struct GatedInputs {
  std::vector<float> w, x, bias;
  std::vector<float> norm, h;  // with a norm: its weight and the CPU's normed rows
  std::vector<int32_t> ids;
  std::vector<float> weights;
};

// The CPU backend's router (CpuDenseBackend::Router) for one token's logits.
void CpuGatedRouter(const GateCase& c, std::vector<float> probs, const std::vector<float>& bias, int32_t* ids,
                    float* weights, std::vector<float>* choice) {
  if (c.sigmoid) {
    for (float& p : probs) p = model::Sigmoid(p);
  } else {
    model::Softmax(probs.data(), c.n_expert);
  }
  *choice = probs;
  if (c.bias) {
    for (int e = 0; e < c.n_expert; ++e) (*choice)[e] = probs[e] + bias[e];
  }
  model::TopK(choice->data(), c.n_expert, c.k, ids);
  double sum = 1.0;
  if (c.renorm) {
    sum = 0;
    for (int j = 0; j < c.k; ++j) sum += probs[ids[j]];
  }
  for (int j = 0; j < c.k; ++j) weights[j] = static_cast<float>(probs[ids[j]] / sum * c.scale);
}

// Random inputs whose top k + 1 choice values are at least 1e-5 apart (probs near 1/n_expert for a softmax:
// checked on the logits, 1e-4 apart, as the default router's test does).
GatedInputs MakeGatedInputs(const GateCase& c, int n_tokens, bool with_norm, Random& rng) {
  GatedInputs in;
  const float w_scale = 2.0f / std::sqrt(static_cast<float>(c.n));
  in.w = RandomFloats(static_cast<size_t>(c.n_expert) * c.n, -w_scale, w_scale, rng);
  in.bias = RandomFloats(c.n_expert, -0.1f, 0.1f, rng);
  if (with_norm) in.norm = RandomFloats(c.n, 0.5f, 1.5f, rng);
  in.x.resize(static_cast<size_t>(n_tokens) * c.n);
  in.h.resize(with_norm ? in.x.size() : 0);
  in.ids.resize(static_cast<size_t>(n_tokens) * c.k);
  in.weights.resize(in.ids.size());
  std::vector<float> logits(c.n_expert), choice;
  for (int t = 0; t < n_tokens; ++t) {
    float* xt = &in.x[t * c.n];
    for (int attempt = 0;; ++attempt) {
      if (attempt == 1000) throw std::runtime_error("no router input without near-ties");
      for (int64_t i = 0; i < c.n; ++i) xt[i] = rng.Uniform(-1.0f, 1.0f);
      const float* ht = xt;
      if (with_norm) {
        model::RmsNorm(xt, in.norm.data(), c.n, kEps, &in.h[t * c.n]);
        ht = &in.h[t * c.n];
      }
      DenseGemvReference(DenseType::kF32, reinterpret_cast<const uint8_t*>(in.w.data()), c.n, 0, c.n_expert, ht, c.n, 1,
                         logits.data(), c.n_expert);
      CpuGatedRouter(c, logits, in.bias, &in.ids[t * c.k], &in.weights[t * c.k], &choice);
      const bool on_logits = !c.sigmoid && !c.bias;
      std::vector<float> sorted = on_logits ? logits : choice;
      std::sort(sorted.begin(), sorted.end(), std::greater<float>());
      bool separated = true;
      for (int j = 0; j + 1 < std::min(c.k + 1, c.n_expert); ++j) {
        separated &= sorted[j] - sorted[j + 1] >= (on_logits ? 1e-4f : 1e-5f);
      }
      if (separated) break;
    }
  }
  return in;
}

TEST_F(DenseKernelsTest, RouterTopKGatesLikeTheCpu) {
  const GateCase cases[] = {
      {"glm4moe", 128, 4096, 8, true, true, true, 2.5f},
      {"qwen2moe", 60, 2048, 4, false, false, false, 1.0f},
      {"olmoe", 64, 2048, 8, false, false, false, 1.0f},
      {"sigmoid unbiased, not renormalised, scaled", 40, 256, 6, true, false, false, 16.0f},
      {"softmax with a bias", 256, 512, 32, false, true, true, 1.0f},
      {"one expert", 3, 64, 1, true, true, true, 0.5f},
  };
  for (const GateCase& c : cases) {
    const int kMostTokens = 300;
    const size_t ws_bytes = RouterWorkspaceBytes(kMostTokens, c.n_expert);
    DeviceArray<uint8_t> workspace(ws_bytes);
    Check(cudaMemset(workspace.get(), 0, ws_bytes), "memset");
    for (int n_tokens : {1, 8, 9, 300}) {
      for (bool with_norm : {false, true}) {  // the fused norm (a decode step) or none (a prompt normed before)
        const uint64_t seed = NextSeed();
        SCOPED_TRACE(absl::StrCat(c.name, ": ", c.n_expert, " experts, n ", c.n, ", k ", c.k, ", ", n_tokens,
                                  " tokens, ", with_norm ? "normed" : "no norm", ", seed ", seed));
        Random rng(seed);
        const GatedInputs in = MakeGatedInputs(c, n_tokens, with_norm, rng);
        DeviceArray<float> dw(in.w.size()), dx(in.x.size()), dbias(in.bias.size()), dweights(in.weights.size()),
            dnorm(c.n), dh(in.x.size());
        DeviceArray<int32_t> dids(in.ids.size());
        dw.Upload(in.w);
        dx.Upload(in.x);
        dbias.Upload(in.bias);
        RouterNorm norm;
        if (with_norm) {
          dnorm.Upload(in.norm);
          norm = RouterNorm{dnorm.get(), kEps, dh.get()};
        }
        RouterGate gate;
        gate.sigmoid = c.sigmoid;
        gate.choice_bias = c.bias ? dbias.get() : nullptr;
        gate.renorm = c.renorm;
        gate.scale = c.scale;
        ASSERT_FALSE(gate.plain());
        const absl::Status s = RouterTopK(dw.get(), c.n_expert, c.n, dx.get(), norm, gate, n_tokens, c.k, dids.get(),
                                          dweights.get(), workspace.get(), ws_bytes, stream_);
        ASSERT_TRUE(s.ok()) << s;
        Sync();
        EXPECT_EQ(dids.Download(), in.ids);
        const std::vector<float> weights = dweights.Download();
        int wrong = 0;
        for (size_t i = 0; i < weights.size(); ++i) {
          const float bound = 2e-6f * std::max(1.0f, std::fabs(in.weights[i]));
          if (!(std::fabs(weights[i] - in.weights[i]) <= bound) && ++wrong <= 5) {
            ADD_FAILURE() << "weight " << i << " is " << weights[i] << ", the CPU's " << in.weights[i];
          }
        }
        EXPECT_EQ(wrong, 0);
        if (!c.renorm && !c.sigmoid && c.k < c.n_expert) {
          // Softmax probs not renormalised: the k chosen ones sum to less than 1 (times the scale).
          for (int t = 0; t < n_tokens; ++t) {
            EXPECT_LT(std::accumulate(&weights[t * c.k], &weights[t * c.k] + c.k, 0.0), c.scale) << "token " << t;
          }
        }
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
  RouterGate bad;
  bad.scale = INFINITY;
  EXPECT_THAT(RouterTopK(w.get(), 8, 64, x.get(), RouterNorm{}, bad, 1, 2, ids.get(), weights.get(), workspace.get(),
                         RouterWorkspaceBytes(1, 8), stream_),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "gate.scale is inf, not a finite number"));
}

// gpt-oss's router (CpuDenseBackend::Router with kSoftmaxTopK): logits plus ffn_gate_inp.bias, the k largest
// of them, a softmax over those k alone, times the routed scale.
void CpuSoftmaxTopKRouter(std::vector<float> logits, const std::vector<float>& bias, int k, float scale,
                          int32_t* ids, float* weights) {
  const int n_expert = static_cast<int>(logits.size());
  model::AddBias(logits.data(), bias.data(), n_expert);
  model::TopK(logits.data(), n_expert, k, ids);
  for (int j = 0; j < k; ++j) weights[j] = logits[ids[j]];
  model::Softmax(weights, k);
  for (int j = 0; j < k; ++j) weights[j] *= scale;
}

TEST_F(DenseKernelsTest, RouterTopKSoftmaxOverTheChosenLikeTheCpu) {
  struct Case {
    const char* name;
    int n_expert;
    int64_t n;
    int k;
    float scale;
  };
  const Case cases[] = {
      {"gpt-oss-120b", 128, 2880, 4, 1.0f},
      {"gpt-oss-20b", 32, 2880, 4, 1.0f},
      {"tiny pack", 8, 128, 2, 1.0f},
      {"k of 32, scaled", 256, 512, 32, 2.5f},
      {"one expert", 3, 64, 1, 1.0f},
  };
  for (const Case& c : cases) {
    const int kMostTokens = 300;
    const size_t ws_bytes = RouterWorkspaceBytes(kMostTokens, c.n_expert);
    DeviceArray<uint8_t> workspace(ws_bytes);
    Check(cudaMemset(workspace.get(), 0, ws_bytes), "memset");
    for (int n_tokens : {1, 8, 9, 300}) {
      for (bool with_norm : {false, true}) {
        const uint64_t seed = NextSeed();
        SCOPED_TRACE(absl::StrCat(c.name, ": ", c.n_expert, " experts, n ", c.n, ", k ", c.k, ", ", n_tokens,
                                  " tokens, ", with_norm ? "normed" : "no norm", ", seed ", seed));
        Random rng(seed);
        const float w_scale = 2.0f / std::sqrt(static_cast<float>(c.n));
        const std::vector<float> w = RandomFloats(static_cast<size_t>(c.n_expert) * c.n, -w_scale, w_scale, rng);
        // A bias large enough to change the choice.
        const std::vector<float> bias = RandomFloats(c.n_expert, -1.0f, 1.0f, rng);
        const std::vector<float> norm_weight = RandomFloats(c.n, 0.5f, 1.5f, rng);
        std::vector<float> x(static_cast<size_t>(n_tokens) * c.n), h(with_norm ? x.size() : 0);
        std::vector<int32_t> ids(static_cast<size_t>(n_tokens) * c.k);
        std::vector<float> weights(ids.size()), logits(c.n_expert);
        for (int t = 0; t < n_tokens; ++t) {
          float* xt = &x[t * c.n];
          // Inputs whose k + 1 largest biased logits are at least 1e-4 apart (the GPU sums in another order).
          for (int attempt = 0;; ++attempt) {
            ASSERT_LT(attempt, 1000) << "no router input without near-ties";
            for (int64_t i = 0; i < c.n; ++i) xt[i] = rng.Uniform(-1.0f, 1.0f);
            const float* ht = xt;
            if (with_norm) {
              model::RmsNorm(xt, norm_weight.data(), c.n, kEps, &h[t * c.n]);
              ht = &h[t * c.n];
            }
            DenseGemvReference(DenseType::kF32, reinterpret_cast<const uint8_t*>(w.data()), c.n, 0, c.n_expert, ht,
                               c.n, 1, logits.data(), c.n_expert);
            std::vector<float> sorted = logits;
            for (int e = 0; e < c.n_expert; ++e) sorted[e] += bias[e];
            std::sort(sorted.begin(), sorted.end(), std::greater<float>());
            bool separated = true;
            for (int j = 0; j + 1 < std::min(c.k + 1, c.n_expert); ++j) separated &= sorted[j] - sorted[j + 1] >= 1e-4f;
            if (separated) break;
          }
          CpuSoftmaxTopKRouter(logits, bias, c.k, c.scale, &ids[t * c.k], &weights[t * c.k]);
        }
        DeviceArray<float> dw(w.size()), dx(x.size()), dbias(bias.size()), dweights(weights.size()), dnorm(c.n),
            dh(x.size());
        DeviceArray<int32_t> dids(ids.size());
        dw.Upload(w);
        dx.Upload(x);
        dbias.Upload(bias);
        RouterNorm norm;
        if (with_norm) {
          dnorm.Upload(norm_weight);
          norm = RouterNorm{dnorm.get(), kEps, dh.get()};
        }
        RouterGate gate;
        gate.softmax_top_k = true;
        gate.logit_bias = dbias.get();
        gate.scale = c.scale;
        ASSERT_FALSE(gate.plain());
        const absl::Status s = RouterTopK(dw.get(), c.n_expert, c.n, dx.get(), norm, gate, n_tokens, c.k, dids.get(),
                                          dweights.get(), workspace.get(), ws_bytes, stream_);
        ASSERT_TRUE(s.ok()) << s;
        Sync();
        EXPECT_EQ(dids.Download(), ids);
        const std::vector<float> got = dweights.Download();
        int wrong = 0;
        for (size_t i = 0; i < got.size(); ++i) {
          // exp of logits that differ from the CPU's by float rounding.
          const float bound = 2e-5f * std::max(1.0f, std::fabs(weights[i]));
          if (!(std::fabs(got[i] - weights[i]) <= bound) && ++wrong <= 5) {
            ADD_FAILURE() << "weight " << i << " is " << got[i] << ", the CPU's " << weights[i];
          }
        }
        EXPECT_EQ(wrong, 0);
        // The k weights of a token are a softmax: they sum to the scale.
        for (int t = 0; t < n_tokens; ++t) {
          EXPECT_NEAR(std::accumulate(&got[t * c.k], &got[t * c.k] + c.k, 0.0), c.scale, 1e-5 * c.scale)
              << "token " << t;
        }
        if (with_norm) ExpectRows(dh.Download(), h, n_tokens, c.n, c.n, 2e-7, "h");
        ExpectGuards(dids, "ids");
        ExpectGuards(dweights, "weights");
        ExpectGuards(workspace, "workspace");
      }
    }
  }
}

// The logit bias moves the choice and the weights alike: a large bias on the experts with the lowest logits
// makes them the choice, weighed by the softmax of their biased logits.
// One token routed among 16 experts whose logits are (e - 8) * 0.5, with a bias of 10 on expert 0 and 9 on
// expert 1 given to `gate` by set_bias (as its logit or choice bias): the chosen ids and their weights.
struct Routed {
  std::vector<int32_t> ids;
  std::vector<float> weights;
};
template <typename SetBias>
Routed RouteOneBiasedToken(RouterGate gate, SetBias set_bias, cudaStream_t stream) {
  constexpr int kExperts = 16, kN = 64, kK = 2;
  std::vector<float> w(kExperts * kN, 0.0f);
  for (int e = 0; e < kExperts; ++e) {
    for (int i = 0; i < kN; ++i) w[e * kN + i] = (e - 8) * 0.5f;  // logit (e - 8) * 0.5 for x = 1 / kN
  }
  std::vector<float> x(kN, 1.0f / kN), bias(kExperts, 0.0f);
  bias[0] = 10.0f;
  bias[1] = 9.0f;
  DeviceArray<float> dw(w.size()), dx(x.size()), dbias(bias.size()), dweights(kK);
  DeviceArray<int32_t> dids(kK);
  dw.Upload(w);
  dx.Upload(x);
  dbias.Upload(bias);
  const size_t ws_bytes = RouterWorkspaceBytes(1, kExperts);
  DeviceArray<uint8_t> workspace(ws_bytes);
  Check(cudaMemset(workspace.get(), 0, ws_bytes), "memset");
  set_bias(gate, dbias.get());
  const absl::Status s = RouterTopK(dw.get(), kExperts, kN, dx.get(), RouterNorm{}, gate, 1, kK, dids.get(),
                                    dweights.get(), workspace.get(), ws_bytes, stream);
  EXPECT_TRUE(s.ok()) << s;
  Check(cudaStreamSynchronize(stream), "sync");
  return {dids.Download(), dweights.Download()};
}

// gpt-oss's router: the logit bias moves the logits, then a softmax over the two chosen: biased logits 6 and 5.5.
TEST_F(DenseKernelsTest, RouterTopKLogitBiasChoosesAndWeighs) {
  RouterGate gate;
  gate.softmax_top_k = true;
  const Routed r = RouteOneBiasedToken(gate, [](RouterGate& g, const float* bias) { g.logit_bias = bias; }, stream_);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{0, 1}));
  ASSERT_EQ(r.weights.size(), 2u);
  EXPECT_NEAR(r.weights[0], 1.0 / (1.0 + std::exp(-0.5)), 1e-6);
  EXPECT_NEAR(r.weights[1], 1.0 / (1.0 + std::exp(0.5)), 1e-6);
}

// The score-correction bias moves the choice and not the weights: a large bias on the experts with the
// lowest logits makes them the choice, with their small unbiased sigmoid scores as weights.
TEST_F(DenseKernelsTest, RouterTopKChoiceBiasChoosesButDoesNotWeigh) {
  RouterGate gate;
  gate.sigmoid = true;
  gate.renorm = false;
  gate.scale = 2.0f;
  const Routed r = RouteOneBiasedToken(gate, [](RouterGate& g, const float* bias) { g.choice_bias = bias; }, stream_);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{0, 1}));
  ASSERT_EQ(r.weights.size(), 2u);
  EXPECT_NEAR(r.weights[0], 2.0 / (1.0 + std::exp(4.0)), 1e-6);
  EXPECT_NEAR(r.weights[1], 2.0 / (1.0 + std::exp(3.5)), 1e-6);
}

}  // namespace
}  // namespace strata::kernels::cuda
