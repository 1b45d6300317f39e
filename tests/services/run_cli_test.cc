#include "services/run_cli.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <regex>
#include <sstream>

#include "absl/synchronization/notification.h"
#include "engine/runtime/engine.h"
#include "engine/runtime/model_factory.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "packtool/convert.h"
#include "packtool/synth.h"
#include "tests/testing/test_util.h"
#include "tests/testing/wait.h"

namespace strata::services {
namespace {

using ::strata::testing::ReadFileBytes;
using ::strata::testing::ScratchDir;
using ::testing::HasSubstr;

// KL(p || q) of the softmaxes of two logit rows, in nats, written here apart from the CLI's.
double Kl(const float* p, const float* q, int64_t n) {
  auto log_softmax = [n](const float* l) {
    double max = -std::numeric_limits<double>::infinity();
    for (int64_t i = 0; i < n; ++i) max = std::max(max, static_cast<double>(l[i]));
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) sum += std::exp(l[i] - max);
    std::vector<double> out(n);
    for (int64_t i = 0; i < n; ++i) out[i] = l[i] - max - std::log(sum);
    return out;
  };
  const std::vector<double> lp = log_softmax(p), lq = log_softmax(q);
  double kl = 0;
  for (int64_t i = 0; i < n; ++i) kl += std::exp(lp[i]) * (lp[i] - lq[i]);
  return kl;
}

// The "KL(...) over N positions: mean M, max X; top-1 agreement A%" line of the CLI.
struct KlLine {
  int positions = -1;
  double mean = -1, max = -1, agreement = -1;
};
bool ParseKlLine(const std::string& out, KlLine* line) {
  static const std::regex re(R"(KL\(.* \|\| .*\) over (\d+) positions: mean ([^,]+), max ([^;]+); top-1 agreement ([^%]+)%)");
  std::smatch m;
  if (!std::regex_search(out, m, re)) return false;
  line->positions = std::stoi(m[1]);
  line->mean = std::stod(m[2]);
  line->max = std::stod(m[3]);
  line->agreement = std::stod(m[4]);
  return true;
}

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
  // The logits of every position of `tokens` from an engine of our own on `pack`, with the CLI's options.
  std::vector<float> EngineLogits(const std::string& pack, const std::vector<int32_t>& tokens) {
    runtime::EngineOptions eo = Options().engine;
    eo.pack_dir = pack;
    auto engine = runtime::Engine::Create(eo);
    EXPECT_TRUE(engine.ok()) << engine.status();
    if (!engine.ok()) return {};
    runtime::GenerateRequest req;
    req.prompt_tokens = tokens;
    req.prompt_logits = true;
    req.sampling.temperature = 0;
    req.sampling.max_tokens = 1;
    // Waited for with a deadline; the callback owns what it writes, so a late one touches nothing here.
    struct State {
      runtime::GenerationResult result;
      absl::Notification done;
    };
    auto state = std::make_shared<State>();
    runtime::GenerateCallbacks cb;
    cb.on_done = [state](const runtime::GenerationResult& r) {
      state->result = r;
      state->done.Notify();
    };
    auto handle = (*engine)->Submit(req, cb);
    EXPECT_TRUE(handle.ok()) << handle.status();
    if (!handle.ok()) return {};
    const bool finished = state->done.WaitForNotificationWithTimeout(strata::testing::kHangDeadline);
    EXPECT_TRUE(finished) << "the engine did not finish the prompt";
    if (!finished) return {};
    EXPECT_TRUE(state->result.status.ok()) << state->result.status;
    return state->result.prompt_logits;
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
  // A tiny pack loads and its prompt runs within the progress delay: no progress lines.
  EXPECT_THAT(err_.str(), ::testing::Not(HasSubstr("loading experts:")));
  EXPECT_THAT(err_.str(), ::testing::Not(HasSubstr("prefill:")));
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
  // The file holds the engine's logits of every position, row-major, nothing else.
  const std::vector<float> f16 = EngineLogits(dir_->Join("f16"), ids);
  ASSERT_FALSE(f16.empty());
  ASSERT_EQ(f16.size() % ids.size(), 0u);
  const uint64_t n_vocab = f16.size() / ids.size();
  EXPECT_GT(n_vocab, 256u);
  const std::vector<uint8_t> dumped_bytes = ReadFileBytes(o.dump_logits_path);
  ASSERT_EQ(dumped_bytes.size(), f16.size() * sizeof(float));
  std::vector<float> dumped(f16.size());
  std::memcpy(dumped.data(), dumped_bytes.data(), dumped_bytes.size());
  int64_t differ = 0;
  for (size_t i = 0; i < f16.size(); ++i) differ += dumped[i] != f16[i];
  EXPECT_EQ(differ, 0) << "of " << f16.size() << " logits; the first position's first: " << dumped[0] << " vs "
                       << f16[0];
  // A pack against itself.
  KlLine same;
  ASSERT_TRUE(ParseKlLine(out_.str(), &same)) << out_.str();
  EXPECT_EQ(same.positions, static_cast<int>(ids.size()));
  EXPECT_EQ(same.mean, 0.0);
  EXPECT_EQ(same.max, 0.0);
  EXPECT_EQ(same.agreement, 100.0);

  // Against s2: the numbers the CLI prints are the KL of the two engines' logits, computed here.
  o.dump_logits_path.clear();
  o.kl_against_dir = dir_->Join("s2");
  ASSERT_EQ(Run(o), 0) << err_.str();
  KlLine s2;
  ASSERT_TRUE(ParseKlLine(out_.str(), &s2)) << out_.str();
  const std::vector<float> q = EngineLogits(dir_->Join("s2"), ids);
  ASSERT_EQ(q.size(), f16.size());
  double sum = 0, max = 0;
  int agree = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    const float* a = f16.data() + i * n_vocab;
    const float* b = q.data() + i * n_vocab;
    const double kl = Kl(a, b, static_cast<int64_t>(n_vocab));
    sum += kl;
    max = std::max(max, kl);
    agree += std::max_element(a, a + n_vocab) - a == std::max_element(b, b + n_vocab) - b;
  }
  const double mean = sum / static_cast<double>(ids.size());
  std::printf("KL(f16 || s2): mean %.6f, max %.6f, top-1 agreement %d of %zu\n", mean, max, agree, ids.size());
  EXPECT_EQ(s2.positions, static_cast<int>(ids.size()));
  EXPECT_TRUE(std::isfinite(s2.mean) && std::isfinite(s2.max)) << out_.str();
  // Printed with 6 decimals.
  EXPECT_NEAR(s2.mean, mean, 1e-6 + 1e-6 * mean) << out_.str();
  EXPECT_NEAR(s2.max, max, 1e-6 + 1e-6 * max) << out_.str();
  EXPECT_NEAR(s2.agreement, 100.0 * agree / static_cast<double>(ids.size()), 0.01) << out_.str();
  // 2-bit experts move the distribution far more than the printing resolution an f16-vs-f16 run shows 0 at.
  EXPECT_GT(s2.mean, 1000 * 1e-6) << out_.str();
  EXPECT_GE(s2.max, s2.mean);
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

// A bad path costs nothing: the error comes before the pack is loaded ("loaded ..." is the first report)
// and names the flag as typed, the path and why.
TEST_F(RunCliTest, EveryPathIsCheckedBeforeLoadingOrGenerating) {
  RunOptions o = Options();
  o.tokens = {1, 2, 3};
  o.kl_against_dir = "nothere";
  EXPECT_EQ(Run(o), 1);
  EXPECT_THAT(err_.str(), HasSubstr("--kl-against nothere: No such file or directory"));
  EXPECT_THAT(err_.str(), ::testing::Not(HasSubstr("loaded")));
  EXPECT_EQ(out_.str(), "");

  o = Options();
  o.tokens = {1, 2, 3};
  o.kl_against_dir = dir_->Join("m.gguf");  // a file, not a pack
  EXPECT_EQ(Run(o), 1);
  EXPECT_THAT(err_.str(), HasSubstr("--kl-against " + dir_->Join("m.gguf") + ": not a directory"));

  o = Options();
  o.tokens = {1, 2, 3};
  o.dump_logits_path = "/nonexistent/x";
  EXPECT_EQ(Run(o), 1);
  EXPECT_THAT(err_.str(), HasSubstr("--dump-logits /nonexistent/x: directory /nonexistent: No such file or directory"));
  EXPECT_THAT(err_.str(), ::testing::Not(HasSubstr("loaded")));

  o.dump_logits_path = dir_->path();
  EXPECT_EQ(Run(o), 1);
  EXPECT_THAT(err_.str(), HasSubstr("--dump-logits " + dir_->path() + ": is a directory"));
  EXPECT_THAT(err_.str(), ::testing::Not(HasSubstr("loaded")));

  o = Options();
  o.prompt = "x";
  o.pack_dir = dir_->path();  // a directory without a manifest
  EXPECT_EQ(Run(o), 1);
  EXPECT_THAT(err_.str(), HasSubstr("--pack " + dir_->path() + ": not a pack: manifest.json"));

  o = Options();
  o.tokenize_only = true;
  o.pack_dir.clear();
  o.gguf_path = dir_->Join("absent.gguf");
  o.prompt = "x";
  EXPECT_EQ(Run(o), 1);
  EXPECT_THAT(err_.str(), HasSubstr("--gguf " + dir_->Join("absent.gguf") + ": No such file or directory"));
}

// A write that fails after the work says why, with the file's name.
TEST_F(RunCliTest, AFailedWriteNamesTheFileAndTheReason) {
  ASSERT_TRUE(std::filesystem::exists("/dev/full"));  // Linux: every write fails with ENOSPC
  RunOptions o = Options();
  o.tokens = {1, 2, 3};
  o.dump_logits_path = "/dev/full";
  EXPECT_EQ(Run(o), 1);
  EXPECT_THAT(err_.str(), HasSubstr("loaded"));
  EXPECT_THAT(err_.str(), HasSubstr("cannot write /dev/full: No space left on device"));
}

// strata-run prints the seed it used ("finish: ..., seed N"); without --seed it differs per run, and given
// back it repeats the text.
TEST_F(RunCliTest, TheSeedUsedIsPrintedAndRepeatsTheText) {
  auto seed_of = [](const std::string& err) -> uint64_t {
    const size_t at = err.find(", seed ");
    return at == std::string::npos ? 0 : std::stoull(err.substr(at + 7));
  };
  RunOptions o = Options();
  o.prompt = "the model";
  o.sampling.temperature = 1.5f;
  o.sampling.max_tokens = 16;
  ASSERT_EQ(Run(o), 0) << err_.str();
  const std::string first_text = out_.str();
  const uint64_t first = seed_of(err_.str());
  ASSERT_THAT(err_.str(), HasSubstr(", seed "));
  ASSERT_EQ(Run(o), 0) << err_.str();
  EXPECT_NE(seed_of(err_.str()), first);
  o.sampling.seed = first;
  ASSERT_EQ(Run(o), 0) << err_.str();
  EXPECT_EQ(out_.str(), first_text);
  EXPECT_EQ(seed_of(err_.str()), first);
}

// --device auto on a machine without a usable CUDA device runs on the CPU and says nothing of CUDA that
// could read like an error; with one, it runs there.
TEST_F(RunCliTest, DeviceAutoWithoutAGpuPrintsNoCudaMessage) {
  RunOptions o = Options();
  o.prompt = "the model";
  o.engine.device.device = "auto";
  ASSERT_EQ(Run(o), 0) << err_.str();
  if (runtime::CudaDeviceAvailable(nullptr)) {
    EXPECT_THAT(err_.str(), HasSubstr("; device cuda"));
    return;
  }
  EXPECT_THAT(err_.str(), HasSubstr("; device cpu"));
  for (const char* alarming : {"CUDA", "driver", "error", "page-locked", "warn"}) {
    EXPECT_THAT(err_.str(), ::testing::Not(HasSubstr(alarming))) << err_.str();
  }
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
