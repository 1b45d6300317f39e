// The tokenizer against llama.cpp's vocabulary fixtures (tests/data/vocab, see SOURCE.txt there):
// every test string must tokenize to exactly the expected ids (no BOS/EOS, special tokens not parsed),
// and the expected ids must detokenize back to the string.

#include <algorithm>
#include <atomic>
#include <iterator>
#include <random>
#include <thread>
#include <ctime>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "engine/gguf/gguf_file.h"
#include "engine/tokenizer/tokenizer.h"
#include "engine/tokenizer/utf8.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/test_util.h"

namespace strata::tokenizer {
namespace {

using ::strata::testing::ReadFileBytes;
using ::strata::testing::TestDataFile;
using ::testing::ElementsAreArray;

std::string ReadText(const std::string& path) {
  const std::vector<uint8_t> bytes = ReadFileBytes(path);
  return std::string(bytes.begin(), bytes.end());
}

struct Case {
  std::string text;
  std::vector<int32_t> ids;
};

// Pairs the strings of `<name>.inp` with the id lines of `<name>.out`.
std::vector<Case> ReadCases(const std::string& name) {
  const std::string inp = ReadText(TestDataFile("vocab/" + name + ".inp"));
  const std::string out = ReadText(TestDataFile("vocab/" + name + ".out"));
  std::vector<std::string> texts = absl::StrSplit(inp, "\n__ggml_vocab_test__\n");
  EXPECT_FALSE(texts.empty());
  if (!texts.empty() && texts.back().empty()) texts.pop_back();
  std::vector<std::string> lines = absl::StrSplit(out, '\n');
  if (!lines.empty() && lines.back().empty()) lines.pop_back();
  EXPECT_EQ(texts.size(), lines.size()) << name;

  std::vector<Case> cases;
  for (size_t i = 0; i < texts.size() && i < lines.size(); ++i) {
    Case c{texts[i], {}};
    for (absl::string_view field : absl::StrSplit(lines[i], ' ', absl::SkipEmpty())) {
      int32_t id = 0;
      EXPECT_TRUE(absl::SimpleAtoi(field, &id)) << name << " line " << i + 1 << ": '" << field << "'";
      c.ids.push_back(id);
    }
    cases.push_back(std::move(c));
  }
  return cases;
}

std::unique_ptr<Tokenizer> Load(const std::string& path) {
  absl::StatusOr<std::unique_ptr<gguf::GgufFile>> file = gguf::GgufFile::Open(path);
  EXPECT_TRUE(file.ok()) << file.status();
  if (!file.ok()) return nullptr;
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = Tokenizer::FromMetadata((*file)->metadata());
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status();
  return tokenizer.ok() ? *std::move(tokenizer) : nullptr;
}

// A file of the vocab folder; a gzipped vocabulary is unpacked once for the whole binary.
std::string VocabPath(const std::string& file) { return TestDataFile("vocab/" + file); }

// CPU seconds this process has used: what a piece of work costs, whatever else the machine runs meanwhile.
double ProcessCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// The least CPU time `work` takes over `runs` runs (the least is the one least disturbed).
template <typename Work>
double LeastCpuSeconds(int runs, Work work) {
  double best = 1e30;
  for (int i = 0; i < runs; ++i) {
    const double start = ProcessCpuSeconds();
    work();
    best = std::min(best, ProcessCpuSeconds() - start);
  }
  return best;
}

struct Fixture {
  const char* name;   // <name>.inp / <name>.out
  const char* vocab;  // file in the vocab folder
};

class VocabFixtureTest : public ::testing::TestWithParam<Fixture> {};

TEST_P(VocabFixtureTest, TokenizesAndDetokenizesEveryCase) {
  const Fixture& fixture = GetParam();
  const std::unique_ptr<Tokenizer> tokenizer = Load(VocabPath(fixture.vocab));
  ASSERT_NE(tokenizer, nullptr);
  const std::vector<Case> cases = ReadCases(fixture.name);
  ASSERT_EQ(cases.size(), 46u);

  int mismatches = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    const std::vector<int32_t> ids = tokenizer->Encode(c.text);
    EXPECT_THAT(ids, ElementsAreArray(c.ids)) << fixture.name << " case " << i << ": '" << c.text << "'";
    EXPECT_EQ(tokenizer->Decode(c.ids), c.text) << fixture.name << " case " << i;
    mismatches += ids != c.ids;
  }
  EXPECT_EQ(mismatches, 0);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, VocabFixtureTest,
                         ::testing::Values(Fixture{"ggml-vocab-qwen2.gguf", "ggml-vocab-qwen2.gguf.gz"},
                                           Fixture{"ggml-vocab-gpt-2.gguf", "ggml-vocab-gpt-2.gguf.gz"},
                                           Fixture{"ggml-vocab-llama-spm.gguf", "ggml-vocab-llama-spm.gguf.gz"},
                                           Fixture{"ggml-vocab-deepseek-llm.gguf", "ggml-vocab-deepseek-llm.gguf.gz"},
                                           Fixture{"ggml-vocab-deepseek-coder.gguf",
                                                   "ggml-vocab-deepseek-coder.gguf.gz"}),
                         [](const ::testing::TestParamInfo<Fixture>& info) {
                           std::string out;
                           for (char c : std::string(info.param.name).substr(11)) {  // after "ggml-vocab-"
                             if (std::isalnum(static_cast<unsigned char>(c))) out.push_back(c);
                           }
                           return out;
                         });

// The llama-bpe fixture has no vocabulary file (SOURCE.txt: too big to include), so it is not tested here.

// Loading and encoding scale linearly. No wall-clock bound (a shared or sanitized machine is slow, a fast one
// hides a quadratic step under any bound loose enough for the slow one): each cost is compared with another
// measured in the same process, in CPU time.
TEST(VocabFixtureTest, LargeVocabularyLoadsAndEncodesInLinearTime) {
  absl::StatusOr<std::unique_ptr<gguf::GgufFile>> file = gguf::GgufFile::Open(VocabPath("ggml-vocab-qwen2.gguf.gz"));
  ASSERT_TRUE(file.ok()) << file.status();
  const gguf::Metadata& metadata = (*file)->metadata();

  // Loading against one linear pass over the same data: every token and merge string read out and hashed
  // into a map, which a loader does at least once. A quadratic step over 151936 tokens would cost
  // thousands of such passes.
  std::unique_ptr<Tokenizer> tokenizer;
  const double load_s = LeastCpuSeconds(2, [&] {
    absl::StatusOr<std::unique_ptr<Tokenizer>> loaded = Tokenizer::FromMetadata(metadata);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    tokenizer = *std::move(loaded);
  });
  ASSERT_NE(tokenizer, nullptr);
  EXPECT_EQ(tokenizer->n_vocab(), 151936);
  size_t mapped = 0;
  const double pass_s = LeastCpuSeconds(2, [&] {
    absl::StatusOr<std::vector<std::string>> tokens = metadata.GetStringArray("tokenizer.ggml.tokens");
    absl::StatusOr<std::vector<std::string>> merges = metadata.GetStringArray("tokenizer.ggml.merges");
    ASSERT_TRUE(tokens.ok() && merges.ok());
    std::map<std::string, int> ids;  // a tree, not a hash map: a pass no faster than a loader's own
    for (size_t i = 0; i < tokens->size(); ++i) ids.emplace((*tokens)[i], static_cast<int>(i));
    for (size_t i = 0; i < merges->size(); ++i) ids.emplace((*merges)[i], static_cast<int>(i));
    mapped = ids.size();
  });
  EXPECT_GT(mapped, 151936u);

  // Encoding a text and the same text 16 times over: a linear encoder takes about 16 times as long.
  const std::string inp = ReadText(VocabPath("ggml-vocab-qwen2.gguf.inp"));
  std::string inp16;
  for (int i = 0; i < 16; ++i) inp16 += inp + "\n";
  std::vector<int32_t> ids, ids16;
  const double encode_s = LeastCpuSeconds(5, [&] { ids = tokenizer->Encode(inp); });
  const double encode16_s = LeastCpuSeconds(5, [&] { ids16 = tokenizer->Encode(inp16); });
  EXPECT_GT(ids.size(), 500u);
  EXPECT_GE(ids16.size(), 16 * ids.size() - 16 * 8);  // the same words; the joins may merge a few tokens

  std::printf("qwen2 vocabulary: load %.1f ms (%.1f x a map of its %zu strings); encode %zu bytes -> %zu ids in "
              "%.2f ms, 16 times that text in %.2f ms (%.1f x)\n",
              1e3 * load_s, load_s / pass_s, mapped, inp.size(), ids.size(), 1e3 * encode_s, 1e3 * encode16_s,
              encode16_s / encode_s);
  // About 0.3 here; a quadratic step would be thousands.
  EXPECT_LT(load_s, 20 * pass_s) << "loading costs " << load_s / pass_s << " linear passes over the vocabulary";
  EXPECT_LT(encode16_s, 48 * encode_s) << "16 times the text costs " << encode16_s / encode_s << " times as much";
}

class Qwen3SynthTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { tokenizer_ = Load(VocabPath("ggml-vocab-qwen3-synth.gguf.gz")).release(); }
  static void TearDownTestSuite() {
    delete tokenizer_;
    tokenizer_ = nullptr;
  }
  static const Tokenizer* tokenizer_;
};
const Tokenizer* Qwen3SynthTest::tokenizer_ = nullptr;

TEST_F(Qwen3SynthTest, LoadsWithItsSpecialTokens) {
  ASSERT_NE(tokenizer_, nullptr);
  EXPECT_EQ(tokenizer_->n_vocab(), 151936);
  EXPECT_EQ(tokenizer_->TokenId("<|im_start|>"), 151644);
  EXPECT_EQ(tokenizer_->eos(), 151645);
  EXPECT_EQ(tokenizer_->bos(), 151643);
  EXPECT_FALSE(tokenizer_->add_bos());
  EXPECT_TRUE(tokenizer_->IsEog(151645));  // <|im_end|>
  EXPECT_TRUE(tokenizer_->IsEog(151643));  // <|endoftext|>
  EXPECT_FALSE(tokenizer_->IsEog(151644));
  EXPECT_TRUE(tokenizer_->IsControl(151644));
}

TEST_F(Qwen3SynthTest, ControlTokensAreParsedOnlyWhenAsked) {
  ASSERT_NE(tokenizer_, nullptr);
  const std::string text = "<|im_start|>user\nhi<|im_end|>";
  const std::vector<int32_t> parsed = tokenizer_->Encode(text, {.parse_special = true});
  ASSERT_GE(parsed.size(), 3u);
  EXPECT_EQ(parsed.front(), 151644);
  EXPECT_EQ(parsed.back(), 151645);
  EXPECT_EQ(std::count(parsed.begin(), parsed.end(), 151644), 1);
  // The text between the specials tokenizes as it would alone.
  std::vector<int32_t> expected = {151644};
  const std::vector<int32_t> middle = tokenizer_->Encode("user\nhi");
  expected.insert(expected.end(), middle.begin(), middle.end());
  expected.push_back(151645);
  EXPECT_EQ(parsed, expected);

  const std::vector<int32_t> literal = tokenizer_->Encode(text);
  EXPECT_EQ(std::count(literal.begin(), literal.end(), 151644), 0);
  EXPECT_EQ(std::count(literal.begin(), literal.end(), 151645), 0);
  EXPECT_GT(literal.size(), parsed.size());
  EXPECT_EQ(tokenizer_->Decode(literal), text);
  EXPECT_EQ(tokenizer_->Decode(parsed, {.render_special = true}), text);
  EXPECT_EQ(tokenizer_->Decode(parsed), "user\nhi");
}

TEST_F(Qwen3SynthTest, UserDefinedTokensAreAlwaysParsed) {
  ASSERT_NE(tokenizer_, nullptr);
  const int32_t think = tokenizer_->TokenId("<think>");
  ASSERT_GE(think, 151643);
  for (bool parse_special : {false, true}) {
    const std::vector<int32_t> ids = tokenizer_->Encode("<think>\nok", {.parse_special = parse_special});
    ASSERT_FALSE(ids.empty());
    EXPECT_EQ(ids.front(), think) << parse_special;
    EXPECT_EQ(tokenizer_->Decode(ids), "<think>\nok");
  }
}

TEST_F(Qwen3SynthTest, AddSpecialAddsNothingWhenTheVocabularySaysSo) {
  ASSERT_NE(tokenizer_, nullptr);
  EXPECT_EQ(tokenizer_->Encode("hello", {.add_special = true}), tokenizer_->Encode("hello"));
}

// Random text from a pool of ASCII, multi-byte characters, white space, special-token names and
// invalid bytes.
std::string RandomText(std::mt19937* rng) {
  static const char* const kPool[] = {
      "a", "Z", "9", " ", "  ", "\t", "\n", "\r\n", "'s", "'LL", ".", "!!", "-", "\xC3\xA4", "\xE4\xBD\xA0",
      "\xF0\x9F\xA6\x99", "\xE2\x80\x8D", "\xC2\x85", "\xE3\x80\x80", "<|im_start|>", "<think>", "<s>",
      "\xFF", "\xE4\xBD", "\x80", "hello", " world", "123456", "\xD0\xBD\xD0\xB5", "\xE1\x9E\x80",
  };
  std::uniform_int_distribution<size_t> pick(0, std::size(kPool) - 1);
  std::uniform_int_distribution<int> length(0, 40);
  std::string text;
  for (int i = length(*rng); i > 0; --i) text += kPool[pick(*rng)];
  return text;
}

TEST(VocabPropertyTest, DecodeInvertsEncodeOnRandomText) {
  std::mt19937 rng(1234);
  const std::unique_ptr<Tokenizer> gpt2 = Load(VocabPath("ggml-vocab-gpt-2.gguf.gz"));
  const std::unique_ptr<Tokenizer> qwen3 = Load(VocabPath("ggml-vocab-qwen3-synth.gguf.gz"));
  const std::unique_ptr<Tokenizer> spm = Load(VocabPath("ggml-vocab-llama-spm.gguf.gz"));
  const std::unique_ptr<Tokenizer> neox = Load(VocabPath("ggml-vocab-gpt-neox.gguf.gz"));  // no .pre key
  ASSERT_NE(neox, nullptr);
  EXPECT_EQ(neox->pre(), "default");
  ASSERT_NE(gpt2, nullptr);
  ASSERT_NE(qwen3, nullptr);
  ASSERT_NE(spm, nullptr);
  for (int i = 0; i < 300; ++i) {
    const std::string text = RandomText(&rng);
    // Byte-level BPE reads invalid UTF-8 as U+FFFD; everything else comes back byte for byte.
    EXPECT_EQ(gpt2->Decode(gpt2->Encode(text)), RepairUtf8(text)) << text;
    EXPECT_EQ(qwen3->Decode(qwen3->Encode(text)), RepairUtf8(text)) << text;
    EXPECT_EQ(neox->Decode(neox->Encode(text)), RepairUtf8(text)) << text;
    EXPECT_EQ(qwen3->Decode(qwen3->Encode(text, {.parse_special = true}), {.render_special = true}),
              RepairUtf8(text))
        << text;
    // SentencePiece keeps every byte (byte fallback) and drops the space prefix it added.
    EXPECT_EQ(spm->Decode(spm->Encode(text)), text) << text;
    for (int32_t id : qwen3->Encode(text)) ASSERT_TRUE(qwen3->IsValid(id));
  }
}

TEST(VocabPropertyTest, ConcurrentEncodeMatchesSerial) {
  const std::unique_ptr<Tokenizer> tokenizer = Load(VocabPath("ggml-vocab-gpt-2.gguf.gz"));
  ASSERT_NE(tokenizer, nullptr);
  const std::vector<Case> cases = ReadCases("ggml-vocab-gpt-2.gguf");
  std::vector<std::vector<int32_t>> serial;
  for (const Case& c : cases) serial.push_back(tokenizer->Encode(c.text));
  std::atomic<int> mismatches{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int round = 0; round < 20; ++round) {
        for (size_t i = 0; i < cases.size(); ++i) {
          if (tokenizer->Encode(cases[i].text) != serial[i]) mismatches++;
          if (tokenizer->Decode(serial[i]) != cases[i].text) mismatches++;
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(mismatches.load(), 0);
}

TEST(LlamaSpmFixtureTest, AddsBosAndHonoursTheSpacePrefix) {
  const std::unique_ptr<Tokenizer> tokenizer = Load(VocabPath("ggml-vocab-llama-spm.gguf.gz"));
  ASSERT_NE(tokenizer, nullptr);
  EXPECT_TRUE(tokenizer->add_bos());
  EXPECT_FALSE(tokenizer->add_eos());
  const std::vector<int32_t> plain = tokenizer->Encode("Hello world");
  const std::vector<int32_t> with_bos = tokenizer->Encode("Hello world", {.add_special = true});
  ASSERT_EQ(with_bos.size(), plain.size() + 1);
  EXPECT_EQ(with_bos.front(), 1);
  EXPECT_TRUE(std::equal(plain.begin(), plain.end(), with_bos.begin() + 1));
  // "<s>" is a control token: literal text unless parse_special.
  EXPECT_EQ(tokenizer->Encode("<s>Hi", {.parse_special = true}).front(), 1);
  EXPECT_NE(tokenizer->Encode("<s>Hi").front(), 1);
  // After a special token the text gets the space prefix again, as llama.cpp does.
  const std::vector<int32_t> after = tokenizer->Encode("<s>Hi", {.parse_special = true});
  const std::vector<int32_t> alone = tokenizer->Encode("Hi");
  EXPECT_EQ(std::vector<int32_t>(after.begin() + 1, after.end()), alone);
  // Byte fallback: a character the vocabulary lacks becomes its UTF-8 bytes as <0xXX> tokens.
  const std::vector<int32_t> bytes = tokenizer->Encode("\xF0\x9F\xA6\x99");  // U+1F999
  ASSERT_EQ(bytes.size(), 5u);                                             // "▁" + 4 byte tokens
  EXPECT_EQ(tokenizer->TokenText(bytes[1]), "<0xF0>");
  EXPECT_EQ(tokenizer->Decode(bytes), "\xF0\x9F\xA6\x99");
}

}  // namespace
}  // namespace strata::tokenizer
