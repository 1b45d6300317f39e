#include "services/cli_flags.h"

#include <cstdint>
#include <optional>

#include "absl/flags/flag.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/test_util.h"

ABSL_FLAG(int, cli_flags_test_count, 0, "test flag");
ABSL_FLAG(bool, cli_flags_test_switch, false, "test flag");
ABSL_FLAG(std::optional<int64_t>, cli_flags_test_size, std::nullopt, "test flag");

namespace strata::services {
namespace {

TEST(HelpTextTest, ListsTheFlagsOfTheNamedFilesWithDefaultsThenTheExitCodes) {
  const std::string help = HelpText("usage: prog [flags]", {"cli_flags_test.cc"}, "exit codes: 0 ok");
  EXPECT_EQ(help.rfind("usage: prog [flags]\n\nflags", 0), 0u) << help;
  EXPECT_THAT(help, ::testing::HasSubstr("  --cli-flags-test-count  (default: 0)\n      test flag\n"));
  EXPECT_THAT(help, ::testing::HasSubstr("  --cli-flags-test-switch  (default: false)\n"));
  EXPECT_THAT(help, ::testing::HasSubstr("  --cli-flags-test-size  (default: none)\n"));
  // Sorted by name; absl's own flags (--flagfile) and other files' flags are left out.
  EXPECT_LT(help.find("--cli-flags-test-count"), help.find("--cli-flags-test-size"));
  EXPECT_LT(help.find("--cli-flags-test-size"), help.find("--cli-flags-test-switch"));
  EXPECT_EQ(help.find("--flagfile"), std::string::npos);
  EXPECT_TRUE(help.size() > 17 && help.compare(help.size() - 17, 17, "exit codes: 0 ok\n") == 0) << help;
  EXPECT_EQ(HelpText("usage", {"no_such_file.cc"}).find("--cli-flags-test"), std::string::npos);
}

TEST(PrepareFlagArgsTest, RewritesDashesInNamesOnly) {
  std::vector<std::string> args = {
      "prog", "convert", "in-file.gguf", "--cli-flags-test-count=3", "--cli-flags-test-switch", "-cli-flags-test-size",
      "7",    "out-dir"};
  ASSERT_TRUE(PrepareFlagArgs(&args).ok());
  EXPECT_EQ(args, (std::vector<std::string>{"prog", "convert", "in-file.gguf", "--cli_flags_test_count=3",
                                            "--cli_flags_test_switch", "-cli_flags_test_size", "7", "out-dir"}));
  EXPECT_EQ(absl::GetFlag(FLAGS_cli_flags_test_count), 3);
  EXPECT_EQ(absl::GetFlag(FLAGS_cli_flags_test_size), std::optional<int64_t>(7));
}

TEST(PrepareFlagArgsTest, UnknownFlagIsNamed) {
  std::vector<std::string> args = {"prog", "--no-such-flag=1"};
  EXPECT_THAT(PrepareFlagArgs(&args), StatusIsWith(absl::StatusCode::kInvalidArgument, "unknown flag --no-such-flag"));
}

TEST(PrepareFlagArgsTest, BadValueIsNamed) {
  std::vector<std::string> args = {"prog", "--cli-flags-test-count=many"};
  EXPECT_THAT(PrepareFlagArgs(&args),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "bad value 'many' for --cli-flags-test-count"));
  args = {"prog", "--cli-flags-test-switch=maybe"};
  EXPECT_THAT(PrepareFlagArgs(&args), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(PrepareFlagArgsTest, MissingValueIsNamed) {
  std::vector<std::string> args = {"prog", "--cli-flags-test-count"};
  EXPECT_THAT(PrepareFlagArgs(&args), StatusIsWith(absl::StatusCode::kInvalidArgument, "needs a value"));
}

TEST(PrepareFlagArgsTest, NegatedBoolAndArgumentsAfterDoubleDashAreAccepted) {
  std::vector<std::string> args = {"prog", "--nocli-flags-test-switch", "--", "--not-a-flag", "-x"};
  ASSERT_TRUE(PrepareFlagArgs(&args).ok());
  EXPECT_EQ(args, (std::vector<std::string>{"prog", "--nocli_flags_test_switch", "--", "--not-a-flag", "-x"}));
}

// What the binaries run: the negated switch turns the flag off, and what follows "--" is positional.
TEST(ParseFlagsTest, NegatedBoolTurnsTheFlagOffAndArgumentsAfterDoubleDashArePositional) {
  absl::SetFlag(&FLAGS_cli_flags_test_switch, true);
  absl::StatusOr<std::vector<std::string>> positional =
      ParseFlags({"prog", "--nocli-flags-test-switch", "in-file", "--", "--not-a-flag", "-x"});
  ASSERT_TRUE(positional.ok()) << positional.status();
  EXPECT_FALSE(absl::GetFlag(FLAGS_cli_flags_test_switch));
  EXPECT_EQ(*positional, (std::vector<std::string>{"prog", "in-file", "--not-a-flag", "-x"}));

  // And the plain switch turns it back on.
  positional = ParseFlags({"prog", "--cli-flags-test-switch"});
  ASSERT_TRUE(positional.ok()) << positional.status();
  EXPECT_TRUE(absl::GetFlag(FLAGS_cli_flags_test_switch));
  EXPECT_EQ(*positional, (std::vector<std::string>{"prog"}));
}

TEST(WantsHelpTest, SeesHelpBeforeDoubleDashOnly) {
  EXPECT_TRUE(WantsHelp({"prog", "convert", "--help"}));
  EXPECT_TRUE(WantsHelp({"prog", "-h"}));
  EXPECT_FALSE(WantsHelp({"prog", "--", "--help"}));
  EXPECT_FALSE(WantsHelp({"prog", "inspect", "x"}));
}

TEST(CheckLogLevelTest, KnowsTheSpdlogLevels) {
  EXPECT_TRUE(CheckLogLevel("info").ok());
  EXPECT_TRUE(CheckLogLevel("off").ok());
  EXPECT_THAT(CheckLogLevel("verbose"), StatusIsWith(absl::StatusCode::kInvalidArgument, "--log-level"));
}

}  // namespace
}  // namespace strata::services
