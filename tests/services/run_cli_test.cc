#include "services/run_cli.h"

#include <algorithm>
#include <filesystem>
#include <sstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "packtool/convert.h"
#include "packtool/synth.h"
#include "tests/testing/test_util.h"

namespace strata::services {
namespace {

using ::strata::testing::ScratchDir;
using ::testing::HasSubstr;

class RunCliTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new ScratchDir();
    packtool::SynthOptions o;
    o.geometry = *packtool::PresetGeometry("qwen3moe", "tiny");
    o.output = dir_->Join("m.gguf");
    o.threads = 2;
    ASSERT_THAT(packtool::SynthesizeGguf(o), IsOk());
    for (auto scheme : {kernels::Scheme::kF16, kernels::Scheme::kS2}) {
      packtool::ConvertOptions c;
      c.input = o.output;
      c.output_dir = dir_->Join(std::string(kernels::SchemeName(scheme)));
      c.scheme = scheme;
      c.threads = 2;
      ASSERT_TRUE(packtool::ConvertGguf(c, nullptr, nullptr).ok());
    }
  }
  static void TearDownTestSuite() { delete dir_; }

  RunOptions Options() {
    RunOptions o;
    o.pack_dir = dir_->Join("f16");
    o.engine.threads = 2;
    o.engine.max_seqs = 1;
    o.sampling.temperature = 0;
    o.sampling.max_tokens = 8;
    o.sampling.ignore_eos = true;
    return o;
  }
  int Run(const RunOptions& o) {
    out_.str("");
    err_.str("");
    return RunCommand(o, out_, err_);
  }

  static ScratchDir* dir_;
  std::ostringstream out_, err_;
};
ScratchDir* RunCliTest::dir_ = nullptr;

TEST_F(RunCliTest, GeneratesTextAndReportsSpeed) {
  RunOptions o = Options();
  o.prompt = "the model";
  ASSERT_EQ(Run(o), 0) << err_.str();
  EXPECT_FALSE(out_.str().empty());
  EXPECT_THAT(err_.str(), HasSubstr("decode: 8 tokens"));
  EXPECT_THAT(err_.str(), HasSubstr("tokens/s"));
  EXPECT_THAT(err_.str(), HasSubstr("MB per token"));
  EXPECT_THAT(err_.str(), HasSubstr("load time"));
}

TEST_F(RunCliTest, TokenizeDumpLogitsAndKl) {
  RunOptions o = Options();
  o.tokenize_only = true;
  o.prompt = "hello model";
  ASSERT_EQ(Run(o), 0) << err_.str();
  std::vector<int32_t> ids;
  std::string line = out_.str();
  std::replace(line.begin(), line.end(), ' ', ',');
  line.erase(std::remove(line.begin(), line.end(), '\n'), line.end());
  ASSERT_TRUE(ParseTokenList(line, &ids)) << out_.str();

  o = Options();
  o.tokens = ids;
  o.dump_logits_path = dir_->Join("logits.bin");
  o.kl_against_dir = dir_->Join("f16");
  ASSERT_EQ(Run(o), 0) << err_.str();
  const uint64_t n_vocab = std::filesystem::file_size(o.dump_logits_path) / sizeof(float) / ids.size();
  EXPECT_EQ(std::filesystem::file_size(o.dump_logits_path), ids.size() * n_vocab * sizeof(float));
  EXPECT_GT(n_vocab, 256u);
  EXPECT_THAT(out_.str(), HasSubstr("mean 0.000000"));
  EXPECT_THAT(out_.str(), HasSubstr("top-1 agreement 100.00%"));

  o.dump_logits_path.clear();
  o.kl_against_dir = dir_->Join("s2");
  ASSERT_EQ(Run(o), 0) << err_.str();
  EXPECT_THAT(out_.str(), HasSubstr("KL("));
  EXPECT_THAT(out_.str(), ::testing::Not(HasSubstr("mean 0.000000,")));
}

TEST_F(RunCliTest, UsageErrorsExitTwoAndBadInputOne) {
  RunOptions o;
  EXPECT_EQ(Run(o), 2);
  EXPECT_THAT(err_.str(), HasSubstr("--pack"));
  o = Options();
  EXPECT_EQ(Run(o), 2);  // no prompt
  o.prompt = "x";
  o.pack_dir = dir_->Join("absent");
  EXPECT_EQ(Run(o), 1);
  EXPECT_THAT(err_.str(), HasSubstr("absent"));
  o = Options();
  o.tokens = {1, 1 << 30};
  EXPECT_EQ(Run(o), 1);
  EXPECT_THAT(err_.str(), HasSubstr("prompt_tokens[1]"));
}

TEST(RunCliParseTest, TokenListsAndKl) {
  std::vector<int32_t> ids;
  EXPECT_TRUE(ParseTokenList("1,2, 3", &ids));
  EXPECT_EQ(ids, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_FALSE(ParseTokenList("1,x", &ids));
  EXPECT_FALSE(ParseTokenList("", &ids));
  const float a[3] = {1, 2, 3}, b[3] = {3, 2, 1};
  EXPECT_DOUBLE_EQ(KlDivergence(a, a, 3), 0.0);
  EXPECT_GT(KlDivergence(a, b, 3), 0.5);
}

}  // namespace
}  // namespace strata::services
