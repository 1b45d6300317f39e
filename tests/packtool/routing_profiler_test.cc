#include "packtool/routing_profiler.h"

#include <atomic>
#include <filesystem>
#include <fstream>

#include "engine/chat/chat_template.h"
#include "engine/pack/pack.h"
#include "engine/tokenizer/tokenizer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "packtool/synth.h"
#include "packtool/validate.h"
#include "tests/testing/test_util.h"

namespace strata::packtool {
namespace {

namespace fs = std::filesystem;
using ::strata::testing::ScratchDir;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

void WriteText(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

// A tiny synthesized pack (2 MoE layers x 8 experts, top-2) shared by the tests; each test profiles a copy.
class RoutingProfilerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new ScratchDir();
    SynthOptions o;
    o.geometry = *PresetGeometry("qwen3moe", "tiny");
    o.geometry.n_ctx = 64;  // small enough for a prompt to exceed
    o.pack_scheme = kernels::Scheme::kS4;
    o.output = dir_->Join("pack");
    o.threads = 2;
    const auto manifest = SynthesizePack(o, nullptr, nullptr);
    ASSERT_TRUE(manifest.ok()) << manifest.status();
  }
  static void TearDownTestSuite() { delete dir_; }

  void SetUp() override {
    pack_ = scratch_.Join("pack");
    fs::copy(dir_->Join("pack"), pack_, fs::copy_options::recursive);
    prompts_ = scratch_.Join("prompts.txt");
    WriteText(prompts_, "The capital of France is\n\n   \nOnce upon a time\r\nfn main() { println!(\"hi\"); }\n");
  }

  ProfileOptions Options(int64_t decode_tokens) const {
    ProfileOptions o;
    o.pack_dir = pack_;
    o.prompts_path = prompts_;
    o.decode_tokens = decode_tokens;
    o.threads = 2;
    return o;
  }

  // The tokens the three prompts of prompts_ make, as ProfilePack tokenizes them.
  uint64_t PromptTokens() const {
    auto pack = pack::Pack::Open(pack_, {.ignore_routing_profile = true});
    EXPECT_TRUE(pack.ok()) << pack.status();
    auto tokenizer = tokenizer::Tokenizer::FromMetadata((*pack)->dense().metadata());
    EXPECT_TRUE(tokenizer.ok()) << tokenizer.status();
    uint64_t n = 0;
    for (const char* p : {"The capital of France is", "Once upon a time", "fn main() { println!(\"hi\"); }"}) {
      n += (*tokenizer)->Encode(p, {.add_special = true}).size();
    }
    return n;
  }

  static void ExpectLayerSums(const pack::RoutingProfile& p) {
    ASSERT_EQ(p.counts.size(), uint64_t{p.n_moe_layers} * p.n_expert);
    for (uint32_t l = 0; l < p.n_moe_layers; ++l) {
      uint64_t sum = 0;
      for (uint32_t e = 0; e < p.n_expert; ++e) sum += p.counts[l * p.n_expert + e];
      EXPECT_EQ(sum, p.tokens * p.n_expert_used) << "moe layer " << l;
    }
  }

  static ScratchDir* dir_;
  ScratchDir scratch_;
  std::string pack_;
  std::string prompts_;
};
ScratchDir* RoutingProfilerTest::dir_ = nullptr;

TEST_F(RoutingProfilerTest, CountsEveryPromptTokenKTimesPerLayerAndStoresTheProfileInThePack) {
  std::vector<ProfileProgress> reports;
  auto result = ProfilePack(Options(0), [&](const ProfileProgress& p) { reports.push_back(p); });
  ASSERT_TRUE(result.ok()) << result.status();
  const pack::RoutingProfile& profile = result->profile;
  EXPECT_EQ(profile.prompts, 3u);
  EXPECT_EQ(profile.n_moe_layers, 2u);
  EXPECT_EQ(profile.n_expert, 8u);
  EXPECT_EQ(profile.n_expert_used, 2u);
  EXPECT_EQ(profile.tokens, PromptTokens());
  ExpectLayerSums(profile);
  // One step per (short) prompt, reported as it went.
  ASSERT_EQ(reports.size(), 3u);
  EXPECT_EQ(reports.back().tokens, profile.tokens);
  EXPECT_EQ(reports.back().prompts, 3u);
  EXPECT_LT(reports.front().tokens, reports.back().tokens);

  auto pack = pack::Pack::Open(pack_);
  ASSERT_TRUE(pack.ok()) << pack.status();
  ASSERT_NE((*pack)->routing_profile(), nullptr);
  EXPECT_EQ(*(*pack)->routing_profile(), profile);
  EXPECT_THAT((*pack)->routing_counts(), ElementsAreArray(profile.counts));
  EXPECT_FALSE(fs::exists(pack_ + "/routing_profile.bin.partial"));

  auto report = ValidatePack(pack_, {.quick = false, .threads = 2});
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_THAT(report->problems, IsEmpty());
}

TEST_F(RoutingProfilerTest, GeneratedTokensAreCountedTooAndTheProfileIsDeterministic) {
  auto first = ProfilePack(Options(5), nullptr);
  ASSERT_TRUE(first.ok()) << first.status();
  const uint64_t prompt_tokens = PromptTokens();
  EXPECT_GT(first->profile.tokens, prompt_tokens);
  EXPECT_LE(first->profile.tokens, prompt_tokens + 3 * 5);
  ExpectLayerSums(first->profile);
  auto second = ProfilePack(Options(5), nullptr);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->profile, first->profile);
}

TEST_F(RoutingProfilerTest, TokenPromptsRunAsTheyAreAndCountAsTheirTextWould) {
  auto pack = pack::Pack::Open(pack_, {.ignore_routing_profile = true});
  ASSERT_TRUE(pack.ok()) << pack.status();
  auto tokenizer = tokenizer::Tokenizer::FromMetadata((*pack)->dense().metadata());
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  ProfileOptions o = Options(5);
  o.prompts_path.clear();
  for (const char* p : {"The capital of France is", "Once upon a time", "fn main() { println!(\"hi\"); }"}) {
    o.prompt_tokens.push_back((*tokenizer)->Encode(p, {.add_special = true}));
  }
  auto from_tokens = ProfilePack(o, nullptr);
  ASSERT_TRUE(from_tokens.ok()) << from_tokens.status();
  auto from_text = ProfilePack(Options(5), nullptr);
  ASSERT_TRUE(from_text.ok()) << from_text.status();
  EXPECT_EQ(from_tokens->profile, from_text->profile);

  // Nothing is added to token prompts: without the BOS the text gets, 3 tokens fewer are run.
  for (auto& prompt : o.prompt_tokens) prompt.erase(prompt.begin());
  o.decode_tokens = 0;
  auto without_bos = ProfilePack(o, nullptr);
  ASSERT_TRUE(without_bos.ok()) << without_bos.status();
  EXPECT_EQ(without_bos->profile.tokens, PromptTokens() - 3);
  ExpectLayerSums(without_bos->profile);
}

TEST_F(RoutingProfilerTest, BadTokenPromptsAreRefusedNamingTheirIndex) {
  ProfileOptions o = Options(0);
  o.prompts_path.clear();
  o.prompt_tokens = {{1, 2, 3}, {4, 99999}};
  EXPECT_THAT(ProfilePack(o, nullptr).status(),
              StatusIsWith(absl::StatusCode::kInvalidArgument,
                           "prompt_tokens[1]: token 99999 is not in the model's vocabulary (0 .. "));
  o.prompt_tokens = {{1, 2, 3}, {}};
  EXPECT_THAT(ProfilePack(o, nullptr).status(),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "prompt_tokens[1]: the prompt makes no token"));
  o.prompt_tokens = {std::vector<int32_t>(65, 5)};  // the pack's context is 64
  EXPECT_THAT(ProfilePack(o, nullptr).status(),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "prompt_tokens[0]: the prompt is 65 tokens"));
  EXPECT_FALSE(fs::exists(pack_ + "/routing_profile.bin"));
}

TEST_F(RoutingProfilerTest, WithChatEachPromptIsAUserMessageThroughTheChatTemplate) {
  ProfileOptions o = Options(0);
  o.chat = true;
  auto result = ProfilePack(o, nullptr);
  ASSERT_TRUE(result.ok()) << result.status();
  ExpectLayerSums(result->profile);

  auto pack = pack::Pack::Open(pack_);
  ASSERT_TRUE(pack.ok()) << pack.status();
  auto tokenizer = tokenizer::Tokenizer::FromMetadata((*pack)->dense().metadata());
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  auto chat_template = chat::LoadChatTemplate((*pack)->dense().metadata(), **tokenizer, "");
  ASSERT_TRUE(chat_template.ok()) << chat_template.status();
  ASSERT_NE(*chat_template, nullptr);
  uint64_t expected = 0;
  for (const char* p : {"The capital of France is", "Once upon a time", "fn main() { println!(\"hi\"); }"}) {
    const chat::ChatMessage message{"user", p};
    auto rendered = (*chat_template)->Render({&message, 1}, {});
    ASSERT_TRUE(rendered.ok()) << rendered.status();
    EXPECT_THAT(*rendered, HasSubstr("<|im_start|>user"));
    expected += (*tokenizer)->Encode(*rendered, {.add_special = true, .parse_special = true}).size();
  }
  EXPECT_EQ(result->profile.tokens, expected);
  EXPECT_GT(result->profile.tokens, PromptTokens());
}

TEST_F(RoutingProfilerTest, WithChatAModelWithoutAChatTemplateIsRefused) {
  SynthOptions o;
  o.geometry = *PresetGeometry("qwen3moe", "tiny");
  o.pack_scheme = kernels::Scheme::kS4;
  o.vocab_path = strata::testing::TestDataFile("vocab/ggml-vocab-gpt-2.gguf.gz");  // no chat template
  o.output = scratch_.Join("no-template");
  o.threads = 2;
  ASSERT_TRUE(SynthesizePack(o, nullptr, nullptr).ok());
  ProfileOptions options = Options(0);
  options.pack_dir = o.output;
  options.chat = true;
  EXPECT_THAT(ProfilePack(options, nullptr).status(),
              StatusIsWith(absl::StatusCode::kFailedPrecondition,
                           o.output + ": the model has no chat template (tokenizer.chat_template is absent"));
  EXPECT_FALSE(fs::exists(o.output + "/routing_profile.bin"));
  options.chat = false;
  EXPECT_TRUE(ProfilePack(options, nullptr).ok());
}

TEST_F(RoutingProfilerTest, AMalformedEarlierProfileIsReplaced) {
  WriteText(pack_ + "/routing_profile.bin", "not a profile");
  ASSERT_FALSE(pack::Pack::Open(pack_).ok());
  auto result = ProfilePack(Options(0), nullptr);
  ASSERT_TRUE(result.ok()) << result.status();
  auto pack = pack::Pack::Open(pack_);
  ASSERT_TRUE(pack.ok()) << pack.status();
  EXPECT_EQ(*(*pack)->routing_profile(), result->profile);
}

TEST_F(RoutingProfilerTest, APromptsFileWithoutPromptsIsRefusedNamingIt) {
  WriteText(prompts_, "");
  EXPECT_THAT(ProfilePack(Options(0), nullptr).status(),
              StatusIsWith(absl::StatusCode::kInvalidArgument, prompts_ + ": no prompts (the file is empty)"));
  WriteText(prompts_, "\n  \n\t\r\n");
  EXPECT_THAT(ProfilePack(Options(0), nullptr).status(),
              StatusIsWith(absl::StatusCode::kInvalidArgument, prompts_ + ": no prompts (only blank lines)"));
  ProfileOptions o = Options(0);
  o.prompts_path = scratch_.Join("missing.txt");
  EXPECT_THAT(ProfilePack(o, nullptr).status(),
              StatusIsWith(absl::StatusCode::kNotFound, o.prompts_path + ": cannot open the prompts file"));
  o.prompts_path = scratch_.path();
  EXPECT_THAT(ProfilePack(o, nullptr).status(), StatusIsWith(absl::StatusCode::kInvalidArgument, "is a directory"));
  EXPECT_FALSE(fs::exists(pack_ + "/routing_profile.bin"));
}

TEST_F(RoutingProfilerTest, APromptLongerThanTheContextIsRefusedByLineBeforeAnythingRuns) {
  std::string long_prompt;
  for (int i = 0; i < 100; ++i) long_prompt += " word";
  WriteText(prompts_, "short\n" + long_prompt + "\n");
  int steps = 0;
  EXPECT_THAT(ProfilePack(Options(0), [&](const ProfileProgress&) { ++steps; }).status(),
              StatusIsWith(absl::StatusCode::kInvalidArgument, prompts_ + " line 2: the prompt is "));
  EXPECT_EQ(steps, 0);
  EXPECT_FALSE(fs::exists(pack_ + "/routing_profile.bin"));
}

TEST_F(RoutingProfilerTest, ACancelledRunLeavesThePackAsItWas) {
  std::atomic<bool> cancel{false};
  ProfileOptions o = Options(3);
  o.cancel = &cancel;
  int steps = 0;
  auto result = ProfilePack(o, [&](const ProfileProgress&) {
    if (++steps == 2) cancel = true;
  });
  EXPECT_THAT(result.status(), StatusIsWith(absl::StatusCode::kCancelled, "the pack is unchanged"));
  EXPECT_EQ(steps, 2);
  EXPECT_FALSE(fs::exists(pack_ + "/routing_profile.bin"));
  EXPECT_FALSE(fs::exists(pack_ + "/routing_profile.bin.partial"));
}

TEST_F(RoutingProfilerTest, BadOptionsAreRefusedByFieldFirst) {
  ProfileOptions o = Options(-1);
  o.pack_dir = "/nonexistent";
  EXPECT_THAT(ProfilePack(o, nullptr).status(),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "decode_tokens: -1 is not in 0 .. "));
  o = Options(0);
  o.threads = -2;
  EXPECT_THAT(CheckProfileOptions(o), StatusIsWith(absl::StatusCode::kInvalidArgument, "threads"));
  o = Options(0);
  o.prompts_path.clear();
  EXPECT_THAT(CheckProfileOptions(o), StatusIsWith(absl::StatusCode::kInvalidArgument, "prompts_path"));
  o = Options(0);
  o.prompt_tokens = {{1, 2}};
  EXPECT_THAT(CheckProfileOptions(o),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "prompt_tokens: 1 prompts given with prompts_path"));
  o.prompts_path.clear();
  EXPECT_THAT(CheckProfileOptions(o), IsOk());
  o.chat = true;
  EXPECT_THAT(CheckProfileOptions(o), StatusIsWith(absl::StatusCode::kInvalidArgument, "chat: needs prompts_path"));
  o = Options(0);
  o.pack_dir.clear();
  EXPECT_THAT(CheckProfileOptions(o), StatusIsWith(absl::StatusCode::kInvalidArgument, "pack_dir"));
  EXPECT_THAT(CheckProfileOptions(Options(0)), IsOk());
}

TEST_F(RoutingProfilerTest, AMissingPackIsTheErrorOfOpeningIt) {
  ProfileOptions o = Options(0);
  o.pack_dir = scratch_.Join("no-pack");
  EXPECT_THAT(ProfilePack(o, nullptr).status(), StatusIsWith(absl::StatusCode::kNotFound, "no-pack/manifest.json"));
}

TEST(MeasureSkewTest, FindsTheHottestExpertAgainstItsLayersMean) {
  pack::RoutingProfile p;
  p.n_moe_layers = 2;
  p.n_expert = 4;
  p.n_expert_used = 2;
  p.tokens = 5;
  p.counts = {4, 3, 2, 1, 0, 0, 7, 3};
  const ProfileSkew skew = MeasureSkew(p);
  EXPECT_DOUBLE_EQ(skew.hottest_over_mean, 7.0 / 2.5);
  EXPECT_EQ(skew.hottest_layer, 1u);
  EXPECT_EQ(skew.hottest_expert, 2u);
  EXPECT_EQ(skew.never_picked, 2u);
}

}  // namespace
}  // namespace strata::packtool
