// ExpertFfn against the CPU references (kernels/cpu) on real MoE shapes and the odd cases, for every scheme
// (QuantizeActivations: quantize_activations_gpu_test.cc).
//
// The expected value of a (token, expert) pair is the CPU expert: QuantizeActivation(x), RoleGemv of gate
// and up, h = silu(g) * u, QuantizeActivation(h) (integer schemes), RoleGemv of down. RoleGemv equals
// DotRowReference bit for bit for the integer schemes.
//
// How close the GPU must be. The integer sums are exact on both sides and x's codes are bit-identical, so
// for the integer schemes the GPU differs only by float order (about 1e-7 relative) - except that g and u,
// rounded differently, can move an element of h across a rounding boundary of its int8 code (h / scale
// within ~1e-4 of k + 0.5), and then the output moves by exactly one code of that element times its
// dequantized down column: +-hscale * W_down[:, c]. The check therefore removes from the residual, one at a
// time, whole +-1 multiples of such columns, only for elements the CPU found within kFlipMargin of a
// boundary and only when the residual's projection on the column says a flip happened; what is left must
// be below kIntegerTolerance of the row's norm. An indexing, layout or scale bug leaves residuals of order
// 1e-2 to 1, which no set of single-code flips explains. f16 has no codes: relative error <= kF16Tolerance.

#include "kernels/cuda/expert_kernels.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/cpu/expert_forward.h"
#include "kernels/cpu/quantize.h"
#include "kernels/cpu/role_gemv.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/format/expert_layout.h"
#include "kernels/format/fp16.h"
#include "kernels/format/role_layout.h"
#include "tests/testing/test_util.h"

namespace strata::kernels::cuda {
namespace {

constexpr double kF16Tolerance = 1e-5;
constexpr double kIntegerTolerance = 2e-5;
constexpr float kFlipMargin = 5e-3f;  // in code units; GPU-CPU differences of h are ~1e-4 at most
constexpr uint32_t kPoisonBits = 0x7FBADBADu;  // a NaN no kernel computes
constexpr size_t kGuardBytes = 4096;
constexpr uint8_t kGuardByte = 0x5A;

::testing::AssertionResult CudaOk(cudaError_t e) {
  if (e == cudaSuccess) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << cudaGetErrorString(e);
}

float PoisonFloat() {
  float f;
  std::memcpy(&f, &kPoisonBits, 4);
  return f;
}

uint32_t Bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

// Device memory with a guard region after `bytes`, filled with kGuardByte, to catch writes past the end.
struct GuardedBuffer {
  DeviceBuffer buffer;
  size_t bytes = 0;

  static GuardedBuffer Make(size_t bytes) {
    GuardedBuffer g;
    g.bytes = bytes;
    absl::StatusOr<DeviceBuffer> b = DeviceBuffer::Allocate(bytes + kGuardBytes);
    EXPECT_TRUE(b.ok()) << b.status();
    if (b.ok()) {
      g.buffer = *std::move(b);
      EXPECT_TRUE(CudaOk(cudaMemset(g.buffer.as<uint8_t>() + bytes, kGuardByte, kGuardBytes)));
    }
    return g;
  }
  template <typename T>
  T* as() const { return buffer.as<T>(); }
  bool GuardIntact() const {
    std::vector<uint8_t> guard(kGuardBytes);
    if (!CudaOk(cudaMemcpy(guard.data(), buffer.as<uint8_t>() + bytes, kGuardBytes, cudaMemcpyDeviceToHost))) return false;
    return std::all_of(guard.begin(), guard.end(), [](uint8_t v) { return v == kGuardByte; });
  }
};

template <typename T>
DeviceBuffer Upload(const std::vector<T>& v) {
  absl::StatusOr<DeviceBuffer> b = DeviceBuffer::Allocate(std::max<size_t>(v.size() * sizeof(T), 16));
  EXPECT_TRUE(b.ok()) << b.status();
  if (!b.ok()) return DeviceBuffer();
  if (!v.empty()) {
    EXPECT_TRUE(CudaOk(cudaMemcpy(b->data(), v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice)));
    // A pageable upload may return before its DMA lands, and the kernels run on a non-blocking stream.
    EXPECT_TRUE(CudaOk(cudaDeviceSynchronize()));
  }
  return *std::move(b);
}

template <typename T>
std::vector<T> Download(const void* device, size_t n) {
  std::vector<T> v(n);
  EXPECT_TRUE(CudaOk(cudaMemcpy(v.data(), device, n * sizeof(T), cudaMemcpyDeviceToHost)));
  return v;
}

// ---------------------------------------------------------------------------------------------------
// Experts

enum class Weights {
  kQuantized,    // Gaussian weights through QuantizeRole (the converter's path; slow for s4 and s2)
  kRandomCodes,  // uniformly random codes with moderate random scales: as good a test of the layout
};

float Uniform(std::mt19937_64& rng) { return static_cast<float>(rng() >> 40) * 0x1.0p-24f; }

void RandomCodesRole(Scheme s, int64_t rows, int64_t cols, std::mt19937_64& rng, uint8_t* dst) {
  const float inv_sqrt_cols = 1.0f / std::sqrt(static_cast<float>(cols));
  if (s == Scheme::kF16) {
    for (int64_t i = 0; i < rows * cols; ++i) {
      StoreHalf(FloatToHalf((2.0f * Uniform(rng) - 1.0f) * 1.7f * inv_sqrt_cols), dst + 2 * i);
    }
    return;
  }
  const int64_t codes = layout::CodesBytes(s, rows, cols);
  for (int64_t i = 0; i < codes; ++i) {
    uint8_t v = static_cast<uint8_t>(rng());
    if (s == Scheme::kS8 && v == 0x80) v = 0x81;  // s8 codes are in [-127, 127]
    dst[i] = v;
  }
  // Scales so that weights have a variance of about 1 / cols (level standard deviations ~74, 4.6, 2.2, 5.9);
  // mxfp4's are the nearest powers of two, as exponent bytes.
  const float level_sd = s == Scheme::kS8 ? 73.9f : s == Scheme::kS4 ? 4.61f : s == Scheme::kS2 ? 2.24f : 5.85f;
  const int64_t records = rows / kRowTile * (cols / layout::Group(s));
  for (int64_t r = 0; r < records; ++r) {
    uint8_t* record = dst + codes + r * layout::RecordBytes(s);
    for (int i = 0; i < kRowTile; ++i) {
      const float d = (0.5f + Uniform(rng)) * inv_sqrt_cols / level_sd;
      if (s == Scheme::kMxfp4) {
        record[i] = static_cast<uint8_t>(std::lround(std::log2(d)) + 128);
        continue;
      }
      StoreHalf(FloatToHalf(d), record + 2 * i);
      if (s == Scheme::kS4) StoreHalf(FloatToHalf(-7.5f * d * (0.5f + Uniform(rng))), record + 32 + 2 * i);
    }
  }
}

std::vector<uint8_t> MakeBlob(const ExpertLayout& l, Weights weights, uint64_t seed) {
  std::vector<uint8_t> blob(l.blob_bytes, 0xA5);
  std::mt19937_64 rng(seed);
  for (int r = 0; r < 3; ++r) {
    uint8_t* dst = blob.data() + l.role_offset[r];
    if (weights == Weights::kRandomCodes) {
      RandomCodesRole(l.scheme, l.rows(r), l.cols(r), rng, dst);
    } else {
      std::mt19937 frng(static_cast<uint32_t>(seed + r));
      std::normal_distribution<float> dist(0.0f, 1.0f / std::sqrt(static_cast<float>(l.cols(r))));
      std::vector<float> w(l.rows(r) * l.cols(r));
      for (float& v : w) v = dist(frng);
      QuantizeRole(l.scheme, w.data(), l.rows(r), l.cols(r), dst);
    }
  }
  return blob;
}

// The experts of a test layer: host blobs of the experts some id routes to, uploaded to device memory or
// (when pinned) to mapped page-locked host memory. Experts no id routes to point to one blob of 0xFF
// bytes (NaN scales), so that reading one by mistake shows up as NaN.
struct Layer {
  ExpertLayout layout;
  std::map<int, std::vector<uint8_t>> blobs;  // expert -> host blob
  std::vector<DeviceBuffer> device_blobs;
  std::vector<PinnedBuffer> pinned_blobs;
  DeviceBuffer poison_blob;
  DeviceBuffer blob_table;  // n_expert device pointers
};

Layer MakeLayer(const ExpertLayout& l, int n_expert, const std::vector<int32_t>& ids, Weights weights, bool pinned,
                uint64_t seed) {
  Layer layer;
  layer.layout = l;
  std::vector<std::pair<int, std::vector<uint8_t>*>> used;
  for (int32_t id : ids) {
    if (id >= 0 && id < n_expert && !layer.blobs.count(id)) used.emplace_back(id, &layer.blobs[id]);
  }
  // Built in parallel: QuantizeRole takes ~0.1 us a weight for s4 and s2.
  const size_t n_threads = std::max(1u, std::thread::hardware_concurrency());
  for (size_t begin = 0; begin < used.size(); begin += n_threads) {
    std::vector<std::thread> threads;
    for (size_t i = begin; i < std::min(used.size(), begin + n_threads); ++i) {
      const auto [e, out] = used[i];
      threads.emplace_back([out, &l, weights, seed, e] { *out = MakeBlob(l, weights, seed * 1000003 + e); });
    }
    for (std::thread& t : threads) t.join();
  }
  layer.poison_blob = Upload(std::vector<uint8_t>(l.blob_bytes, 0xFF));
  std::vector<const uint8_t*> table(n_expert, layer.poison_blob.as<const uint8_t>());
  for (const auto& [e, blob] : layer.blobs) {
    if (pinned && e % 2 == 1) {
      absl::StatusOr<PinnedBuffer> p = PinnedBuffer::Allocate(blob.size());
      EXPECT_TRUE(p.ok()) << p.status();
      if (!p.ok()) continue;
      std::memcpy(p->data(), blob.data(), blob.size());
      void* device_pointer = nullptr;
      EXPECT_TRUE(CudaOk(cudaHostGetDevicePointer(&device_pointer, p->data(), 0)));
      table[e] = static_cast<const uint8_t*>(device_pointer);
      layer.pinned_blobs.push_back(*std::move(p));
    } else {
      layer.device_blobs.push_back(Upload(blob));
      table[e] = layer.device_blobs.back().as<const uint8_t>();
    }
  }
  layer.blob_table = Upload(table);
  return layer;
}

// ---------------------------------------------------------------------------------------------------
// Routing

enum class Routing {
  kRandom,       // k distinct experts a token
  kWithSkips,    // kRandom, then a quarter of the ids negative or >= n_expert
  kAllSkipped,   // every id -1
  kHotExpert,    // kRandom with one expert in every token's list; token 0 names it in all k slots
  kEveryExpert,  // ids[p] = p % n_expert: every expert used, distinct per token
  kGraded,       // expert e gets e + 1 pairs (needs n_tokens * k = n_expert (n_expert + 1) / 2)
};

std::vector<int32_t> MakeRouting(Routing routing, int n_tokens, int k, int n_expert, std::mt19937& rng) {
  std::vector<int32_t> ids(static_cast<size_t>(n_tokens) * k);
  std::vector<int32_t> experts(n_expert);
  for (int e = 0; e < n_expert; ++e) experts[e] = e;
  auto random_rows = [&] {
    for (int t = 0; t < n_tokens; ++t) {
      std::shuffle(experts.begin(), experts.end(), rng);
      for (int j = 0; j < k; ++j) ids[t * k + j] = experts[j];
    }
  };
  switch (routing) {
    case Routing::kRandom:
      random_rows();
      break;
    case Routing::kWithSkips: {
      random_rows();
      const int32_t skips[] = {-1, -2, -1000, n_expert, n_expert + 5};
      for (size_t p = 0; p < ids.size(); ++p) {
        if (rng() % 4 == 0) ids[p] = skips[rng() % 5];
      }
      break;
    }
    case Routing::kAllSkipped:
      std::fill(ids.begin(), ids.end(), -1);
      break;
    case Routing::kHotExpert: {
      random_rows();
      const int32_t hot = n_expert / 2;
      for (int t = 0; t < n_tokens; ++t) {
        int32_t* row = &ids[t * k];
        if (std::find(row, row + k, hot) == row + k) row[rng() % k] = hot;
      }
      std::fill(ids.begin(), ids.begin() + k, hot);
      break;
    }
    case Routing::kEveryExpert:
      for (size_t p = 0; p < ids.size(); ++p) ids[p] = static_cast<int32_t>(p % n_expert);
      break;
    case Routing::kGraded: {
      std::vector<int32_t> pairs;
      for (int e = 0; e < n_expert; ++e) pairs.insert(pairs.end(), e + 1, e);
      EXPECT_EQ(pairs.size(), ids.size()) << "kGraded needs n_tokens * k = n_expert (n_expert + 1) / 2";
      pairs.resize(ids.size(), -1);
      std::shuffle(pairs.begin(), pairs.end(), rng);
      ids = pairs;
      break;
    }
  }
  return ids;
}

std::vector<float> Gaussian(size_t n, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// gpt-oss's expert extras of a test layer (ExpertFfnExtras): per-expert biases, expert e's row at e * width
// (empty: none), and the activation; on the host for the CPU's expectation, on the device for ExpertFfn.
// Gate and up biases up to +-9 push some of g and u past the clamp's limit of 7.
struct Extras {
  std::vector<float> gate, up, down;
  ExpertActivation activation = ExpertActivation::kSwiGlu;
  DeviceBuffer d_gate, d_up, d_down;

  static Extras Make(const ExpertLayout& l, int n_expert, bool biases, bool clamped, std::mt19937& rng) {
    Extras e;
    e.activation = clamped ? ExpertActivation::kClampedSwiGlu : ExpertActivation::kSwiGlu;
    if (!biases) return e;
    std::uniform_real_distribution<float> wide(-9.0f, 9.0f), narrow(-1.0f, 1.0f);
    e.gate.resize(static_cast<size_t>(n_expert) * l.expert_ff);
    e.up.resize(e.gate.size());
    e.down.resize(static_cast<size_t>(n_expert) * l.n_embd);
    for (float& v : e.gate) v = wide(rng);
    for (float& v : e.up) v = wide(rng);
    for (float& v : e.down) v = narrow(rng);
    e.d_gate = Upload(e.gate);
    e.d_up = Upload(e.up);
    e.d_down = Upload(e.down);
    return e;
  }
  ExpertFfnExtras device() const {
    ExpertFfnExtras d;
    if (!gate.empty()) {
      d.gate_bias = d_gate.as<float>();
      d.up_bias = d_up.as<float>();
      d.down_bias = d_down.as<float>();
    }
    d.clamped_swiglu = activation == ExpertActivation::kClampedSwiGlu;
    return d;
  }
};

// ---------------------------------------------------------------------------------------------------
// The CPU expectation

struct Expected {
  std::vector<std::vector<float>> out;     // per pair: n_embd (empty for a skipped pair)
  std::vector<std::vector<float>> h;       // per pair: h before quantization
  std::vector<QuantizedActivation> hq;     // per pair: h quantized (integer schemes)
};

// With `extras`, as ExpertWork computes biased experts: h = ExpertGlu(activation, g + gate bias, u + up
// bias), out = down . h + down bias.
Expected CpuExperts(const Layer& layer, int n_expert, const std::vector<int32_t>& ids, int n_tokens, int k,
                    const std::vector<float>& x, const Extras* extras) {
  const ExpertLayout& l = layer.layout;
  const Scheme s = l.scheme;
  std::vector<QuantizedActivation> xa(n_tokens);
  for (int t = 0; t < n_tokens; ++t) QuantizeActivation(x.data() + t * l.n_embd, l.n_embd, &xa[t]);
  Expected want;
  want.out.resize(ids.size());
  want.h.resize(ids.size());
  want.hq.resize(ids.size());
  for (const auto& [e, blob] : layer.blobs) {
    std::vector<int> pairs;
    for (size_t p = 0; p < ids.size(); ++p) {
      if (ids[p] == e) pairs.push_back(static_cast<int>(p));
    }
    const int n = static_cast<int>(pairs.size());
    if (n == 0) continue;  // an expert of the layer this routing does not use
    std::vector<const QuantizedActivation*> xs(n), hs(n);
    std::vector<std::vector<float>> g(n, std::vector<float>(l.expert_ff)), u = g;
    std::vector<float*> gp(n), up(n), op(n);
    for (int i = 0; i < n; ++i) {
      xs[i] = &xa[pairs[i] / k];
      gp[i] = g[i].data();
      up[i] = u[i].data();
      want.out[pairs[i]].resize(l.n_embd);
      op[i] = want.out[pairs[i]].data();
    }
    RoleGemv(s, blob.data() + l.role_offset[kGate], l.expert_ff, l.n_embd, 0, l.expert_ff, xs.data(), n, gp.data());
    RoleGemv(s, blob.data() + l.role_offset[kUp], l.expert_ff, l.n_embd, 0, l.expert_ff, xs.data(), n, up.data());
    for (int i = 0; i < n; ++i) {
      std::vector<float>& h = want.h[pairs[i]];
      h.resize(l.expert_ff);
      if (extras == nullptr) {
        for (int64_t r = 0; r < l.expert_ff; ++r) h[r] = g[i][r] / (1.0f + std::exp(-g[i][r])) * u[i][r];
      } else {
        const bool biased = !extras->gate.empty();
        for (int64_t r = 0; r < l.expert_ff; ++r) {
          const float gb = biased ? extras->gate[e * l.expert_ff + r] : 0.0f;
          const float ub = biased ? extras->up[e * l.expert_ff + r] : 0.0f;
          h[r] = ExpertGlu(extras->activation, g[i][r] + gb, u[i][r] + ub);
        }
      }
      QuantizeActivation(h.data(), l.expert_ff, &want.hq[pairs[i]]);
      hs[i] = &want.hq[pairs[i]];
    }
    RoleGemv(s, blob.data() + l.role_offset[kDown], l.n_embd, l.expert_ff, 0, l.n_embd, hs.data(), n, op.data());
    if (extras != nullptr && !extras->down.empty()) {
      for (int i = 0; i < n; ++i) {
        for (int64_t r = 0; r < l.n_embd; ++r) op[i][r] += extras->down[e * l.n_embd + r];
      }
    }
  }
  return want;
}

double Norm(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x * x;
  return std::sqrt(s);
}

// Checks one pair's row (see the top of the file). `down` is the expert's dequantized down role (integer
// schemes). Returns the number of single-code flips of h it had to explain.
int CheckRow(Scheme s, const Expected& want, size_t pair, const float* got, const std::vector<float>& down,
             int64_t n_embd, int64_t ff, const std::string& where) {
  const std::vector<float>& ref = want.out[pair];
  std::vector<double> residual(n_embd), reference(n_embd);
  for (int64_t r = 0; r < n_embd; ++r) {
    if (!std::isfinite(got[r])) {
      ADD_FAILURE() << where << ": element " << r << " is " << got[r] << " (unwritten or NaN)";
      return 0;
    }
    residual[r] = static_cast<double>(got[r]) - ref[r];
    reference[r] = ref[r];
  }
  const double ref_norm = Norm(reference);
  if (s == Scheme::kF16) {
    EXPECT_LE(Norm(residual), kF16Tolerance * ref_norm) << where;
    return 0;
  }
  // Elements of h the CPU put within kFlipMargin of a code boundary, and their one-code output columns.
  const QuantizedActivation& hq = want.hq[pair];
  std::vector<int64_t> candidates;
  for (int64_t c = 0; c < ff; ++c) {
    const float scale = hq.scale[c / kActBlock];
    if (scale == 0.0f) continue;
    const float v = want.h[pair][c] / scale;
    if (std::fabs(v - std::floor(v) - 0.5f) < kFlipMargin) candidates.push_back(c);
  }
  auto column = [&](int64_t c, int64_t r) { return static_cast<double>(hq.scale[c / kActBlock]) * down[r * ff + c]; };
  int flips = 0;
  while (!candidates.empty()) {
    size_t best = 0;
    double best_a = 0;
    for (size_t i = 0; i < candidates.size(); ++i) {
      double dot = 0, nn = 0;
      for (int64_t r = 0; r < n_embd; ++r) {
        const double v = column(candidates[i], r);
        dot += residual[r] * v;
        nn += v * v;
      }
      const double a = nn > 0 ? dot / nn : 0;
      if (std::fabs(a) > std::fabs(best_a)) best_a = a, best = i;
    }
    if (std::fabs(best_a) <= 0.5) break;
    const double n = std::round(best_a);
    if (std::fabs(n) != 1.0 || std::fabs(best_a - n) > 0.25) {
      ADD_FAILURE() << where << ": residual projects " << best_a << " codes on h[" << candidates[best]
                    << "], not a single-code flip";
      return flips;
    }
    for (int64_t r = 0; r < n_embd; ++r) residual[r] -= n * column(candidates[best], r);
    candidates.erase(candidates.begin() + best);
    ++flips;
  }
  EXPECT_LE(Norm(residual), kIntegerTolerance * ref_norm) << where << " (after " << flips << " code flips)";
  return flips;
}

// ---------------------------------------------------------------------------------------------------
// Running ExpertFfn

class ExpertFfnGpuTest : public ::testing::TestWithParam<Scheme> {
 protected:
  void SetUp() override {
    int devices = 0;
    ASSERT_TRUE(CudaOk(cudaGetDeviceCount(&devices)));
    ASSERT_GE(devices, 1);
    ASSERT_TRUE(CudaOk(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)));
  }
  void TearDown() override {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  ExpertLayout Layout(int64_t n_embd, int64_t ff) {
    absl::StatusOr<ExpertLayout> l = ComputeExpertLayout(GetParam(), n_embd, ff);
    EXPECT_TRUE(l.ok()) << l.status();
    return *l;
  }

  // Runs ExpertFfn with poisoned parts and workspace (and guards after both) and returns parts.
  std::vector<float> Run(const Layer& layer, int n_expert, const std::vector<int32_t>& ids, int n_tokens, int k,
                         const std::vector<float>& x, const ExpertFfnExtras& extras = {}) {
    const int64_t n_embd = layer.layout.n_embd;
    const size_t parts_count = static_cast<size_t>(n_tokens) * k * n_embd;
    DeviceBuffer d_ids = Upload(ids), d_x = Upload(x);
    GuardedBuffer parts = GuardedBuffer::Make(parts_count * sizeof(float));
    EXPECT_TRUE(CudaOk(cudaMemcpy(parts.as<float>(), std::vector<float>(parts_count, PoisonFloat()).data(),
                                  parts_count * sizeof(float), cudaMemcpyHostToDevice)));
    EXPECT_TRUE(CudaOk(cudaDeviceSynchronize()));
    const size_t ws_bytes = ExpertFfnWorkspaceBytes(layer.layout, n_tokens, k, n_expert);
    EXPECT_GT(ws_bytes, 0u);
    GuardedBuffer ws = GuardedBuffer::Make(ws_bytes);
    EXPECT_TRUE(CudaOk(cudaMemset(ws.as<uint8_t>(), 0xFF, ws_bytes)));
    const absl::Status s = ExpertFfn(layer.layout, layer.blob_table.as<const uint8_t* const>(), n_expert,
                                     d_ids.as<int32_t>(), n_tokens, k, d_x.as<float>(), parts.as<float>(), extras,
                                     ws.as<void>(), ws_bytes, stream_);
    EXPECT_TRUE(s.ok()) << s;
    EXPECT_TRUE(CudaOk(cudaStreamSynchronize(stream_)));
    EXPECT_TRUE(CudaOk(cudaGetLastError()));
    EXPECT_TRUE(parts.GuardIntact()) << "ExpertFfn wrote past the end of parts";
    EXPECT_TRUE(ws.GuardIntact()) << "ExpertFfn wrote past the end of its workspace";
    return Download<float>(parts.as<float>(), parts_count);
  }

  // Every valid pair's row against the CPU, every skipped pair's row untouched.
  void Check(const Layer& layer, int n_expert, const std::vector<int32_t>& ids, int n_tokens, int k,
             const std::vector<float>& x, const std::vector<float>& parts, const std::string& name,
             const Extras* extras = nullptr) {
    const ExpertLayout& l = layer.layout;
    const Expected want = CpuExperts(layer, n_expert, ids, n_tokens, k, x, extras);
    int flips = 0, checked = 0;
    for (const auto& [e, blob] : layer.blobs) {
      std::vector<float> down;
      if (l.scheme != Scheme::kF16) {
        down.resize(l.n_embd * l.expert_ff);
        DequantizeRole(l.scheme, blob.data() + l.role_offset[kDown], l.n_embd, l.expert_ff, down.data());
      }
      for (size_t p = 0; p < ids.size(); ++p) {
        if (ids[p] != e) continue;
        const std::string where = name + " token " + std::to_string(p / k) + " slot " + std::to_string(p % k) +
                                  " expert " + std::to_string(e);
        flips += CheckRow(l.scheme, want, p, parts.data() + p * l.n_embd, down, l.n_embd, l.expert_ff, where);
        ++checked;
        if (::testing::Test::HasFailure()) return;
      }
    }
    for (size_t p = 0; p < ids.size(); ++p) {
      if (ids[p] >= 0 && ids[p] < n_expert) continue;
      for (int64_t r = 0; r < l.n_embd; ++r) {
        ASSERT_EQ(Bits(parts[p * l.n_embd + r]), kPoisonBits)
            << name << ": skipped pair " << p << " (id " << ids[p] << ") element " << r << " was written";
      }
    }
    // A flip needs h within ~1e-4 codes of a boundary (expected ~1e-4 of the elements); many more would
    // mean h is computed differently.
    EXPECT_LE(flips, 4 + checked * l.expert_ff / 1000) << name << ": " << flips << " code flips in " << checked
                                                        << " rows";
  }

  struct Case {
    std::string name;
    int64_t n_embd, ff;
    int n_expert, n_tokens, k;
    Routing routing;
    Weights weights;
    bool pinned = false;
    bool biases = false;   // gpt-oss's expert biases (Extras)
    bool clamped = false;  // gpt-oss's clamped SwiGLU
  };

  void RunCase(const Case& c) {
    SCOPED_TRACE(c.name);
    const ExpertLayout l = Layout(c.n_embd, c.ff);
    std::mt19937 rng(std::hash<std::string>{}(c.name) ^ static_cast<unsigned>(GetParam()));
    const std::vector<int32_t> ids = MakeRouting(c.routing, c.n_tokens, c.k, c.n_expert, rng);
    const std::vector<float> x = Gaussian(static_cast<size_t>(c.n_tokens) * c.n_embd, rng);
    const Layer layer = MakeLayer(l, c.n_expert, ids, c.weights, c.pinned, rng());
    const bool with_extras = c.biases || c.clamped;
    const Extras extras = Extras::Make(l, c.n_expert, c.biases, c.clamped, rng);
    const ExpertFfnExtras device_extras = with_extras ? extras.device() : ExpertFfnExtras{};
    const std::vector<float> parts = Run(layer, c.n_expert, ids, c.n_tokens, c.k, x, device_extras);
    if (HasFailure()) return;
    Check(layer, c.n_expert, ids, c.n_tokens, c.k, x, parts, c.name, with_extras ? &extras : nullptr);
    // Twice: the grouping's atomics order pairs differently, the results must not change.
    const std::vector<float> again = Run(layer, c.n_expert, ids, c.n_tokens, c.k, x, device_extras);
    EXPECT_EQ(std::memcmp(parts.data(), again.data(), parts.size() * sizeof(float)), 0)
        << c.name << ": a second run gave different bits";
  }

  cudaStream_t stream_ = nullptr;
};

// Narrow tiles (tokens * k < 4 * n_expert) versus wide tiles (8 tokens a work item) are noted per case.

TEST_P(ExpertFfnGpuTest, OneTokenOneExpert) {
  RunCase({"one token one expert", 2560, 640, 1, 1, 1, Routing::kRandom, Weights::kQuantized});
}

TEST_P(ExpertFfnGpuTest, DecodeBatchOne) {  // narrow, a warp a tile of down
  RunCase({"decode batch 1", 2560, 640, 64, 1, 8, Routing::kRandom, Weights::kQuantized});
}

// Narrow with 4 tiles of down a warp: (160 / 2 + 128) work items x 160 tiles >= 32768.
TEST_P(ExpertFfnGpuTest, DecodeManyExpertsWithSkippedAndInvalidIds) {
  RunCase({"decode 40 tokens", 2560, 640, 128, 40, 4, Routing::kWithSkips, Weights::kRandomCodes});
}

TEST_P(ExpertFfnGpuTest, SmallBatchWithSkips) {  // narrow
  RunCase({"16 tokens with skips", 2048, 768, 128, 16, 8, Routing::kWithSkips, Weights::kRandomCodes});
}

TEST_P(ExpertFfnGpuTest, EveryExpertUsed) {  // wide, 6 tokens an expert
  RunCase({"every expert", 2048, 768, 16, 24, 4, Routing::kEveryExpert, Weights::kRandomCodes});
}

TEST_P(ExpertFfnGpuTest, KEqualsNExpert) {  // wide, 5 tokens an expert
  RunCase({"k = n_expert", 2560, 640, 6, 5, 6, Routing::kEveryExpert, Weights::kQuantized});
}

TEST_P(ExpertFfnGpuTest, HotExpertInNarrowTiles) {  // narrow: the hot expert's 41 pairs in 21 items
  RunCase({"hot expert narrow", 2048, 768, 64, 40, 2, Routing::kHotExpert, Weights::kRandomCodes});
}

// At most 32 pairs are grouped by one warp (match.any) instead of the counting sort: skipped and invalid ids,
// an expert with more pairs than a narrow tile, and exactly 32 pairs.
TEST_P(ExpertFfnGpuTest, FewPairsWithSkipsAndAHotExpert) {
  RunCase({"4 tokens with skips", 2560, 640, 64, 4, 8, Routing::kWithSkips, Weights::kRandomCodes});
  RunCase({"hot expert, 16 tokens", 2048, 768, 64, 16, 2, Routing::kHotExpert, Weights::kRandomCodes});
  RunCase({"3 tokens, top-10 of 512", 2560, 640, 512, 3, 10, Routing::kRandom, Weights::kRandomCodes});
}

TEST_P(ExpertFfnGpuTest, PrefillWithAHotExpert) {  // wide: the hot expert's 303 pairs in 38 items
  RunCase({"prefill 300 tokens", 2560, 640, 32, 300, 4, Routing::kHotExpert, Weights::kRandomCodes});
  // The shapes of synth's small and tiny presets.
  RunCase({"small preset prefill", 1024, 512, 32, 200, 4, Routing::kRandom, Weights::kRandomCodes});
  RunCase({"small preset decode", 1024, 512, 32, 16, 4, Routing::kRandom, Weights::kRandomCodes});
  RunCase({"tiny preset prefill", 128, 128, 8, 60, 2, Routing::kRandom, Weights::kRandomCodes});
}

// gpt-oss's experts (ExpertFfnExtras): biases and the clamped SwiGLU, together and apart, in narrow tiles
// (decode) and wide ones (a prompt), on gpt-oss-120b's expert shape and synth's presets.
TEST_P(ExpertFfnGpuTest, BiasedClampedExpertsInDecode) {
  RunCase({"gpt-oss decode batch 1", 2880, 2880, 128, 1, 4, Routing::kRandom, Weights::kRandomCodes, false, true,
           true});
  RunCase({"gpt-oss decode 16 with skips", 2880, 2880, 128, 16, 4, Routing::kWithSkips, Weights::kRandomCodes, false,
           true, true});
  RunCase({"small preset decode, biases only", 1024, 512, 32, 8, 4, Routing::kRandom, Weights::kRandomCodes, false,
           true, false});
  RunCase({"small preset decode, clamp only", 1024, 512, 32, 8, 4, Routing::kRandom, Weights::kRandomCodes, false,
           false, true});
}

TEST_P(ExpertFfnGpuTest, BiasedClampedExpertsInPrefill) {
  RunCase({"gpt-oss prefill with a hot expert", 2880, 2880, 32, 64, 4, Routing::kHotExpert, Weights::kRandomCodes,
           false, true, true});
  RunCase({"small preset prefill", 1024, 512, 32, 200, 4, Routing::kRandom, Weights::kRandomCodes, false, true,
           true});
  RunCase({"tiny preset prefill", 128, 128, 8, 60, 2, Routing::kRandom, Weights::kRandomCodes, false, true, true});
  RunCase({"every tile size, biases only", 2048, 768, 16, 68, 2, Routing::kGraded, Weights::kRandomCodes, false, true,
           false});
}

TEST_P(ExpertFfnGpuTest, EveryTileSize) {  // wide: work items of 1 .. 8 tokens
  RunCase({"graded counts", 2048, 768, 16, 68, 2, Routing::kGraded, Weights::kRandomCodes});
}

TEST_P(ExpertFfnGpuTest, AllPairsSkipped) {
  RunCase({"all skipped", 2048, 768, 8, 4, 2, Routing::kAllSkipped, Weights::kRandomCodes});
}

TEST_P(ExpertFfnGpuTest, LargeExpertNarrow) {
  RunCase({"4096x14336 narrow", 4096, 14336, 2, 1, 2, Routing::kEveryExpert, Weights::kRandomCodes});
}

TEST_P(ExpertFfnGpuTest, LargeExpertWide) {  // 4 tokens an expert
  RunCase({"4096x14336 wide", 4096, 14336, 2, 4, 2, Routing::kEveryExpert, Weights::kRandomCodes});
}

// Narrow with 4 tiles of down a warp (work items x tiles >= 32768), 66 tiles of down (s2: 68), so the last
// block has a warp with 2 tiles and idle warps; expert_ff 128 is 4 blocks a row of down, so half the lanes
// have no blocks.
TEST_P(ExpertFfnGpuTest, OddShape) {
  const int64_t n_embd = GetParam() == Scheme::kS2 ? 1088 : 1056;  // s2 needs a multiple of 64
  RunCase({"odd shape", n_embd, 128, 512, 100, 4, Routing::kRandom, Weights::kRandomCodes});
}

TEST_P(ExpertFfnGpuTest, BlobsInMappedHostMemory) {
  RunCase({"pinned blobs", 2048, 768, 8, 6, 2, Routing::kRandom, Weights::kRandomCodes, /*pinned=*/true});
}

// A token's result is the same bits alone or with two others (narrow tiles) as in a large batch (wide tiles).
TEST_P(ExpertFfnGpuTest, ResultsDoNotDependOnBatching) {
  const ExpertLayout l = Layout(2048, 768);
  const int n_expert = 16, k = 4, n_tokens = 40;
  std::mt19937 rng(31);
  const std::vector<int32_t> ids = MakeRouting(Routing::kRandom, n_tokens, k, n_expert, rng);
  const std::vector<float> x = Gaussian(static_cast<size_t>(n_tokens) * l.n_embd, rng);
  const Layer layer = MakeLayer(l, n_expert, ids, Weights::kRandomCodes, false, 32);
  const std::vector<float> all = Run(layer, n_expert, ids, n_tokens, k, x);
  for (const int few : {1, 3}) {
    SCOPED_TRACE(absl::StrCat(few, " tokens alone"));
    // With the large call's workspace size: any workspace of at least the size works.
    DeviceBuffer d_ids = Upload(std::vector<int32_t>(ids.begin(), ids.begin() + few * k));
    DeviceBuffer d_x = Upload(std::vector<float>(x.begin(), x.begin() + few * l.n_embd));
    const size_t parts_count = static_cast<size_t>(few) * k * l.n_embd;
    DeviceBuffer parts = Upload(std::vector<float>(parts_count, PoisonFloat()));
    const size_t ws_bytes = ExpertFfnWorkspaceBytes(l, n_tokens, k, n_expert);
    ASSERT_GE(ws_bytes, ExpertFfnWorkspaceBytes(l, few, k, n_expert));
    absl::StatusOr<DeviceBuffer> ws = DeviceBuffer::Allocate(ws_bytes);
    ASSERT_TRUE(ws.ok()) << ws.status();
    ASSERT_TRUE(ExpertFfn(l, layer.blob_table.as<const uint8_t* const>(), n_expert, d_ids.as<int32_t>(), few, k,
                          d_x.as<float>(), parts.as<float>(), {}, ws->data(), ws_bytes, stream_)
                    .ok());
    ASSERT_TRUE(CudaOk(cudaStreamSynchronize(stream_)));
    EXPECT_EQ(std::memcmp(Download<float>(parts.data(), parts_count).data(), all.data(), parts_count * 4), 0);
  }
}

// Captured once in a CUDA graph, ExpertFfn replays correctly for routings other than the captured one.
TEST_P(ExpertFfnGpuTest, CapturedGraphReplaysForAnyRouting) {
  const ExpertLayout l = Layout(2048, 768);
  const int n_expert = 32, k = 4, n_tokens = 16;
  std::mt19937 rng(41);
  std::vector<std::vector<int32_t>> routings = {MakeRouting(Routing::kRandom, n_tokens, k, n_expert, rng),
                                                MakeRouting(Routing::kHotExpert, n_tokens, k, n_expert, rng),
                                                MakeRouting(Routing::kWithSkips, n_tokens, k, n_expert, rng)};
  std::vector<int32_t> all_ids;
  for (const auto& r : routings) all_ids.insert(all_ids.end(), r.begin(), r.end());
  const Layer layer = MakeLayer(l, n_expert, all_ids, Weights::kRandomCodes, false, 42);
  const std::vector<float> x = Gaussian(static_cast<size_t>(n_tokens) * l.n_embd, rng);
  DeviceBuffer d_ids = Upload(routings[0]), d_x = Upload(x);
  const size_t parts_count = static_cast<size_t>(n_tokens) * k * l.n_embd;
  DeviceBuffer parts = Upload(std::vector<float>(parts_count, PoisonFloat()));
  const size_t ws_bytes = ExpertFfnWorkspaceBytes(l, n_tokens, k, n_expert);
  absl::StatusOr<DeviceBuffer> ws = DeviceBuffer::Allocate(ws_bytes);
  ASSERT_TRUE(ws.ok()) << ws.status();

  cudaGraph_t graph = nullptr;
  ASSERT_TRUE(CudaOk(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal)));
  const absl::Status captured = ExpertFfn(l, layer.blob_table.as<const uint8_t* const>(), n_expert,
                                          d_ids.as<int32_t>(), n_tokens, k, d_x.as<float>(), parts.as<float>(), {},
                                          ws->data(), ws_bytes, stream_);
  ASSERT_TRUE(CudaOk(cudaStreamEndCapture(stream_, &graph)));
  ASSERT_TRUE(captured.ok()) << captured;
  cudaGraphExec_t exec = nullptr;
  ASSERT_TRUE(CudaOk(cudaGraphInstantiate(&exec, graph, 0)));
  for (size_t i = 0; i < routings.size(); ++i) {
    ASSERT_TRUE(CudaOk(cudaMemcpy(d_ids.data(), routings[i].data(), routings[i].size() * 4, cudaMemcpyHostToDevice)));
    ASSERT_TRUE(CudaOk(cudaMemcpy(parts.data(), std::vector<float>(parts_count, PoisonFloat()).data(),
                                  parts_count * sizeof(float), cudaMemcpyHostToDevice)));
    ASSERT_TRUE(CudaOk(cudaDeviceSynchronize()));
    ASSERT_TRUE(CudaOk(cudaGraphLaunch(exec, stream_)));
    ASSERT_TRUE(CudaOk(cudaStreamSynchronize(stream_)));
    Check(layer, n_expert, routings[i], n_tokens, k, x, Download<float>(parts.data(), parts_count),
          "graph replay " + std::to_string(i));
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

TEST_P(ExpertFfnGpuTest, RejectsBadArguments) {
  const ExpertLayout l = Layout(2048, 768);
  const int n_expert = 8, k = 2, n_tokens = 4;
  DeviceBuffer table = Upload(std::vector<const uint8_t*>(n_expert, nullptr));
  DeviceBuffer ids = Upload(std::vector<int32_t>(n_tokens * k, -1));
  DeviceBuffer x = Upload(std::vector<float>(n_tokens * l.n_embd, 0.0f));
  DeviceBuffer parts = Upload(std::vector<float>(n_tokens * k * l.n_embd, 0.0f));
  const size_t ws_bytes = ExpertFfnWorkspaceBytes(l, n_tokens, k, n_expert);
  absl::StatusOr<DeviceBuffer> ws = DeviceBuffer::Allocate(ws_bytes);
  ASSERT_TRUE(ws.ok());
  const auto* blobs = table.as<const uint8_t* const>();
  auto call = [&](const ExpertLayout& layout, int ne, int nt, int kk, const float* xp, float* pp, size_t bytes) {
    return ExpertFfn(layout, blobs, ne, ids.as<int32_t>(), nt, kk, xp, pp, {}, ws->data(), bytes, stream_);
  };
  using absl::StatusCode;
  EXPECT_THAT(call(l, n_expert, n_tokens, k, x.as<float>(), parts.as<float>(), ws_bytes), IsOk());
  EXPECT_THAT(call(l, n_expert, -1, k, x.as<float>(), parts.as<float>(), ws_bytes),
              StatusIsWith(StatusCode::kInvalidArgument, "n_tokens -1"));
  EXPECT_THAT(call(l, n_expert, n_tokens, n_expert + 1, x.as<float>(), parts.as<float>(), ws_bytes),
              StatusIsWith(StatusCode::kInvalidArgument, "k 9"));
  EXPECT_THAT(call(l, n_expert, n_tokens, 0, x.as<float>(), parts.as<float>(), ws_bytes),
              StatusIsWith(StatusCode::kInvalidArgument, "k 0"));
  EXPECT_THAT(call(l, 0, n_tokens, k, x.as<float>(), parts.as<float>(), ws_bytes),
              StatusIsWith(StatusCode::kInvalidArgument, "n_expert 0"));
  EXPECT_THAT(call(l, n_expert, n_tokens, k, x.as<float>(), parts.as<float>(), ws_bytes - 1),
              StatusIsWith(StatusCode::kInvalidArgument, std::to_string(ws_bytes - 1) + " is less than the " +
                                                             std::to_string(ws_bytes)));
  EXPECT_THAT(call(l, n_expert, n_tokens, k, nullptr, parts.as<float>(), ws_bytes),
              StatusIsWith(StatusCode::kInvalidArgument, "x must be"));
  EXPECT_THAT(call(l, n_expert, n_tokens, k, x.as<float>(), parts.as<float>() + 1, ws_bytes),
              StatusIsWith(StatusCode::kInvalidArgument, "parts must be"));
  ExpertLayout bad = l;
  bad.role_bytes[kUp] += 16;
  EXPECT_THAT(call(bad, n_expert, n_tokens, k, x.as<float>(), parts.as<float>(), ws_bytes),
              StatusIsWith(StatusCode::kInvalidArgument, "role_bytes of up"));
  bad = l;
  bad.expert_ff = 100;
  EXPECT_THAT(call(bad, n_expert, n_tokens, k, x.as<float>(), parts.as<float>(), ws_bytes),
              StatusIsWith(StatusCode::kInvalidArgument, "expert_ff 100"));
  ExpertFfnExtras misaligned;
  misaligned.down_bias = reinterpret_cast<const float*>(x.as<uint8_t>() + 2);
  EXPECT_THAT(ExpertFfn(l, blobs, n_expert, ids.as<int32_t>(), n_tokens, k, x.as<float>(), parts.as<float>(),
                        misaligned, ws->data(), ws_bytes, stream_),
              StatusIsWith(StatusCode::kInvalidArgument, "extras.down_bias must be aligned to 4 bytes"));
  EXPECT_EQ(ExpertFfnWorkspaceBytes(l, -1, k, n_expert), 0u);
  // No tokens: nothing enqueued, nothing checked beyond the sizes.
  EXPECT_THAT(call(l, n_expert, 0, k, nullptr, nullptr, 0), IsOk());
  ASSERT_TRUE(CudaOk(cudaStreamSynchronize(stream_)));
}

INSTANTIATE_TEST_SUITE_P(Schemes, ExpertFfnGpuTest,
                         ::testing::Values(Scheme::kF16, Scheme::kS8, Scheme::kS4, Scheme::kS2, Scheme::kMxfp4),
                         [](const ::testing::TestParamInfo<Scheme>& info) {
                           return std::string(SchemeName(info.param));
                         });

}  // namespace
}  // namespace strata::kernels::cuda
