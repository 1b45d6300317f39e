// QkNormRopeAttention against the two launches it stands for (QkNormRopeStore, then Attention), which
// attention_gpu_test.cc checks against the CPU: where it fuses them (every token its sequence's only one, the
// decode kernel's batches) the keys and values it stores and its output must be the same bits, and q must stay
// as it was; elsewhere it must make the two calls. Every sequence has its own cache, poisoned past the positions
// it holds, so a read of any other slot spoils the output.

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "tests/kernels/cuda/dense_test_support.h"

namespace strata::kernels::cuda {
namespace {

using namespace dense_test;  // the shared helpers of this test binary

struct FusedCase {
  const char* name;
  int n_head, n_head_kv, head_dim;
  int rope_dim;  // 0: the whole head
  bool qk_norm;
  int rope_style;  // 0 normal, 1 NeoX
  int window;      // 0: none; else the layer is a ring of window + 1 slots (KvPlace{1, 1, true})
  bool sinks;
};

// What a way of running leaves behind.
struct Outputs {
  std::vector<float> out, keys, values, q;
};

class QkNormRopeAttentionTest : public DenseKernelsTest {
 protected:
  // Runs the case over tokens at `positions` (token t at positions[t] of sequence seqs[t]) through the two launches
  // and through QkNormRopeAttention, and compares what they leave. TokenSlot::first_new is each sequence's lowest
  // position in the batch, or 0 without `first_new`.
  void Compare(const FusedCase& c, const std::vector<int>& positions, const std::vector<int>& seqs,
               bool one_token_each, bool expect_q_kept, bool first_new = true) {
    const uint64_t seed = NextSeed();
    SCOPED_TRACE(absl::StrCat(c.name, ": ", positions.size(), " tokens, one_token_each ", one_token_each,
                              first_new ? "" : ", first_new 0", ", seed ", seed));
    Random rng(seed);
    const int n = static_cast<int>(positions.size());
    const int64_t kv_dim = static_cast<int64_t>(c.n_head_kv) * c.head_dim;
    const int64_t q_dim = static_cast<int64_t>(c.n_head) * c.head_dim;
    const int rope_dim = c.rope_dim == 0 ? c.head_dim : c.rope_dim;
    const KvPlace place = c.window > 0 ? KvPlace(1, 1, true) : KvPlace(2);
    int n_seq = 0;
    for (int s : seqs) n_seq = std::max(n_seq, s + 1);
    int max_pos = 0;
    for (int p : positions) max_pos = std::max(max_pos, p);

    // One cache buffer for all sequences, sequence s at s * seq_floats: two layers before the tested one
    // (two full ones, or a full one and a ring before a ring layer). Positions below a token's are random, the
    // rest poison.
    const int64_t capacity = max_pos + 1;
    const int64_t ring_slots = c.window > 0 ? c.window + 1 : 0;
    const int64_t seq_slots = c.window > 0 ? capacity + 2 * ring_slots : 3 * capacity;
    const int64_t seq_floats = seq_slots * kv_dim;
    std::vector<float> keys(n_seq * seq_floats, PoisonFloat()), values(keys.size(), PoisonFloat());
    const auto slot_of = [&](int p) {
      return c.window > 0 ? capacity + ring_slots + p % ring_slots : 2 * capacity + p;
    };
    for (int t = 0; t < n; ++t) {
      const int first = c.window > 0 ? std::max(0, positions[t] - c.window + 1) : 0;
      for (int p = first; p < positions[t]; ++p) {
        float* k = &keys[seqs[t] * seq_floats + slot_of(p) * kv_dim];
        float* v = &values[seqs[t] * seq_floats + slot_of(p) * kv_dim];
        for (int64_t i = 0; i < kv_dim; ++i) k[i] = rng.Uniform(-1.0f, 1.0f), v[i] = rng.Uniform(-1.0f, 1.0f);
      }
    }
    const std::vector<float> q = RandomFloats(n * q_dim, -2.0f, 2.0f, rng);
    const std::vector<float> k = RandomFloats(n * kv_dim, -2.0f, 2.0f, rng);
    const std::vector<float> v = RandomFloats(n * kv_dim, -2.0f, 2.0f, rng);
    const std::vector<float> q_norm = RandomFloats(c.head_dim, 0.5f, 1.5f, rng);
    const std::vector<float> k_norm = RandomFloats(c.head_dim, 0.5f, 1.5f, rng);
    std::vector<float> sinks = RandomFloats(c.n_head, -2.0f, 2.0f, rng);
    std::vector<double> freq(rope_dim / 2);
    for (int i = 0; i < rope_dim / 2; ++i) freq[i] = std::pow(1e4, -2.0 * i / rope_dim);
    DeviceArray<float> dk(k.size()), dv(v.size()), dqn(q_norm.size()), dkn(k_norm.size()), dsinks(sinks.size());
    DeviceArray<double> dfreq(freq.size());
    dk.Upload(k);
    dv.Upload(v);
    dqn.Upload(q_norm);
    dkn.Upload(k_norm);
    dsinks.Upload(sinks);
    dfreq.Upload(freq);
    const int max_positions = max_pos + 1;
    const size_t ws_bytes = AttentionWorkspaceBytes(n, c.n_head, c.n_head_kv, c.head_dim, max_positions);
    const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
    const AttentionSinkWindow sink_window{c.sinks ? dsinks.get() : nullptr, c.window};

    Outputs runs[2];
    for (int fused = 0; fused < 2; ++fused) {
      DeviceArray<float> dq(q.size()), dkeys(keys.size()), dvalues(values.size()), dout(n * q_dim);
      DeviceArray<uint8_t> workspace(ws_bytes);
      Check(cudaMemset(workspace.get(), 0, ws_bytes), "clearing the workspace");
      dq.Upload(q);
      dkeys.Upload(keys);
      dvalues.Upload(values);
      std::vector<TokenSlot> slots;
      for (int t = 0; t < n; ++t) {
        TokenSlot s{dkeys.get() + seqs[t] * seq_floats, dvalues.get() + seqs[t] * seq_floats, capacity, positions[t],
                    0, ring_slots};
        s.first_new = first_new ? positions[t] : 0;
        for (int u = 0; u < n; ++u) {
          if (seqs[u] == seqs[t]) s.first_new = std::min(s.first_new, positions[u]);
        }
        slots.push_back(s);
      }
      DeviceArray<TokenSlot> dslots(slots.size());
      dslots.Upload(slots);
      QkRopeInputs rope;
      rope.q = dq.get();
      rope.k = dk.get();
      rope.v = dv.get();
      rope.rope_dim = rope_dim;
      rope.q_norm = c.qk_norm ? dqn.get() : nullptr;
      rope.k_norm = c.qk_norm ? dkn.get() : nullptr;
      rope.eps = 1e-6f;
      rope.freq = dfreq.get();
      rope.rope_style = c.rope_style;
      // Twice through one workspace: a call must leave the split counters as it found them.
      for (int call = 0; call < 2; ++call) {
        // The two launches rotate q in place: each call starts from the projection.
        if (call == 1) dq.Upload(q);
        absl::Status s;
        if (fused == 1) {
          s = QkNormRopeAttention(rope, one_token_each, dslots.get(), n, place, c.n_head, c.n_head_kv, c.head_dim,
                                  scale, sink_window, max_positions, dout.get(), workspace.get(), ws_bytes, stream_);
        } else {
          s = QkNormRopeStore(rope.q, rope.k, rope.v, dslots.get(), n, place, c.n_head, c.n_head_kv, c.head_dim,
                              rope_dim, rope.q_norm, rope.k_norm, rope.eps, rope.freq, rope.rope_magnitude,
                              rope.rope_style, stream_);
          ASSERT_TRUE(s.ok()) << s;
          s = Attention(dq.get(), dslots.get(), n, place, c.n_head, c.n_head_kv, c.head_dim, scale, sink_window,
                        max_positions, dout.get(), workspace.get(), ws_bytes, stream_);
        }
        ASSERT_TRUE(s.ok()) << s;
        Sync();
      }
      runs[fused] = Outputs{dout.Download(), dkeys.Download(), dvalues.Download(), dq.Download()};
      ExpectGuards(dout, "out");
      ExpectGuards(dkeys, "keys");
      ExpectGuards(dvalues, "values");
      ExpectGuards(workspace, "workspace");
    }
    const auto same_bits = [](const std::vector<float>& a, const std::vector<float>& b) {
      return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
    };
    EXPECT_TRUE(same_bits(runs[1].out, runs[0].out)) << "out differs from the two launches'";
    EXPECT_TRUE(same_bits(runs[1].keys, runs[0].keys)) << "the caches' keys differ from the two launches'";
    EXPECT_TRUE(same_bits(runs[1].values, runs[0].values)) << "the caches' values differ from the two launches'";
    // The output is finite where every token's row is (no poison read).
    EXPECT_TRUE(std::all_of(runs[1].out.begin(), runs[1].out.end(), [](float f) { return std::isfinite(f); }));
    if (expect_q_kept) {
      EXPECT_TRUE(same_bits(runs[1].q, q)) << "the fused path wrote q";
    } else {
      EXPECT_TRUE(same_bits(runs[1].q, runs[0].q)) << "the two calls' q differs";
    }
  }
};

const FusedCase kCases[] = {
    {"qwen3moe", 32, 4, 128, 0, true, 1, 0, false},
    {"mixtral", 32, 8, 128, 0, false, 0, 0, false},
    {"partial rope, neox", 12, 4, 128, 64, false, 1, 0, false},
    {"partial rope, normal, norm", 6, 2, 64, 16, true, 0, 0, false},
    {"16 heads a group", 32, 2, 128, 0, true, 1, 0, false},
    {"head_dim 32", 16, 1, 32, 0, true, 0, 0, false},
    {"gpt-oss: sinks and a window", 8, 2, 64, 0, false, 1, 128, true},
};

TEST_F(QkNormRopeAttentionTest, FusedDecodeGivesTheBitsOfTheTwoLaunches) {
  for (const FusedCase& c : kCases) {
    // One token: positions 0, one split, and deep in many splits (merged by the last to finish).
    Compare(c, {0}, {0}, true, true);
    Compare(c, {63}, {0}, true, true);
    Compare(c, {3000}, {0}, true, true);
    // Eight sequences at scattered positions, one of them ringed past its window where there is one.
    Compare(c, {5, 700, 64, 1, 333, 129, 0, 2047}, {0, 1, 2, 3, 4, 5, 6, 7}, true, true);
    // first_new left 0: nothing read ahead, the same bits.
    Compare(c, {5, 700, 64, 1, 333, 129, 0, 2047}, {0, 1, 2, 3, 4, 5, 6, 7}, true, true, false);
  }
}

TEST_F(QkNormRopeAttentionTest, OtherBatchesTakeTheTwoLaunches) {
  for (const FusedCase& c : {kCases[0], kCases[6]}) {
    // Two tokens of one sequence (a short prompt): the caller says so, and the two launches run.
    Compare(c, {10, 11, 300}, {0, 0, 1}, false, false);
    // Single tokens the caller did not vouch for.
    Compare(c, {10, 300}, {0, 1}, false, false);
    // More tokens than the decode kernel takes: the prefill kernel, after the store.
    std::vector<int> positions, seqs;
    for (int t = 0; t < 40; ++t) positions.push_back(7 * t), seqs.push_back(t);
    Compare(c, positions, seqs, true, false);
  }
}

TEST_F(QkNormRopeAttentionTest, RejectsBadArgumentsByName) {
  DeviceArray<float> buf(4096);
  DeviceArray<double> freq(64);
  DeviceArray<TokenSlot> slots(1);
  DeviceArray<uint8_t> workspace(1 << 20);
  QkRopeInputs rope;
  rope.q = buf.get();
  rope.k = buf.get();
  rope.v = buf.get();
  rope.rope_dim = 129;
  rope.freq = freq.get();
  const absl::Status odd = QkNormRopeAttention(rope, true, slots.get(), 1, 0, 8, 2, 128, 1.0f, {}, 16, buf.get(),
                                               workspace.get(), 1 << 20, stream_);
  EXPECT_EQ(odd.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(odd.message().find("QkNormRopeAttention"), absl::string_view::npos) << odd;
  EXPECT_NE(odd.message().find("rope_dim"), absl::string_view::npos) << odd;
  rope.rope_dim = 128;
  rope.freq = nullptr;
  const absl::Status no_freq = QkNormRopeAttention(rope, true, slots.get(), 1, 0, 8, 2, 128, 1.0f, {}, 16, buf.get(),
                                                   workspace.get(), 1 << 20, stream_);
  EXPECT_NE(no_freq.message().find("freq"), absl::string_view::npos) << no_freq;
  rope.freq = freq.get();
  rope.rope_dim = 64;
  const absl::Status bad_dim = QkNormRopeAttention(rope, true, slots.get(), 1, 0, 8, 2, 96, 1.0f, {}, 16, buf.get(),
                                                   workspace.get(), 1 << 20, stream_);
  EXPECT_NE(bad_dim.message().find("head_dim"), absl::string_view::npos) << bad_dim;
  EXPECT_TRUE(buf.GuardsIntact());
}

}  // namespace
}  // namespace strata::kernels::cuda
