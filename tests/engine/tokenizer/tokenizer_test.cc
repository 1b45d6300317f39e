// The tokenizer on small hand-built vocabularies: BPE merge order, SentencePiece scoring and byte
// fallback, special tokens, BOS/EOS and invalid vocabularies.

#include "engine/tokenizer/tokenizer.h"

#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/tokenizer/utf8.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/test_util.h"

namespace strata::tokenizer {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

std::string ByteLevel(std::string_view raw) {
  std::string out;
  ByteLevelEncode(raw, &out);
  return out;
}

// Byte-level BPE: ids 0..255 are the byte characters (id == byte), then `extra` (raw text, stored in the
// byte alphabet), then `specials` as written with `special_type`. Merges are raw text pairs.
TokenizerVocab BpeVocab(const std::vector<std::pair<std::string, std::string>>& merges,
                        const std::vector<std::string>& extra, const std::vector<std::string>& specials = {},
                        TokenType special_type = TokenType::kControl) {
  TokenizerVocab vocab;
  vocab.model = "gpt2";
  vocab.pre = "gpt-2";
  for (int b = 0; b < 256; ++b) vocab.tokens.push_back(ByteLevel(std::string(1, static_cast<char>(b))));
  for (const std::string& e : extra) vocab.tokens.push_back(ByteLevel(e));
  vocab.token_types.assign(vocab.tokens.size(), static_cast<int32_t>(TokenType::kNormal));
  for (const std::string& s : specials) {
    vocab.tokens.push_back(s);
    vocab.token_types.push_back(static_cast<int32_t>(special_type));
  }
  for (const auto& [left, right] : merges) vocab.merges.push_back(ByteLevel(left) + " " + ByteLevel(right));
  return vocab;
}

// SentencePiece: <unk>, <s>, </s>, the byte tokens <0x00>..<0xFF>, then `pieces` ("▁" for spaces).
constexpr int32_t kFirstPiece = 3 + 256;
TokenizerVocab SpmVocab(const std::vector<std::pair<std::string, float>>& pieces) {
  TokenizerVocab vocab;
  vocab.model = "llama";
  const auto add = [&](std::string text, float score, TokenType type) {
    vocab.tokens.push_back(std::move(text));
    vocab.scores.push_back(score);
    vocab.token_types.push_back(static_cast<int32_t>(type));
  };
  add("<unk>", 0, TokenType::kUnknown);
  add("<s>", 0, TokenType::kControl);
  add("</s>", 0, TokenType::kControl);
  static constexpr char kHex[] = "0123456789ABCDEF";
  for (int b = 0; b < 256; ++b) add(std::string("<0x") + kHex[b >> 4] + kHex[b & 15] + ">", 0, TokenType::kByte);
  for (const auto& [text, score] : pieces) add(text, score, TokenType::kNormal);
  return vocab;
}

std::unique_ptr<Tokenizer> Make(TokenizerVocab vocab) {
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = Tokenizer::Create(std::move(vocab));
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status();
  return tokenizer.ok() ? *std::move(tokenizer) : nullptr;
}

TEST(BpeTest, LowerRankMergesFirst) {
  // "abc": with b+c ranked before a+b the result is a|bc; with the order reversed, ab|c.
  auto bc_first = Make(BpeVocab({{"b", "c"}, {"a", "b"}}, {"bc", "ab"}));
  auto ab_first = Make(BpeVocab({{"a", "b"}, {"b", "c"}}, {"bc", "ab"}));
  ASSERT_NE(bc_first, nullptr);
  ASSERT_NE(ab_first, nullptr);
  EXPECT_THAT(bc_first->Encode("abc"), ElementsAre('a', 256));
  EXPECT_THAT(ab_first->Encode("abc"), ElementsAre(257, 'c'));
}

TEST(BpeTest, EqualPairsMergeLeftmostFirst) {
  auto tokenizer = Make(BpeVocab({{"a", "a"}}, {"aa"}));
  ASSERT_NE(tokenizer, nullptr);
  EXPECT_THAT(tokenizer->Encode("aaa"), ElementsAre(256, 'a'));
  EXPECT_THAT(tokenizer->Encode("aaaa"), ElementsAre(256, 256));
}

TEST(BpeTest, MergesChainAcrossRanksAndWordsStaySeparate) {
  auto tokenizer = Make(BpeVocab({{"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"}, {" ", "w"}},
                                 {"he", "ll", "hell", "hello", " w"}));
  ASSERT_NE(tokenizer, nullptr);
  EXPECT_THAT(tokenizer->Encode("hello"), ElementsAre(259));
  // The pre-tokenizer makes " hello" one word, which has no merge for " h": bytes then merges.
  EXPECT_THAT(tokenizer->Encode("hello hello"), ElementsAre(259, ' ', 259));
  EXPECT_THAT(tokenizer->Encode(" w"), ElementsAre(260));
  EXPECT_EQ(tokenizer->Decode(tokenizer->Encode("hello hello w")), "hello hello w");
  EXPECT_EQ(tokenizer->TokenPiece(260), " w");
  EXPECT_EQ(tokenizer->TokenText(260), ByteLevel(" w"));
}

TEST(BpeTest, InvalidUtf8BecomesReplacementCharacters) {
  auto tokenizer = Make(BpeVocab({}, {}));
  ASSERT_NE(tokenizer, nullptr);
  // As llama.cpp: each invalid byte is read as U+FFFD (EF BF BD), whose bytes are then tokens.
  EXPECT_THAT(tokenizer->Encode("a\xFF"), ElementsAre('a', 0xEF, 0xBF, 0xBD));
  EXPECT_THAT(tokenizer->Encode(""), IsEmpty());
}

TEST(BpeTest, ControlTokensNeedParseSpecialUserDefinedDoNot) {
  auto control = Make(BpeVocab({}, {}, {"<|x|>"}, TokenType::kControl));
  auto user = Make(BpeVocab({}, {}, {"<|x|>"}, TokenType::kUserDefined));
  ASSERT_NE(control, nullptr);
  ASSERT_NE(user, nullptr);
  EXPECT_THAT(control->Encode("a<|x|>b", {.parse_special = true}), ElementsAre('a', 256, 'b'));
  EXPECT_THAT(control->Encode("a<|x|>b"), ElementsAre('a', '<', '|', 'x', '|', '>', 'b'));
  EXPECT_THAT(user->Encode("a<|x|>b"), ElementsAre('a', 256, 'b'));
  // Control tokens render only on request; user-defined ones always.
  EXPECT_EQ(control->Decode(std::vector<int32_t>{'a', 256}), "a");
  EXPECT_EQ(control->Decode(std::vector<int32_t>{'a', 256}, {.render_special = true}), "a<|x|>");
  EXPECT_EQ(user->Decode(std::vector<int32_t>{'a', 256}), "a<|x|>");
}

TEST(BpeTest, LongerSpecialTokensWinAndRepeatsAreAllFound) {
  auto tokenizer = Make(BpeVocab({}, {}, {"<a>", "<a><b>"}, TokenType::kControl));
  ASSERT_NE(tokenizer, nullptr);
  EXPECT_THAT(tokenizer->Encode("<a><b><a>x<a>", {.parse_special = true}), ElementsAre(257, 256, 'x', 256));
}

TEST(BpeTest, BosAndEosFollowTheVocabulary) {
  TokenizerVocab vocab = BpeVocab({}, {}, {"<bos>", "<eos>"});
  vocab.bos_id = 256;
  vocab.eos_id = 257;
  auto plain = Make(vocab);
  ASSERT_NE(plain, nullptr);
  EXPECT_FALSE(plain->add_bos());  // BPE default
  EXPECT_THAT(plain->Encode("a", {.add_special = true}), ElementsAre('a'));
  EXPECT_TRUE(plain->IsEog(257));
  EXPECT_FALSE(plain->IsEog(256));

  vocab.add_bos = true;
  vocab.add_eos = true;
  auto both = Make(vocab);
  ASSERT_NE(both, nullptr);
  EXPECT_THAT(both->Encode("a", {.add_special = true}), ElementsAre(256, 'a', 257));
  EXPECT_THAT(both->Encode("a"), ElementsAre('a'));
  EXPECT_THAT(both->Encode("", {.add_special = true}), ElementsAre(256, 257));
}

TEST(BpeTest, Llama3FamilyAddsBosByDefaultAndSkipsMergesForWholeTokens) {
  // "abc" is a token but no merges build it: llama3's ignore_merges emits it whole.
  TokenizerVocab vocab = BpeVocab({{"a", "b"}}, {"ab", "abc"}, {"<|begin_of_text|>"});
  vocab.pre = "llama-bpe";
  vocab.bos_id = 258;
  auto tokenizer = Make(vocab);
  ASSERT_NE(tokenizer, nullptr);
  EXPECT_TRUE(tokenizer->add_bos());
  EXPECT_THAT(tokenizer->Encode("abc", {.add_special = true}), ElementsAre(258, 257));

  vocab.pre = "gpt-2";
  auto gpt2 = Make(vocab);
  ASSERT_NE(gpt2, nullptr);
  EXPECT_THAT(gpt2->Encode("abc"), ElementsAre(256, 'c'));
}

TEST(BpeTest, EndOfGenerationTokensAreFoundByName) {
  TokenizerVocab vocab = BpeVocab({}, {}, {"<|im_end|>", "<|endoftext|>", "<|im_start|>"});
  vocab.eos_id = 256;
  auto tokenizer = Make(vocab);
  ASSERT_NE(tokenizer, nullptr);
  EXPECT_THAT(tokenizer->eog_ids(), ElementsAre(256, 257));
  EXPECT_EQ(tokenizer->eot(), 256);
}

TEST(SpmTest, HighestScoreMergesFirst) {
  // "▁he": "he" (-1) outranks "▁h" (-2), and "▁he" exists, so the result is one token.
  auto tokenizer = Make(SpmVocab({{"\xE2\x96\x81", -5}, {"h", -5}, {"e", -5}, {"\xE2\x96\x81h", -2},
                                  {"he", -1}, {"\xE2\x96\x81he", -3}}));
  ASSERT_NE(tokenizer, nullptr);
  EXPECT_THAT(tokenizer->Encode("he"), ElementsAre(kFirstPiece + 5));
  // Without the space prefix "he" is one token too.
  TokenizerVocab vocab = SpmVocab({{"\xE2\x96\x81", -5}, {"h", -5}, {"e", -5}, {"he", -1}});
  vocab.add_space_prefix = false;
  auto no_prefix = Make(vocab);
  ASSERT_NE(no_prefix, nullptr);
  EXPECT_THAT(no_prefix->Encode("he"), ElementsAre(kFirstPiece + 3));
}

TEST(SpmTest, EqualScoresMergeLeftmostFirst) {
  TokenizerVocab vocab = SpmVocab({{"a", -1}, {"aa", -1}});
  vocab.add_space_prefix = false;
  auto tokenizer = Make(vocab);
  ASSERT_NE(tokenizer, nullptr);
  EXPECT_THAT(tokenizer->Encode("aaa"), ElementsAre(kFirstPiece + 1, kFirstPiece));
}

TEST(SpmTest, ByteFallbackAndLeadingSpace) {
  auto tokenizer = Make(SpmVocab({{"\xE2\x96\x81", -1}, {"a", -1}}));
  ASSERT_NE(tokenizer, nullptr);
  // "é" (C3 A9) is not a piece: byte tokens <0xC3> <0xA9>.
  const std::vector<int32_t> ids = tokenizer->Encode("a \xC3\xA9");
  EXPECT_THAT(ids, ElementsAre(kFirstPiece, kFirstPiece + 1, kFirstPiece, 3 + 0xC3, 3 + 0xA9));
  EXPECT_EQ(tokenizer->Decode(ids), "a \xC3\xA9");  // the prefix space is dropped again
  EXPECT_EQ(tokenizer->Decode(ids, {.strip_leading_space = false}), " a \xC3\xA9");
  EXPECT_EQ(tokenizer->TokenPiece(3 + 0xC3), "\xC3");
  EXPECT_EQ(tokenizer->TokenPiece(kFirstPiece), " ");
}

TEST(SpmTest, DefaultsAddBosAndNameTheUsualIds) {
  auto tokenizer = Make(SpmVocab({{"a", -1}}));
  ASSERT_NE(tokenizer, nullptr);
  EXPECT_EQ(tokenizer->bos(), 1);
  EXPECT_EQ(tokenizer->eos(), 2);
  EXPECT_EQ(tokenizer->unk(), 0);
  EXPECT_TRUE(tokenizer->add_bos());
  EXPECT_TRUE(tokenizer->add_space_prefix());
  EXPECT_EQ(tokenizer->Encode("a", {.add_special = true}).front(), 1);
  EXPECT_TRUE(tokenizer->IsEog(2));
  EXPECT_EQ(tokenizer->TokenPiece(1, /*render_special=*/false), "");
  EXPECT_EQ(tokenizer->TokenPiece(1), "<s>");
  EXPECT_EQ(tokenizer->TokenPiece(-1), "");
  EXPECT_EQ(tokenizer->TokenPiece(tokenizer->n_vocab()), "");
}

TEST(TokenizerErrorsTest, InvalidVocabulariesAreRejectedNamingTheKey) {
  const auto error_of = [](TokenizerVocab vocab) {
    absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = Tokenizer::Create(std::move(vocab));
    return tokenizer.status();
  };
  TokenizerVocab vocab = BpeVocab({}, {});
  vocab.model = "bert";
  EXPECT_THAT(error_of(vocab), StatusIsWith(absl::StatusCode::kInvalidArgument, "tokenizer.ggml.model = 'bert'"));

  vocab = BpeVocab({}, {});
  vocab.pre = "no-such-pre";
  EXPECT_THAT(error_of(vocab), StatusIsWith(absl::StatusCode::kInvalidArgument, "'no-such-pre'"));
  EXPECT_THAT(error_of(vocab), StatusIsWith(absl::StatusCode::kInvalidArgument, "tokenizer.ggml.pre"));

  vocab = BpeVocab({{"a", "b"}}, {"ab"});
  vocab.merges.push_back("nospace");
  EXPECT_THAT(error_of(vocab), StatusIsWith(absl::StatusCode::kInvalidArgument, "tokenizer.ggml.merges[1]"));

  vocab = BpeVocab({{"a", "b"}}, {"ab"});
  vocab.tokens[5] = vocab.tokens[6];
  EXPECT_THAT(error_of(vocab), StatusIsWith(absl::StatusCode::kInvalidArgument, "twice (ids 5 and 6)"));

  vocab = BpeVocab({{"a", "b"}}, {"ab"});
  vocab.token_types[3] = 9;
  EXPECT_THAT(error_of(vocab), StatusIsWith(absl::StatusCode::kInvalidArgument, "tokenizer.ggml.token_type[3]"));

  vocab = BpeVocab({{"a", "b"}}, {"ab"});
  vocab.token_types.pop_back();
  EXPECT_THAT(error_of(vocab), StatusIsWith(absl::StatusCode::kInvalidArgument, "tokenizer.ggml.token_type has"));

  vocab = SpmVocab({{"a", -1}});
  vocab.scores.push_back(0);
  EXPECT_THAT(error_of(vocab), StatusIsWith(absl::StatusCode::kInvalidArgument, "tokenizer.ggml.scores has"));

  vocab = SpmVocab({{"a", -1}});
  vocab.scores[1] = std::nanf("");
  EXPECT_THAT(error_of(vocab),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "tokenizer.ggml.scores[1] is NaN"));

  vocab = BpeVocab({{"a", "b"}}, {"ab"});
  vocab.eos_id = 100000;
  EXPECT_THAT(error_of(vocab),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "tokenizer.ggml.eos_token_id = 100000"));

  vocab = BpeVocab({{"a", "b"}}, {"ab"});
  vocab.add_bos = true;
  EXPECT_THAT(error_of(vocab), StatusIsWith(absl::StatusCode::kInvalidArgument, "tokenizer.ggml.add_bos_token"));

  vocab = BpeVocab({{"a", "b"}}, {"ab"});
  vocab.tokens.clear();
  vocab.token_types.clear();
  EXPECT_THAT(error_of(vocab), StatusIsWith(absl::StatusCode::kInvalidArgument, "tokenizer.ggml.tokens"));
}

TEST(TokenizerErrorsTest, OutOfRangeOptionalIdsAreIgnored) {
  TokenizerVocab vocab = BpeVocab({{"a", "b"}}, {"ab"});
  vocab.pad_id = 1 << 20;
  // A negative FIM id must not wrap around onto a real token and end generations there.
  vocab.fim_pad_id = -4294967295LL;
  auto tokenizer = Make(vocab);
  ASSERT_NE(tokenizer, nullptr);
  EXPECT_EQ(tokenizer->pad(), -1);
  for (int32_t id = 0; id < tokenizer->n_vocab(); ++id) {
    EXPECT_EQ(tokenizer->IsEog(id), id == tokenizer->eos() || id == tokenizer->eot()) << "token " << id;
  }
}

TEST(TokenizerErrorsTest, FimIdsInTheVocabularyEndGenerationsOthersAreIgnored) {
  TokenizerVocab vocab = BpeVocab({{"a", "b"}}, {"ab"});
  vocab.fim_rep_id = 1;
  vocab.fim_sep_id = 1 << 20;  // outside: a warning, not an error
  auto tokenizer = Make(vocab);
  ASSERT_NE(tokenizer, nullptr);
  EXPECT_TRUE(tokenizer->IsEog(1));
  for (int32_t id = 0; id < tokenizer->n_vocab(); ++id) {
    EXPECT_EQ(tokenizer->IsEog(id), id == 1 || id == tokenizer->eos() || id == tokenizer->eot()) << "token " << id;
  }
}

TEST(TokenizerMetadataTest, ReadsTheGgufKeys) {
  gguf::Metadata metadata;
  std::vector<gguf::Value> tokens;
  std::vector<gguf::Value> types;
  for (int b = 0; b < 256; ++b) {
    tokens.push_back(gguf::Value::String(ByteLevel(std::string(1, static_cast<char>(b)))));
    types.push_back(gguf::Value::Int32(1));
  }
  tokens.push_back(gguf::Value::String("ab"));
  types.push_back(gguf::Value::Int32(1));
  tokens.push_back(gguf::Value::String("<|end|>"));
  types.push_back(gguf::Value::Int32(3));
  metadata.Add("tokenizer.ggml.model", gguf::Value::String("gpt2"));
  metadata.Add("tokenizer.ggml.pre", gguf::Value::String("qwen2"));
  metadata.Add("tokenizer.ggml.tokens", gguf::Value::MakeArray(gguf::ValueType::kString, tokens));
  metadata.Add("tokenizer.ggml.token_type", gguf::Value::MakeArray(gguf::ValueType::kInt32, types));
  metadata.Add("tokenizer.ggml.merges",
               gguf::Value::MakeArray(gguf::ValueType::kString, {gguf::Value::String("a b")}));
  metadata.Add("tokenizer.ggml.eos_token_id", gguf::Value::Uint32(257));
  metadata.Add("tokenizer.ggml.add_eos_token", gguf::Value::Bool(true));

  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = Tokenizer::FromMetadata(metadata);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  EXPECT_EQ((*tokenizer)->pre(), "qwen2");
  EXPECT_THAT((*tokenizer)->Encode("ab12", {.add_special = true}), ElementsAre(256, '1', '2', 257));

  // A wrong type is an error naming the key; so is a missing required key.
  gguf::Metadata bad = metadata;
  bad.Add("tokenizer.ggml.tokens", gguf::Value::String("not an array"));
  EXPECT_THAT(Tokenizer::FromMetadata(bad).status(),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "tokenizer.ggml.tokens"));
  gguf::Metadata no_model;
  no_model.Add("tokenizer.ggml.tokens", gguf::Value::MakeArray(gguf::ValueType::kString, tokens));
  EXPECT_THAT(Tokenizer::FromMetadata(no_model).status(),
              StatusIsWith(absl::StatusCode::kNotFound, "tokenizer.ggml.model"));
  gguf::Metadata no_merges;
  for (const auto& [key, value] : metadata.entries()) {
    if (key != "tokenizer.ggml.merges") no_merges.Add(key, value);
  }
  EXPECT_THAT(Tokenizer::FromMetadata(no_merges).status(),
              StatusIsWith(absl::StatusCode::kNotFound, "tokenizer.ggml.merges"));
  gguf::Metadata bad_type = metadata;
  types[3] = gguf::Value::Int32(42);
  bad_type.Add("tokenizer.ggml.token_type", gguf::Value::MakeArray(gguf::ValueType::kInt32, types));
  EXPECT_THAT(Tokenizer::FromMetadata(bad_type).status(),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "tokenizer.ggml.token_type[3] = 42"));
}

}  // namespace
}  // namespace strata::tokenizer
