#include "services/generate_client.h"

#include <atomic>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "services/inference_protos.h"
#include "services/pack_cli.h"
#include "tests/services/inference_test_util.h"
#include "tests/services/service_test_util.h"

namespace strata::services {
namespace {

using ::strata::services::testing::InferenceTestServer;
using ::strata::services::testing::TinyEngineOptions;
using ::testing::HasSubstr;

struct CliRun {
  int code = -1;
  std::string out;
  std::string err;
};

CliRun RunCli(const std::vector<std::string>& args, const ClientOptions& options,
           const std::shared_ptr<grpc::Channel>& channel, const std::atomic<bool>* cancel = nullptr,
           const std::string& input = "") {
  std::ostringstream out, err;
  std::istringstream in(input);
  ClientIo io;
  io.out = &out;
  io.err = &err;
  io.in = &in;
  io.cancel = cancel;
  CliRun run;
  run.code = RunClient(args, options, channel, io);
  run.out = out.str();
  run.err = err.str();
  return run;
}

ClientOptions GreedyOptions(int max_tokens) {
  ClientOptions o;
  o.sampling.set_temperature(0);
  o.sampling.set_max_tokens(max_tokens);
  o.sampling.set_ignore_eos(true);
  return o;
}

// `strata generate` pointed at a strata-packd: one line naming both servers, not a bare "UNIMPLEMENTED: ".
TEST(GenerateClientTest, AtAStrataPackdTheErrorNamesTheServerThatAnswered) {
  strata::testing::ScratchDir root;
  testing::TestServer packd(root.path());
  ClientOptions options = GreedyOptions(4);
  options.server = "127.0.0.1:50052";
  const CliRun run = RunCli({"generate", "hello"}, options, packd.channel());
  EXPECT_EQ(run.code, kExitFailure);
  EXPECT_EQ(run.err,
            "strata: error: UNIMPLEMENTED: the server at 127.0.0.1:50052 is a strata-packd (strata.v1.PackTool), not "
            "a strata-server (strata.v1.Inference)\n");
}

// The seed in the summary line ("| seed N").
uint64_t SummarySeed(const std::string& err) {
  const size_t at = err.rfind("| seed ");
  if (at == std::string::npos) return 0;
  return std::stoull(err.substr(at + 7));
}

// No --seed: the server draws one per call and the summary prints it; giving it back repeats the text.
TEST(GenerateClientTest, TheSeedUsedIsPrintedAndRepeatsTheText) {
  InferenceTestServer server(TinyEngineOptions());
  ClientOptions options;
  options.sampling.set_temperature(1.5f);
  options.sampling.set_max_tokens(16);
  options.sampling.set_ignore_eos(true);
  const CliRun a = RunCli({"generate", "Once upon a time"}, options, server.channel());
  const CliRun b = RunCli({"generate", "Once upon a time"}, options, server.channel());
  ASSERT_EQ(a.code, kExitOk) << a.err;
  ASSERT_EQ(b.code, kExitOk) << b.err;
  ASSERT_THAT(a.err, HasSubstr("| seed "));
  EXPECT_NE(SummarySeed(a.err), SummarySeed(b.err));
  options.sampling.set_seed(SummarySeed(a.err));
  const CliRun again = RunCli({"generate", "Once upon a time"}, options, server.channel());
  ASSERT_EQ(again.code, kExitOk) << again.err;
  EXPECT_EQ(again.out, a.out);
  EXPECT_EQ(SummarySeed(again.err), SummarySeed(a.err));
}

// A bad sampling value is a usage error naming the flag, found before any call.
TEST(GenerateClientTest, BadSamplingValuesAreUsageErrorsNamingTheFlag) {
  InferenceTestServer server(TinyEngineOptions());
  ClientOptions options;
  options.sampling.set_temperature(-1);
  CliRun run = RunCli({"generate", "hi"}, options, server.channel());
  EXPECT_EQ(run.code, kExitUsage);
  EXPECT_THAT(run.err, HasSubstr("--temperature: -1 is negative"));
  options = ClientOptions();
  options.sampling.set_top_p(2);
  run = RunCli({"generate", "hi"}, options, server.channel());
  EXPECT_EQ(run.code, kExitUsage);
  EXPECT_THAT(run.err, HasSubstr("--top-p: 2 is not in (0, 1]"));
  EXPECT_EQ(server.engine().stats().requests_finished, 0u);
}

TEST(GenerateClientTest, GeneratePrintsTheStreamedTextThenSpeedAndHitRate) {
  InferenceTestServer server(TinyEngineOptions());
  const ClientOptions options = GreedyOptions(16);
  const CliRun run = RunCli({"generate", "Once upon a time"}, options, server.channel());
  ASSERT_EQ(run.code, kExitOk) << run.err;

  runtime::GenerateRequest direct;
  direct.prompt = "Once upon a time";
  direct.sampling = SamplingParamsFromProto(options.sampling);
  auto expected = server.engine().Generate(direct);
  ASSERT_TRUE(expected.ok()) << expected.status();
  ASSERT_EQ(expected->result.tokens.size(), 16u);
  // The text, then a newline unless it ended with one.
  std::string want = expected->text;
  if (want.empty() || want.back() != '\n') want += "\n";
  EXPECT_EQ(run.out, want);
  EXPECT_THAT(run.err, HasSubstr("16 tokens (length)"));
  EXPECT_THAT(run.err, HasSubstr("tokens/s"));
  EXPECT_THAT(run.err, HasSubstr("expert hit rate"));
}

// The reply the engine gives to a conversation, as the CLI prints it (a newline added when missing).
std::string ExpectedReply(InferenceTestServer& server, const std::vector<chat::ChatMessage>& messages,
                          const ClientOptions& options) {
  runtime::ChatRequest chat;
  chat.messages = messages;
  chat.system_prompt = options.system_prompt;
  chat.sampling = SamplingParamsFromProto(options.sampling);
  auto request = server.engine().PrepareChat(chat);
  EXPECT_TRUE(request.ok()) << request.status();
  if (!request.ok()) return "";
  auto done = server.engine().Generate(*std::move(request));
  EXPECT_TRUE(done.ok()) << done.status();
  if (!done.ok()) return "";
  return done->text;
}

std::string WithNewline(std::string s) {
  if (s.empty() || s.back() != '\n') s += "\n";
  return s;
}

TEST(GenerateClientTest, ChatRepliesToTheConversationItsArgumentsSpell) {
  InferenceTestServer server(TinyEngineOptions());
  ClientOptions options = GreedyOptions(8);
  options.system_prompt = "Be brief.";
  const CliRun run = RunCli({"chat", "Hi", "Hello!", "How are you?"}, options, server.channel());
  ASSERT_EQ(run.code, kExitOk) << run.err;
  const std::string want =
      ExpectedReply(server, {{"user", "Hi"}, {"assistant", "Hello!"}, {"user", "How are you?"}}, options);
  EXPECT_EQ(run.out, WithNewline(want));
  EXPECT_THAT(run.err, HasSubstr("8 tokens (length)"));

  const CliRun even = RunCli({"chat", "Hi", "Hello!"}, options, server.channel());
  EXPECT_EQ(even.code, kExitUsage);
  EXPECT_THAT(even.err, HasSubstr("ending with the user's"));
}

// Without message arguments, each line of input is a user message answered with the history so far.
TEST(GenerateClientTest, InteractiveChatKeepsTheHistory) {
  InferenceTestServer server(TinyEngineOptions());
  const ClientOptions options = GreedyOptions(5);
  const CliRun run = RunCli({"chat"}, options, server.channel(), nullptr, "Hi\n\nTell me more\n");
  ASSERT_EQ(run.code, kExitOk) << run.err;
  const std::string first = ExpectedReply(server, {{"user", "Hi"}}, options);
  const std::string second =
      ExpectedReply(server, {{"user", "Hi"}, {"assistant", first}, {"user", "Tell me more"}}, options);
  EXPECT_EQ(run.out, WithNewline(first) + WithNewline(second));
  // Two replies, two summaries; the empty line was skipped.
  size_t summaries = 0;
  for (size_t p = run.err.find("5 tokens (length)"); p != std::string::npos; p = run.err.find("5 tokens (length)", p + 1)) {
    ++summaries;
  }
  EXPECT_EQ(summaries, 2u);
}

TEST(GenerateClientTest, TokenIdPromptsAndLogprobs) {
  InferenceTestServer server(TinyEngineOptions());
  ClientOptions options = GreedyOptions(3);
  options.tokens = "5,6,7";
  options.sampling.set_logprobs(true);
  options.sampling.set_top_logprobs(2);
  options.quiet = true;
  const CliRun run = RunCli({"generate"}, options, server.channel());
  ASSERT_EQ(run.code, kExitOk) << run.err;
  EXPECT_EQ(run.out, "");
  // One line per token, each with two alternatives, then the summary.
  std::vector<std::string> lines = absl::StrSplit(run.err, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 4u) << run.err;
  for (int i = 0; i < 3; ++i) {
    EXPECT_THAT(lines[i], ::testing::StartsWith("token "));
    EXPECT_THAT(lines[i], HasSubstr("logprob"));
    EXPECT_THAT(lines[i], HasSubstr("  | "));
  }
  EXPECT_THAT(lines[3], HasSubstr("prompt 3 tokens"));
}

TEST(GenerateClientTest, TokenizeDetokenizeInfoAndStats) {
  InferenceTestServer server(TinyEngineOptions());
  ClientOptions options;
  options.add_special = false;
  const CliRun tokens = RunCli({"tokenize", "strata streams"}, options, server.channel());
  ASSERT_EQ(tokens.code, kExitOk) << tokens.err;
  EXPECT_EQ(tokens.out, absl::StrJoin(server.engine().Tokenize("strata streams", false, false), ",") + "\n");

  std::string ids = tokens.out;
  ids.pop_back();
  const CliRun text = RunCli({"detokenize", ids}, options, server.channel());
  ASSERT_EQ(text.code, kExitOk) << text.err;
  EXPECT_EQ(text.out, "strata streams\n");

  const CliRun info = RunCli({"info"}, options, server.channel());
  ASSERT_EQ(info.code, kExitOk) << info.err;
  EXPECT_THAT(info.out, HasSubstr("qwen3moe"));
  EXPECT_THAT(info.out, HasSubstr("2 layers, 8 experts (top-2)"));
  EXPECT_THAT(info.out, HasSubstr("scheme s4"));
  EXPECT_THAT(info.out, HasSubstr("chat          the model's chat template"));
  EXPECT_THAT(info.out, HasSubstr("kv cache      262.1 KB per sequence of 256 positions\n"));

  ASSERT_EQ(RunCli({"generate", "x"}, GreedyOptions(4), server.channel()).code, kExitOk);
  ASSERT_TRUE(server.WaitUntilIdle());  // the engine counts a request just after its last callback
  const CliRun stats = RunCli({"stats"}, options, server.channel());
  ASSERT_EQ(stats.code, kExitOk) << stats.err;
  EXPECT_THAT(stats.out, HasSubstr("requests finished  1\n"));
}

TEST(GenerateClientTest, UsageErrorsExitWithTwo) {
  InferenceTestServer server(TinyEngineOptions());
  const auto channel = server.channel();
  EXPECT_EQ(RunCli({}, {}, channel).code, kExitUsage);
  const CliRun unknown = RunCli({"summarize"}, {}, channel);
  EXPECT_EQ(unknown.code, kExitUsage);
  EXPECT_THAT(unknown.err, HasSubstr("unknown command 'summarize'"));
  EXPECT_EQ(RunCli({"generate"}, {}, channel).code, kExitUsage);
  EXPECT_EQ(RunCli({"generate", "a", "b"}, {}, channel).code, kExitUsage);
  ClientOptions bad_tokens;
  bad_tokens.tokens = "1,x";
  EXPECT_THAT(RunCli({"generate"}, bad_tokens, channel).err, HasSubstr("--tokens"));
  EXPECT_EQ(RunCli({"detokenize", "one"}, {}, channel).code, kExitUsage);
  EXPECT_EQ(RunCli({"info", "extra"}, {}, channel).code, kExitUsage);
  EXPECT_EQ(server.engine().stats().requests_finished, 0u);
}

TEST(GenerateClientTest, RefusedRequestsAndAnUnreachableServerExitWithOne) {
  InferenceTestServer server(TinyEngineOptions());
  // A stop token id outside the model's vocabulary: only the server can tell (a bad --temperature is a
  // usage error found by the client, see BadSamplingValuesAreUsageErrorsNamingTheFlag).
  ClientOptions beyond = GreedyOptions(4);
  beyond.stop_token_ids = "1073741824";
  const CliRun refused = RunCli({"generate", "hi"}, beyond, server.channel());
  EXPECT_EQ(refused.code, kExitFailure);
  EXPECT_THAT(refused.err, HasSubstr("INVALID_ARGUMENT"));
  EXPECT_THAT(refused.err, HasSubstr("stop_token_ids[0]"));

  // Port 1 on loopback: nothing listens there.
  ClientOptions options;
  options.server = "127.0.0.1:1";
  options.timeout_seconds = 10;
  const CliRun down = RunCli({"info"}, options,
                          grpc::CreateChannel(options.server, grpc::InsecureChannelCredentials()));
  EXPECT_EQ(down.code, kExitFailure);
  EXPECT_THAT(down.err, HasSubstr("UNAVAILABLE"));
  EXPECT_THAT(down.err, HasSubstr("127.0.0.1:1"));
}

TEST(GenerateClientTest, ACancelRequestStopsTheGeneration) {
  InferenceTestServer server(TinyEngineOptions(/*max_seqs=*/2, /*slow=*/true));
  std::atomic<bool> cancel{true};  // as if the user pressed Ctrl-C at once
  const CliRun run = RunCli({"generate", "a long story"}, GreedyOptions(250), server.channel(), &cancel);
  EXPECT_EQ(run.code, kExitFailure);
  EXPECT_THAT(run.err, HasSubstr("cancelled"));
  EXPECT_TRUE(server.WaitUntilIdle());
  EXPECT_LT(server.engine().stats().tokens_generated, 250u);
}

}  // namespace
}  // namespace strata::services
