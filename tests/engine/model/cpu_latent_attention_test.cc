// Latent attention on the CPU backend: the naive form (keys and values rebuilt from the latents) and the
// absorbed form (W_UK folded into the query, W_UV after the weighted sum) each against the reference model,
// which computes the naive way independently, and against each other; prompt batches and one-token decode
// steps, one sequence and two sharing a batch.

#include <memory>
#include <string>
#include <vector>

#include "engine/exec/thread_pool.h"
#include "engine/gguf/gguf_file.h"
#include "engine/model/cpu_dense_backend.h"
#include "engine/model/cpu_moe_dispatch.h"
#include "engine/model/kv_cache.h"
#include "engine/model/model.h"
#include "engine/pack/expert_source.h"
#include "engine/pack/pack.h"
#include "gtest/gtest.h"
#include "tests/engine/runtime/engine_test_util.h"
#include "tests/testing/hf_checkpoint_writer.h"

namespace strata::model {
namespace {

using runtime::RelativeError;
using testing::ReferenceModel;

// The tiny deepseek2 (no q LoRA) or small (q LoRA) preset's f16 pack, loaded with the CPU backend in one form.
class LatentModel {
 public:
  LatentModel(const std::string& pack_dir, LatentForm form) {
    auto pack = pack::Pack::Open(pack_dir);
    EXPECT_TRUE(pack.ok()) << pack.status();
    pack_ = std::move(*pack);
    auto model = Model::Create(*pack_);
    EXPECT_TRUE(model.ok()) << model.status();
    model_ = std::move(*model);
    pack::ExpertSourceOptions o;
    o.kind = "mmap";
    auto source = pack::OpenExpertSource(*pack_, o, nullptr);
    EXPECT_TRUE(source.ok()) << source.status();
    source_ = std::move(*source);
    pool_ = std::move(*exec::ThreadPool::Create(2));
    model_->Attach(std::make_unique<CpuDenseBackend>(model_->config(), model_->weights(), pool_.get(), form),
                   std::make_unique<CpuMoeDispatch>(source_.get(), pack_->layout(), model_->config().n_expert,
                                                    pool_.get(), ExpertExtrasOf(model_->config(), model_->weights())));
    kv_ = std::make_unique<KvCachePool>(CacheShape(model_->config(), 64), uint64_t{1} << 28, HostKvMemory());
  }

  std::unique_ptr<KvCache> NewCache() { return *kv_->Allocate(64); }

  // Logits of every token of the batch, each wanting them.
  std::vector<float> Forward(std::vector<ForwardToken> batch) {
    for (ForwardToken& t : batch) t.want_logits = true;
    std::vector<float> logits(batch.size() * model_->config().n_vocab);
    const absl::Status s = model_->Forward(batch, logits.data(), nullptr);
    EXPECT_TRUE(s.ok()) << s;
    return logits;
  }

  int64_t n_vocab() const { return model_->config().n_vocab; }

 private:
  std::unique_ptr<pack::Pack> pack_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<pack::ExpertSource> source_;
  std::unique_ptr<exec::ThreadPool> pool_;
  std::unique_ptr<KvCachePool> kv_;
};

const std::vector<int32_t> kSequence = {5, 77, 140, 3, 250, 31, 9, 200, 64, 12};
constexpr size_t kPromptLength = 6;  // the rest are decoded one token per step

// One sequence: the prompt as one batch, then one token per step. Row i holds position i's logits.
std::vector<float> PromptThenDecode(LatentModel& m) {
  std::unique_ptr<KvCache> cache = m.NewCache();
  std::vector<ForwardToken> prompt;
  for (size_t i = 0; i < kPromptLength; ++i) prompt.push_back({kSequence[i], static_cast<int64_t>(i), cache.get()});
  std::vector<float> rows = m.Forward(prompt);
  for (size_t i = kPromptLength; i < kSequence.size(); ++i) {
    const std::vector<float> step = m.Forward({{kSequence[i], static_cast<int64_t>(i), cache.get()}});
    rows.insert(rows.end(), step.begin(), step.end());
  }
  return rows;
}

double WorstRowError(const std::vector<float>& got, const std::vector<float>& want, int64_t n_vocab) {
  EXPECT_EQ(got.size(), want.size());
  double worst = 0;
  for (size_t r = 0; r * n_vocab < std::min(got.size(), want.size()); ++r) {
    worst = std::max(worst, RelativeError(got.data() + r * n_vocab, want.data() + r * n_vocab, n_vocab));
  }
  return worst;
}

class LatentFormTest : public ::testing::TestWithParam<std::string> {};

TEST_P(LatentFormTest, NaiveAndAbsorbedFormsEachMatchTheReferenceAndEachOther) {
  runtime::TinyModel tiny("deepseek2", gguf::GgmlType::kF32, GetParam());
  const std::string pack = tiny.Pack(kernels::Scheme::kF16);
  auto ref = ReferenceModel::FromPack(pack);
  ASSERT_TRUE(ref.ok()) << ref.status();
  const std::vector<float> expected = (*ref)->Logits(kSequence);
  LatentModel naive(pack, LatentForm::kNaive), absorbed(pack, LatentForm::kAbsorbed);
  const std::vector<float> by_naive = PromptThenDecode(naive);
  const std::vector<float> by_absorbed = PromptThenDecode(absorbed);
  const int64_t v = naive.n_vocab();
  EXPECT_LT(WorstRowError(by_naive, expected, v), 1e-4);
  EXPECT_LT(WorstRowError(by_absorbed, expected, v), 1e-4);
  EXPECT_LT(WorstRowError(by_absorbed, by_naive, v), 1e-5);
  // Not trivially equal: the rows differ between positions.
  EXPECT_GT(RelativeError(by_naive.data(), by_naive.data() + v, v), 1e-2);
}

// kAuto in one batch: sequence A decodes one token (absorbed) while sequence B sends its whole prompt (naive).
TEST_P(LatentFormTest, AutoMixesTheFormsInOneBatchOfTwoSequences) {
  runtime::TinyModel tiny("deepseek2", gguf::GgmlType::kF32, GetParam());
  const std::string pack = tiny.Pack(kernels::Scheme::kF16);
  auto ref = ReferenceModel::FromPack(pack);
  ASSERT_TRUE(ref.ok()) << ref.status();
  LatentModel m(pack, LatentForm::kAuto);
  std::unique_ptr<KvCache> a = m.NewCache(), b = m.NewCache();
  const std::vector<int32_t> seq_a = {17, 4, 99, 180}, seq_b = {2, 66, 140, 7, 31};
  m.Forward({{seq_a[0], 0, a.get()}, {seq_a[1], 1, a.get()}, {seq_a[2], 2, a.get()}});
  std::vector<ForwardToken> mixed = {{seq_a[3], 3, a.get()}};
  for (size_t i = 0; i < seq_b.size(); ++i) mixed.push_back({seq_b[i], static_cast<int64_t>(i), b.get()});
  const std::vector<float> got = m.Forward(mixed);
  const int64_t v = m.n_vocab();
  const std::vector<float> want_a = (*ref)->Logits(seq_a), want_b = (*ref)->Logits(seq_b);
  EXPECT_LT(RelativeError(got.data(), want_a.data() + 3 * v, v), 1e-4);
  for (size_t i = 0; i < seq_b.size(); ++i) {
    EXPECT_LT(RelativeError(got.data() + (1 + i) * v, want_b.data() + i * v, v), 1e-4) << "B position " << i;
  }
}

// The split form is the same model: the engine and the reference give the same logits from it as from attn_kv_b.
TEST_P(LatentFormTest, AGgufWithAttnKvBSplitIntoKAndVIsTheSameModel) {
  runtime::TinyModel tiny("deepseek2", gguf::GgmlType::kF32, GetParam());
  const std::string whole_pack = tiny.Pack(kernels::Scheme::kF16);
  const std::string split_gguf = tiny.dir.Join("split.gguf");
  const absl::Status split = ::strata::testing::SplitDeepseekKvB(tiny.dir.Join("model.gguf"), split_gguf);
  ASSERT_TRUE(split.ok()) << split;
  packtool::ConvertOptions c;
  c.input = split_gguf;
  c.output_dir = tiny.dir.Join("split-pack");
  c.scheme = kernels::Scheme::kF16;
  c.threads = 2;
  auto manifest = packtool::ConvertGguf(c, nullptr, nullptr);
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  for (LatentForm form : {LatentForm::kNaive, LatentForm::kAbsorbed}) {
    LatentModel whole(whole_pack, form), split(c.output_dir, form);
    EXPECT_LT(WorstRowError(PromptThenDecode(split), PromptThenDecode(whole), whole.n_vocab()), 1e-6);
  }
  auto ref_whole = ReferenceModel::FromGguf(tiny.dir.Join("model.gguf"));
  auto ref_split = ReferenceModel::FromGguf(split_gguf);
  ASSERT_TRUE(ref_whole.ok() && ref_split.ok()) << ref_split.status();
  EXPECT_EQ((*ref_split)->hparams().head_dim, (*ref_whole)->hparams().head_dim);
  EXPECT_EQ((*ref_split)->Logits(kSequence), (*ref_whole)->Logits(kSequence));
}

INSTANTIATE_TEST_SUITE_P(Presets, LatentFormTest, ::testing::Values("tiny", "small"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace strata::model
