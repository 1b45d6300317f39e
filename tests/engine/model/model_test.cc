// Model::Forward's batch checks (engine/model/model.cc) for sliding-window caches: a step may write at most
// the positions of a sequence its windowed blocks' rings were sized for.

#include <memory>
#include <string>
#include <vector>

#include "engine/exec/thread_pool.h"
#include "engine/model/kv_cache.h"
#include "engine/model/model.h"
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

}  // namespace
}  // namespace strata::model
