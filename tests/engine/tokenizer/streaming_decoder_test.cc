// UTF-8 helpers and the streaming decoder: characters split across tokens are held back until complete,
// and everything emitted is valid UTF-8.

#include "engine/tokenizer/streaming_decoder.h"

#include <memory>
#include <string>
#include <vector>

#include "engine/tokenizer/tokenizer.h"
#include "engine/tokenizer/utf8.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace strata::tokenizer {
namespace {

using ::testing::ElementsAre;

const std::string kFffd(kReplacementChar);

// SentencePiece: <unk>, <s>, </s>, byte tokens (id 3 + byte), "▁" and "a".
std::unique_ptr<Tokenizer> ByteTokenizer() {
  TokenizerVocab vocab;
  vocab.model = "llama";
  const auto add = [&](std::string text, TokenType type) {
    vocab.tokens.push_back(std::move(text));
    vocab.token_types.push_back(static_cast<int32_t>(type));
  };
  add("<unk>", TokenType::kUnknown);
  add("<s>", TokenType::kControl);
  add("</s>", TokenType::kControl);
  static constexpr char kHex[] = "0123456789ABCDEF";
  for (int b = 0; b < 256; ++b) add(std::string("<0x") + kHex[b >> 4] + kHex[b & 15] + ">", TokenType::kByte);
  add("\xE2\x96\x81", TokenType::kNormal);
  add("a", TokenType::kNormal);
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = Tokenizer::Create(std::move(vocab));
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status();
  return tokenizer.ok() ? *std::move(tokenizer) : nullptr;
}

int32_t Byte(uint8_t b) { return 3 + b; }
constexpr int32_t kSpace = 3 + 256;
constexpr int32_t kA = kSpace + 1;

// Feeds `ids` one at a time and returns what each Add emitted, then what Flush emitted.
std::vector<std::string> Stream(const Tokenizer& tokenizer, const std::vector<int32_t>& ids) {
  StreamingDecoder decoder(&tokenizer);
  std::vector<std::string> chunks;
  for (int32_t id : ids) {
    chunks.push_back(decoder.Add(id));
    EXPECT_TRUE(IsValidUtf8(chunks.back()));
  }
  chunks.push_back(decoder.Flush());
  EXPECT_EQ(decoder.held_bytes(), 0u);
  return chunks;
}

TEST(StreamingDecoderTest, ChineseCharactersSplitIntoByteTokens) {
  auto tokenizer = ByteTokenizer();
  ASSERT_NE(tokenizer, nullptr);
  // 你好 = E4 BD A0 E5 A5 BD.
  EXPECT_THAT(Stream(*tokenizer, {Byte(0xE4), Byte(0xBD), Byte(0xA0), Byte(0xE5), Byte(0xA5), Byte(0xBD)}),
              ElementsAre("", "", "\xE4\xBD\xA0", "", "", "\xE5\xA5\xBD", ""));
}

TEST(StreamingDecoderTest, EmojiSplitAcrossTokensWithTextAround) {
  auto tokenizer = ByteTokenizer();
  ASSERT_NE(tokenizer, nullptr);
  // " a😀a": the emoji F0 9F 98 80 arrives in four tokens.
  EXPECT_THAT(Stream(*tokenizer, {kSpace, kA, Byte(0xF0), Byte(0x9F), Byte(0x98), Byte(0x80), kA}),
              ElementsAre(" ", "a", "", "", "", "\xF0\x9F\x98\x80", "a", ""));
}

TEST(StreamingDecoderTest, InvalidAndTruncatedSequencesBecomeReplacementCharacters) {
  auto tokenizer = ByteTokenizer();
  ASSERT_NE(tokenizer, nullptr);
  // A byte that starts nothing is replaced at once.
  EXPECT_THAT(Stream(*tokenizer, {Byte(0xFF), kA}), ElementsAre(kFffd, "a", ""));
  // A lead byte followed by ASCII: the lead is replaced, the ASCII kept.
  EXPECT_THAT(Stream(*tokenizer, {Byte(0xE4), kA}), ElementsAre("", kFffd + "a", ""));
  // A sequence still incomplete at the end is flushed as one U+FFFD.
  EXPECT_THAT(Stream(*tokenizer, {kA, Byte(0xF0), Byte(0x9F)}), ElementsAre("a", "", "", kFffd));
  // An encoded surrogate (ED A0 80) is invalid UTF-8, known as such once A0 arrives; each byte is replaced.
  EXPECT_THAT(Stream(*tokenizer, {Byte(0xED), Byte(0xA0), Byte(0x80)}), ElementsAre("", kFffd + kFffd, kFffd, ""));
}

TEST(StreamingDecoderTest, ControlTokensAndLeadingSpace) {
  auto tokenizer = ByteTokenizer();
  ASSERT_NE(tokenizer, nullptr);
  // Control tokens render as nothing by default; the first token keeps its space (a continuation).
  EXPECT_THAT(Stream(*tokenizer, {1, kSpace, kA, 2}), ElementsAre("", " ", "a", "", ""));
  StreamingDecoder fresh(tokenizer.get(), {.render_special = true, .strip_leading_space = true});
  EXPECT_EQ(fresh.Add(kSpace), "");
  EXPECT_EQ(fresh.Add(kA), "a");
  EXPECT_EQ(fresh.Add(2), "</s>");
  EXPECT_EQ(fresh.Add(-5), "");  // out of range: nothing
}

TEST(StreamingDecoderTest, MatchesDecodeOnByteLevelBpe) {
  // A byte-level vocabulary where "ä½" (E4 BD) is one token: pieces cross character boundaries.
  TokenizerVocab vocab;
  vocab.model = "gpt2";
  vocab.pre = "qwen2";
  for (int b = 0; b < 256; ++b) {
    std::string text;
    ByteLevelEncode(std::string(1, static_cast<char>(b)), &text);
    vocab.tokens.push_back(text);
  }
  std::string e4, bd, merged;
  ByteLevelEncode("\xE4", &e4);
  ByteLevelEncode("\xBD", &bd);
  ByteLevelEncode("\xE4\xBD", &merged);
  EXPECT_EQ(merged, "\xC3\xA4\xC2\xBD");  // "ä½"
  vocab.tokens.push_back(merged);
  vocab.merges.push_back(e4 + " " + bd);
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = Tokenizer::Create(std::move(vocab));
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();

  const std::string text = "\xE4\xBD\xA0\xE5\xA5\xBD!";  // 你好!
  const std::vector<int32_t> ids = (*tokenizer)->Encode(text);
  EXPECT_THAT(ids, ElementsAre(256, 0xA0, 0xE5, 0xA5, 0xBD, '!'));
  const std::vector<std::string> chunks = Stream(**tokenizer, ids);
  EXPECT_THAT(chunks, ElementsAre("", "\xE4\xBD\xA0", "", "", "\xE5\xA5\xBD", "!", ""));
  EXPECT_EQ((*tokenizer)->Decode(ids), text);
}

TEST(Utf8Test, ScanAndRepair) {
  EXPECT_EQ(ScanUtf8("\xE4\xBD\xA0", 0).kind, Utf8Scan::kValid);
  EXPECT_EQ(ScanUtf8("\xE4\xBD\xA0", 0).code_point, 0x4F60u);
  EXPECT_EQ(ScanUtf8("\xE4\xBD", 0).kind, Utf8Scan::kIncomplete);
  EXPECT_EQ(ScanUtf8("\xC0\x80", 0).kind, Utf8Scan::kInvalid);      // overlong
  EXPECT_EQ(ScanUtf8("\xF4\x90\x80\x80", 0).kind, Utf8Scan::kInvalid);  // above U+10FFFF
  EXPECT_EQ(RepairUtf8("a\xE4\xBD" "b\xFF"), "a" + kFffd + "b" + kFffd);
  EXPECT_TRUE(IsValidUtf8("\xF0\x9F\x98\x80"));
  EXPECT_FALSE(IsValidUtf8("\xF0\x9F\x98"));
}

TEST(Utf8Test, ByteLevelAlphabetRoundTrips) {
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  std::string encoded;
  ByteLevelEncode(all, &encoded);
  EXPECT_TRUE(IsValidUtf8(encoded));
  EXPECT_EQ(encoded.find(' '), std::string::npos);
  std::string decoded;
  ASSERT_TRUE(ByteLevelDecode(encoded, &decoded));
  EXPECT_EQ(decoded, all);
  std::string space;
  ByteLevelEncode(" ", &space);
  EXPECT_EQ(space, "\xC4\xA0");  // "Ġ"
  std::string out;
  EXPECT_FALSE(ByteLevelDecode("\xE4\xBD\xA0", &out));  // 你 is outside the alphabet
}

}  // namespace
}  // namespace strata::tokenizer
