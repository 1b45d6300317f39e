// Every binary (the services' mains and the benches) answers --help and -h on stdout with exit 0, listing
// every flag its source parses with a default, and the exit codes. The flags are read from the sources
// (ABSL_FLAG in a main, flags.String("name", ...) and the other getters in a bench), so a flag added
// without help fails here.

#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "gmock/gmock.h"
#include "engine/runtime/sampling_params.h"
#include "gtest/gtest.h"
#include "tests/testing/test_util.h"

namespace strata::services {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

struct Binary {
  std::string name;    // strata-run
  std::string path;    // in the build tree
  std::string source;  // the file that defines its flags
  std::vector<std::string> flags;  // as typed: --max-tokens
};

std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::vector<std::string> FlagsIn(const std::string& source, const std::regex& definition) {
  std::vector<std::string> flags;
  const std::string text = ReadText(source);
  for (std::sregex_iterator it(text.begin(), text.end(), definition), end; it != end; ++it) {
    flags.push_back("--" + absl::StrReplaceAll((*it)[1].str(), {{"_", "-"}}));
  }
  return flags;
}

// Every *_main.cc of services/ and every *_bench.cc of bench/ the build makes.
std::vector<Binary> Binaries() {
  static const std::regex absl_flag(R"(ABSL_FLAG\(\s*[^,]+,\s*(\w+)\s*,)");
  static const std::regex bench_flag(R"(flags\.(?:String|Int|Double|Bool|IntList|StringList)\(\s*"([^"]+)\")");
  std::vector<Binary> binaries;
  for (const auto& [folder, suffix] : {std::pair<std::string, std::string>{"services", "_main.cc"}, {"bench", "_bench.cc"}}) {
    for (const fs::directory_entry& entry : fs::directory_iterator(absl::StrCat(STRATA_SOURCE_DIR, "/", folder))) {
      const std::string file = entry.path().filename().string();
      if (file.size() <= suffix.size() || file.compare(file.size() - suffix.size(), suffix.size(), suffix) != 0) continue;
#ifndef STRATA_HAVE_CUDA
      if (file.find("_gpu_bench.cc") != std::string::npos) continue;  // built only with the CUDA kernels
#endif
      Binary b;
      std::string stem = file.substr(0, file.size() - (folder == "services" ? suffix.size() : 3));
      if (folder == "bench") stem = "strata_" + stem;
      b.name = absl::StrReplaceAll(stem, {{"_", "-"}});
      b.path = absl::StrCat(STRATA_BINARY_DIR, "/", folder, "/", b.name);
      b.source = entry.path().string();
      b.flags = FlagsIn(b.source, folder == "services" ? absl_flag : bench_flag);
      binaries.push_back(std::move(b));
    }
  }
  return binaries;
}

struct Ran {
  int exit_code = -1;
  std::string out, err;
};

Ran RunCommandLine(const std::string& command, const strata::testing::ScratchDir& dir) {
  const std::string err_file = dir.Join("stderr");
  Ran ran;
  FILE* pipe = popen(absl::StrCat(command, " 2>", err_file).c_str(), "r");
  if (pipe == nullptr) return ran;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) ran.out.append(buffer, n);
  const int status = pclose(pipe);
  ran.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  ran.err = ReadText(err_file);
  return ran;
}

TEST(HelpTest, EveryBinaryListsEveryFlagItParsesWithItsDefaultAndTheExitCodes) {
  const std::vector<Binary> binaries = Binaries();
  // The five services binaries and at least the CPU benches.
  ASSERT_GE(binaries.size(), 9u);
  strata::testing::ScratchDir dir;
  for (const Binary& b : binaries) {
    SCOPED_TRACE(b.name);
    ASSERT_TRUE(fs::exists(b.path)) << b.path;
    EXPECT_FALSE(b.flags.empty()) << "no flags found in " << b.source;
    const Ran help = RunCommandLine(b.path + " --help", dir);
    EXPECT_EQ(help.exit_code, 0) << help.err;
    EXPECT_EQ(help.err, "");
    EXPECT_THAT(help.out, HasSubstr("usage: "));
    EXPECT_THAT(help.out, HasSubstr("exit codes: 0 "));
    for (const std::string& flag : b.flags) {
      // Listed as a flag of its own with its default: "  --name  (default: ...)".
      EXPECT_THAT(help.out, HasSubstr("  " + flag + "  (default: ")) << "in " << b.source;
    }
    const Ran h = RunCommandLine(b.path + " -h", dir);
    EXPECT_EQ(h.exit_code, 0) << h.err;
    EXPECT_EQ(h.out, help.out);
  }
}

// strata-run and strata show the engine's one set of sampling defaults, and refuse a bad value before any
// work with the usage exit code, naming the flag as typed.
TEST(HelpTest, SamplingDefaultsAreTheEnginesAndBadValuesAreUsageErrors) {
  strata::testing::ScratchDir dir;
  const runtime::SamplingParams defaults;
  for (const std::string binary : {"strata-run", "strata"}) {
    SCOPED_TRACE(binary);
    const std::string path = absl::StrCat(STRATA_BINARY_DIR, "/services/", binary);
    const Ran help = RunCommandLine(path + " --help", dir);
    EXPECT_THAT(help.out, HasSubstr(absl::StrCat("  --temperature  (default: ", defaults.temperature, ")")));
    EXPECT_THAT(help.out, HasSubstr(absl::StrCat("  --top-k  (default: ", defaults.top_k, ")")));
    EXPECT_THAT(help.out, HasSubstr(absl::StrCat("  --top-p  (default: ", defaults.top_p, ")")));
    EXPECT_THAT(help.out, HasSubstr(absl::StrCat("  --min-p  (default: ", defaults.min_p, ")")));
    EXPECT_THAT(help.out, HasSubstr(absl::StrCat("  --max-tokens  (default: ", defaults.max_tokens, ")")));
    EXPECT_THAT(help.out, HasSubstr("  --seed  (default: none)"));
    // strata-run's pack and strata's server need not exist: the check comes first.
    const std::string args = binary == "strata-run" ? " --pack /nonexistent x" : " --server 127.0.0.1:1 generate x";
    const Ran bad = RunCommandLine(path + args + " --temperature=-1", dir);
    EXPECT_EQ(bad.exit_code, 2);
    EXPECT_THAT(bad.err, HasSubstr("--temperature: -1 is negative"));
    const Ran top_p = RunCommandLine(path + args + " --top-p 1.5", dir);
    EXPECT_EQ(top_p.exit_code, 2);
    EXPECT_THAT(top_p.err, HasSubstr("--top-p: 1.5 is not in (0, 1]"));
  }
}

}  // namespace
}  // namespace strata::services
