#include "services/pack_cli.h"

#include <atomic>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "engine/gguf/gguf_file.h"
#include "engine/pack/pack.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/packtool_backend.h"
#include "tests/services/inference_test_util.h"
#include "tests/services/service_test_util.h"
#include "tests/testing/hf_checkpoint_writer.h"

namespace strata::services {
namespace {

namespace fs = std::filesystem;
using ::strata::services::testing::CopyTree;
using ::strata::services::testing::Models;
using ::strata::services::testing::TestServer;
using ::strata::testing::ScratchDir;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

struct CliRun {
  int code = -1;
  std::string out;
  std::string err;
};

CliRun RunCli(const std::vector<std::string>& args, const PackCliOptions& options = {},
              const std::atomic<bool>* cancel = nullptr) {
  std::ostringstream out, err;
  CliIo io;
  io.out = &out;
  io.err = &err;
  io.cancel = cancel;
  CliRun run;
  run.code = RunPackCli(args, options, io);
  run.out = out.str();
  run.err = err.str();
  return run;
}

// An error is exactly one line, "strata-pack: error: ...".
void ExpectOneErrorLine(const CliRun& run, const std::string& substring) {
  const std::vector<std::string> lines = absl::StrSplit(run.err, '\n', absl::SkipEmpty());
  ASSERT_FALSE(lines.empty());
  EXPECT_THAT(lines.back(), StartsWith("strata-pack: error: "));
  EXPECT_THAT(lines.back(), HasSubstr(substring));
  for (size_t i = 0; i + 1 < lines.size(); ++i) EXPECT_THAT(lines[i], Not(HasSubstr("error"))) << lines[i];
}

class PackCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = scratch_.Join("root");
    fs::create_directories(root_);
    fs::copy_file(Models().tiny_gguf, root_ + "/tiny.gguf");
    CopyTree(Models().tiny_pack, root_ + "/tiny-pack");
  }

  ScratchDir scratch_;
  std::string root_;
};

TEST_F(PackCliTest, UsageErrorsExitTwo) {
  CliRun run = RunCli({});
  EXPECT_EQ(run.code, kExitUsage);
  ExpectOneErrorLine(run, "missing command");

  run = RunCli({"frobnicate"});
  EXPECT_EQ(run.code, kExitUsage);
  ExpectOneErrorLine(run, "unknown command 'frobnicate'");

  run = RunCli({"convert", root_ + "/tiny.gguf"});
  EXPECT_EQ(run.code, kExitUsage);
  ExpectOneErrorLine(run, "missing the output directory");

  run = RunCli({"validate"});
  EXPECT_EQ(run.code, kExitUsage);
  run = RunCli({"inspect", "a", "b"});
  EXPECT_EQ(run.code, kExitUsage);
  ExpectOneErrorLine(run, "unexpected argument 'b'");

  PackCliOptions options;
  options.scheme = "s3";
  run = RunCli({"convert", root_ + "/tiny.gguf", root_ + "/out"}, options);
  EXPECT_EQ(run.code, kExitUsage);
  ExpectOneErrorLine(run, "--scheme");
  EXPECT_FALSE(fs::exists(root_ + "/out"));

  options = PackCliOptions();
  options.threads = 5000;
  run = RunCli({"convert", root_ + "/tiny.gguf", root_ + "/out"}, options);
  EXPECT_EQ(run.code, kExitUsage);
  ExpectOneErrorLine(run, "--threads: 5000 is not in 0 .. 1024");
  EXPECT_FALSE(fs::exists(root_ + "/out.partial"));

  options = PackCliOptions();
  options.dense_type = "f8";
  run = RunCli({"convert", root_ + "/tiny.gguf", root_ + "/out"}, options);
  EXPECT_EQ(run.code, kExitUsage);
  ExpectOneErrorLine(run, "--dense-type: unknown 'f8'; expected keep, f16, bf16 or q8_0");
  EXPECT_FALSE(fs::exists(root_ + "/out.partial"));
}

TEST_F(PackCliTest, SynthUsageErrors) {
  PackCliOptions options;
  CliRun run = RunCli({"synth"}, options);
  EXPECT_EQ(run.code, kExitUsage);
  ExpectOneErrorLine(run, "--out");

  options.out = root_ + "/s.gguf";
  options.server = "127.0.0.1:1";
  run = RunCli({"synth"}, options);
  EXPECT_EQ(run.code, kExitUsage);
  ExpectOneErrorLine(run, "--server");

  options.server.clear();
  options.type = "q3_k";
  run = RunCli({"synth"}, options);
  EXPECT_EQ(run.code, kExitUsage);
  ExpectOneErrorLine(run, "--type");

  options.type = "f16";
  options.preset = "huge";
  run = RunCli({"synth"}, options);
  EXPECT_EQ(run.code, kExitUsage);
  ExpectOneErrorLine(run, "huge");

  options.preset = "tiny";
  options.experts_used = 99;  // more than the 8 experts
  run = RunCli({"synth"}, options);
  EXPECT_EQ(run.code, kExitUsage);
  ExpectOneErrorLine(run, "geometry");
  EXPECT_FALSE(fs::exists(options.out));

  options.experts_used.reset();
  options.router_skew = -1;
  run = RunCli({"synth"}, options);
  EXPECT_EQ(run.code, kExitUsage);
  ExpectOneErrorLine(run, "--router-skew: -1 is out of range (expected a number from 0 to 8)");

  options.router_skew = 0.3;
  options.arch = "gpt-oss";
  run = RunCli({"synth"}, options);
  EXPECT_EQ(run.code, kExitUsage);
  ExpectOneErrorLine(run, "--router-skew: architecture gpt-oss is not supported");
  EXPECT_FALSE(fs::exists(options.out));

  options.router_skew = 0;
  options.arch = "qwen3moe";
  options.mtp_layers = 1;
  run = RunCli({"synth"}, options);
  EXPECT_EQ(run.code, kExitUsage);
  ExpectOneErrorLine(run, "--mtp-layers: architecture qwen3moe has no multi-token-prediction blocks");
  options.arch = "glm4moe";
  options.pack_only = true;
  run = RunCli({"synth"}, options);
  EXPECT_EQ(run.code, kExitUsage);
  ExpectOneErrorLine(run, "--mtp-layers: 1 with --pack-only");
  EXPECT_FALSE(fs::exists(options.out));
}

// A GLM-4.5-like GGUF with its multi-token-prediction block: inspect counts it apart, convert leaves it out
// and the pack validates.
TEST_F(PackCliTest, SynthMtpLayersInspectsConvertsAndValidates) {
  PackCliOptions options;
  options.out = root_ + "/mtp.gguf";
  options.arch = "glm4moe";
  options.mtp_layers = 1;
  CliRun run = RunCli({"synth"}, options);
  ASSERT_EQ(run.code, kExitOk) << run.err;
  run = RunCli({"inspect", options.out});
  ASSERT_EQ(run.code, kExitOk) << run.err;
  EXPECT_THAT(run.out, HasSubstr("layers         2 (1 with routed experts)"));
  EXPECT_THAT(run.out, HasSubstr("MTP blocks     1 more in the file (multi-token prediction)"));
  run = RunCli({"convert", options.out, root_ + "/mtp-pack"});
  ASSERT_EQ(run.code, kExitOk) << run.err;
  run = RunCli({"inspect", root_ + "/mtp-pack"});
  ASSERT_EQ(run.code, kExitOk) << run.err;
  EXPECT_THAT(run.out, HasSubstr("layers         2 (1 with routed experts)"));
  EXPECT_THAT(run.out, Not(HasSubstr("MTP blocks")));
  EXPECT_THAT(run.out, Not(HasSubstr("nextn")));
  run = RunCli({"validate", root_ + "/mtp-pack"});
  EXPECT_EQ(run.code, kExitOk) << run.err;
}

TEST_F(PackCliTest, SynthPackOnlyWithARouterSkewSaysWhatItAimsAt) {
  PackCliOptions options;
  options.out = root_ + "/skewed-pack";
  options.pack_only = true;
  options.experts = 32;
  options.router_skew = 0.5;
  options.threads = 2;
  CliRun run = RunCli({"synth"}, options);
  ASSERT_EQ(run.code, kExitOk) << run.err;
  EXPECT_THAT(run.out, HasSubstr("router skew 0.5: the hottest expert of each layer aimed at 3.22x the mean"));
  run = RunCli({"validate", options.out});
  EXPECT_EQ(run.code, kExitOk) << run.err;
}

TEST_F(PackCliTest, SynthWritesAModelWithTheGeometryOverrides) {
  PackCliOptions options;
  options.out = root_ + "/s.gguf";
  options.layers = 3;
  options.experts = 4;
  options.threads = 2;
  CliRun run = RunCli({"synth"}, options);
  ASSERT_EQ(run.code, kExitOk) << run.err;
  EXPECT_THAT(run.out, HasSubstr("3 layers x 4 experts"));
  run = RunCli({"inspect", options.out});
  ASSERT_EQ(run.code, kExitOk) << run.err;
  EXPECT_THAT(run.out, HasSubstr("qwen3moe"));
  EXPECT_THAT(run.out, HasSubstr("4 per layer"));
}

TEST_F(PackCliTest, SynthPackOnlyWritesAValidPack) {
  PackCliOptions options;
  options.out = root_ + "/synth-pack";
  options.pack_only = true;
  options.scheme = "s2";
  options.threads = 2;
  CliRun run = RunCli({"synth"}, options);
  ASSERT_EQ(run.code, kExitOk) << run.err;
  EXPECT_THAT(run.out, HasSubstr("scheme s2"));
  run = RunCli({"validate", options.out});
  EXPECT_EQ(run.code, kExitOk) << run.err;
}

TEST_F(PackCliTest, ConvertPrintsProgressLinesAndTheErrorTable) {
  PackCliOptions options;
  options.scheme = "s2";
  options.threads = 2;
  const CliRun run = RunCli({"convert", root_ + "/tiny.gguf", root_ + "/out"}, options);
  ASSERT_EQ(run.code, kExitOk) << run.err;
  EXPECT_THAT(run.err, HasSubstr("convert: writing dense.gguf\n"));
  EXPECT_EQ(run.err.find('\r'), std::string::npos);
  EXPECT_THAT(run.out, HasSubstr("quantization error by role"));
  for (const char* role : {"gate", "up", "down"}) EXPECT_THAT(run.out, HasSubstr(absl::StrCat("  ", role, " ")));
  EXPECT_THAT(run.out, HasSubstr("scheme s2"));
  EXPECT_TRUE(fs::is_directory(root_ + "/out"));
}

TEST_F(PackCliTest, ConvertPicksTheSchemeFromTheSourceByDefault) {
  PackCliOptions options;
  EXPECT_EQ(options.scheme, "auto");
  options.threads = 2;
  const CliRun run = RunCli({"convert", root_ + "/tiny.gguf", root_ + "/out"}, options);
  ASSERT_EQ(run.code, kExitOk) << run.err;
  EXPECT_THAT(run.out, HasSubstr("scheme s4"));  // the shared tiny model has f16 experts
}

TEST_F(PackCliTest, ConvertReadsAHuggingFaceCheckpoint) {
  fs::create_directories(root_ + "/hf");
  ASSERT_TRUE(::strata::testing::WriteHfCheckpointFromGguf(root_ + "/tiny.gguf", root_ + "/hf").ok());
  PackCliOptions options;
  options.threads = 2;
  const CliRun run = RunCli({"convert", root_ + "/hf", root_ + "/out"}, options);
  ASSERT_EQ(run.code, kExitOk) << run.err;
  EXPECT_THAT(run.err, HasSubstr("convert: writing the Hugging Face checkpoint as a GGUF\n"));
  EXPECT_THAT(run.out, HasSubstr("scheme s4"));  // f16 experts, as from the GGUF
  EXPECT_TRUE(fs::is_directory(root_ + "/out"));
  EXPECT_FALSE(fs::exists(root_ + "/out.hf.gguf"));
}

// A checkpoint whose tokenizer Strata cannot read from tokenizer.json (here: none) takes it from a GGUF, locally
// and at a server (paths relative to its data root); a GGUF input keeps its own tokenizer and refuses the flag.
TEST_F(PackCliTest, ConvertTakesTheTokenizerOfAHuggingFaceCheckpointFromAGgufWhenAsked) {
  fs::create_directories(root_ + "/hf");
  ASSERT_TRUE(::strata::testing::WriteHfCheckpointFromGguf(root_ + "/tiny.gguf", root_ + "/hf", {.tokenizer = false}).ok());
  PackCliOptions options;
  options.threads = 2;
  CliRun run = RunCli({"convert", root_ + "/hf", root_ + "/out"}, options);
  EXPECT_EQ(run.code, kExitFailure);
  ExpectOneErrorLine(run, "tokenizer.json: missing; pass --tokenizer-gguf");
  options.tokenizer_gguf = root_ + "/tiny.gguf";
  run = RunCli({"convert", root_ + "/hf", root_ + "/out"}, options);
  ASSERT_EQ(run.code, kExitOk) << run.err;
  EXPECT_TRUE(fs::is_directory(root_ + "/out"));
  run = RunCli({"convert", root_ + "/tiny.gguf", root_ + "/out-gguf"}, options);
  EXPECT_EQ(run.code, kExitFailure);
  ExpectOneErrorLine(run, "tokenizer_gguf: only for a Hugging Face checkpoint directory input");

  TestServer server(root_, "127.0.0.1:0");
  ASSERT_GT(server.port(), 0);
  PackCliOptions remote;
  remote.server = absl::StrCat("127.0.0.1:", server.port());
  remote.threads = 2;
  remote.tokenizer_gguf = "tiny.gguf";
  run = RunCli({"convert", "hf", "served"}, remote);
  ASSERT_EQ(run.code, kExitOk) << run.err;
  EXPECT_TRUE(fs::is_directory(root_ + "/served"));
  remote.tokenizer_gguf = "../outside.gguf";
  run = RunCli({"convert", "hf", "served-2"}, remote);
  EXPECT_EQ(run.code, kExitFailure);
  ExpectOneErrorLine(run, "outside the data root");
}

TEST_F(PackCliTest, ConvertWithADenseTypeListsTheDenseErrorInTheTable) {
  PackCliOptions options;
  options.dense_type = "bf16";
  options.threads = 2;
  const CliRun run = RunCli({"convert", root_ + "/tiny.gguf", root_ + "/out"}, options);
  ASSERT_EQ(run.code, kExitOk) << run.err;
  EXPECT_THAT(run.out, HasSubstr("  dense "));
  auto dense = gguf::GgufFile::Open(root_ + "/out/dense.gguf");
  ASSERT_TRUE(dense.ok()) << dense.status();
  EXPECT_EQ((*dense)->FindTensor("output.weight")->type, gguf::GgmlType::kBF16);
}

TEST_F(PackCliTest, ConvertFailureIsOneLineAndExitsOne) {
  CliRun run = RunCli({"convert", root_ + "/tiny.gguf", root_ + "/tiny-pack"});
  EXPECT_EQ(run.code, kExitFailure);
  ExpectOneErrorLine(run, "tiny-pack");

  run = RunCli({"convert", root_ + "/nope.gguf", root_ + "/out"});
  EXPECT_EQ(run.code, kExitFailure);
  ExpectOneErrorLine(run, "nope.gguf");
  EXPECT_FALSE(fs::exists(root_ + "/out"));
  EXPECT_FALSE(fs::exists(root_ + "/out.partial"));
}

TEST_F(PackCliTest, ValidateReportsEachProblemAndExitsOne) {
  CliRun run = RunCli({"validate", root_ + "/tiny-pack"});
  ASSERT_EQ(run.code, kExitOk) << run.err;
  EXPECT_THAT(run.out, HasSubstr("GB/s"));
  EXPECT_THAT(run.out, HasSubstr("valid pack"));

  fs::resize_file(root_ + "/tiny-pack/experts.bin", fs::file_size(root_ + "/tiny-pack/experts.bin") - 1);
  run = RunCli({"validate", root_ + "/tiny-pack"});
  EXPECT_EQ(run.code, kExitFailure);
  EXPECT_THAT(run.out, HasSubstr("experts.bin: "));
  ExpectOneErrorLine(run, "invalid pack");

  run = RunCli({"validate", root_ + "/no-such-pack"});
  EXPECT_EQ(run.code, kExitFailure);
  ExpectOneErrorLine(run, "no-such-pack");
}

TEST_F(PackCliTest, ProfileStoresTheRoutingCountsAndValidateAcceptsThem) {
  const std::string prompts = root_ + "/prompts.txt";
  std::ofstream(prompts) << "Hello there\nWhat is a mixture of experts?\n";
  PackCliOptions options;
  options.prompts = prompts;
  options.tokens = 4;
  options.threads = 2;
  CliRun run = RunCli({"profile", root_ + "/tiny-pack"}, options);
  ASSERT_EQ(run.code, kExitOk) << run.err;
  EXPECT_THAT(run.out, HasSubstr(" tokens of 2 prompts in "));
  EXPECT_THAT(run.out, HasSubstr("x its layer's mean"));
  EXPECT_THAT(run.out, HasSubstr("wrote " + root_ + "/tiny-pack/routing_profile.bin"));
  EXPECT_TRUE(fs::exists(root_ + "/tiny-pack/routing_profile.bin"));
  run = RunCli({"validate", root_ + "/tiny-pack"});
  ASSERT_EQ(run.code, kExitOk) << run.err;
  EXPECT_THAT(run.out, HasSubstr("valid pack"));
  const uint64_t plain_tokens = pack::Pack::Open(root_ + "/tiny-pack").value()->routing_profile()->tokens;

  // Through the chat template: more tokens (the template's), same prompts.
  options.chat = true;
  run = RunCli({"profile", root_ + "/tiny-pack"}, options);
  ASSERT_EQ(run.code, kExitOk) << run.err;
  EXPECT_GT(pack::Pack::Open(root_ + "/tiny-pack").value()->routing_profile()->tokens, plain_tokens);

  // A corrupted profile fails validation, naming the file.
  std::fstream file(root_ + "/tiny-pack/routing_profile.bin", std::ios::in | std::ios::out | std::ios::binary);
  file.seekp(44);
  file.put('\x7f');
  file.close();
  for (const bool quick : {false, true}) {
    PackCliOptions validate;
    validate.quick = quick;
    run = RunCli({"validate", root_ + "/tiny-pack"}, validate);
    EXPECT_EQ(run.code, kExitFailure);
    EXPECT_THAT(run.out, HasSubstr("routing_profile.bin: field 'xxh3'"));
    ExpectOneErrorLine(run, "invalid pack, 1 problem");
  }
}

TEST_F(PackCliTest, ProfileErrors) {
  CliRun run = RunCli({"profile", root_ + "/tiny-pack"});
  EXPECT_EQ(run.code, kExitUsage);
  ExpectOneErrorLine(run, "profile: missing --prompts FILE");
  run = RunCli({"profile"});
  EXPECT_EQ(run.code, kExitUsage);
  ExpectOneErrorLine(run, "profile: missing the pack directory");

  const std::string prompts = root_ + "/prompts.txt";
  std::ofstream(prompts) << "\n\n";
  PackCliOptions options;
  options.prompts = prompts;
  options.tokens = -1;
  run = RunCli({"profile", root_ + "/tiny-pack"}, options);
  EXPECT_EQ(run.code, kExitUsage);
  ExpectOneErrorLine(run, "--tokens: -1 is not in 0 .. ");
  options.tokens = 0;
  options.server = "127.0.0.1:1";
  run = RunCli({"profile", root_ + "/tiny-pack"}, options);
  EXPECT_EQ(run.code, kExitUsage);
  ExpectOneErrorLine(run, "profile runs in this process only");

  options.server.clear();
  run = RunCli({"profile", root_ + "/tiny-pack"}, options);
  EXPECT_EQ(run.code, kExitFailure);
  ExpectOneErrorLine(run, prompts + ": no prompts (only blank lines); expected one prompt a line");
  EXPECT_FALSE(fs::exists(root_ + "/tiny-pack/routing_profile.bin"));
}

TEST_F(PackCliTest, InspectFailureExitsOne) {
  const CliRun run = RunCli({"inspect", root_ + "/missing.gguf"});
  EXPECT_EQ(run.code, kExitFailure);
  ExpectOneErrorLine(run, "missing.gguf");
}

TEST_F(PackCliTest, HelpGoesToStdout) {
  const CliRun run = RunCli({"help"});
  EXPECT_EQ(run.code, kExitOk);
  EXPECT_THAT(run.out, HasSubstr("usage: strata-pack"));
  EXPECT_EQ(run.out, PackCliUsage());
}

TEST_F(PackCliTest, ACancelledValidateStopsWithAnErrorNotAVerdict) {
  const std::atomic<bool> cancel{true};  // as after a first Ctrl-C
  CliRun run = RunCli({"validate", root_ + "/tiny-pack"}, {}, &cancel);
  EXPECT_EQ(run.code, kExitFailure);
  ExpectOneErrorLine(run, "cancelled");
  EXPECT_THAT(run.out, Not(HasSubstr("valid pack")));
}

TEST_F(PackCliTest, ServerModeGivesTheSameOutputAndExitCodes) {
  TestServer server(root_, "127.0.0.1:0");
  ASSERT_GT(server.port(), 0);
  PackCliOptions remote;
  remote.server = absl::StrCat("127.0.0.1:", server.port());
  remote.threads = 2;

  // Paths are relative to the server's data root.
  CliRun run = RunCli({"convert", "tiny.gguf", "served"}, remote);
  ASSERT_EQ(run.code, kExitOk) << run.err;
  EXPECT_THAT(run.out, HasSubstr("quantization error by role"));
  EXPECT_THAT(run.err, HasSubstr("convert: "));
  EXPECT_TRUE(fs::is_directory(root_ + "/served"));

  run = RunCli({"validate", "served"}, remote);
  EXPECT_EQ(run.code, kExitOk) << run.err;

  const CliRun remote_inspect = RunCli({"inspect", "tiny-pack"}, remote);
  ASSERT_EQ(remote_inspect.code, kExitOk) << remote_inspect.err;
  const CliRun local_inspect = RunCli({"inspect", root_ + "/tiny-pack"});
  ASSERT_EQ(local_inspect.code, kExitOk) << local_inspect.err;
  EXPECT_EQ(remote_inspect.out, local_inspect.out);

  run = RunCli({"convert", "tiny.gguf", "served"}, remote);
  EXPECT_EQ(run.code, kExitFailure);
  ExpectOneErrorLine(run, "already exists");

  // A first Ctrl-C before or during a remote call cancels it.
  const std::atomic<bool> cancelled{true};
  run = RunCli({"validate", "served"}, remote, &cancelled);
  EXPECT_EQ(run.code, kExitFailure);
  ExpectOneErrorLine(run, "CANCELLED");
  run = RunCli({"inspect", "tiny-pack"}, remote, &cancelled);
  EXPECT_EQ(run.code, kExitFailure);
  ExpectOneErrorLine(run, "CANCELLED");

  run = RunCli({"validate", "../"}, remote);
  EXPECT_EQ(run.code, kExitFailure);
  ExpectOneErrorLine(run, "outside the data root");

  fs::resize_file(root_ + "/served/experts.bin", 4096);
  run = RunCli({"validate", "served"}, remote);
  EXPECT_EQ(run.code, kExitFailure);
  EXPECT_THAT(run.out, HasSubstr("experts.bin: "));
}

TEST_F(PackCliTest, UnreachableServerIsOneLine) {
  int port = 0;
  {
    TestServer server(root_, "127.0.0.1:0");
    port = server.port();
  }  // closed again: nothing listens there now
  PackCliOptions remote;
  remote.server = absl::StrCat("127.0.0.1:", port);
  const CliRun run = RunCli({"inspect", "tiny-pack"}, remote);
  EXPECT_EQ(run.code, kExitFailure);
  ExpectOneErrorLine(run, "strata-packd at 127.0.0.1:");
}

// strata-pack --server pointed at a strata-server: the error names the server that answered.
TEST_F(PackCliTest, AtAStrataServerTheRemoteBackendNamesTheServerThatAnswered) {
  testing::InferenceTestServer inference(testing::TinyEngineOptions());
  std::unique_ptr<PackToolBackend> backend = NewRemoteBackend(inference.channel(), "127.0.0.1:50051");
  v1::ValidateRequest request;
  request.set_pack_dir("tiny-pack");
  const absl::StatusOr<v1::ValidateReport> report = backend->Validate(request, nullptr);
  ASSERT_FALSE(report.ok());
  EXPECT_EQ(report.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(report.status().message(),
            "the server at 127.0.0.1:50051 is a strata-server (strata.v1.Inference), not a strata-packd "
            "(strata.v1.PackTool)");
}

}  // namespace
}  // namespace strata::services
