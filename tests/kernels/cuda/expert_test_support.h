#ifndef STRATA_TESTS_KERNELS_CUDA_EXPERT_TEST_SUPPORT_H_
#define STRATA_TESTS_KERNELS_CUDA_EXPERT_TEST_SUPPORT_H_

// What the ExpertFfn GPU tests build on: guarded device buffers, test layers of random or quantized experts
// (in device or mapped host memory), routings, gpt-oss's extras, and the CPU expectation with its check.
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

namespace strata::kernels::cuda::expert_test {

inline constexpr double kF16Tolerance = 1e-5;
inline constexpr double kIntegerTolerance = 2e-5;
inline constexpr float kFlipMargin = 5e-3f;  // in code units; GPU-CPU differences of h are ~1e-4 at most
inline constexpr uint32_t kPoisonBits = 0x7FBADBADu;  // a NaN no kernel computes
inline constexpr size_t kGuardBytes = 4096;
inline constexpr uint8_t kGuardByte = 0x5A;

inline ::testing::AssertionResult CudaOk(cudaError_t e) {
  if (e == cudaSuccess) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << cudaGetErrorString(e);
}

inline float PoisonFloat() {
  float f;
  std::memcpy(&f, &kPoisonBits, 4);
  return f;
}

inline uint32_t Bits(float f) {
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

inline float Uniform(std::mt19937_64& rng) { return static_cast<float>(rng() >> 40) * 0x1.0p-24f; }

inline void RandomCodesRole(Scheme s, int64_t rows, int64_t cols, std::mt19937_64& rng, uint8_t* dst) {
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

inline std::vector<uint8_t> MakeBlob(const ExpertLayout& l, Weights weights, uint64_t seed) {
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

inline Layer MakeLayer(const ExpertLayout& l, int n_expert, const std::vector<int32_t>& ids, Weights weights, bool pinned,
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
  kRandom,         // k distinct experts a token
  kWithSkips,      // kRandom, then a quarter of the ids negative or >= n_expert
  kAllSkipped,     // every id -1
  kMostlySkipped,  // kRandom, then -1 for ids not among the first n_expert / 16 experts (a streamed chunk)
  kHotExpert,      // kRandom with one expert in every token's list; token 0 names it in all k slots
  kEveryExpert,    // ids[p] = p % n_expert: every expert used, distinct per token
  kGraded,         // expert e gets e + 1 pairs (needs n_tokens * k = n_expert (n_expert + 1) / 2)
};

inline std::vector<int32_t> MakeRouting(Routing routing, int n_tokens, int k, int n_expert, std::mt19937& rng) {
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
    case Routing::kMostlySkipped:
      random_rows();
      for (int32_t& id : ids) id = id < std::max(1, n_expert / 16) ? id : -1;
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

inline std::vector<float> Gaussian(size_t n, std::mt19937& rng) {
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
inline Expected CpuExperts(const Layer& layer, int n_expert, const std::vector<int32_t>& ids, int n_tokens, int k,
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

inline double Norm(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x * x;
  return std::sqrt(s);
}

// Checks one pair's row (see the top of the file). `down` is the expert's dequantized down role (integer
// schemes). Returns the number of single-code flips of h it had to explain.
inline int CheckRow(Scheme s, const Expected& want, size_t pair, const float* got, const std::vector<float>& down,
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

}  // namespace strata::kernels::cuda::expert_test

#endif  // STRATA_TESTS_KERNELS_CUDA_EXPERT_TEST_SUPPORT_H_
