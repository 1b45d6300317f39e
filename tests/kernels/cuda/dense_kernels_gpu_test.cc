// Checks every dense CUDA kernel against the CPU code it must reproduce (DenseGemvReference, the ops of
// engine/model/ops.h, and an attention written here in double), on the shapes of real models and on odd
// ones. Outputs start as a NaN poison pattern, with poisoned guard bands around every device buffer and in
// the gaps of strided outputs: a value never written, or written where it must not be, is reported. The
// router's tests are in router_gpu_test.cc, the attention side's in attention_gpu_test.cc.

#include <cstring>
#include <string>

#include "tests/kernels/cuda/dense_test_support.h"

namespace strata::kernels::cuda {
namespace {

using namespace dense_test;  // the shared helpers of this test binary

constexpr int64_t kDequantElements = int64_t{4096} * 4096;
// x's TF32 parts for up to 512 tokens of 4096 (a context with split products).
constexpr int64_t kSplitElements = int64_t{512} * 4096;

void RunMatmul(MatmulContext& ctx, cudaStream_t stream, DenseType type, int64_t rows, int64_t cols, int n_tokens,
               bool accumulate, int64_t x_pad, int64_t y_pad) {
  const uint64_t seed = NextSeed();
  SCOPED_TRACE(absl::StrCat(DenseTypeName(type), " ", rows, "x", cols, " n_tokens ", n_tokens, " accumulate ",
                            accumulate, " x_pad ", x_pad, " y_pad ", y_pad, " seed ", seed));
  Random rng(seed);
  const int64_t x_stride = cols + x_pad, y_stride = rows + y_pad;
  const std::vector<uint8_t> w = RandomMatrix(type, rows, cols, seed);
  std::vector<float> x(static_cast<size_t>(n_tokens) * x_stride, PoisonFloat());
  std::vector<float> y0(static_cast<size_t>(n_tokens) * y_stride, PoisonFloat());
  for (int t = 0; t < n_tokens; ++t) {
    for (int64_t c = 0; c < cols; ++c) x[t * x_stride + c] = rng.Uniform(-1.0f, 1.0f);
    if (accumulate) {
      for (int64_t r = 0; r < rows; ++r) y0[t * y_stride + r] = rng.Uniform(-4.0f, 4.0f);
    }
  }
  DeviceArray<uint8_t> dw(w.size());
  DeviceArray<float> dx(x.size()), dy(y0.size());
  dw.Upload(w);
  dx.Upload(x);
  dy.Upload(y0);
  const absl::Status s = DenseMatmul(ctx, type, dw.get(), rows, cols, dx.get(), x_stride, n_tokens, dy.get(), y_stride,
                                     accumulate, stream);
  ASSERT_TRUE(s.ok()) << s;
  Check(cudaStreamSynchronize(stream), "DenseMatmul");

  std::vector<float> want = ReferenceProduct(type, w, rows, cols, x, x_stride, n_tokens, y_stride);
  if (accumulate) {
    for (int t = 0; t < n_tokens; ++t) {
      for (int64_t r = 0; r < rows; ++r) want[t * y_stride + r] = y0[t * y_stride + r] + want[t * y_stride + r];
    }
  }
  // A row of one or two outputs is a single short dot product whose terms can cancel: its relative error is
  // not bounded by float rounding of the result, so those rows get 1e-4 (any indexing bug is O(1)).
  ExpectRows(dy.Download(), want, n_tokens, rows, y_stride, rows <= 2 ? 1e-4 : 1e-5, "y");
  ExpectGuards(dy, "y");
}

TEST_F(DenseKernelsTest, MatmulMatchesTheCpuOnModelShapes) {
  auto ctx = Unwrap(MatmulContext::Create(stream_, kDequantElements, 0));
  for (DenseType type : kAllTypes) {
    // n_embd 2560 with 32 x 128 query heads: Wq, then Wo; 300 tokens cross to cuBLAS.
    for (int n_tokens : {1, 7, 16, 32, 300}) {
      RunMatmul(*ctx, stream_, type, 4096, 2560, n_tokens, /*accumulate=*/n_tokens % 2 == 0, 0, 0);
    }
    RunMatmul(*ctx, stream_, type, 4096, 2560, 1, /*accumulate=*/true, 0, 0);
    RunMatmul(*ctx, stream_, type, 4096, 2560, 300, /*accumulate=*/false, 0, 0);
    for (int n_tokens : {1, 8, 33}) RunMatmul(*ctx, stream_, type, 2560, 4096, n_tokens, n_tokens == 8, 0, 0);
    // 2048 and 4096 (Mixtral) hidden sizes, k/v projections.
    for (int n_tokens : {2, 16, 64}) RunMatmul(*ctx, stream_, type, 512, 2048, n_tokens, n_tokens == 16, 0, 0);
    for (int n_tokens : {1, 4}) RunMatmul(*ctx, stream_, type, 1024, 4096, n_tokens, false, 0, 0);
  }
}

TEST_F(DenseKernelsTest, MatmulMatchesTheCpuOnOddShapes) {
  auto ctx = Unwrap(MatmulContext::Create(stream_, kDequantElements, 0));
  // 37 rows: partial row blocks. cols 96 and 2080: Q8_0 rows that start 2 bytes past a word boundary.
  for (DenseType type : kAllTypes) {
    for (int64_t cols : {32, 96, 2080}) {
      for (int n_tokens : {1, 2, 3, 4, 5, 9, 16, 17, 31, 32, 33, 40}) {
        RunMatmul(*ctx, stream_, type, 37, cols, n_tokens, n_tokens % 3 == 0, /*x_pad=*/4, /*y_pad=*/3);
      }
    }
    RunMatmul(*ctx, stream_, type, 1, 64, 1, false, 8, 5);
    RunMatmul(*ctx, stream_, type, 3, 256, 2, true, 0, 1);
  }
}

TEST_F(DenseKernelsTest, MatmulMatchesTheCpuOnVocabularyMatrices) {
  auto ctx = Unwrap(MatmulContext::Create(stream_, kDequantElements, 0));
  // 151936 x 2560 (Qwen3 output); 33 tokens widen it in 24 row blocks.
  for (DenseType type : {DenseType::kF16, DenseType::kQ8_0}) {
    for (int n_tokens : {1, 33}) RunMatmul(*ctx, stream_, type, 151936, 2560, n_tokens, false, 0, 0);
  }
  // An F32 matrix over 2^31 bytes (the loader widens K-quant outputs to F32).
  for (int n_tokens : {1, 33}) RunMatmul(*ctx, stream_, DenseType::kF32, 151936, 4096, n_tokens, false, 0, 0);
  for (DenseType type : kAllTypes) RunMatmul(*ctx, stream_, type, 32000, 4096, 1, false, 0, 0);
}

TEST_F(DenseKernelsTest, MatmulWithoutAWideningWorkspaceLoopsTheGemv) {
  auto ctx = Unwrap(MatmulContext::Create(stream_, 0, 0));
  for (DenseType type : kAllTypes) {
    RunMatmul(*ctx, stream_, type, 300, 512, 70, true, 4, 2);  // F32: cuBLAS; others: 3 GEMV launches
  }
}

TEST_F(DenseKernelsTest, PromptProductsMeetTheFp32BoundWithOrWithoutSplitProducts) {
  // Without a split workspace (SGEMM), with one that holds every x here (TF32 for F16 and BF16), and with one of
  // 100 x 2560 elements, which 300 tokens overflow (SGEMM again) while 33 tokens fit.
  for (int64_t split : {int64_t{0}, kSplitElements, int64_t{100} * 2560}) {
    SCOPED_TRACE(absl::StrCat("split workspace ", split));
    auto ctx = Unwrap(MatmulContext::Create(stream_, kDequantElements, split));
    for (DenseType type : kAllTypes) {
      RunMatmul(*ctx, stream_, type, 4096, 2560, 300, /*accumulate=*/true, 4, 0);
      RunMatmul(*ctx, stream_, type, 2560, 4096, 300, /*accumulate=*/false, 0, 3);
      RunMatmul(*ctx, stream_, type, 40, 96, 33, /*accumulate=*/false, 0, 0);
    }
  }
}

TEST_F(DenseKernelsTest, SplitTf32IsAnotherComputationThanFp32) {
  // The same F16 product by a context without and with a split workspace: each within the f32 bound, and not the
  // same bits, which shows the split path ran (a single TF32 pass would miss the 1e-5 bound by an order of
  // magnitude).
  constexpr int64_t kRows = 512, kCols = 2560;
  constexpr int kTokens = 64;
  const uint64_t seed = NextSeed(), w_seed = NextSeed();
  SCOPED_TRACE(absl::StrCat("seed ", seed, ", weights' seed ", w_seed));
  Random rng(seed);
  const std::vector<uint8_t> w = RandomMatrix(DenseType::kF16, kRows, kCols, w_seed);
  std::vector<float> x(kTokens * kCols);
  for (float& v : x) v = rng.Uniform(-1.0f, 1.0f);
  DeviceArray<uint8_t> dw(w.size());
  DeviceArray<float> dx(x.size());
  dw.Upload(w);
  dx.Upload(x);
  std::vector<float> results[2];  // [without, with the split workspace]
  bool has_tf32 = false;
  for (int with_split = 0; with_split < 2; ++with_split) {
    auto ctx = Unwrap(MatmulContext::Create(stream_, kDequantElements, with_split ? kSplitElements : 0));
    has_tf32 = ctx->has_tf32();
    DeviceArray<float> dy(kTokens * kRows);
    ASSERT_TRUE(DenseMatmul(*ctx, DenseType::kF16, dw.get(), kRows, kCols, dx.get(), kCols, kTokens, dy.get(), kRows,
                            false, stream_)
                    .ok());
    Check(cudaStreamSynchronize(stream_), "DenseMatmul");
    results[with_split] = dy.Download();
  }
  const std::vector<float> want = ReferenceProduct(DenseType::kF16, w, kRows, kCols, x, kCols, kTokens, kRows);
  ExpectRows(results[0], want, kTokens, kRows, kRows, 1e-5, "FP32");
  ExpectRows(results[1], want, kTokens, kRows, kRows, 1e-5, "split TF32");
  // Without TF32 tensor cores (compute capability below 8.0) the split falls back to FP32: the same bits.
  const bool same = std::memcmp(results[0].data(), results[1].data(), results[0].size() * sizeof(float)) == 0;
  EXPECT_EQ(same, !has_tf32);
}

void RunMatmulGroup(MatmulContext& ctx, cudaStream_t stream, DenseType type, int64_t cols,
                    const std::vector<int64_t>& rows, int n_tokens) {
  const uint64_t seed = NextSeed();
  SCOPED_TRACE(absl::StrCat(DenseTypeName(type), " cols ", cols, " outputs ", rows.size(), " n_tokens ", n_tokens,
                            " seed ", seed));
  Random rng(seed);
  const int64_t x_stride = cols;
  const std::vector<float> x = RandomFloats(static_cast<size_t>(n_tokens) * x_stride, -1.0f, 1.0f, rng);
  DeviceArray<float> dx(x.size());
  dx.Upload(x);
  std::vector<std::vector<uint8_t>> w;
  std::vector<std::unique_ptr<DeviceArray<uint8_t>>> dw;
  std::vector<std::unique_ptr<DeviceArray<float>>> dy;
  std::vector<MatmulOutput> outputs;
  for (size_t i = 0; i < rows.size(); ++i) {
    w.push_back(RandomMatrix(type, rows[i], cols, seed + 101 * (i + 1)));
    dw.push_back(std::make_unique<DeviceArray<uint8_t>>(w[i].size()));
    dw[i]->Upload(w[i]);
    const int64_t y_stride = rows[i] + 1;
    dy.push_back(std::make_unique<DeviceArray<float>>(static_cast<size_t>(n_tokens) * y_stride));
    outputs.push_back(MatmulOutput{dw[i]->get(), rows[i], dy[i]->get(), y_stride});
  }
  const absl::Status s = DenseMatmulGroup(ctx, type, cols, outputs, dx.get(), x_stride, n_tokens, stream);
  ASSERT_TRUE(s.ok()) << s;
  Check(cudaStreamSynchronize(stream), "DenseMatmulGroup");
  for (size_t i = 0; i < rows.size(); ++i) {
    const std::string what = absl::StrCat("outputs[", i, "]");
    const std::vector<float> want =
        ReferenceProduct(type, w[i], rows[i], cols, x, x_stride, n_tokens, outputs[i].y_stride);
    // As RunMatmul: an output of one or two rows is a short dot product whose terms can cancel.
    ExpectRows(dy[i]->Download(), want, n_tokens, rows[i], outputs[i].y_stride, rows[i] <= 2 ? 1e-4 : 1e-5, what);
    ExpectGuards(*dy[i], what);
  }
}

TEST_F(DenseKernelsTest, MatmulGroupComputesEachOutput) {
  auto ctx = Unwrap(MatmulContext::Create(stream_, kDequantElements, 0));
  for (DenseType type : kAllTypes) {
    for (int n_tokens : {1, 5, 32, 300}) RunMatmulGroup(*ctx, stream_, type, 2560, {4096, 512, 512}, n_tokens);
    for (int n_tokens : {1, 9}) RunMatmulGroup(*ctx, stream_, type, 2048, {4096, 512, 512}, n_tokens);
    RunMatmulGroup(*ctx, stream_, type, 4096, {4096, 1024, 1024}, 3);
    RunMatmulGroup(*ctx, stream_, type, 96, {5, 37}, 17);
    RunMatmulGroup(*ctx, stream_, type, 64, {1}, 2);
  }
}

TEST_F(DenseKernelsTest, MatmulGroupSharesOneSplitAmongItsOutputs) {
  // The engine's QKV and gate/up products with split products: one split of x feeds every output.
  auto ctx = Unwrap(MatmulContext::Create(stream_, kDequantElements, kSplitElements));
  for (DenseType type : {DenseType::kF16, DenseType::kBF16}) {
    RunMatmulGroup(*ctx, stream_, type, 2560, {4096, 512, 512}, 300);
    RunMatmulGroup(*ctx, stream_, type, 2560, {1024, 1024}, 33);
  }
}

TEST_F(DenseKernelsTest, MatmulRejectsBadArguments) {
  EXPECT_THAT(MatmulContext::Create(stream_, -1, 0).status(),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "max_dequant_elements is -1"));
  // A size whose bytes would overflow is refused, not wrapped into a small allocation.
  EXPECT_THAT(MatmulContext::Create(stream_, 0, int64_t{1} << 62).status(),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "max_split_elements"));
  auto ctx = Unwrap(MatmulContext::Create(stream_, 0, 0));
  DeviceArray<uint8_t> w(1 << 16);
  DeviceArray<float> x(1 << 12), y(1 << 12);
  EXPECT_THAT(DenseMatmul(*ctx, DenseType::kQ8_0, w.get(), 4, 48, x.get(), 48, 1, y.get(), 4, false, stream_),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "cols is 48"));
  EXPECT_THAT(DenseMatmul(*ctx, DenseType::kF16, w.get(), 4, 12, x.get(), 12, 1, y.get(), 4, false, stream_),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "cols is 12"));
  EXPECT_THAT(DenseMatmul(*ctx, DenseType::kF32, w.get(), 4, 64, x.get(), 32, 1, y.get(), 4, false, stream_),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "x_stride is 32"));
  EXPECT_THAT(DenseMatmul(*ctx, DenseType::kF32, w.get(), 4, 64, x.get(), 66, 1, y.get(), 4, false, stream_),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "x_stride is 66"));
  EXPECT_THAT(DenseMatmul(*ctx, DenseType::kF32, w.get(), 8, 64, x.get(), 64, 2, y.get(), 4, false, stream_),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "y_stride is 4"));
  EXPECT_THAT(DenseMatmul(*ctx, DenseType::kF32, w.get() + 4, 4, 64, x.get(), 64, 1, y.get(), 4, false, stream_),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "16-byte aligned"));
  EXPECT_THAT(DenseMatmul(*ctx, DenseType::kF32, w.get(), 0, 64, x.get(), 64, 1, y.get(), 4, false, stream_),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "rows is 0"));
  const MatmulOutput o{w.get(), 4, y.get(), 4};
  const std::vector<MatmulOutput> four(4, o);
  EXPECT_THAT(DenseMatmulGroup(*ctx, DenseType::kF32, 64, std::span<const MatmulOutput>(), x.get(), 64, 1, stream_),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "outputs.size() is 0"));
  EXPECT_THAT(DenseMatmulGroup(*ctx, DenseType::kF32, 64, four, x.get(), 64, 1, stream_),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "outputs.size() is 4"));
  // n_tokens == 0 enqueues nothing.
  EXPECT_TRUE(DenseMatmul(*ctx, DenseType::kF32, w.get(), 4, 64, x.get(), 64, 0, y.get(), 4, false, stream_).ok());
  Sync();
  const std::vector<float> untouched = y.Download();
  EXPECT_TRUE(std::all_of(untouched.begin(), untouched.end(), IsPoison));
}

// ---------------------------------------------------------------------------------------------------------
// RmsNorm and CombineAndNorm.

TEST_F(DenseKernelsTest, RmsNormMatchesTheCpu) {
  struct Case {
    int rows;
    int64_t n;
    int64_t pad;
    bool in_place;
  };
  for (const Case& c : {Case{1, 2560, 0, false}, Case{7, 2048, 3, false}, Case{300, 4096, 0, true},
                        Case{3, 128, 5, true}, Case{5, 33, 1, false}, Case{2, 1, 0, false}}) {
    const uint64_t seed = NextSeed();
    SCOPED_TRACE(absl::StrCat("rows ", c.rows, " n ", c.n, " pad ", c.pad, " in place ", c.in_place, " seed ", seed));
    Random rng(seed);
    const int64_t stride = c.n + c.pad;
    std::vector<float> x(static_cast<size_t>(c.rows) * stride, PoisonFloat());
    for (int r = 0; r < c.rows; ++r) {
      for (int64_t i = 0; i < c.n; ++i) x[r * stride + i] = rng.Uniform(-3.0f, 3.0f);
    }
    const std::vector<float> weight = RandomFloats(c.n, 0.5f, 1.5f, rng);
    DeviceArray<float> dx(x.size()), dw(weight.size()), dout(x.size());
    dx.Upload(x);
    dw.Upload(weight);
    float* out = c.in_place ? dx.get() : dout.get();
    const absl::Status s = RmsNorm(dx.get(), stride, dw.get(), c.n, c.rows, 1e-6f, out, stride, stream_);
    ASSERT_TRUE(s.ok()) << s;
    Sync();
    std::vector<float> want(x.size(), PoisonFloat());
    for (int r = 0; r < c.rows; ++r) model::RmsNorm(&x[r * stride], weight.data(), c.n, 1e-6f, &want[r * stride]);
    ExpectRows(c.in_place ? dx.Download() : dout.Download(), want, c.rows, c.n, stride, 1e-6, "out");
    ExpectGuards(c.in_place ? dx : dout, "out");
  }
}

TEST_F(DenseKernelsTest, CombineAndNormMatchesTheCpu) {
  struct Case {
    int n_tokens;
    int k;
    int64_t n;
    bool norm;
  };
  for (const Case& c : {Case{1, 8, 2048, true}, Case{7, 8, 2560, true}, Case{64, 2, 4096, true}, Case{3, 1, 40, true},
                        Case{5, 8, 2048, false}, Case{2, 20, 7168, true}, Case{1, 10, 513, true}}) {
    const uint64_t seed = NextSeed();
    SCOPED_TRACE(absl::StrCat("n_tokens ", c.n_tokens, " k ", c.k, " n ", c.n, " norm ", c.norm, " seed ", seed));
    Random rng(seed);
    const size_t xn = static_cast<size_t>(c.n_tokens) * c.n;
    const std::vector<float> parts = RandomFloats(xn * c.k, -1.0f, 1.0f, rng);
    const std::vector<float> weights = RandomFloats(static_cast<size_t>(c.n_tokens) * c.k, 0.0f, 1.0f, rng);
    const std::vector<float> x = RandomFloats(xn, -2.0f, 2.0f, rng);
    const std::vector<float> norm = RandomFloats(c.n, 0.5f, 1.5f, rng);
    DeviceArray<float> dparts(parts.size()), dweights(weights.size()), dx(xn), dnorm(norm.size()), dh(xn);
    dparts.Upload(parts);
    dweights.Upload(weights);
    dx.Upload(x);
    dnorm.Upload(norm);
    const absl::Status s = CombineAndNorm(dparts.get(), dweights.get(), c.n_tokens, c.k, c.n, dx.get(),
                                          c.norm ? dnorm.get() : nullptr, 1e-5f, c.norm ? dh.get() : nullptr, stream_);
    ASSERT_TRUE(s.ok()) << s;
    Sync();
    std::vector<float> want_x = x, want_h(xn, PoisonFloat());
    for (int t = 0; t < c.n_tokens; ++t) {
      float* xt = &want_x[t * c.n];
      for (int j = 0; j < c.k; ++j) {
        const float wj = weights[t * c.k + j];
        const float* part = &parts[(static_cast<size_t>(t) * c.k + j) * c.n];
        for (int64_t i = 0; i < c.n; ++i) xt[i] += wj * part[i];
      }
      if (c.norm) model::RmsNorm(xt, norm.data(), c.n, 1e-5f, &want_h[t * c.n]);
    }
    ExpectRows(dx.Download(), want_x, c.n_tokens, c.n, c.n, 1e-6, "x");
    ExpectGuards(dx, "x");
    if (c.norm) {
      ExpectRows(dh.Download(), want_h, c.n_tokens, c.n, c.n, 1e-6, "h");
    } else {
      const std::vector<float> h = dh.Download();
      EXPECT_TRUE(std::all_of(h.begin(), h.end(), IsPoison)) << "h written without a norm";
    }
    ExpectGuards(dh, "h");
  }
}

// ---------------------------------------------------------------------------------------------------------
// KV caches, QkNormRopeStore and Attention.

TEST_F(DenseKernelsTest, EmbedRowsWidensTheTokensRows) {
  struct Case {
    DenseType type;
    int64_t vocab;
    int64_t n;
  };
  std::vector<Case> cases;
  for (DenseType type : kAllTypes) {
    cases.push_back({type, 1000, 2560});
    cases.push_back({type, 7, 32});
  }
  cases.push_back({DenseType::kF32, 151936, 4096});  // rows past 2^31 bytes
  cases.push_back({DenseType::kQ8_0, 151936, 2080});
  for (const Case& c : cases) {
    const uint64_t seed = NextSeed();
    SCOPED_TRACE(absl::StrCat(DenseTypeName(c.type), " vocab ", c.vocab, " n ", c.n, " seed ", seed));
    Random rng(seed);
    std::vector<int> tokens = {0, static_cast<int>(c.vocab - 1), static_cast<int>(c.vocab / 2),
                               3 % static_cast<int>(c.vocab)};
    for (int i = 0; i < 5; ++i) tokens.push_back(rng.UniformInt(0, static_cast<int>(c.vocab - 1)));
    const uint64_t row_bytes = DenseRowBytes(c.type, c.n);
    // Only the rows looked up are uploaded; the rest of the table is never read.
    DeviceArray<uint8_t> table(static_cast<size_t>(c.vocab) * row_bytes, /*poison=*/false);
    std::vector<std::vector<uint8_t>> rows;
    for (size_t i = 0; i < tokens.size(); ++i) {
      rows.push_back(RandomMatrix(c.type, 1, c.n, seed + i));
      table.UploadAt(static_cast<size_t>(tokens[i]) * row_bytes, rows[i].data(), row_bytes);
    }
    // A token repeated: the last upload of its row wins.
    std::vector<float> want;
    for (size_t i = 0; i < tokens.size(); ++i) {
      size_t last = i;
      for (size_t j = 0; j < tokens.size(); ++j) {
        if (tokens[j] == tokens[i]) last = j;
      }
      const std::vector<float> row = WidenRow(c.type, rows[last].data(), c.n);
      want.insert(want.end(), row.begin(), row.end());
    }
    std::vector<TokenSlot> slots;
    for (int t : tokens) slots.push_back(TokenSlot{nullptr, nullptr, 0, 0, t});
    DeviceArray<TokenSlot> dslots(slots.size());
    dslots.Upload(slots);
    DeviceArray<float> x(want.size());
    const absl::Status s =
        EmbedRows(c.type, table.get(), c.n, dslots.get(), static_cast<int>(tokens.size()), x.get(), stream_);
    ASSERT_TRUE(s.ok()) << s;
    Sync();
    const std::vector<float> got = x.Download();
    int wrong = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      if (std::memcmp(&got[i], &want[i], 4) != 0 && ++wrong <= 5) {
        ADD_FAILURE() << "token " << i / c.n << " (id " << tokens[i / c.n] << ") column " << i % c.n << ": "
                      << got[i] << ", the CPU's " << want[i];
      }
    }
    EXPECT_EQ(wrong, 0) << "elements differ from the CPU's";
    ExpectGuards(x, "x");
  }
  DeviceArray<uint8_t> table(1024);
  DeviceArray<float> x(1024);
  DeviceArray<TokenSlot> slots(1);
  EXPECT_THAT(EmbedRows(DenseType::kQ8_0, table.get(), 40, slots.get(), 1, x.get(), stream_),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "n is 40"));
}

// ---------------------------------------------------------------------------------------------------------
// A decode step captured once in a CUDA graph and replayed with new token ids and positions.

double GraphMillis(cudaStream_t stream, const std::function<void()>& enqueue, int replays) {
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  Check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), "begin capture");
  enqueue();
  Check(cudaStreamEndCapture(stream, &graph), "end capture");
  Check(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
  Check(cudaGraphLaunch(exec, stream), "warm-up");
  cudaEvent_t start, stop;
  Check(cudaEventCreate(&start), "event");
  Check(cudaEventCreate(&stop), "event");
  Check(cudaEventRecord(start, stream), "event");
  for (int i = 0; i < replays; ++i) Check(cudaGraphLaunch(exec, stream), "graph launch");
  Check(cudaEventRecord(stop, stream), "event");
  Check(cudaEventSynchronize(stop), "event");
  float ms = 0;
  Check(cudaEventElapsedTime(&ms, start, stop), "event");
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  return ms;
}

TEST_F(DenseKernelsTest, GemvReadsTheWeightsAtHbmSpeed) {
  constexpr int64_t kRows = 4096, kCols = 2560;
  constexpr int kCopies = 8, kCallsPerCopy = 8, kReplays = 5;
  auto ctx = Unwrap(MatmulContext::Create(stream_, 0, 0));
  const uint64_t bytes = kRows * DenseRowBytes(DenseType::kF16, kCols);
  DeviceArray<uint8_t> w(bytes * kCopies, /*poison=*/false);
  DeviceArray<float> x(kMaxGemvTokens * kCols), y(kMaxGemvTokens * kRows);
  Check(cudaMemset(w.get(), 0, bytes * kCopies), "memset");
  Check(cudaMemset(x.get(), 0, x.size() * 4), "memset");

  // Half the copies onto the other half: bytes * kCopies read and written in all.
  const double copy_ms = GraphMillis(
      stream_,
      [&] {
        for (int i = 0; i < kCallsPerCopy; ++i) {
          Check(cudaMemcpyAsync(w.get() + bytes * kCopies / 2, w.get(), bytes * kCopies / 2, cudaMemcpyDeviceToDevice,
                                stream_),
                "copy");
        }
      },
      kReplays);
  const double copy_gbps = 2.0 * (bytes * kCopies / 2) * kCallsPerCopy * kReplays / (copy_ms * 1e6);
  std::printf("device-to-device copy: %.0f GB/s (read + write)\n", copy_gbps);

  for (int n_tokens : {1, 2, 4, 8, 16, 32}) {
    absl::Status status;
    const double ms = GraphMillis(
        stream_,
        [&] {
          for (int i = 0; i < kCallsPerCopy; ++i) {
            for (int c = 0; c < kCopies && status.ok(); ++c) {
              status = DenseMatmul(*ctx, DenseType::kF16, w.get() + c * bytes, kRows, kCols, x.get(), kCols, n_tokens,
                                   y.get(), kRows, false, stream_);
            }
          }
        },
        kReplays);
    ASSERT_TRUE(status.ok()) << status;
    const double calls = static_cast<double>(kCopies) * kCallsPerCopy * kReplays;
    const double gbps = bytes * calls / (ms * 1e6);
    std::printf("GEMV 4096x2560 F16, %2d tokens: %6.2f us a call, %.0f GB/s of weights (%.0f%% of the copy)\n",
                n_tokens, ms * 1e3 / calls, gbps, 100 * gbps / copy_gbps);
    RecordProperty(absl::StrCat("gemv_gbps_", n_tokens), static_cast<int>(gbps));
    if (n_tokens == 1) {
      EXPECT_GT(gbps, 0.5 * copy_gbps) << "far below the copy bandwidth";
    }
  }
}

}  // namespace
}  // namespace strata::kernels::cuda
