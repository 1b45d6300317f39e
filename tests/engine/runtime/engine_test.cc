#include "engine/runtime/engine.h"

#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <set>
#include <thread>

#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "packtool/convert.h"
#include "packtool/synth.h"
#include "tests/testing/reference_model.h"
#include "tests/testing/test_util.h"

namespace strata::runtime {
namespace {

using ::strata::testing::ReferenceModel;
using ::strata::testing::ScratchDir;

// A tiny synthesized model of `arch`, as GGUF and as packs in each scheme, shared by a test suite.
struct TinyModel {
  explicit TinyModel(const std::string& arch) {
    packtool::SynthOptions o;
    o.geometry = *packtool::PresetGeometry(arch, "tiny");
    o.dense_type = gguf::GgmlType::kF32;
    o.expert_type = gguf::GgmlType::kF32;
    o.seed = 11;
    o.output = dir.Join("model.gguf");
    o.threads = 2;
    const absl::Status s = packtool::SynthesizeGguf(o);
    EXPECT_TRUE(s.ok()) << s;
  }
  std::string Pack(kernels::Scheme scheme) {
    const std::string out = dir.Join(std::string(kernels::SchemeName(scheme)));
    if (!std::filesystem::exists(out)) {
      packtool::ConvertOptions c;
      c.input = dir.Join("model.gguf");
      c.output_dir = out;
      c.scheme = scheme;
      c.threads = 2;
      auto m = packtool::ConvertGguf(c, nullptr, nullptr);
      EXPECT_TRUE(m.ok()) << m.status();
    }
    return out;
  }
  ScratchDir dir;
};

EngineOptions Options(const std::string& pack, int max_seqs = 4) {
  EngineOptions o;
  o.pack_dir = pack;
  o.threads = 2;
  o.max_seqs = max_seqs;
  o.max_ctx = 256;
  return o;
}

GenerateRequest Greedy(std::vector<int32_t> prompt, int max_tokens) {
  GenerateRequest r;
  r.prompt_tokens = std::move(prompt);
  r.sampling.temperature = 0;
  r.sampling.max_tokens = max_tokens;
  r.sampling.ignore_eos = true;
  return r;
}

// Greedy continuation by the reference: recompute the whole sequence each step.
std::vector<int32_t> ReferenceGreedy(ReferenceModel& ref, std::vector<int32_t> tokens, int n) {
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) {
    const std::vector<float> logits = ref.Logits(tokens);
    const float* last = logits.data() + (tokens.size() - 1) * ref.n_vocab();
    const int32_t next = static_cast<int32_t>(std::max_element(last, last + ref.n_vocab()) - last);
    out.push_back(next);
    tokens.push_back(next);
  }
  return out;
}

double RelativeError(const float* a, const float* b, int64_t n) {
  double d = 0, r = 0;
  for (int64_t i = 0; i < n; ++i) {
    d += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    r += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(d / r);
}

class EngineArchTest : public ::testing::TestWithParam<std::string> {};

TEST_P(EngineArchTest, F16LogitsAndGreedyTokensMatchTheReference) {
  TinyModel model(GetParam());
  auto ref = ReferenceModel::FromGguf(model.dir.Join("model.gguf"));
  ASSERT_TRUE(ref.ok()) << ref.status();
  auto engine = Engine::Create(Options(model.Pack(kernels::Scheme::kF16)));
  ASSERT_TRUE(engine.ok()) << engine.status();
  const std::vector<int32_t> prompt = {5, 77, 140, 3, 250, 31, 9};
  GenerateRequest req = Greedy(prompt, 12);
  req.prompt_logits = true;
  auto done = (*engine)->Generate(req);
  ASSERT_TRUE(done.ok()) << done.status();
  ASSERT_TRUE(done->result.status.ok()) << done->result.status;
  const int64_t n_vocab = (*ref)->n_vocab();
  const std::vector<float> expected = (*ref)->Logits(prompt);
  ASSERT_EQ(done->result.prompt_logits.size(), expected.size());
  for (size_t p = 0; p < prompt.size(); ++p) {
    EXPECT_LT(RelativeError(done->result.prompt_logits.data() + p * n_vocab, expected.data() + p * n_vocab, n_vocab),
              1e-3)
        << "position " << p;
  }
  EXPECT_EQ(done->result.tokens, ReferenceGreedy(**ref, prompt, 12));
  EXPECT_EQ(done->result.reason, FinishReason::kLength);
  // A forward pass that varies: not one token forever.
  std::set<int32_t> distinct(done->result.tokens.begin(), done->result.tokens.end());
  EXPECT_GE(distinct.size(), 3u);
}

INSTANTIATE_TEST_SUITE_P(Architectures, EngineArchTest, ::testing::Values("qwen3moe", "mixtral"));

class EngineSchemeTest : public ::testing::TestWithParam<kernels::Scheme> {};

// Integer schemes quantize activations to int8 per 32, so the engine differs from the reference that uses
// the same dequantized weights with float activations; the bounds are what that costs on the tiny model.
TEST_P(EngineSchemeTest, QuantizedLogitsStayNearTheReferenceOfTheSameWeights) {
  TinyModel model("qwen3moe");
  const std::string pack = model.Pack(GetParam());
  auto ref = ReferenceModel::FromPack(pack);
  ASSERT_TRUE(ref.ok()) << ref.status();
  auto engine = Engine::Create(Options(pack));
  ASSERT_TRUE(engine.ok()) << engine.status();
  const std::vector<int32_t> prompt = {17, 4, 99, 180, 2, 66};
  GenerateRequest req = Greedy(prompt, 1);
  req.prompt_logits = true;
  auto done = (*engine)->Generate(req);
  ASSERT_TRUE(done.ok() && done->result.status.ok());
  const int64_t n_vocab = (*ref)->n_vocab();
  const std::vector<float> expected = (*ref)->Logits(prompt);
  double worst = 0;
  for (size_t p = 0; p < prompt.size(); ++p) {
    worst = std::max(worst, RelativeError(done->result.prompt_logits.data() + p * n_vocab,
                                          expected.data() + p * n_vocab, n_vocab));
  }
  EXPECT_LT(worst, 0.02) << kernels::SchemeName(GetParam());
}

INSTANTIATE_TEST_SUITE_P(Schemes, EngineSchemeTest,
                         ::testing::Values(kernels::Scheme::kS8, kernels::Scheme::kS4, kernels::Scheme::kS2),
                         [](const auto& info) { return std::string(kernels::SchemeName(info.param)); });

class EngineTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_ = new TinyModel("qwen3moe");
    pack_ = new std::string(model_->Pack(kernels::Scheme::kS4));
  }
  static void TearDownTestSuite() {
    delete pack_;
    delete model_;
  }
  static TinyModel* model_;
  static std::string* pack_;
};
TinyModel* EngineTest::model_ = nullptr;
std::string* EngineTest::pack_ = nullptr;

TEST_F(EngineTest, BatchedDecodingGivesTheSameTokensAsOneAtATime) {
  const std::vector<std::vector<int32_t>> prompts = {{1, 2, 3}, {200, 100, 50, 25}, {7}, {90, 91, 92, 93, 94, 95}};
  std::vector<std::vector<int32_t>> alone;
  {
    auto engine = Engine::Create(Options(*pack_, 1));
    ASSERT_TRUE(engine.ok()) << engine.status();
    for (const auto& p : prompts) alone.push_back((*engine)->Generate(Greedy(p, 10))->result.tokens);
  }
  auto engine = Engine::Create(Options(*pack_, 4));
  ASSERT_TRUE(engine.ok());
  std::vector<GenerationResult> results(prompts.size());
  std::vector<absl::Notification> done(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    GenerateCallbacks cb;
    cb.on_done = [&, i](const GenerationResult& r) {
      results[i] = r;
      done[i].Notify();
    };
    ASSERT_TRUE((*engine)->Submit(Greedy(prompts[i], 10), cb).ok());
  }
  for (auto& d : done) d.WaitForNotification();
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(results[i].tokens, alone[i]) << "prompt " << i;
  EXPECT_GT((*engine)->stats().steps, 0u);
}

TEST_F(EngineTest, SameSeedSameTokensAndStopRules) {
  auto engine = Engine::Create(Options(*pack_));
  ASSERT_TRUE(engine.ok());
  GenerateRequest r = Greedy({3, 1, 4, 1, 5}, 20);
  r.sampling.temperature = 1.0f;
  r.sampling.seed = 42;
  auto a = (*engine)->Generate(r);
  auto b = (*engine)->Generate(r);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->result.tokens, b->result.tokens);
  EXPECT_EQ(a->result.tokens.size(), 20u);
  // A stop token id ends generation right after it.
  GenerateRequest s = r;
  s.sampling.stop_token_ids = {a->result.tokens[4]};
  auto c = (*engine)->Generate(s);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->result.reason, FinishReason::kStop);
  EXPECT_LE(c->result.tokens.size(), 5u);
  EXPECT_EQ(c->result.tokens.back(), a->result.tokens[4]);
}

TEST_F(EngineTest, BadOptionsAreRefusedNamingTheField) {
  EngineOptions o = Options(*pack_);
  o.threads = -4;
  EXPECT_THAT(Engine::Create(o).status(), StatusIsWith(absl::StatusCode::kInvalidArgument, "threads: -4"));
  o = Options(*pack_);
  o.max_ctx = -1;
  EXPECT_THAT(Engine::Create(o).status(), StatusIsWith(absl::StatusCode::kInvalidArgument, "max_ctx: -1"));
}

TEST_F(EngineTest, BadRequestsAreRefusedNamingTheField) {
  auto engine = Engine::Create(Options(*pack_));
  ASSERT_TRUE(engine.ok());
  GenerateRequest empty;
  EXPECT_THAT((*engine)->Submit(empty, {}).status(), StatusIsWith(absl::StatusCode::kInvalidArgument, "prompt"));
  EXPECT_THAT((*engine)->Submit(Greedy({1, 999999}, 4), {}).status(),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "prompt_tokens[1]"));
  EXPECT_THAT((*engine)->Submit(Greedy(std::vector<int32_t>(300, 1), 4), {}).status(),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "context"));
  GenerateRequest hot = Greedy({1}, 4);
  hot.sampling.temperature = -1;
  EXPECT_THAT((*engine)->Submit(hot, {}).status(), StatusIsWith(absl::StatusCode::kInvalidArgument, "temperature"));
}

// Fails every read of one expert: the request must fail cleanly, with no token emitted.
class FailingSource : public pack::ExpertSource {
 public:
  explicit FailingSource(std::unique_ptr<pack::ExpertSource> inner) : inner_(std::move(inner)) {}
  absl::StatusOr<const uint8_t*> Blob(int64_t layer, int64_t expert) override {
    if (layer == 1) return absl::DataLossError("experts.bin: short read of blob (moe layer 1)");
    return inner_->Blob(layer, expert);
  }
  std::string_view kind() const override { return "failing"; }
  uint64_t blob_bytes() const override { return inner_->blob_bytes(); }

 private:
  std::unique_ptr<pack::ExpertSource> inner_;
};

TEST_F(EngineTest, AnExpertReadFailureFailsTheRequestWithoutTokens) {
  EngineOptions o = Options(*pack_);
  o.source_factory = [](const pack::Pack& p) -> std::unique_ptr<pack::ExpertSource> {
    return std::make_unique<FailingSource>(*pack::OpenExpertSource(p, {}, nullptr));
  };
  auto engine = Engine::Create(o);
  ASSERT_TRUE(engine.ok()) << engine.status();
  int token_events = 0;
  GenerationResult result;
  absl::Notification done;
  GenerateCallbacks cb;
  cb.on_tokens = [&](const TokenEvent&) { ++token_events; };
  cb.on_done = [&](const GenerationResult& r) {
    result = r;
    done.Notify();
  };
  ASSERT_TRUE((*engine)->Submit(Greedy({1, 2, 3}, 5), cb).ok());
  done.WaitForNotification();
  EXPECT_EQ(result.reason, FinishReason::kError);
  EXPECT_THAT(result.status, StatusIsWith(absl::StatusCode::kDataLoss, "moe layer 1"));
  EXPECT_EQ(token_events, 0);
  EXPECT_TRUE(result.tokens.empty());
  EXPECT_EQ((*engine)->stats().kv_bytes_in_use, 0u);
}

TEST_F(EngineTest, CancelFreesTheSequence) {
  auto engine = Engine::Create(Options(*pack_, 1));
  ASSERT_TRUE(engine.ok());
  GenerationResult result;
  absl::Notification done;
  GenerateCallbacks cb;
  std::shared_ptr<RequestHandle> handle;
  std::atomic<int> events{0};
  cb.on_tokens = [&](const TokenEvent&) { ++events; };
  cb.on_done = [&](const GenerationResult& r) {
    result = r;
    done.Notify();
  };
  auto h = (*engine)->Submit(Greedy({1, 2, 3}, 200), cb);
  ASSERT_TRUE(h.ok());
  while (events.load() < 2) std::this_thread::yield();
  (*h)->Cancel();
  done.WaitForNotification();
  EXPECT_EQ(result.reason, FinishReason::kCancelled);
  EXPECT_LT(result.tokens.size(), 200u);
  EXPECT_EQ((*engine)->stats().kv_bytes_in_use, 0u);
  // The engine still serves.
  auto next = (*engine)->Generate(Greedy({4, 5}, 3));
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(next->result.tokens.size(), 3u);
}

TEST_F(EngineTest, CallbacksOfARequestRunOneAtATimeInOrderAndAllBeforeTheEngineIsGone) {
  constexpr int kRequests = 4;
  std::vector<std::atomic<int>> inside(2 * kRequests);  // per request
  std::atomic<int> overlaps{0};
  std::atomic<int> out_of_order{0};
  std::atomic<int> second_batch_events{0};
  // Element i is touched only by request i's callbacks, which run one at a time.
  std::vector<std::vector<int32_t>> tokens_seen(2 * kRequests);
  std::vector<char> finished(2 * kRequests, false);
  std::vector<std::atomic<int>> done_calls(2 * kRequests);
  std::vector<GenerationResult> results(2 * kRequests);
  auto callbacks = [&](int i) {
    GenerateCallbacks cb;
    cb.on_tokens = [&, i](const TokenEvent& e) {
      if (inside[i].fetch_add(1) != 0) overlaps.fetch_add(1);
      if (finished[i]) out_of_order.fetch_add(1);
      tokens_seen[i].insert(tokens_seen[i].end(), e.tokens.begin(), e.tokens.end());
      if (i >= kRequests) second_batch_events.fetch_add(1);
      std::this_thread::sleep_for(std::chrono::microseconds(50));  // widen any window for overlap
      inside[i].fetch_sub(1);
    };
    cb.on_done = [&, i](const GenerationResult& r) {
      if (inside[i].fetch_add(1) != 0) overlaps.fetch_add(1);
      finished[i] = true;
      results[i] = r;
      done_calls[i].fetch_add(1);
      inside[i].fetch_sub(1);
    };
    return cb;
  };
  {
    EngineOptions o = Options(*pack_, kRequests);
    o.threads = 3;  // workers exist, so callbacks run as posted work
    auto engine = Engine::Create(o);
    ASSERT_TRUE(engine.ok());
    for (int i = 0; i < kRequests; ++i) {
      ASSERT_TRUE((*engine)->Submit(Greedy({static_cast<int32_t>(i + 1), 2, 3}, 12), callbacks(i)).ok());
    }
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    auto all_done = [&] {
      for (int i = 0; i < kRequests; ++i) {
        if (done_calls[i].load() == 0) return false;
      }
      return true;
    };
    while (!all_done() && std::chrono::steady_clock::now() < give_up) std::this_thread::yield();
    ASSERT_TRUE(all_done());
    // A second batch is still running when the engine goes: each gets its on_done before the destructor
    // returns.
    for (int i = kRequests; i < 2 * kRequests; ++i) {
      ASSERT_TRUE((*engine)->Submit(Greedy({static_cast<int32_t>(i + 1), 5}, 200), callbacks(i)).ok());
    }
    while (second_batch_events.load() == 0 && std::chrono::steady_clock::now() < give_up) std::this_thread::yield();
    ASSERT_GT(second_batch_events.load(), 0);
  }
  EXPECT_EQ(overlaps.load(), 0);
  EXPECT_EQ(out_of_order.load(), 0);
  for (int i = 0; i < 2 * kRequests; ++i) {
    EXPECT_EQ(done_calls[i].load(), 1) << "request " << i;
    EXPECT_EQ(tokens_seen[i], results[i].tokens) << "request " << i;  // every token, in order
  }
  for (int i = 0; i < kRequests; ++i) EXPECT_EQ(results[i].reason, FinishReason::kLength);
  for (int i = kRequests; i < 2 * kRequests; ++i) EXPECT_EQ(results[i].reason, FinishReason::kCancelled);
}

TEST_F(EngineTest, FullQueueIsResourceExhausted) {
  EngineOptions o = Options(*pack_, 1);
  o.max_queue = 1;
  auto engine = Engine::Create(o);
  ASSERT_TRUE(engine.ok());
  std::vector<std::shared_ptr<RequestHandle>> handles;
  absl::Status last;
  for (int i = 0; i < 6 && last.ok(); ++i) {
    auto h = (*engine)->Submit(Greedy({1, 2}, 100), {});
    if (h.ok()) handles.push_back(*h);
    last = h.status();
  }
  EXPECT_THAT(last, StatusIs(absl::StatusCode::kResourceExhausted));
  for (auto& h : handles) h->Cancel();
}

}  // namespace
}  // namespace strata::runtime
