// ExpertFfn against the CPU references (kernels/cpu) on real MoE shapes and the odd cases, for every scheme
// (QuantizeActivations: quantize_activations_gpu_test.cc).
//
// The layers, routings and the check of a result against the CPU: expert_test_support.h.

#include "kernels/cuda/expert_kernels.h"

#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/kernels/cuda/expert_test_support.h"
#include "tests/testing/test_util.h"

namespace strata::kernels::cuda {
namespace {

using namespace expert_test;  // the shared helpers of these tests

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
    // Twice, the second with the other launch form (mostly_skipped: wide integer calls walk the items): the
    // grouping's atomics order pairs differently and the walk takes units in another order; the bits must not
    // change.
    ExpertFfnExtras walked = device_extras;
    walked.mostly_skipped = true;
    const std::vector<float> again = Run(layer, c.n_expert, ids, c.n_tokens, c.k, x, walked);
    EXPECT_EQ(std::memcmp(parts.data(), again.data(), parts.size() * sizeof(float)), 0)
        << c.name << ": a second run (items walked) gave different bits";
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

// Wide: more units (item, strip or group of down tiles) than the blocks an H200 holds at once (132 SMs x 3),
// so that the walking blocks of RunCase's second run take several units each (RunCase checks the first run
// against the CPU, then the second's bits against it). Only integer schemes walk; f16 runs the grid twice.
TEST_P(ExpertFfnGpuTest, MoreUnitsThanGridBlocks) {  // 4096 pairs: 512 to 640 items, 8 strips and 8 groups
  RunCase({"5120 units at most", 512, 256, 128, 512, 8, Routing::kRandom, Weights::kRandomCodes});
}

// A streamed chunk's call: most ids skipped, the rest of a few experts, walked and launched on the bound.
TEST_P(ExpertFfnGpuTest, MostPairsSkipped) {
  RunCase({"most skipped", 1024, 512, 64, 1024, 8, Routing::kMostlySkipped, Weights::kRandomCodes});
}

TEST_P(ExpertFfnGpuTest, AllPairsSkipped) {  // narrow, then wide (no items to walk)
  RunCase({"all skipped", 2048, 768, 8, 4, 2, Routing::kAllSkipped, Weights::kRandomCodes});
  RunCase({"all skipped wide", 1024, 512, 8, 64, 2, Routing::kAllSkipped, Weights::kRandomCodes});
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
