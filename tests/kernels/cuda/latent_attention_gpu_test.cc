// Latent attention's kernels (kernels/cuda/latent_attention.h) against references written here: each kernel
// alone (the norm and RoPE through engine/model/ops.h, the CPU's own; the products and the softmax in double),
// and the four in a chain against the naive form of DeepSeek-V2's attention (keys and values rebuilt per head
// from the latents, arXiv 2405.04434 eq. 9-11), which the absorbed form must equal. Shapes: DeepSeek-V3's
// (128 heads, nope 128, rope 64, v 128, rank 512), the synth presets' (4 heads, 32/16/32, rank 64; 8 heads,
// 64/32/64, 128), 12 heads (not a whole block of 16) and rank 1024 (the largest); decode at positions across
// tiles and splits, mixed batches and a prompt chunk. Poison and guard checks as dense_kernels_gpu_test.cc.

#include <cmath>
#include <numeric>

#include "kernels/cuda/latent_attention.h"
#include "tests/kernels/cuda/dense_test_support.h"

namespace strata::kernels::cuda {
namespace {

using namespace dense_test;  // the shared helpers of this test binary

struct Shape {
  const char* name;
  LatentShape s;
};

const Shape kShapes[] = {
    {"deepseek-v3", {128, 128, 64, 128, 512}},
    {"tiny", {4, 32, 16, 32, 64}},
    {"small", {8, 64, 32, 64, 128}},
    {"12 heads", {12, 48, 16, 40, 96}},
    {"rank 1024", {6, 64, 64, 48, 1024}},  // the largest rank: two 512-rank blocks of sums a thread
};

constexpr int kLayers = 2;
constexpr int kLayer = 1;  // the layer the tests use; layer 0 stays poisoned

// A sequence's latent cache: [layer][capacity][rank + rope], host mirror and device copy, poisoned except where
// filled.
struct LatentCache {
  LatentCache(int64_t capacity, int64_t key_dim)
      : capacity(capacity),
        key_dim(key_dim),
        keys(static_cast<size_t>(kLayers) * capacity * key_dim, PoisonFloat()),
        d_keys(keys.size()) {}
  float* key(int64_t pos) { return &keys[(kLayer * capacity + pos) * key_dim]; }
  void Fill(int64_t n, Random& rng) {
    for (int64_t p = 0; p < n; ++p) {
      for (int64_t i = 0; i < key_dim; ++i) key(p)[i] = rng.Uniform(-1.0f, 1.0f);
    }
  }
  TokenSlot Slot(int pos) const { return TokenSlot{d_keys.get(), d_keys.get(), capacity, pos, 0}; }
  int64_t capacity;
  int64_t key_dim;
  std::vector<float> keys;
  DeviceArray<float> d_keys;
};

struct BatchToken {
  int seq;
  int pos;
};

// The tokens' slots on the device.
DeviceArray<TokenSlot> Slots(const std::vector<LatentCache*>& caches, const std::vector<BatchToken>& batch) {
  std::vector<TokenSlot> slots;
  for (const BatchToken& b : batch) slots.push_back(caches[b.seq]->Slot(b.pos));
  DeviceArray<TokenSlot> d(slots.size(), false);
  d.Upload(slots);
  return d;
}

int PositionsBound(const std::vector<BatchToken>& batch) {
  int most = 0;
  for (const BatchToken& b : batch) most = std::max(most, b.pos + 1);
  int bound = 256;
  while (bound < most) bound *= 2;
  return bound;
}

// The matrix widened as the CPU does, row-major floats.
std::vector<float> Widened(DenseType type, const std::vector<uint8_t>& m, int64_t rows, int64_t cols) {
  std::vector<float> out(static_cast<size_t>(rows * cols));
  ParallelFor(rows, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const std::vector<float> f = WidenRow(type, m.data() + r * DenseRowBytes(type, cols), cols);
      std::copy(f.begin(), f.end(), out.begin() + r * cols);
    }
  });
  return out;
}

// The device cache against the mirror: poison where the mirror has it, elsewhere within `tol` relative.
void ExpectCache(const LatentCache& c, double tol) {
  const std::vector<float> got = c.d_keys.Download();
  int failures = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const float want = c.keys[i];
    const double error = std::fabs(static_cast<double>(got[i]) - want);
    const bool ok = IsPoison(want) ? IsPoison(got[i]) : error <= tol * std::max(1.0f, std::fabs(want));
    if (!ok && ++failures <= 5) {
      ADD_FAILURE() << "cache element " << i << " (position " << i / c.key_dim % c.capacity << " of layer "
                    << i / c.key_dim / c.capacity << "): " << got[i] << ", expected " << want;
    }
  }
  EXPECT_EQ(failures, 0);
  ExpectGuards(c.d_keys, "cache");
}

class LatentAttentionTest : public DenseKernelsTest {};

TEST_F(LatentAttentionTest, RopeStoreNormsTheLatentAndRotatesTheRopeValues) {
  for (const Shape& shape : kShapes) {
    for (int style : {0, 1}) {
      SCOPED_TRACE(::testing::Message() << shape.name << " style " << style);
      const LatentShape& s = shape.s;
      Random rng(NextSeed());
      LatentCache a(64, s.key_dim()), b(64, s.key_dim());
      const std::vector<BatchToken> batch = {{0, 0}, {1, 17}, {0, 5}, {1, 63}};
      const int n = static_cast<int>(batch.size());
      const int64_t head_width = s.nope_dim + s.rope_dim;
      std::vector<float> q = RandomFloats(static_cast<size_t>(n) * s.q_dim(), -1.0f, 1.0f, rng);
      const std::vector<float> kv = RandomFloats(static_cast<size_t>(n) * s.key_dim(), -2.0f, 2.0f, rng);
      const std::vector<float> norm = RandomFloats(s.rank, 0.5f, 1.5f, rng);
      const std::vector<double> freq = model::RopeFrequencies(s.rope_dim, 10000.0f);
      DeviceArray<float> d_q(q.size()), d_kv(kv.size()), d_norm(norm.size());
      DeviceArray<double> d_freq(freq.size());
      d_q.Upload(q);
      d_kv.Upload(kv);
      d_norm.Upload(norm);
      d_freq.Upload(freq);
      std::vector<LatentCache*> caches = {&a, &b};
      const DeviceArray<TokenSlot> slots = Slots(caches, batch);
      constexpr float kMagnitude = 1.25f;
      ASSERT_TRUE(LatentRopeStore(d_q.get(), d_kv.get(), slots.get(), n, kLayer, s, d_norm.get(), 1e-6f, d_freq.get(),
                                  kMagnitude, style, stream_)
                      .ok());
      Sync();
      const auto rope_style = style == 1 ? model::RopeStyle::kNeox : model::RopeStyle::kNormal;
      std::vector<float> cos(s.rope_dim / 2), sin(s.rope_dim / 2);
      for (int t = 0; t < n; ++t) {
        model::RopeAngles(freq, batch[t].pos, cos.data(), sin.data(), kMagnitude);
        float* want = caches[batch[t].seq]->key(batch[t].pos);
        model::RmsNorm(kv.data() + t * s.key_dim(), norm.data(), s.rank, 1e-6f, want);
        std::copy_n(kv.data() + t * s.key_dim() + s.rank, s.rope_dim, want + s.rank);
        model::Rope(want + s.rank, s.rope_dim, cos.data(), sin.data(), rope_style);
        for (int h = 0; h < s.n_head; ++h) {
          model::Rope(q.data() + (t * s.n_head + h) * head_width + s.nope_dim, s.rope_dim, cos.data(), sin.data(),
                      rope_style);
        }
      }
      // Rotations are the CPU's operations; the norm's double sum may round differently in its last bit.
      ExpectRows(d_q.Download(), q, n * s.n_head, head_width, head_width, 1e-7, "q");
      for (LatentCache* c : caches) ExpectCache(*c, 1e-6);  // untouched positions stay poisoned
      ExpectGuards(d_q, "q");
    }
  }
}

TEST_F(LatentAttentionTest, QueryAbsorbAndValueProjectAreTheHeadsProducts) {
  for (const Shape& shape : kShapes) {
    for (DenseType type : kAllTypes) {
      SCOPED_TRACE(::testing::Message() << shape.name << " " << DenseTypeName(type));
      const LatentShape& s = shape.s;
      const int64_t per_head = s.nope_dim + s.v_dim, head_width = s.nope_dim + s.rope_dim;
      const std::vector<uint8_t> kv_b = RandomMatrix(type, s.n_head * per_head, s.rank, NextSeed());
      const std::vector<float> w = Widened(type, kv_b, s.n_head * per_head, s.rank);
      DeviceArray<uint8_t> d_kv_b(kv_b.size(), false);
      d_kv_b.Upload(kv_b);
      for (int n : {1, 3, 19}) {
        Random rng(NextSeed());
        const std::vector<float> q = RandomFloats(static_cast<size_t>(n) * s.q_dim(), -1.0f, 1.0f, rng);
        const std::vector<float> latent = RandomFloats(static_cast<size_t>(n) * s.n_head * s.rank, -1.0f, 1.0f, rng);
        DeviceArray<float> d_q(q.size()), d_latent(latent.size());
        DeviceArray<float> d_q_latent(static_cast<size_t>(n) * s.n_head * s.key_dim());
        DeviceArray<float> d_out(static_cast<size_t>(n) * s.n_head * s.v_dim);
        d_q.Upload(q);
        d_latent.Upload(latent);
        ASSERT_TRUE(LatentQueryAbsorb(type, d_kv_b.get(), d_q.get(), n, s, d_q_latent.get(), stream_).ok());
        ASSERT_TRUE(LatentValueProject(type, d_kv_b.get(), d_latent.get(), n, s, d_out.get(), stream_).ok());
        Sync();
        std::vector<float> want_q(d_q_latent.size()), want_out(d_out.size());
        ParallelFor(s.n_head, [&](int64_t h0, int64_t h1) {
          for (int64_t h = h0; h < h1; ++h) {
            for (int t = 0; t < n; ++t) {
              const float* qh = q.data() + (t * s.n_head + h) * head_width;
              std::vector<double> sum(s.rank, 0.0);
              for (int d = 0; d < s.nope_dim; ++d) {
                const float* wr = w.data() + (h * per_head + d) * s.rank;
                for (int r = 0; r < s.rank; ++r) sum[r] += static_cast<double>(wr[r]) * qh[d];
              }
              float* out_q = want_q.data() + (t * s.n_head + h) * s.key_dim();
              for (int r = 0; r < s.rank; ++r) out_q[r] = static_cast<float>(sum[r]);
              std::copy_n(qh + s.nope_dim, s.rope_dim, out_q + s.rank);
              const float* lh = latent.data() + (t * s.n_head + h) * s.rank;
              for (int d = 0; d < s.v_dim; ++d) {
                const float* wr = w.data() + (h * per_head + s.nope_dim + d) * s.rank;
                double dot = 0;
                for (int r = 0; r < s.rank; ++r) dot += static_cast<double>(wr[r]) * lh[r];
                want_out[(t * s.n_head + h) * s.v_dim + d] = static_cast<float>(dot);
              }
            }
          }
        });
        ExpectRows(d_q_latent.Download(), want_q, n * s.n_head, s.key_dim(), s.key_dim(), 1e-5, "q_latent");
        ExpectRows(d_out.Download(), want_out, n * s.n_head, s.v_dim, s.v_dim, 1e-5, "out");
        ExpectGuards(d_q_latent, "q_latent");
        ExpectGuards(d_out, "out");
      }
    }
  }
}

// softmax_p(scale * q . cache(p)) over p <= pos, times cache(p)[0, rank), in double.
std::vector<float> ReferenceLatent(const LatentShape& s, const std::vector<float>& q_latent,
                                   const std::vector<LatentCache*>& caches, const std::vector<BatchToken>& batch,
                                   float scale) {
  const int n = static_cast<int>(batch.size());
  std::vector<float> out(static_cast<size_t>(n) * s.n_head * s.rank);
  ParallelFor(static_cast<int64_t>(n) * s.n_head, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const int t = static_cast<int>(i / s.n_head);
      const float* q = q_latent.data() + i * s.key_dim();
      LatentCache& c = *caches[batch[t].seq];
      const int positions = batch[t].pos + 1;
      std::vector<double> score(positions);
      double most = -INFINITY;
      for (int p = 0; p < positions; ++p) {
        double dot = 0;
        for (int j = 0; j < s.key_dim(); ++j) dot += static_cast<double>(q[j]) * c.key(p)[j];
        score[p] = dot * scale;
        most = std::max(most, score[p]);
      }
      double total = 0;
      for (double& v : score) total += (v = std::exp(v - most));
      std::vector<double> sum(s.rank, 0.0);
      for (int p = 0; p < positions; ++p) {
        for (int r = 0; r < s.rank; ++r) sum[r] += score[p] / total * c.key(p)[r];
      }
      for (int r = 0; r < s.rank; ++r) out[i * s.rank + r] = static_cast<float>(sum[r]);
    }
  });
  return out;
}

TEST_F(LatentAttentionTest, AttentionOverTheLatentCacheMatchesASoftmaxInDouble) {
  struct Case {
    const char* what;
    std::vector<BatchToken> batch;
  };
  std::vector<BatchToken> prompt;  // a prompt chunk of sequence 0: positions 200..263
  for (int p = 200; p < 264; ++p) prompt.push_back({0, p});
  const Case cases[] = {
      {"first position", {{0, 0}}},
      {"within a tile", {{0, 14}}},
      {"a tile and one", {{0, 16}}},
      {"several splits", {{0, 700}}},
      {"a long context", {{1, 2999}}},
      {"a mixed batch", {{0, 3}, {1, 900}, {0, 64}, {1, 65}, {0, 129}}},
      {"a prompt chunk", prompt},
  };
  for (const Shape& shape : kShapes) {
    const LatentShape& s = shape.s;
    Random rng(NextSeed());
    // The caches hold the positions the cases read and no more: a read past a token's position meets poison.
    LatentCache a(1024, s.key_dim()), b(3072, s.key_dim());
    for (const Case& c : cases) {
      SCOPED_TRACE(::testing::Message() << shape.name << ", " << c.what);
      std::vector<LatentCache*> caches = {&a, &b};
      int filled[2] = {0, 0};
      for (const BatchToken& t : c.batch) filled[t.seq] = std::max(filled[t.seq], t.pos + 1);
      std::fill(a.keys.begin(), a.keys.end(), PoisonFloat());
      std::fill(b.keys.begin(), b.keys.end(), PoisonFloat());
      a.Fill(filled[0], rng);
      b.Fill(filled[1], rng);
      a.d_keys.Upload(a.keys);
      b.d_keys.Upload(b.keys);
      const int n = static_cast<int>(c.batch.size());
      const std::vector<float> q = RandomFloats(static_cast<size_t>(n) * s.n_head * s.key_dim(), -0.3f, 0.3f, rng);
      DeviceArray<float> d_q(q.size()), d_out(static_cast<size_t>(n) * s.n_head * s.rank);
      d_q.Upload(q);
      const DeviceArray<TokenSlot> slots = Slots(caches, c.batch);
      const int bound = PositionsBound(c.batch);
      const size_t ws_bytes = LatentAttentionWorkspaceBytes(n, s, bound);
      DeviceArray<uint8_t> ws(std::max<size_t>(ws_bytes, 1));
      const float scale = 1.0f / std::sqrt(static_cast<float>(s.nope_dim + s.rope_dim));
      ASSERT_TRUE(LatentAttention(d_q.get(), slots.get(), n, kLayer, s, scale, bound, d_out.get(), ws.get(), ws_bytes,
                                  stream_)
                      .ok());
      Sync();
      ExpectRows(d_out.Download(), ReferenceLatent(s, q, caches, c.batch, scale), n * s.n_head, s.rank, s.rank, 1e-5,
                 "latent");
      ExpectGuards(d_out, "latent");
      ExpectGuards(ws, "workspace");
    }
  }
}

// The four kernels in order against the naive form: per head k_nope[p] = W_UK c[p], v[p] = W_UV c[p],
// out = sum_p softmax(scale (q_nope . k_nope[p] + q_pe . k_pe[p])) v[p], with c and k_pe as LatentRopeStore
// stores them (the same CPU operations).
TEST_F(LatentAttentionTest, TheAbsorbedChainEqualsTheNaiveForm) {
  for (const Shape& shape : kShapes) {
    for (DenseType type : {DenseType::kF16, DenseType::kQ8_0}) {
      SCOPED_TRACE(::testing::Message() << shape.name << " " << DenseTypeName(type));
      const LatentShape& s = shape.s;
      const int64_t per_head = s.nope_dim + s.v_dim, head_width = s.nope_dim + s.rope_dim;
      Random rng(NextSeed());
      const std::vector<uint8_t> kv_b = RandomMatrix(type, s.n_head * per_head, s.rank, NextSeed());
      const std::vector<float> w = Widened(type, kv_b, s.n_head * per_head, s.rank);
      DeviceArray<uint8_t> d_kv_b(kv_b.size(), false);
      d_kv_b.Upload(kv_b);
      const std::vector<float> norm = RandomFloats(s.rank, 0.5f, 1.5f, rng);
      const std::vector<double> freq = model::RopeFrequencies(s.rope_dim, 10000.0f);
      DeviceArray<float> d_norm(norm.size());
      DeviceArray<double> d_freq(freq.size());
      d_norm.Upload(norm);
      d_freq.Upload(freq);
      // Positions [0, 40) cached already; a step of two tokens at 40 and 41 (the second attends to the first).
      LatentCache cache(64, s.key_dim());
      cache.Fill(40, rng);
      cache.d_keys.Upload(cache.keys);
      const std::vector<BatchToken> batch = {{0, 40}, {0, 41}};
      const int n = 2;
      const std::vector<float> q = RandomFloats(static_cast<size_t>(n) * s.q_dim(), -1.0f, 1.0f, rng);
      const std::vector<float> kv = RandomFloats(static_cast<size_t>(n) * s.key_dim(), -1.0f, 1.0f, rng);
      DeviceArray<float> d_q(q.size()), d_kv(kv.size());
      DeviceArray<float> d_q_latent(static_cast<size_t>(n) * s.n_head * s.key_dim());
      DeviceArray<float> d_latent(static_cast<size_t>(n) * s.n_head * s.rank);
      DeviceArray<float> d_out(static_cast<size_t>(n) * s.n_head * s.v_dim);
      d_q.Upload(q);
      d_kv.Upload(kv);
      std::vector<LatentCache*> caches = {&cache};
      const DeviceArray<TokenSlot> slots = Slots(caches, batch);
      const int bound = PositionsBound(batch);
      const size_t ws_bytes = LatentAttentionWorkspaceBytes(n, s, bound);
      DeviceArray<uint8_t> ws(std::max<size_t>(ws_bytes, 1));
      const float scale = 0.7f / std::sqrt(static_cast<float>(head_width));
      ASSERT_TRUE(LatentRopeStore(d_q.get(), d_kv.get(), slots.get(), n, kLayer, s, d_norm.get(), 1e-6f, d_freq.get(),
                                  1.0f, 0, stream_)
                      .ok());
      ASSERT_TRUE(LatentQueryAbsorb(type, d_kv_b.get(), d_q.get(), n, s, d_q_latent.get(), stream_).ok());
      ASSERT_TRUE(LatentAttention(d_q_latent.get(), slots.get(), n, kLayer, s, scale, bound, d_latent.get(), ws.get(),
                                  ws_bytes, stream_)
                      .ok());
      ASSERT_TRUE(LatentValueProject(type, d_kv_b.get(), d_latent.get(), n, s, d_out.get(), stream_).ok());
      Sync();

      // The reference: the new positions stored and q rotated by the CPU's operations, then the naive form.
      std::vector<float> q_ref = q;
      std::vector<float> cos(s.rope_dim / 2), sin(s.rope_dim / 2);
      for (int t = 0; t < n; ++t) {
        model::RopeAngles(freq, batch[t].pos, cos.data(), sin.data());
        float* stored = cache.key(batch[t].pos);
        model::RmsNorm(kv.data() + t * s.key_dim(), norm.data(), s.rank, 1e-6f, stored);
        std::copy_n(kv.data() + t * s.key_dim() + s.rank, s.rope_dim, stored + s.rank);
        model::Rope(stored + s.rank, s.rope_dim, cos.data(), sin.data(), model::RopeStyle::kNormal);
        for (int h = 0; h < s.n_head; ++h) {
          model::Rope(q_ref.data() + (t * s.n_head + h) * head_width + s.nope_dim, s.rope_dim, cos.data(), sin.data(),
                      model::RopeStyle::kNormal);
        }
      }
      std::vector<float> want(d_out.size());
      ParallelFor(s.n_head, [&](int64_t h0, int64_t h1) {
        for (int64_t h = h0; h < h1; ++h) {
          const float* uk = w.data() + h * per_head * s.rank;  // W_UK[h]: nope rows, then W_UV[h]: v rows
          const float* uv = uk + s.nope_dim * s.rank;
          for (int t = 0; t < n; ++t) {
            const float* qh = q_ref.data() + (t * s.n_head + h) * head_width;
            const int positions = batch[t].pos + 1;
            std::vector<double> score(positions), value_sum(s.v_dim, 0.0);
            double most = -INFINITY, total = 0;
            for (int p = 0; p < positions; ++p) {
              const float* c = cache.key(p);
              double dot = 0;
              for (int d = 0; d < s.nope_dim; ++d) {
                double k = 0;
                for (int r = 0; r < s.rank; ++r) k += static_cast<double>(uk[d * s.rank + r]) * c[r];
                dot += qh[d] * k;
              }
              for (int d = 0; d < s.rope_dim; ++d) dot += static_cast<double>(qh[s.nope_dim + d]) * c[s.rank + d];
              score[p] = dot * scale;
              most = std::max(most, score[p]);
            }
            for (double& v : score) total += (v = std::exp(v - most));
            for (int p = 0; p < positions; ++p) {
              for (int d = 0; d < s.v_dim; ++d) {
                double v = 0;
                for (int r = 0; r < s.rank; ++r) v += static_cast<double>(uv[d * s.rank + r]) * cache.key(p)[r];
                value_sum[d] += score[p] / total * v;
              }
            }
            for (int d = 0; d < s.v_dim; ++d) want[(t * s.n_head + h) * s.v_dim + d] = static_cast<float>(value_sum[d]);
          }
        }
      });
      ExpectRows(d_out.Download(), want, n * s.n_head, s.v_dim, s.v_dim, 1e-4, "attention output");
      ExpectGuards(d_out, "out");
    }
  }
}

TEST_F(LatentAttentionTest, BadArgumentsAreRefusedNamingThem) {
  const LatentShape good{8, 64, 32, 64, 128};
  DeviceArray<float> buf(1 << 16);
  DeviceArray<TokenSlot> slots(1);
  float* p = buf.get();
  auto expect = [](const absl::Status& s, const std::string& field) {
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find(field), std::string::npos) << s;
  };
  LatentShape bad = good;
  bad.rank = 12;
  expect(CheckLatentShape(bad, DenseType::kF16), "shape.rank");
  expect(CheckLatentShape({8, 64, 32, 64, 64 + 8}, DenseType::kQ8_0), "shape.rank");
  expect(CheckLatentShape({8, 64, 32, 64, 2048}, DenseType::kF16), "shape.rank");
  bad = good;
  bad.rope_dim = 3;
  expect(LatentRopeStore(p, p, slots.get(), 1, 0, bad, p, 1e-6f, reinterpret_cast<double*>(p), 1.0f, 0, stream_),
         "shape.rope_dim");
  expect(LatentRopeStore(p, p, slots.get(), 1, 0, good, nullptr, 1e-6f, reinterpret_cast<double*>(p), 1.0f, 0,
                         stream_),
         "kv_norm");
  expect(LatentQueryAbsorb(DenseType::kF16, nullptr, p, 1, good, p, stream_), "kv_b");
  expect(LatentValueProject(DenseType::kF16, reinterpret_cast<uint8_t*>(p), p + 1, 1, good, p, stream_), "latent");
  const size_t need = LatentAttentionWorkspaceBytes(1, good, 4096);
  ASSERT_GT(need, 0u);
  expect(LatentAttention(p, slots.get(), 1, 0, good, 1.0f, 4096, p, p, need - 4, stream_), "workspace_bytes");
  expect(LatentAttention(p, slots.get(), 70000, 0, good, 1.0f, 4096, p, p, need, stream_), "n_tokens");
  // n_tokens 0 enqueues nothing, with any workspace.
  EXPECT_TRUE(LatentAttention(p, slots.get(), 0, 0, good, 1.0f, 4096, p, nullptr, 0, stream_).ok());
}

}  // namespace
}  // namespace strata::kernels::cuda
