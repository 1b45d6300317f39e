#include "services/auth_tokens.h"

#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/test_util.h"

namespace strata::services {
namespace {

using ::testing::HasSubstr;

constexpr char kAlpha[] = "alpha-0123456789abcdef";
constexpr char kBeta[] = "beta-0123456789abcdef";

void WriteText(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

TEST(ParseAuthTokensTest, SkipsCommentsAndBlankLinesAndTrims) {
  auto tokens = ParseAuthTokens(std::string("# operators\n\n  ") + kAlpha + "  \r\n#" + kBeta + "\n" + kBeta, "t");
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  EXPECT_THAT(*tokens, ::testing::ElementsAre(kAlpha, kBeta));
}

TEST(ParseAuthTokensTest, NamesFileAndLineOfAMalformedToken) {
  auto spaced = ParseAuthTokens(std::string(kAlpha) + "\nnot one token at all\n", "tokens.txt");
  EXPECT_EQ(spaced.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(spaced.status().message(), HasSubstr("--auth-tokens-file tokens.txt:2: "));
  EXPECT_THAT(spaced.status().message(), HasSubstr("without spaces"));

  auto short_token = ParseAuthTokens("short\n", "tokens.txt");
  EXPECT_THAT(short_token.status().message(), HasSubstr("tokens.txt:1: a token of 5 characters; expected 16 to 512"));
}

TEST(ParseAuthTokensTest, AFileWithoutTokensIsAnError) {
  auto none = ParseAuthTokens("# nothing yet\n\n", "empty.txt");
  EXPECT_EQ(none.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(none.status().message(), HasSubstr("empty.txt: holds no token"));
}

TEST(AuthTokensTest, AllowsOnlyBearerHeadersWithAKnownToken) {
  strata::testing::ScratchDir dir;
  WriteText(dir.Join("tokens"), std::string(kAlpha) + "\n");
  auto tokens = AuthTokens::Load(dir.Join("tokens"));
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  EXPECT_TRUE((*tokens)->Allows(std::string("Bearer ") + kAlpha));
  EXPECT_TRUE((*tokens)->Allows(std::string("bearer ") + kAlpha));
  EXPECT_FALSE((*tokens)->Allows(kAlpha));                              // no scheme
  EXPECT_FALSE((*tokens)->Allows(std::string("Basic ") + kAlpha));      // another scheme
  EXPECT_FALSE((*tokens)->Allows(std::string("Bearer ") + kBeta));      // unknown token
  EXPECT_FALSE((*tokens)->Allows(std::string("Bearer ") + kAlpha + "x"));  // a longer token
  EXPECT_FALSE((*tokens)->Allows("Bearer alpha-0123456789abcde"));     // a prefix
  EXPECT_FALSE((*tokens)->Allows("Bearer "));
  EXPECT_FALSE((*tokens)->Allows(""));
}

TEST(AuthTokensTest, ReloadTakesTheNewFileAndKeepsTheOldTokensWhenItIsBad) {
  strata::testing::ScratchDir dir;
  const std::string path = dir.Join("tokens");
  WriteText(path, std::string(kAlpha) + "\n");
  auto tokens = AuthTokens::Load(path);
  ASSERT_TRUE(tokens.ok()) << tokens.status();

  WriteText(path, std::string(kBeta) + "\n");
  ASSERT_TRUE((*tokens)->Reload().ok());
  EXPECT_FALSE((*tokens)->Allows(std::string("Bearer ") + kAlpha));
  EXPECT_TRUE((*tokens)->Allows(std::string("Bearer ") + kBeta));

  WriteText(path, "# emptied by mistake\n");
  absl::Status bad = (*tokens)->Reload();
  EXPECT_THAT(bad.message(), HasSubstr("holds no token"));
  EXPECT_TRUE((*tokens)->Allows(std::string("Bearer ") + kBeta));
}

TEST(AuthTokensTest, AMissingFileIsNamed) {
  auto tokens = AuthTokens::Load("/nonexistent/strata-tokens");
  EXPECT_EQ(tokens.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(tokens.status().message(), HasSubstr("--auth-tokens-file: cannot read '/nonexistent/strata-tokens'"));
}

}  // namespace
}  // namespace strata::services
