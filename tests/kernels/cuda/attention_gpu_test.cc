// The attention-side kernels against the CPU: q/k norm + RoPE + KV store (YaRN's too), and attention (decode,
// causal prefill, mixed batches; gpt-oss's sinks and sliding window) against an attention written here in
// double. Same poison and guard checks as
// dense_kernels_gpu_test.cc.

#include <climits>

#include "tests/kernels/cuda/dense_test_support.h"

namespace strata::kernels::cuda {
namespace {

using namespace dense_test;  // the shared helpers of this test binary

struct HeadShape {
  int n_head;
  int n_head_kv;
  int head_dim;
  int64_t kv_dim() const { return static_cast<int64_t>(n_head_kv) * head_dim; }
  int64_t q_dim() const { return static_cast<int64_t>(n_head) * head_dim; }
};

// A sequence's KV cache: a host mirror and the device copy, [layer][capacity][kv_dim] each, poisoned
// except where filled.
struct Cache {
  Cache(int n_layer, int64_t capacity, int64_t kv_dim)
      : capacity(capacity),
        kv_dim(kv_dim),
        keys(static_cast<size_t>(n_layer) * capacity * kv_dim, PoisonFloat()),
        values(keys.size(), PoisonFloat()),
        d_keys(keys.size()),
        d_values(keys.size()) {}
  float* key(int64_t layer, int64_t pos) { return &keys[(layer * capacity + pos) * kv_dim]; }
  float* value(int64_t layer, int64_t pos) { return &values[(layer * capacity + pos) * kv_dim]; }
  // Random keys and values at positions [begin, n) of `layer`.
  void Fill(int64_t layer, int64_t n, Random& rng, int64_t begin = 0) {
    for (int64_t p = begin; p < n; ++p) {
      for (int64_t i = 0; i < kv_dim; ++i) {
        key(layer, p)[i] = rng.Uniform(-1.0f, 1.0f);
        value(layer, p)[i] = rng.Uniform(-1.0f, 1.0f);
      }
    }
  }
  void Upload() {
    d_keys.Upload(keys);
    d_values.Upload(values);
  }
  TokenSlot Slot(int pos, int token = 0) const { return TokenSlot{d_keys.get(), d_values.get(), capacity, pos, token}; }

  int64_t capacity;
  int64_t kv_dim;
  std::vector<float> keys, values;
  DeviceArray<float> d_keys, d_values;
};

struct BatchToken {
  int seq;  // index into the caches
  int pos;
};

// TokenSlot::first_new as the engine fills it: the lowest position of the token's sequence in the batch.
int FirstNew(const std::vector<BatchToken>& batch, const BatchToken& b) {
  int lowest = b.pos;
  for (const BatchToken& other : batch) {
    if (other.seq == b.seq) lowest = std::min(lowest, other.pos);
  }
  return lowest;
}

// first_new: each slot's TokenSlot::first_new filled as the engine does, or left 0.
DeviceArray<TokenSlot> UploadSlots(const std::vector<std::unique_ptr<Cache>>& caches,
                                   const std::vector<BatchToken>& batch, bool first_new = false) {
  std::vector<TokenSlot> slots;
  for (const BatchToken& b : batch) {
    slots.push_back(caches[b.seq]->Slot(b.pos));
    if (first_new) slots.back().first_new = FirstNew(batch, b);
  }
  DeviceArray<TokenSlot> d(slots.size());
  d.Upload(slots);
  return d;
}

// Per-head RmsNorm (if a norm is given) and RoPE of the first rope_dim values of n_heads heads at `pos`, as
// Model::Forward does them.
void ReferenceNormRope(float* heads, int n_heads, int head_dim, int rope_dim, const std::vector<float>& norm,
                       float eps, const std::vector<double>& freq, int pos, model::RopeStyle style,
                       float magnitude = 1.0f) {
  std::vector<float> cos(rope_dim / 2), sin(rope_dim / 2);
  model::RopeAngles(freq, pos, cos.data(), sin.data(), magnitude);
  for (int h = 0; h < n_heads; ++h) {
    float* head = heads + static_cast<int64_t>(h) * head_dim;
    if (!norm.empty()) model::RmsNorm(head, norm.data(), head_dim, eps, head);
    model::Rope(head, rope_dim, cos.data(), sin.data(), style);
  }
}

// The first position a token at `pos` attends to with a sliding window of `window` (0: none).
int FirstPosition(int pos, int window) { return window > 0 ? std::max(0, pos - window + 1) : 0; }

// Attention of every (token, head) of the batch over the host caches, in double; with `sinks` (n_head
// logits), each head's sink joins its softmax's denominator, and with a `window` each token attends to its
// last `window` positions only (CpuDenseBackend::AttendAll's definition).
std::vector<float> ReferenceAttention(const std::vector<float>& q, const std::vector<BatchToken>& batch,
                                      const std::vector<std::unique_ptr<Cache>>& caches, int64_t layer,
                                      const HeadShape& shape, float scale, const std::vector<float>& sinks = {},
                                      int window = 0) {
  const int d_head = shape.head_dim, group = shape.n_head / shape.n_head_kv;
  std::vector<float> out(batch.size() * shape.q_dim());
  ParallelFor(static_cast<int64_t>(batch.size()) * shape.n_head, [&](int64_t i0, int64_t i1) {
    std::vector<double> scores, acc(d_head);
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t t = i / shape.n_head, h = i % shape.n_head;
      Cache& cache = *caches[batch[t].seq];
      const float* qh = &q[(t * shape.n_head + h) * d_head];
      const int64_t kv_off = (h / group) * d_head;
      const int pos = batch[t].pos, first = FirstPosition(pos, window);
      scores.assign(pos + 1, 0.0);
      const double sink = sinks.empty() ? -INFINITY : sinks[h];
      double max = sink;
      for (int p = first; p <= pos; ++p) {
        const float* key = cache.key(layer, p) + kv_off;
        double s = 0;
        for (int d = 0; d < d_head; ++d) s += static_cast<double>(qh[d]) * key[d];
        scores[p] = s * scale;
        max = std::max(max, scores[p]);
      }
      double sum = sinks.empty() ? 0.0 : std::exp(sink - max);
      for (int p = first; p <= pos; ++p) sum += scores[p] = std::exp(scores[p] - max);
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int p = first; p <= pos; ++p) {
        const float* value = cache.value(layer, p) + kv_off;
        for (int d = 0; d < d_head; ++d) acc[d] += scores[p] / sum * value[d];
      }
      for (int d = 0; d < d_head; ++d) out[(t * shape.n_head + h) * d_head + d] = static_cast<float>(acc[d]);
    }
  });
  return out;
}

struct RopeCase {
  HeadShape shape;
  bool qk_norm;
  model::RopeStyle style;
  float freq_base;
  int rope_dim;  // 0: the whole head
};

TEST_F(DenseKernelsTest, QkNormRopeStoreMatchesTheCpu) {
  const RopeCase cases[] = {
      {{32, 4, 128}, true, model::RopeStyle::kNeox, 1e6f, 0},     // Qwen3 MoE
      {{32, 8, 128}, false, model::RopeStyle::kNormal, 1e6f, 0},  // Mixtral
      {{6, 2, 64}, true, model::RopeStyle::kNormal, 1e4f, 0},
      {{5, 1, 80}, true, model::RopeStyle::kNeox, 1e4f, 0},  // lanes with one pair and with two
      {{2, 1, 256}, false, model::RopeStyle::kNeox, 1e4f, 0},
      // Partial RoPE: GLM-4.5's half of each head; a quarter, with a norm, in both styles; pairs past the
      // rotated ones in the lanes' second and third rounds.
      {{12, 4, 128}, false, model::RopeStyle::kNeox, 1e6f, 64},
      {{6, 2, 64}, true, model::RopeStyle::kNeox, 1e4f, 16},
      {{6, 2, 64}, true, model::RopeStyle::kNormal, 1e4f, 16},
      {{4, 2, 256}, true, model::RopeStyle::kNeox, 1e4f, 130},
  };
  constexpr int kLayers = 3;
  for (const RopeCase& rc : cases) {
    for (int64_t layer : {int64_t{0}, int64_t{2}}) {
      const HeadShape& shape = rc.shape;
      const int rope_dim = rc.rope_dim == 0 ? shape.head_dim : rc.rope_dim;
      const uint64_t seed = NextSeed();
      SCOPED_TRACE(absl::StrCat(shape.n_head, "/", shape.n_head_kv, " heads of ", shape.head_dim, " norm ", rc.qk_norm,
                                " neox ", rc.style == model::RopeStyle::kNeox, " rope_dim ", rope_dim, " layer ", layer,
                                " seed ", seed));
      Random rng(seed);
      // Positions 0, 1, 255, 256, 4095 in their own caches; the last two tokens share cache 2.
      std::vector<std::unique_ptr<Cache>> caches;
      for (int64_t capacity : {1, 300, 257, 4096, 40}) {
        caches.push_back(std::make_unique<Cache>(kLayers, capacity, shape.kv_dim()));
      }
      for (auto& c : caches) c->Upload();
      const std::vector<BatchToken> batch = {{0, 0}, {1, 1}, {1, 255}, {2, 256}, {3, 4095}, {4, 17}, {2, 3}};
      const int n = static_cast<int>(batch.size());
      DeviceArray<TokenSlot> slots = UploadSlots(caches, batch);
      const std::vector<float> q = RandomFloats(n * shape.q_dim(), -2.0f, 2.0f, rng);
      const std::vector<float> k = RandomFloats(n * shape.kv_dim(), -2.0f, 2.0f, rng);
      const std::vector<float> v = RandomFloats(n * shape.kv_dim(), -2.0f, 2.0f, rng);
      std::vector<float> q_norm, k_norm;
      if (rc.qk_norm) {
        q_norm = RandomFloats(shape.head_dim, 0.5f, 1.5f, rng);
        k_norm = RandomFloats(shape.head_dim, 0.5f, 1.5f, rng);
      }
      const std::vector<double> freq = model::RopeFrequencies(rope_dim, rc.freq_base);
      DeviceArray<float> dq(q.size()), dk(k.size()), dv(v.size()), dqn(shape.head_dim), dkn(shape.head_dim);
      DeviceArray<double> dfreq(freq.size());
      dq.Upload(q);
      dk.Upload(k);
      dv.Upload(v);
      dfreq.Upload(freq);
      if (rc.qk_norm) {
        dqn.Upload(q_norm);
        dkn.Upload(k_norm);
      }
      const int style = rc.style == model::RopeStyle::kNeox ? 1 : 0;
      const absl::Status s = QkNormRopeStore(
          dq.get(), dk.get(), dv.get(), slots.get(), n, layer, shape.n_head, shape.n_head_kv, shape.head_dim, rope_dim,
          rc.qk_norm ? dqn.get() : nullptr, rc.qk_norm ? dkn.get() : nullptr, 1e-6f, dfreq.get(), 1.0f, style,
          stream_);
      ASSERT_TRUE(s.ok()) << s;
      Sync();

      std::vector<float> want_q = q, want_k = k;
      for (int t = 0; t < n; ++t) {
        ReferenceNormRope(&want_q[t * shape.q_dim()], shape.n_head, shape.head_dim, rope_dim, q_norm, 1e-6f, freq,
                          batch[t].pos, rc.style);
        ReferenceNormRope(&want_k[t * shape.kv_dim()], shape.n_head_kv, shape.head_dim, rope_dim, k_norm, 1e-6f, freq,
                          batch[t].pos, rc.style);
        Cache& c = *caches[batch[t].seq];
        std::copy_n(&want_k[t * shape.kv_dim()], shape.kv_dim(), c.key(layer, batch[t].pos));
        std::copy_n(&v[t * shape.kv_dim()], shape.kv_dim(), c.value(layer, batch[t].pos));
      }
      ExpectRows(dq.Download(), want_q, n * shape.n_head, shape.head_dim, shape.head_dim, 1e-6, "q");
      EXPECT_EQ(dk.Download(), k) << "k was modified";
      EXPECT_EQ(dv.Download(), v) << "v was modified";
      for (size_t i = 0; i < caches.size(); ++i) {
        Cache& c = *caches[i];
        // Keys row by row (rows never stored stay poisoned, so they must match the poison bit for bit).
        const std::vector<float> keys = c.d_keys.Download(), values = c.d_values.Download();
        const int64_t n_rows = kLayers * c.capacity;
        int wrong = 0;
        for (int64_t r = 0; r < n_rows; ++r) {
          const float* want_row = &c.keys[r * c.kv_dim];
          const float* got_row = &keys[r * c.kv_dim];
          if (IsPoison(want_row[0])) {
            for (int64_t j = 0; j < c.kv_dim; ++j) wrong += !IsPoison(got_row[j]);
            for (int64_t j = 0; j < c.kv_dim; ++j) wrong += !IsPoison(values[r * c.kv_dim + j]);
            continue;
          }
          double err2 = 0, ref2 = 0;
          for (int64_t j = 0; j < c.kv_dim; ++j) {
            err2 += std::pow(static_cast<double>(got_row[j]) - want_row[j], 2);
            ref2 += std::pow(static_cast<double>(want_row[j]), 2);
          }
          if (!(std::sqrt(err2) <= 1e-6 * std::sqrt(ref2))) ++wrong;
          if (std::memcmp(&values[r * c.kv_dim], &c.values[r * c.kv_dim], c.kv_dim * 4) != 0) ++wrong;
        }
        EXPECT_EQ(wrong, 0) << "cache " << i << ": wrong or stray keys/values";
        ExpectGuards(c.d_keys, "keys");
        ExpectGuards(c.d_values, "values");
      }
    }
  }
}

// gpt-oss's options of a RunAttention call: random sink logits (one of them large, so that it is the
// softmax's maximum) and a sliding window.
struct SinkWindow {
  bool sinks = false;
  int window = 0;
};

// YaRN (gpt-oss: factor 32 over 4096 positions, base 150000, NEOX): the GPU takes the CPU's frequency
// table and magnitude, and rotates by them exactly as model::RopeAngles and model::Rope do. The magnitude
// is checked to matter: the rotated heads' norms grow by it.
TEST_F(DenseKernelsTest, QkNormRopeStoreWithYarnMatchesTheCpu) {
  const HeadShape shape{8, 2, 64};
  model::RopeYarn yarn;
  yarn.factor = 32.0f;
  yarn.original_context = 4096;
  const float magnitude = model::YarnMagnitude(yarn);
  ASSERT_GT(magnitude, 1.3f);
  const std::vector<double> freq = model::YarnFrequencies(shape.head_dim, 150000.0f, yarn);
  const std::vector<double> plain = model::RopeFrequencies(shape.head_dim, 150000.0f);
  ASSERT_NE(freq, plain) << "YaRN must change some frequency";
  const uint64_t seed = NextSeed();
  SCOPED_TRACE(absl::StrCat("seed ", seed));
  Random rng(seed);
  std::vector<std::unique_ptr<Cache>> caches;
  caches.push_back(std::make_unique<Cache>(1, 70000, shape.kv_dim()));
  caches[0]->Upload();
  const std::vector<BatchToken> batch = {{0, 0}, {0, 1}, {0, 4097}, {0, 65000}};
  const int n = static_cast<int>(batch.size());
  DeviceArray<TokenSlot> slots = UploadSlots(caches, batch);
  const std::vector<float> q = RandomFloats(n * shape.q_dim(), -2.0f, 2.0f, rng);
  const std::vector<float> k = RandomFloats(n * shape.kv_dim(), -2.0f, 2.0f, rng);
  const std::vector<float> v = RandomFloats(n * shape.kv_dim(), -2.0f, 2.0f, rng);
  DeviceArray<float> dq(q.size()), dk(k.size()), dv(v.size());
  DeviceArray<double> dfreq(freq.size());
  dq.Upload(q);
  dk.Upload(k);
  dv.Upload(v);
  dfreq.Upload(freq);
  const absl::Status s = QkNormRopeStore(dq.get(), dk.get(), dv.get(), slots.get(), n, 0, shape.n_head,
                                         shape.n_head_kv, shape.head_dim, shape.head_dim, nullptr, nullptr, 1e-6f,
                                         dfreq.get(), magnitude, 1, stream_);
  ASSERT_TRUE(s.ok()) << s;
  Sync();
  std::vector<float> want_q = q, want_k = k;
  for (int t = 0; t < n; ++t) {
    ReferenceNormRope(&want_q[t * shape.q_dim()], shape.n_head, shape.head_dim, shape.head_dim, {}, 1e-6f, freq,
                      batch[t].pos, model::RopeStyle::kNeox, magnitude);
    ReferenceNormRope(&want_k[t * shape.kv_dim()], shape.n_head_kv, shape.head_dim, shape.head_dim, {}, 1e-6f, freq,
                      batch[t].pos, model::RopeStyle::kNeox, magnitude);
  }
  const std::vector<float> got_q = dq.Download();
  ExpectRows(got_q, want_q, n * shape.n_head, shape.head_dim, shape.head_dim, 1e-6, "q");
  const std::vector<float> keys = caches[0]->d_keys.Download();
  for (int t = 0; t < n; ++t) {
    std::vector<float> got_k(keys.begin() + batch[t].pos * shape.kv_dim(),
                             keys.begin() + (batch[t].pos + 1) * shape.kv_dim());
    std::vector<float> row_want(want_k.begin() + t * shape.kv_dim(), want_k.begin() + (t + 1) * shape.kv_dim());
    ExpectRows(got_k, row_want, shape.n_head_kv, shape.head_dim, shape.head_dim, 1e-6, absl::StrCat("k ", t));
  }
  // A rotation by angles scaled by the magnitude: each head's norm grows by it.
  double in2 = 0, out2 = 0;
  for (size_t i = 0; i < q.size(); ++i) {
    in2 += static_cast<double>(q[i]) * q[i];
    out2 += static_cast<double>(got_q[i]) * got_q[i];
  }
  EXPECT_NEAR(std::sqrt(out2 / in2), magnitude, 1e-4);
  EXPECT_THAT(QkNormRopeStore(dq.get(), dk.get(), dv.get(), slots.get(), n, 0, shape.n_head, shape.n_head_kv,
                              shape.head_dim, shape.head_dim, nullptr, nullptr, 1e-6f, dfreq.get(), 0.0f, 1, stream_),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "rope_magnitude is 0"));
}

// Caches in model::KvCache's layout with sliding-window rings: layers [ring][full][ring][full], a ring of
// ring_slots = min(capacity, window + span - 1) slots keeping position p in slot p % ring_slots. Poisoned but for
// what CopyFrom writes.
struct RingCache {
  RingCache(int64_t capacity, int64_t ring, int64_t kv_dim)
      : capacity(capacity),
        ring_slots(std::min(capacity, ring)),
        kv_dim(kv_dim),
        keys(static_cast<size_t>(2 * (capacity + ring_slots) * kv_dim), PoisonFloat()),
        values(keys.size(), PoisonFloat()),
        d_keys(keys.size()),
        d_values(keys.size()) {}
  // Slot of position p in layer 2 (the second ring, KvPlace{1, 1, true}) or 3 (full, KvPlace{1, 2, false}).
  int64_t Slot(int layer, int64_t p) const {
    return layer == 2 ? ring_slots + capacity + p % ring_slots : 2 * ring_slots + capacity + p;
  }
  // Positions [begin, end) of `from`'s layer `from_layer` into layers 2 and 3, in rising order (a ring keeps the
  // last of those that share a slot).
  void CopyFrom(Cache& from, int64_t from_layer, int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      for (int layer : {2, 3}) {
        std::copy_n(from.key(from_layer, p), kv_dim, &keys[Slot(layer, p) * kv_dim]);
        std::copy_n(from.value(from_layer, p), kv_dim, &values[Slot(layer, p) * kv_dim]);
      }
    }
    d_keys.Upload(keys);
    d_values.Upload(values);
  }
  TokenSlot Token(int pos) const { return TokenSlot{d_keys.get(), d_values.get(), capacity, pos, 0, ring_slots}; }

  int64_t capacity, ring_slots, kv_dim;
  std::vector<float> keys, values;
  DeviceArray<float> d_keys, d_values;
};

// QkNormRopeStore into ring caches: a windowed layer's key and value land in slot pos % ring_slots of its ring,
// a full layer's after the rings before it, and nothing else is written.
TEST_F(DenseKernelsTest, QkNormRopeStoreWritesTheRingAndFullLayersOfARingCache) {
  const HeadShape shape{4, 2, 32};
  Random rng(NextSeed());
  std::vector<std::unique_ptr<RingCache>> rings;
  rings.push_back(std::make_unique<RingCache>(64, 11, shape.kv_dim()));
  rings.push_back(std::make_unique<RingCache>(64, 11, shape.kv_dim()));
  const std::vector<BatchToken> batch = {{0, 25}, {1, 7}};  // 25 wraps to slot 3 of its ring
  const int n = static_cast<int>(batch.size());
  std::vector<TokenSlot> host_slots;
  for (const BatchToken& b : batch) host_slots.push_back(rings[b.seq]->Token(b.pos));
  DeviceArray<TokenSlot> slots(host_slots.size());
  slots.Upload(host_slots);
  const std::vector<float> q = RandomFloats(n * shape.q_dim(), -2.0f, 2.0f, rng);
  const std::vector<float> k = RandomFloats(n * shape.kv_dim(), -2.0f, 2.0f, rng);
  const std::vector<float> v = RandomFloats(n * shape.kv_dim(), -2.0f, 2.0f, rng);
  const std::vector<double> freq = model::RopeFrequencies(shape.head_dim, 1e4f);
  DeviceArray<float> dq(q.size()), dk(k.size()), dv(v.size());
  DeviceArray<double> dfreq(freq.size());
  dk.Upload(k);
  dv.Upload(v);
  dfreq.Upload(freq);
  for (const KvPlace& place : {KvPlace(1, 1, true), KvPlace(1, 2, false)}) {
    dq.Upload(q);
    ASSERT_TRUE(QkNormRopeStore(dq.get(), dk.get(), dv.get(), slots.get(), n, place, shape.n_head, shape.n_head_kv,
                                shape.head_dim, shape.head_dim, nullptr, nullptr, 1e-6f, dfreq.get(), 1.0f, 1, stream_)
                    .ok());
    Sync();
  }
  std::vector<float> want_k = k;
  for (int t = 0; t < n; ++t) {
    ReferenceNormRope(&want_k[t * shape.kv_dim()], shape.n_head_kv, shape.head_dim, shape.head_dim, {}, 1e-6f, freq,
                      batch[t].pos, model::RopeStyle::kNeox);
    RingCache& c = *rings[batch[t].seq];
    for (int layer : {2, 3}) {
      std::copy_n(&want_k[t * shape.kv_dim()], shape.kv_dim(), &c.keys[c.Slot(layer, batch[t].pos) * c.kv_dim]);
      std::copy_n(&v[t * shape.kv_dim()], shape.kv_dim(), &c.values[c.Slot(layer, batch[t].pos) * c.kv_dim]);
    }
  }
  for (const auto& c : rings) {
    const std::vector<float> keys = c->d_keys.Download(), values = c->d_values.Download();
    int wrong = 0;
    for (size_t i = 0; i < keys.size(); ++i) {
      if (IsPoison(c->keys[i])) {
        wrong += !IsPoison(keys[i]) + !IsPoison(values[i]);
        continue;
      }
      wrong += !(std::fabs(keys[i] - c->keys[i]) <= 1e-6f * std::max(1.0f, std::fabs(c->keys[i])));
      wrong += values[i] != c->values[i];
    }
    EXPECT_EQ(wrong, 0) << "wrong or stray keys/values in a ring cache";
    ExpectGuards(c->d_keys, "keys");
    ExpectGuards(c->d_values, "values");
  }
}

void RunAttention(cudaStream_t stream, const HeadShape& shape, const std::vector<int64_t>& capacities,
                  const std::vector<BatchToken>& batch, int max_positions, const std::string& name,
                  const SinkWindow& sink_window = {}, bool first_new = true) {
  const uint64_t seed = NextSeed();
  SCOPED_TRACE(absl::StrCat(name, ": ", shape.n_head, "/", shape.n_head_kv, " heads of ", shape.head_dim, ", ",
                            batch.size(), " tokens, max_positions ", max_positions, ", sinks ", sink_window.sinks,
                            ", window ", sink_window.window, first_new ? ", first_new set" : "", ", seed ", seed));
  Random rng(seed);
  constexpr int kLayers = 2;
  constexpr int64_t kLayer = 1;
  std::vector<std::unique_ptr<Cache>> caches;
  for (int64_t capacity : capacities) caches.push_back(std::make_unique<Cache>(kLayers, capacity, shape.kv_dim()));
  // Each sequence holds keys and values from the first position any of its tokens attends to (0 without a
  // window) up to its last position in the batch; everything else, and the other layer, stays poisoned
  // (NaN): reading any of it would spoil the output.
  std::vector<int> filled(caches.size(), 0), first(caches.size(), INT_MAX);
  for (const BatchToken& b : batch) {
    filled[b.seq] = std::max(filled[b.seq], b.pos + 1);
    first[b.seq] = std::min(first[b.seq], FirstPosition(b.pos, sink_window.window));
  }
  for (size_t i = 0; i < caches.size(); ++i) {
    caches[i]->Fill(kLayer, filled[i], rng, first[i] == INT_MAX ? 0 : first[i]);
    caches[i]->Upload();
  }
  std::vector<float> sinks;
  DeviceArray<float> dsinks(shape.n_head);
  if (sink_window.sinks) {
    sinks = RandomFloats(shape.n_head, -2.0f, 2.0f, rng);
    sinks[0] = 6.0f;
    dsinks.Upload(sinks);
  }
  const AttentionSinkWindow options{sink_window.sinks ? dsinks.get() : nullptr, sink_window.window};
  DeviceArray<TokenSlot> slots = UploadSlots(caches, batch, first_new);
  const int n = static_cast<int>(batch.size());
  const std::vector<float> q = RandomFloats(n * shape.q_dim(), -2.0f, 2.0f, rng);
  DeviceArray<float> dq(q.size()), dout(q.size());
  dq.Upload(q);
  const size_t ws_bytes = AttentionWorkspaceBytes(n, shape.n_head, shape.n_head_kv, shape.head_dim, max_positions);
  DeviceArray<uint8_t> workspace(ws_bytes);
  Check(cudaMemset(workspace.get(), 0, ws_bytes), "clearing the workspace");
  const float scale = 1.0f / std::sqrt(static_cast<float>(shape.head_dim));
  const std::vector<float> want =
      ReferenceAttention(q, batch, caches, kLayer, shape, scale, sinks, sink_window.window);
  // Twice through one workspace: the first call must leave its counters as it found them.
  for (int call = 0; call < 2; ++call) {
    SCOPED_TRACE(absl::StrCat("call ", call));
    Check(cudaMemset(dout.get(), 0xff, q.size() * 4), "poisoning out");
    const absl::Status s = Attention(dq.get(), slots.get(), n, kLayer, shape.n_head, shape.n_head_kv, shape.head_dim,
                                     scale, options, max_positions, dout.get(), workspace.get(), ws_bytes, stream);
    ASSERT_TRUE(s.ok()) << s;
    Check(cudaStreamSynchronize(stream), "Attention");
    ExpectRows(dout.Download(), want, static_cast<int64_t>(n) * shape.n_head, shape.head_dim, shape.head_dim, 1e-5,
               "out");
  }
  ExpectGuards(dout, "out");
  ExpectGuards(workspace, "workspace");
  EXPECT_EQ(dq.Download(), q) << "q was modified";
  if (sink_window.window == 0) return;

  // The same keys and values in ring caches (the engine's layout for sliding-window layers): the ring layer and
  // the full layer after it must give the full cache's bits (a wrong slot holds another position's key, or
  // poison). Each sequence's ring holds its window plus the positions it has in the batch, less one, so that
  // the rings wrap wherever a sequence reaches past that.
  const std::vector<float> full_cache_out = dout.Download();
  std::vector<int> lowest(caches.size(), INT_MAX), highest(caches.size(), -1);
  for (const BatchToken& b : batch) {
    lowest[b.seq] = std::min(lowest[b.seq], b.pos);
    highest[b.seq] = std::max(highest[b.seq], b.pos);
  }
  std::vector<std::unique_ptr<RingCache>> rings;
  for (size_t i = 0; i < caches.size(); ++i) {
    const int span = highest[i] < 0 ? 1 : highest[i] - lowest[i] + 1;
    rings.push_back(std::make_unique<RingCache>(caches[i]->capacity, sink_window.window + span - 1, shape.kv_dim()));
    rings.back()->CopyFrom(*caches[i], kLayer, first[i] == INT_MAX ? 0 : first[i], filled[i]);
  }
  std::vector<TokenSlot> ring_slots;
  for (const BatchToken& b : batch) {
    ring_slots.push_back(rings[b.seq]->Token(b.pos));
    if (first_new) ring_slots.back().first_new = FirstNew(batch, b);
  }
  DeviceArray<TokenSlot> d_ring_slots(ring_slots.size());
  d_ring_slots.Upload(ring_slots);
  for (const KvPlace& place : {KvPlace(1, 1, true), KvPlace(1, 2, false)}) {
    SCOPED_TRACE(place.windowed ? "ring layer" : "full layer after rings");
    Check(cudaMemset(dout.get(), 0xff, q.size() * 4), "poisoning out");
    const absl::Status s = Attention(dq.get(), d_ring_slots.get(), n, place, shape.n_head, shape.n_head_kv,
                                     shape.head_dim, scale, options, max_positions, dout.get(), workspace.get(),
                                     ws_bytes, stream);
    ASSERT_TRUE(s.ok()) << s;
    Check(cudaStreamSynchronize(stream), "Attention");
    EXPECT_EQ(dout.Download(), full_cache_out);
  }
}

const HeadShape kAttentionShapes[] = {
    {32, 4, 128},  // Qwen3 MoE (n_embd 2048 and 2560 alike)
    {32, 8, 128},  // Mixtral
    {8, 8, 64},    // no grouping
    {12, 2, 64},   // 6 heads a group: prefill tiles of 10 tokens, 60 rows
    {64, 1, 64},   // 64 heads a group: decode batches take the tiled kernel too
    {32, 2, 128},  // 16 heads a group: the decode kernel's largest
    {16, 1, 32},   // head_dim 32
};

TEST_F(DenseKernelsTest, AttentionDecodeMatchesTheCpu) {
  for (const HeadShape& shape : kAttentionShapes) {
    // One token per sequence at positions 0, 1, 255, 256, 4095 and 37, split over positions.
    RunAttention(stream_, shape, {1, 2, 256, 300, 4096, 40}, {{0, 0}, {1, 1}, {2, 255}, {3, 256}, {4, 4095}, {5, 37}},
                 4096, "decode");
    // A grid sized for longer contexts than any token has: whole splits are empty.
    RunAttention(stream_, shape, {300, 4096}, {{0, 299}, {1, 1000}}, 9000, "oversized max_positions");
    // A single split.
    RunAttention(stream_, shape, {1}, {{0, 0}}, 1, "one position");
    RunAttention(stream_, shape, {128}, {{0, 127}}, 128, "one full split");
    // One token deep in a long grid: dozens of splits merged by the last to finish.
    RunAttention(stream_, shape, {4096}, {{0, 3000}}, 4096, "one token, many splits");
    // Two tokens of one sequence (a short prefill) among others, 32 tokens: still one token per block.
    std::vector<BatchToken> batch = {{0, 10}, {1, 500}, {0, 11}};
    for (int i = 0; i < 29; ++i) batch.push_back({2 + i, i * 37});
    std::vector<int64_t> capacities = {12, 501};
    for (int i = 0; i < 29; ++i) capacities.push_back(i * 37 + 1);
    RunAttention(stream_, shape, capacities, batch, 1037, "32 tokens");
    // Every key and value read after the wait (TokenSlot::first_new 0).
    RunAttention(stream_, shape, {4096}, {{0, 3000}}, 4096, "many splits, first_new 0", {}, false);
    RunAttention(stream_, shape, capacities, batch, 1037, "32 tokens, first_new 0", {}, false);
  }
}

TEST_F(DenseKernelsTest, AttentionPrefillMatchesTheCpu) {
  for (const HeadShape& shape : kAttentionShapes) {
    std::vector<BatchToken> batch;
    for (int p = 0; p < 512; ++p) batch.push_back({0, p});
    RunAttention(stream_, shape, {512}, batch, 512, "causal prefill of 512");
    // A continued prefill: 100 tokens after 300 cached positions.
    batch.clear();
    for (int p = 300; p < 400; ++p) batch.push_back({0, p});
    RunAttention(stream_, shape, {1000}, batch, 400, "prefill at 300");
    // 33 tokens (just past the decode path) deep into a context: tiles and splits together.
    batch.clear();
    for (int p = 5000; p < 5033; ++p) batch.push_back({0, p});
    RunAttention(stream_, shape, {6000}, batch, 5033, "prefill at 5000");
  }
}

TEST_F(DenseKernelsTest, AttentionOfAMixedLargeBatchMatchesTheCpu) {
  // Two interleaved prefills and a lone decode token in one batch of 41: tiles mix sequences.
  for (const HeadShape& shape : kAttentionShapes) {
    std::vector<BatchToken> batch;
    for (int i = 0; i < 20; ++i) {
      batch.push_back({0, i});
      batch.push_back({1, 100 + i});
    }
    batch.push_back({2, 4095});
    RunAttention(stream_, shape, {20, 200, 4096}, batch, 4096, "mixed");
  }
}

// gpt-oss's shapes: gpt-oss-120b's 64 heads over 8 kv heads of 64, and the synthesized tiny and small packs'.
const HeadShape kGptOssShapes[] = {{64, 8, 64}, {16, 4, 64}, {4, 2, 32}, {32, 4, 128}};

TEST_F(DenseKernelsTest, AttentionWithSinksAndAWindowMatchesTheCpuInDecode) {
  for (const HeadShape& shape : kGptOssShapes) {
    for (const SinkWindow& sw : {SinkWindow{true, 128}, SinkWindow{true, 0}, SinkWindow{false, 128},
                                 SinkWindow{true, 8}, SinkWindow{true, 1}}) {
      // Positions inside the first window, at its edge and far past it, over many splits.
      RunAttention(stream_, shape, {1, 2, 128, 300, 4096, 40},
                   {{0, 0}, {1, 1}, {2, 127}, {3, 299}, {4, 4095}, {5, 37}}, 4096, "decode", sw);
      // One token deep in a long grid: the splits before its window exit, the rest merge.
      RunAttention(stream_, shape, {4096}, {{0, 3000}}, 4096, "one token, many splits", sw);
      RunAttention(stream_, shape, {300, 4096}, {{0, 299}, {1, 1000}}, 9000, "oversized max_positions", sw);
      RunAttention(stream_, shape, {1}, {{0, 0}}, 1, "one position", sw);
    }
  }
}

TEST_F(DenseKernelsTest, AttentionWithSinksAndAWindowMatchesTheCpuInPrefill) {
  for (const HeadShape& shape : kGptOssShapes) {
    for (const SinkWindow& sw : {SinkWindow{true, 128}, SinkWindow{false, 100}, SinkWindow{true, 8}}) {
      std::vector<BatchToken> batch;
      for (int p = 0; p < 512; ++p) batch.push_back({0, p});
      RunAttention(stream_, shape, {512}, batch, 512, "causal prefill of 512", sw);
      batch.clear();
      for (int p = 300; p < 400; ++p) batch.push_back({0, p});
      RunAttention(stream_, shape, {1000}, batch, 400, "prefill at 300", sw);
      batch.clear();
      for (int p = 5000; p < 5033; ++p) batch.push_back({0, p});
      RunAttention(stream_, shape, {6000}, batch, 5033, "prefill at 5000", sw);
      // Two interleaved prefills and a lone decode token: tiles mix sequences, each with its own window.
      batch.clear();
      for (int i = 0; i < 20; ++i) {
        batch.push_back({0, i});
        batch.push_back({1, 100 + i});
      }
      batch.push_back({2, 4095});
      RunAttention(stream_, shape, {20, 200, 4096}, batch, 4096, "mixed", sw);
    }
  }
}

TEST_F(DenseKernelsTest, AttentionRejectsBadArguments) {
  DeviceArray<float> q(1024), out(1024);
  DeviceArray<TokenSlot> slots(1);
  EXPECT_THAT(Attention(q.get(), slots.get(), 1, 0, 32, 4, 96, 1.0f, {}, 16, out.get(), nullptr, 0, stream_),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "head_dim is 96"));
  EXPECT_THAT(Attention(q.get(), slots.get(), 1, 0, 30, 4, 128, 1.0f, {}, 16, out.get(), nullptr, 0, stream_),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "n_head is 30"));
  EXPECT_THAT(Attention(q.get(), slots.get(), 1, 0, 32, 4, 128, 1.0f, {}, 0, out.get(), nullptr, 0, stream_),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "max_positions is 0"));
  EXPECT_THAT(Attention(q.get(), slots.get(), 1, 0, 32, 4, 128, 1.0f, AttentionSinkWindow{nullptr, -1}, 16,
                        out.get(), nullptr, 0, stream_),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "sink_window.window is -1"));
  const size_t needed = AttentionWorkspaceBytes(1, 32, 4, 128, 4096);
  ASSERT_GT(needed, 0u);
  // A workspace sized for a batch and a context serves every smaller one.
  const size_t most = AttentionWorkspaceBytes(64, 32, 4, 128, 4096);
  for (int n = 1; n <= 64; ++n) {
    for (int positions : {1, 128, 129, 1000, 4095, 4096}) {
      EXPECT_LE(AttentionWorkspaceBytes(n, 32, 4, 128, positions), most)
          << n << " tokens, " << positions << " positions";
    }
  }
  EXPECT_THAT(Attention(q.get(), slots.get(), 1, 0, 32, 4, 128, 1.0f, {}, 4096, out.get(), q.get(), needed - 4,
                        stream_),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "workspace_bytes"));
}

// ---------------------------------------------------------------------------------------------------------
// EmbedRows.


TEST_F(DenseKernelsTest, CapturedDecodeStepReplaysWithNewSlots) {
  const HeadShape shape{32, 4, 128};
  constexpr int kN = 256;  // embedding width
  constexpr int kVocab = 50, kExperts = 16, kTopK = 4, kMaxPositions = 4096;
  constexpr int64_t kLayer = 0;
  const uint64_t seed = NextSeed();
  SCOPED_TRACE(absl::StrCat("seed ", seed));
  Random rng(seed);
  auto ctx = Unwrap(MatmulContext::Create(stream_, 0, 0));

  std::vector<std::unique_ptr<Cache>> caches;
  for (int64_t capacity : {64, 200, 4096}) caches.push_back(std::make_unique<Cache>(1, capacity, shape.kv_dim()));
  // Positions [0, 10), [0, 100) and [0, 4000) are cached; the two replays add 10, 100, 4000 then 11, 101, 4001.
  const int first_pos[] = {10, 100, 4000};
  for (size_t i = 0; i < caches.size(); ++i) {
    caches[i]->Fill(kLayer, first_pos[i], rng);
    caches[i]->Upload();
  }
  const std::vector<uint8_t> table = RandomMatrix(DenseType::kF16, kVocab, kN, seed + 1);
  const std::vector<uint8_t> wo = RandomMatrix(DenseType::kF16, kN, shape.q_dim(), seed + 2);
  const float w_scale = 1.0f / std::sqrt(static_cast<float>(kN));
  const std::vector<float> router_w = RandomFloats(kExperts * kN, -w_scale, w_scale, rng);
  const std::vector<float> q_src = RandomFloats(3 * shape.q_dim(), -2.0f, 2.0f, rng);
  const std::vector<float> k_src = RandomFloats(3 * shape.kv_dim(), -2.0f, 2.0f, rng);
  const std::vector<float> v_src = RandomFloats(3 * shape.kv_dim(), -2.0f, 2.0f, rng);
  const std::vector<double> freq = model::RopeFrequencies(shape.head_dim, 1e6f);
  DeviceArray<uint8_t> dtable(table.size()), dwo(wo.size());
  DeviceArray<float> drouter(router_w.size()), dq_src(q_src.size()), dq(q_src.size()), dk(k_src.size()),
      dv(v_src.size()), dattn(q_src.size()), dx(3 * kN), dy(3 * kN), dweights(3 * kTopK);
  DeviceArray<int32_t> dids(3 * kTopK);
  DeviceArray<double> dfreq(freq.size());
  DeviceArray<TokenSlot> dslots(3);
  dtable.Upload(table);
  dwo.Upload(wo);
  drouter.Upload(router_w);
  dq_src.Upload(q_src);
  dk.Upload(k_src);
  dv.Upload(v_src);
  dfreq.Upload(freq);
  const size_t attn_ws = AttentionWorkspaceBytes(3, shape.n_head, shape.n_head_kv, shape.head_dim, kMaxPositions);
  const size_t router_ws = RouterWorkspaceBytes(3, kExperts);
  DeviceArray<uint8_t> dattn_ws(attn_ws), drouter_ws(router_ws);
  Check(cudaMemset(drouter_ws.get(), 0, router_ws), "memset");
  Check(cudaMemset(dattn_ws.get(), 0, attn_ws), "memset");
  const float scale = 1.0f / std::sqrt(static_cast<float>(shape.head_dim));

  cudaGraph_t graph;
  Check(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeGlobal), "begin capture");
  absl::Status s = EmbedRows(DenseType::kF16, dtable.get(), kN, dslots.get(), 3, dx.get(), stream_);
  if (s.ok()) {
    s = CudaStatus(cudaMemcpyAsync(dq.get(), dq_src.get(), q_src.size() * 4, cudaMemcpyDeviceToDevice, stream_),
                   "copy q");
  }
  if (s.ok()) {
    s = QkNormRopeStore(dq.get(), dk.get(), dv.get(), dslots.get(), 3, kLayer, shape.n_head, shape.n_head_kv,
                        shape.head_dim, shape.head_dim, nullptr, nullptr, 1e-6f, dfreq.get(), 1.0f, 1, stream_);
  }
  if (s.ok()) {
    s = Attention(dq.get(), dslots.get(), 3, kLayer, shape.n_head, shape.n_head_kv, shape.head_dim, scale, {},
                  kMaxPositions, dattn.get(), dattn_ws.get(), attn_ws, stream_);
  }
  if (s.ok()) {
    s = DenseMatmul(*ctx, DenseType::kF16, dwo.get(), kN, shape.q_dim(), dattn.get(), shape.q_dim(), 3, dy.get(), kN,
                    false, stream_);
  }
  if (s.ok()) {
    s = RouterTopK(drouter.get(), kExperts, kN, dx.get(), RouterNorm{}, RouterGate{}, 3, kTopK, dids.get(),
                   dweights.get(), drouter_ws.get(), router_ws, stream_);
  }
  const cudaError_t end = cudaStreamEndCapture(stream_, &graph);
  ASSERT_TRUE(s.ok()) << s;
  Check(end, "end capture");
  cudaGraphExec_t exec;
  Check(cudaGraphInstantiate(&exec, graph, 0), "instantiate");

  for (int replay = 0; replay < 2; ++replay) {
    SCOPED_TRACE(absl::StrCat("replay ", replay));
    std::vector<BatchToken> batch;
    std::vector<TokenSlot> slots;
    std::vector<int> tokens;
    for (int i = 0; i < 3; ++i) {
      batch.push_back({i, first_pos[i] + replay});
      tokens.push_back(rng.UniformInt(0, kVocab - 1));
      slots.push_back(caches[i]->Slot(batch[i].pos, tokens[i]));
    }
    Check(
        cudaMemcpyAsync(dslots.get(), slots.data(), slots.size() * sizeof(TokenSlot), cudaMemcpyHostToDevice, stream_),
        "slots");
    Check(cudaGraphLaunch(exec, stream_), "graph launch");
    Sync();

    // The CPU's version of the same step.
    std::vector<float> x;
    for (int t : tokens) {
      const std::vector<float> row =
          WidenRow(DenseType::kF16, table.data() + t * DenseRowBytes(DenseType::kF16, kN), kN);
      x.insert(x.end(), row.begin(), row.end());
    }
    std::vector<float> q = q_src, k = k_src;
    for (int t = 0; t < 3; ++t) {
      ReferenceNormRope(&q[t * shape.q_dim()], shape.n_head, shape.head_dim, shape.head_dim, {}, 1e-6f, freq,
                        batch[t].pos, model::RopeStyle::kNeox);
      ReferenceNormRope(&k[t * shape.kv_dim()], shape.n_head_kv, shape.head_dim, shape.head_dim, {}, 1e-6f, freq,
                        batch[t].pos, model::RopeStyle::kNeox);
      std::copy_n(&k[t * shape.kv_dim()], shape.kv_dim(), caches[t]->key(kLayer, batch[t].pos));
      std::copy_n(&v_src[t * shape.kv_dim()], shape.kv_dim(), caches[t]->value(kLayer, batch[t].pos));
    }
    const std::vector<float> attn = ReferenceAttention(q, batch, caches, kLayer, shape, scale);
    const std::vector<float> y = ReferenceProduct(DenseType::kF16, wo, kN, shape.q_dim(), attn, shape.q_dim(), 3, kN);
    std::vector<int32_t> ids(3 * kTopK);
    std::vector<float> weights(3 * kTopK), logits(kExperts);
    for (int t = 0; t < 3; ++t) {
      DenseGemvReference(DenseType::kF32, reinterpret_cast<const uint8_t*>(router_w.data()), kN, 0, kExperts,
                         &x[t * kN], kN, 1, logits.data(), kExperts);
      model::Softmax(logits.data(), kExperts);
      model::TopK(logits.data(), kExperts, kTopK, &ids[t * kTopK]);
      double sum = 0;
      for (int j = 0; j < kTopK; ++j) sum += logits[ids[t * kTopK + j]];
      for (int j = 0; j < kTopK; ++j) weights[t * kTopK + j] = static_cast<float>(logits[ids[t * kTopK + j]] / sum);
    }

    EXPECT_EQ(dx.Download(), x) << "embedding";
    ExpectRows(dattn.Download(), attn, 3 * shape.n_head, shape.head_dim, shape.head_dim, 1e-5, "attention");
    ExpectRows(dy.Download(), y, 3, kN, kN, 1e-5, "output projection");
    // Random inputs: a near-tie among 16 experts is possible but rare; report it rather than hide it.
    EXPECT_EQ(dids.Download(), ids) << "router ids (check for a near-tie if only these differ)";
    const std::vector<float> got_weights = dweights.Download();
    for (size_t i = 0; i < weights.size(); ++i) EXPECT_NEAR(got_weights[i], weights[i], 1e-6f) << "weight " << i;
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

// ---------------------------------------------------------------------------------------------------------
// Speed of the decode GEMV on the 4096 x 2560 F16 matrix. Calls run from a CUDA graph (as the engine runs
// them) and rotate over 8 copies of the matrix (168 MB, more than the L2), so every call reads HBM. The time
// per call includes the gap between graph nodes; a profiler gives the kernel alone. Reported with a
// device-to-device copy's bandwidth for scale; the check is only a floor against gross regressions.

}  // namespace
}  // namespace strata::kernels::cuda
