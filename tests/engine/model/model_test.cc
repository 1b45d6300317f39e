// Model::Forward (engine/model/model.cc): the batch checks for sliding-window caches (a step may write at most
// the positions of a sequence its windowed blocks' rings were sized for) and the order of the blocks with
// routing guesses.

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "engine/exec/thread_pool.h"
#include "engine/model/cpu_dense_backend.h"
#include "engine/model/cpu_moe_dispatch.h"
#include "engine/model/kv_cache.h"
#include "engine/model/model.h"
#include "engine/pack/expert_source.h"
#include "engine/pack/pack.h"
#include "engine/runtime/model_factory.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/engine/runtime/engine_test_util.h"

namespace strata::model {
namespace {

using ::testing::HasSubstr;

// The tiny preset of `arch` loaded on the CPU backend, with caches for steps of 4 positions.
class LoadedTiny {
 public:
  explicit LoadedTiny(const std::string& arch) : synth_(arch) {
    auto pack = pack::Pack::Open(synth_.Pack(kernels::Scheme::kF16));
    EXPECT_TRUE(pack.ok()) << pack.status();
    pack_ = std::move(*pack);
    pool_ = std::move(*exec::ThreadPool::Create(2));
    runtime::DeviceOptions device;
    device.device = "cpu";
    auto loaded = runtime::LoadModel(*pack_, device, {}, {}, pool_.get(), nullptr);
    EXPECT_TRUE(loaded.ok()) << loaded.status();
    loaded_ = std::move(*loaded);
    kv_ = std::make_unique<KvCachePool>(CacheShape(model().config(), 4), uint64_t{1} << 26,
                                        model().backend().kv_memory());
    logits_.resize(static_cast<size_t>(model().config().n_vocab));
  }
  Model& model() { return *loaded_.model; }
  std::unique_ptr<KvCache> NewCache() { return *kv_->Allocate(64); }
  // A cache of another shape (from a pool kept for the model's lifetime).
  std::unique_ptr<KvCache> NewCacheOf(const KvShape& shape) {
    other_pools_.push_back(std::make_unique<KvCachePool>(shape, uint64_t{1} << 26, model().backend().kv_memory()));
    return *other_pools_.back()->Allocate(64);
  }
  // Positions first .. first + n - 1 of each cache in one step.
  absl::Status Step(const std::vector<KvCache*>& caches, int64_t first, int64_t n) {
    std::vector<ForwardToken> batch;
    for (KvCache* cache : caches) {
      for (int64_t p = first; p < first + n; ++p) batch.push_back({static_cast<int32_t>(5 + p), p, cache, false});
    }
    batch.back().want_logits = true;
    return model().Forward(batch, logits_.data(), nullptr);
  }

 private:
  runtime::TinyModel synth_;
  std::unique_ptr<pack::Pack> pack_;
  std::unique_ptr<exec::ThreadPool> pool_;
  runtime::LoadedModel loaded_;
  std::unique_ptr<KvCachePool> kv_;
  std::vector<std::unique_ptr<KvCachePool>> other_pools_;
  std::vector<float> logits_;
};

TEST(ModelTest, AStepWiderThanTheRingsWereSizedForIsRefused) {
  LoadedTiny tiny("gpt-oss");
  std::unique_ptr<KvCache> a = tiny.NewCache(), b = tiny.NewCache();
  ASSERT_TRUE(a->windowed());
  EXPECT_EQ(a->slots(0), 8 + 4 - 1);
  // Four positions of each of two sequences in one step, then the next four: within each ring's step.
  EXPECT_TRUE(tiny.Step({a.get(), b.get()}, 0, 4).ok());
  EXPECT_TRUE(tiny.Step({a.get(), b.get()}, 4, 4).ok());
  const absl::Status wide = tiny.Step({a.get()}, 8, 5);
  EXPECT_EQ(wide.code(), absl::StatusCode::kInvalidArgument) << wide;
  EXPECT_THAT(wide.message(), HasSubstr("positions 8..12"));
  EXPECT_THAT(wide.message(), HasSubstr("sliding-window KV cache holds at most 4 per step"));
}

TEST(ModelTest, CachesWithoutWindowsTakeAnyStep) {
  LoadedTiny tiny("qwen3moe");
  std::unique_ptr<KvCache> cache = tiny.NewCache();
  EXPECT_FALSE(cache->windowed());
  EXPECT_TRUE(tiny.Step({cache.get()}, 0, 64).ok());
}

// A cache laid out for another model (layers, key or value widths, rings for other windows) is refused before
// any block reads it; one without rings fits any model, sliding windows included.
TEST(ModelTest, ACacheLaidOutForAnotherModelIsRefused) {
  LoadedTiny tiny("gpt-oss");
  const KvShape own = CacheShape(tiny.model().config(), 4);
  ASSERT_FALSE(own.windows.empty());
  auto refused = [&](KvShape shape, const std::string& says) {
    std::unique_ptr<KvCache> cache = tiny.NewCacheOf(shape);
    const absl::Status s = tiny.Step({cache.get()}, 0, 1);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(s.message(), HasSubstr(says));
  };
  KvShape shape = own;
  shape.n_layer += 1;
  shape.windows.push_back(0);
  refused(shape, absl::StrCat("a KV cache of ", own.n_layer + 1, " layers"));
  shape = own;
  shape.layout.key_dim += 4;
  refused(shape, "reached a model that needs");
  shape = own;
  shape.layout.value_dim -= 4;
  refused(shape, "reached a model that needs");
  int64_t windowed = 0;
  while (own.windows[windowed] == 0) ++windowed;
  shape = own;
  shape.windows[windowed] = own.windows[windowed] / 2;
  refused(shape, absl::StrCat("layer ", windowed, " of a KV cache keeps a ring for a window of ",
                              own.windows[windowed] / 2, " positions; the model's is ", own.windows[windowed]));
  shape = own;
  const int64_t unwindowed = own.windows[0] == 0 ? 0 : 1;
  ASSERT_EQ(own.windows[unwindowed], 0);
  shape.windows[unwindowed] = own.windows[windowed];
  refused(shape, absl::StrCat("layer ", unwindowed, " of a KV cache keeps a ring"));
  // No rings at all: every layer keeps every position.
  shape = own;
  shape.windows.clear();
  std::unique_ptr<KvCache> plain = tiny.NewCacheOf(shape);
  ASSERT_FALSE(plain->windowed());
  EXPECT_TRUE(tiny.Step({plain.get()}, 0, 8).ok());
}

// Records the blocks a step runs, in order, around the CPU backend and dispatch; the dispatch wants routing
// guesses for steps of up to max_guess_tokens tokens.
class RecordingBackend : public DenseBackend {
 public:
  RecordingBackend(std::unique_ptr<DenseBackend> inner, std::vector<std::string>* log)
      : inner_(std::move(inner)), log_(log) {}
  BackendInfo info() const override { return inner_->info(); }
  KvMemory* kv_memory() override { return inner_->kv_memory(); }
  absl::Status BeginBatch(std::span<const ForwardToken> tokens) override {
    n_tokens_ = static_cast<int>(tokens.size());
    return inner_->BeginBatch(tokens);
  }
  absl::Status Run(absl::FunctionRef<absl::Status()> blocks) override { return inner_->Run(blocks); }
  absl::Status Embed() override { return inner_->Embed(); }
  absl::Status Attention(int64_t l) override { return inner_->Attention(l); }
  absl::Status Router(int64_t l, MoeBatch* moe) override {
    log_->push_back(absl::StrCat("router ", l));
    return inner_->Router(l, moe);
  }
  absl::Status GuessRouting(int64_t next_layer, RoutingGuess* guess) override {
    log_->push_back(absl::StrCat("guess ", next_layer));
    guess->n_tokens = n_tokens_;
    return absl::OkStatus();
  }
  absl::Status Combine(int64_t l, const MoeBatch& moe) override {
    log_->push_back(absl::StrCat("combine ", l));
    return inner_->Combine(l, moe);
  }
  absl::Status DenseFfn(int64_t l) override {
    log_->push_back(absl::StrCat("dense ", l));
    return inner_->DenseFfn(l);
  }
  absl::Status Head() override { return inner_->Head(); }
  absl::Status EndBatch(float* logits) override { return inner_->EndBatch(logits); }
  const int32_t* routing(int64_t l) const override { return inner_->routing(l); }

 private:
  std::unique_ptr<DenseBackend> inner_;
  std::vector<std::string>* log_;
  int n_tokens_ = 0;
};

class GuessingDispatch : public MoeDispatch {
 public:
  GuessingDispatch(std::unique_ptr<MoeDispatch> inner, int max_guess_tokens, std::vector<std::string>* log)
      : inner_(std::move(inner)), max_guess_tokens_(max_guess_tokens), log_(log) {}
  std::string_view device() const override { return inner_->device(); }
  bool WantsRoutingGuess(int n_tokens) const override { return n_tokens <= max_guess_tokens_; }
  absl::Status Prefetch(const RoutingGuess& guess) override {
    log_->push_back(absl::StrCat("prefetch moe ", guess.moe_layer, " of ", guess.n_tokens, " tokens"));
    return absl::OkStatus();
  }
  absl::Status Run(const MoeBatch& batch) override {
    log_->push_back(absl::StrCat("run moe ", batch.moe_layer));
    return inner_->Run(batch);
  }
  void Account(int64_t moe_layer, const int32_t* ids, int n_tokens, int k, DispatchStats* stats) const override {
    inner_->Account(moe_layer, ids, n_tokens, k, stats);
  }

 private:
  std::unique_ptr<MoeDispatch> inner_;
  int max_guess_tokens_;
  std::vector<std::string>* log_;
};

// A dispatch that wants guesses gets, after each MoE block's router, the guess of the next block's routing,
// when that block is a MoE block, before the current block's Run; dense leading blocks get none, and steps
// longer than the dispatch wants get none either.
TEST(ModelTest, RoutingGuessesComeOneMoeBlockEarlyForTheStepsThatWantThem) {
  runtime::TinyModel synth("deepseek2");  // a dense leading block, then two MoE blocks
  auto pack = pack::Pack::Open(synth.Pack(kernels::Scheme::kF16));
  ASSERT_TRUE(pack.ok()) << pack.status();
  auto source = pack::OpenExpertSource(**pack, {}, nullptr);
  ASSERT_TRUE(source.ok()) << source.status();
  auto pool = exec::ThreadPool::Create(2);
  ASSERT_TRUE(pool.ok());
  auto model = Model::Create(**pack);
  ASSERT_TRUE(model.ok()) << model.status();
  Model& m = **model;
  const ModelConfig& c = m.config();
  ASSERT_GE(c.n_dense_lead, 1);
  ASSERT_GE(c.n_layer - c.n_dense_lead, 2);
  std::vector<std::string> log;
  m.Attach(std::make_unique<RecordingBackend>(std::make_unique<CpuDenseBackend>(c, m.weights(), pool->get()), &log),
           std::make_unique<GuessingDispatch>(
               std::make_unique<CpuMoeDispatch>(source->get(), (*pack)->layout(), c.n_expert, pool->get(),
                                                ExpertExtrasOf(c, m.weights())),
               2, &log));
  KvCachePool kv(CacheShape(c, 4), uint64_t{1} << 26, m.backend().kv_memory());
  std::unique_ptr<KvCache> a = *kv.Allocate(64), b = *kv.Allocate(64);
  std::vector<float> logits(static_cast<size_t>(c.n_vocab));

  std::vector<ForwardToken> step = {{5, 0, a.get(), false}, {6, 0, b.get(), true}};
  ASSERT_TRUE(m.Forward(step, logits.data(), nullptr).ok());
  std::vector<std::string> want;
  for (int64_t l = 0; l < c.n_layer; ++l) {
    if (l < c.n_dense_lead) {
      want.push_back(absl::StrCat("dense ", l));
      continue;
    }
    want.push_back(absl::StrCat("router ", l));
    if (l + 1 < c.n_layer) {
      want.push_back(absl::StrCat("guess ", l + 1));
      want.push_back(absl::StrCat("prefetch moe ", l + 1 - c.n_dense_lead, " of 2 tokens"));
    }
    want.push_back(absl::StrCat("run moe ", l - c.n_dense_lead));
    want.push_back(absl::StrCat("combine ", l));
  }
  EXPECT_EQ(log, want);

  // Three tokens: more than the dispatch guesses for.
  log.clear();
  step = {{7, 1, a.get(), false}, {8, 2, a.get(), false}, {9, 1, b.get(), true}};
  ASSERT_TRUE(m.Forward(step, logits.data(), nullptr).ok());
  for (const std::string& call : log) {
    EXPECT_FALSE(absl::StartsWith(call, "guess") || absl::StartsWith(call, "prefetch")) << call;
  }
  EXPECT_FALSE(log.empty());
}

}  // namespace
}  // namespace strata::model
