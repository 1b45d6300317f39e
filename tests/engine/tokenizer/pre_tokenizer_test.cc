// The regex pre-tokenizers: per-family splitting rules, the white-space set, and the chained "default".

#include "engine/tokenizer/pre_tokenizer.h"

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/test_util.h"

namespace strata::tokenizer {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

std::vector<std::string> Split(std::string_view pre, std::string_view text) {
  absl::StatusOr<PreTokenizerSpec> spec = LookupPreTokenizer(pre);
  EXPECT_TRUE(spec.ok()) << spec.status();
  if (!spec.ok()) return {};
  absl::StatusOr<std::unique_ptr<PreTokenizer>> pre_tokenizer = PreTokenizer::Create(spec->patterns);
  EXPECT_TRUE(pre_tokenizer.ok()) << pre_tokenizer.status();
  if (!pre_tokenizer.ok()) return {};
  std::vector<std::string_view> words;
  (*pre_tokenizer)->Split(text, &words);
  std::string joined;
  for (std::string_view w : words) {
    EXPECT_FALSE(w.empty());
    joined.append(w);
  }
  EXPECT_EQ(joined, text);
  return std::vector<std::string>(words.begin(), words.end());
}

TEST(PreTokenizerTest, Gpt2SplitsWordsNumbersAndTrailingSpace) {
  EXPECT_THAT(Split("gpt-2", "Hello world  !"), ElementsAre("Hello", " world", " ", " !"));
  EXPECT_THAT(Split("gpt-2", "a   b"), ElementsAre("a", "  ", " b"));
  EXPECT_THAT(Split("gpt-2", "I've 12345"), ElementsAre("I", "'ve", " 12345"));
  EXPECT_THAT(Split("gpt-2", "x  "), ElementsAre("x", "  "));  // (?!\S) holds at the end
  EXPECT_THAT(Split("gpt-2", "\tHi"), ElementsAre("\t", "Hi"));
  EXPECT_THAT(Split("gpt-2", ""), IsEmpty());
}

TEST(PreTokenizerTest, Qwen2SplitsDigitsSinglyLlama3InThrees) {
  EXPECT_THAT(Split("qwen2", "x12345"), ElementsAre("x", "1", "2", "3", "4", "5"));
  EXPECT_THAT(Split("llama-bpe", "x12345"), ElementsAre("x", "123", "45"));
  // A non-letter may lead a word; newlines gather with preceding spaces; contractions are case-blind.
  EXPECT_THAT(Split("qwen2", "(hi) \n\nWE'RE"), ElementsAre("(hi", ")", " \n\n", "WE", "'RE"));
}

TEST(PreTokenizerTest, WhiteSpaceIsUnicodeWhiteSpace) {
  // U+0085 (NEL) is white space for Hugging Face and llama.cpp, though not for PCRE2's own \s.
  EXPECT_THAT(Split("gpt-2", "a\xC2\x85\xC2\x85" "b"), ElementsAre("a", "\xC2\x85", "\xC2\x85", "b"));
  // U+3000 (ideographic space) likewise; U+200D (a format character) is not white space.
  EXPECT_THAT(Split("gpt-2", "a\xE3\x80\x80\xE3\x80\x80" "b"), ElementsAre("a", "\xE3\x80\x80", "\xE3\x80\x80", "b"));
  EXPECT_THAT(Split("gpt-2", "a \xE2\x80\x8D"), ElementsAre("a", " \xE2\x80\x8D"));
}

TEST(PreTokenizerTest, DefaultChainSplitsPunctuationFirst) {
  // llama.cpp's chain for vocabularies without tokenizer.ggml.pre: punctuation runs are cut out before
  // the GPT-2 regex sees the text, so " ," does not stay together as it does with "gpt-2".
  EXPECT_THAT(Split("", "a ,b"), ElementsAre("a", " ", ",", "b"));
  EXPECT_THAT(Split("gpt-2", "a ,b"), ElementsAre("a", " ,", "b"));
  EXPECT_THAT(Split("", " 1234"), ElementsAre(" ", "123", "4"));
}

TEST(PreTokenizerTest, FamiliesAndUnknownNames) {
  absl::StatusOr<PreTokenizerSpec> llama3 = LookupPreTokenizer("llama3");
  ASSERT_TRUE(llama3.ok());
  EXPECT_TRUE(llama3->ignore_merges);
  EXPECT_TRUE(llama3->add_bos);
  absl::StatusOr<PreTokenizerSpec> qwen = LookupPreTokenizer("deepseek-r1-qwen");
  ASSERT_TRUE(qwen.ok());
  EXPECT_EQ(qwen->name, "qwen2");
  EXPECT_FALSE(qwen->add_bos);
  EXPECT_THAT(LookupPreTokenizer("klingon").status(),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "tokenizer.ggml.pre: unsupported pre-tokenizer 'klingon'"));
  // Every family's regexes compile.
  for (const char* name : {"default", "gpt-2", "llama3", "dbrx", "glm4", "qwen2", "starcoder", "deepseek-v3", "gpt-4o"}) {
    absl::StatusOr<PreTokenizerSpec> spec = LookupPreTokenizer(name);
    ASSERT_TRUE(spec.ok()) << name;
    EXPECT_TRUE(PreTokenizer::Create(spec->patterns).ok()) << name;
  }
}

TEST(PreTokenizerTest, MoreFamilies) {
  EXPECT_THAT(Split("gpt-4o", "HelloWorld's 1234"), ElementsAre("Hello", "World's", " ", "123", "4"));
  EXPECT_THAT(Split("deepseek-v3", "ab 12345\xE4\xBD\xA0\xE5\xA5\xBD"),
              ElementsAre("ab", " ", "123", "45", "\xE4\xBD\xA0\xE5\xA5\xBD"));
}

}  // namespace
}  // namespace strata::tokenizer
