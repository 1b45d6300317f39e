#include "packtool/hf_tokenizer.h"

#include <fstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/test_util.h"

namespace strata::packtool {
namespace {

using ::strata::testing::ScratchDir;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using json = nlohmann::json;

// A small byte-level BPE tokenizer.json: 4 vocabulary tokens, 2 merges, 2 added tokens (one special).
json Tokenizer() {
  json pre = {{"type", "Sequence"},
              {"pretokenizers",
               {{{"type", "Split"}, {"pattern", {{"Regex", kHfQwen2PreRegex}}}},
                {{"type", "ByteLevel"}, {"use_regex", false}}}}};
  return {{"pre_tokenizer", pre},
          {"added_tokens",
           {{{"id", 4}, {"content", "<|end|>"}, {"special", true}}, {{"id", 5}, {"content", "<think>"}, {"special", false}}}},
          {"model",
           {{"type", "BPE"},
            {"vocab", {{"a", 0}, {"b", 1}, {"ab", 2}, {"Ġab", 3}}},
            {"merges", {"a b", {"Ġ", "ab"}}}}}};
}

HfTokenizerOptions In(const ScratchDir& dir) {
  HfTokenizerOptions o;
  o.dir = dir.path();
  return o;
}

void Write(const std::string& path, const json& j) { std::ofstream(path) << j.dump(); }

std::map<std::string, gguf::Value> Keys(const VocabMetadata& v) {
  std::map<std::string, gguf::Value> m;
  for (const auto& [k, value] : v.entries) m[k] = value;
  return m;
}

std::vector<std::string> Strings(const gguf::Value& v) {
  std::vector<std::string> out;
  for (const gguf::Value& e : std::get<gguf::Array>(v.data).elements) out.push_back(std::get<std::string>(e.data));
  return out;
}

std::vector<int64_t> Ints(const gguf::Value& v) {
  std::vector<int64_t> out;
  for (const gguf::Value& e : std::get<gguf::Array>(v.data).elements) out.push_back(std::get<int64_t>(e.data));
  return out;
}

TEST(HfTokenizerTest, ReadsVocabMergesAddedTokensAndConfig) {
  ScratchDir dir;
  Write(dir.Join("tokenizer.json"), Tokenizer());
  Write(dir.Join("tokenizer_config.json"), {{"eos_token", {{"content", "<|end|>"}}},
                                            {"pad_token", "<|end|>"},
                                            {"add_bos_token", false},
                                            {"chat_template", "{{ messages }}"}});
  HfTokenizerOptions o;
  o.dir = dir.path();
  o.n_vocab = 8;  // padded beyond the 6 tokens
  o.bos_id = 1;   // from config.json: tokenizer_config.json names no bos_token
  o.eos_id = 0;   // overridden by tokenizer_config.json's eos_token
  auto v = VocabFromHfTokenizer(o);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->n_tokens, 8);
  auto keys = Keys(*v);
  EXPECT_EQ(std::get<std::string>(keys["tokenizer.ggml.model"].data), "gpt2");
  EXPECT_EQ(std::get<std::string>(keys["tokenizer.ggml.pre"].data), "qwen2");
  EXPECT_THAT(Strings(keys["tokenizer.ggml.tokens"]),
              ElementsAre("a", "b", "ab", "Ġab", "<|end|>", "<think>", "[PAD6]", "[PAD7]"));
  EXPECT_THAT(Ints(keys["tokenizer.ggml.token_type"]), ElementsAre(1, 1, 1, 1, 3, 4, 5, 5));
  EXPECT_THAT(Strings(keys["tokenizer.ggml.merges"]), ElementsAre("a b", "Ġ ab"));
  EXPECT_EQ(std::get<uint64_t>(keys["tokenizer.ggml.eos_token_id"].data), 4u);
  EXPECT_EQ(std::get<uint64_t>(keys["tokenizer.ggml.bos_token_id"].data), 1u);
  EXPECT_EQ(std::get<uint64_t>(keys["tokenizer.ggml.padding_token_id"].data), 4u);
  EXPECT_EQ(std::get<bool>(keys["tokenizer.ggml.add_bos_token"].data), false);
  EXPECT_EQ(std::get<std::string>(keys["tokenizer.chat_template"].data), "{{ messages }}");
}

TEST(HfTokenizerTest, NamesThePreTokenizerByItsRegex) {
  ScratchDir dir;
  json t = Tokenizer();
  t["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = kHfLlama3PreRegex;
  Write(dir.Join("tokenizer.json"), t);
  auto v = VocabFromHfTokenizer(In(dir));
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(std::get<std::string>(Keys(*v)["tokenizer.ggml.pre"].data), "llama3");
  t["pre_tokenizer"] = {{"type", "ByteLevel"}, {"use_regex", true}};
  Write(dir.Join("tokenizer.json"), t);
  v = VocabFromHfTokenizer(In(dir));
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(std::get<std::string>(Keys(*v)["tokenizer.ggml.pre"].data), "gpt-2");
}

// gpt-oss's o200k Split, and DeepSeek-V3's three Splits, each followed by a ByteLevel step without its regex.
TEST(HfTokenizerTest, NamesGptOssAndDeepseekV3PreTokenizers) {
  ScratchDir dir;
  json t = Tokenizer();
  auto pre = [&]() -> std::string {
    Write(dir.Join("tokenizer.json"), t);
    auto v = VocabFromHfTokenizer(In(dir));
    if (!v.ok()) return std::string(v.status().message());
    return std::get<std::string>(Keys(*v)["tokenizer.ggml.pre"].data);
  };
  t["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = kHfGpt4oPreRegex;
  EXPECT_EQ(pre(), "gpt-4o");
  json splits = json::array();
  for (const char* regex : kHfDeepseekV3PreRegexes) {
    splits.push_back({{"type", "Split"}, {"pattern", {{"Regex", regex}}}, {"behavior", "Isolated"}});
  }
  splits.push_back({{"type", "ByteLevel"}, {"use_regex", false}});
  t["pre_tokenizer"]["pretokenizers"] = splits;
  EXPECT_EQ(pre(), "deepseek-v3");
  // The kana range as tokenizer.json holds it (UTF-8 characters), and CR / LF written as characters
  // (JSON "\r\n") rather than as the regex escapes: the same pre-tokenizer.
  EXPECT_EQ(std::string(kHfDeepseekV3PreRegexes[1]), "[一-龥぀-ゟ゠-ヿ]+");
  std::string third = kHfDeepseekV3PreRegexes[2];
  for (size_t at; (at = third.find("\\r\\n")) != std::string::npos;) third.replace(at, 4, "\r\n");
  ASSERT_NE(third, kHfDeepseekV3PreRegexes[2]);
  t["pre_tokenizer"]["pretokenizers"][2]["pattern"]["Regex"] = third;
  EXPECT_EQ(pre(), "deepseek-v3");
  // Two of the three, or another order, is not DeepSeek-V3's.
  std::swap(t["pre_tokenizer"]["pretokenizers"][0], t["pre_tokenizer"]["pretokenizers"][1]);
  EXPECT_THAT(pre(), HasSubstr("pre_tokenizer: not one Strata knows"));
  t["pre_tokenizer"]["pretokenizers"].erase(0);
  EXPECT_THAT(pre(), HasSubstr("pre_tokenizer: not one Strata knows"));
}

struct BadTokenizer {
  std::function<void(json&)> edit;
  std::string message;
};

class HfTokenizerBadTest : public ::testing::TestWithParam<BadTokenizer> {};

TEST_P(HfTokenizerBadTest, IsRefusedWithItsMessage) {
  ScratchDir dir;
  json t = Tokenizer();
  GetParam().edit(t);
  Write(dir.Join("tokenizer.json"), t);
  absl::Status s = VocabFromHfTokenizer(In(dir)).status();
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), HasSubstr(GetParam().message));
  EXPECT_THAT(std::string(s.message()), HasSubstr("tokenizer.json"));
}

INSTANTIATE_TEST_SUITE_P(
    Malformed, HfTokenizerBadTest,
    ::testing::Values(
        BadTokenizer{[](json& t) { t["model"]["type"] = "Unigram"; }, "model.type 'Unigram': only byte-level BPE"},
        BadTokenizer{[](json& t) { t["model"]["byte_fallback"] = true; }, "model.byte_fallback"},
        BadTokenizer{[](json& t) { t["model"]["type"] = 3; }, "model.type '': only byte-level BPE"},
        BadTokenizer{[](json& t) { t["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "\\w+"; },
                     "pre_tokenizer: not one Strata knows"},
        BadTokenizer{[](json& t) { t["model"]["vocab"]["a"] = -1; }, "model.vocab['a']: expected a token id"},
        BadTokenizer{[](json& t) { t["model"]["vocab"]["a"] = 1u << 30; }, "model.vocab['a']: expected a token id"},
        BadTokenizer{[](json& t) { t["added_tokens"][1].erase("content"); }, "added_tokens[1]: expected an object"},
        BadTokenizer{[](json& t) { t["model"]["merges"][1] = {"x"}; }, "model.merges[1]: expected"},
        BadTokenizer{[](json& t) { t["model"].erase("merges"); }, "model.merges: expected an array"},
        BadTokenizer{[](json& t) { t.erase("model"); }, "expected an object with a \"model\" object"}));

TEST(HfTokenizerTest, RefusesAnUnknownSpecialToken) {
  ScratchDir dir;
  Write(dir.Join("tokenizer.json"), Tokenizer());
  Write(dir.Join("tokenizer_config.json"), {{"eos_token", "</s>"}});
  absl::Status s = VocabFromHfTokenizer(In(dir)).status();
  EXPECT_THAT(std::string(s.message()), HasSubstr("tokenizer_config.json: eos_token '</s>' is not a token"));
}

TEST(HfTokenizerTest, RefusesInvalidJson) {
  ScratchDir dir;
  std::ofstream(dir.Join("tokenizer.json")) << "{\"model\": ";
  EXPECT_THAT(std::string(VocabFromHfTokenizer(In(dir)).status().message()),
              HasSubstr("tokenizer.json: not valid JSON"));
}

}  // namespace
}  // namespace strata::packtool
