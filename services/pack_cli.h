#ifndef STRATA_SERVICES_PACK_CLI_H_
#define STRATA_SERVICES_PACK_CLI_H_

// The strata-pack command line: synth, convert, validate, inspect and profile, in-process or (except synth
// and profile) as a client of a strata-packd. main() parses the flags into PackCliOptions and calls RunPackCli, which prints
// results on `out`, progress and errors on `err` (an error is one line, "strata-pack: error: ...") and
// returns the exit code. One thread calls it.

#include <atomic>
#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "services/cli_flags.h"

namespace strata::services {

// kExitOk, kExitFailure (invalid input or pack, failed job) and kExitUsage come from cli_flags.h.

struct PackCliOptions {
  std::string server;  // strata-packd address; empty: in-process

  // synth
  std::string arch = "qwen3moe";
  std::string preset = "tiny";
  std::string out;  // required
  // Override the preset's geometry when set.
  std::optional<int64_t> layers, experts, experts_used, embd, expert_ff, shared_ff, heads, kv_heads, head_dim, vocab_size, ctx;
  std::optional<int64_t> mtp_layers;  // multi-token-prediction blocks after the layers (glm4moe, deepseek2)
  bool qk_norm = false;               // glm4moe: GLM-4.5's per-head q/k norm
  std::string type = "f16";         // dense weights
  std::string expert_type = "f16";  // expert weights in the GGUF
  uint64_t seed = 1;
  std::string vocab;       // GGUF to copy the tokenizer from
  bool pack_only = false;  // write a pack directly, no GGUF
  bool exact_quantize = false;  // with pack_only: quantize f32 weights (slow) instead of random codes
  double router_skew = 0;       // Zipf exponent of expert popularity (packtool/synth_router_skew.h); 0: none

  // synth --pack-only and convert
  std::string scheme = "auto";  // convert: from the source's expert types; synth --pack-only: s4
  int threads = 0;  // 0: all cores (or the server's default)

  // convert
  std::string dense_type = "keep";  // dense weight matrices: keep, f16, bf16 or q8_0
  std::string tokenizer_gguf;       // Hugging Face input: the tokenizer from this GGUF instead of tokenizer.json

  // validate
  bool quick = false;

  // profile
  std::string prompts;        // text file, one prompt a line
  int64_t tokens = 32;        // generated after each prompt
  bool chat = false;          // each prompt a user message through the model's chat template
};

struct CliIo {
  std::ostream* out = nullptr;
  std::ostream* err = nullptr;
  bool err_is_terminal = false;               // draw a progress bar rather than progress lines
  const std::atomic<bool>* cancel = nullptr;  // set by a signal handler: stop converting, clean up
};

// `args` are the positional arguments, subcommand first (flags already removed).
int RunPackCli(const std::vector<std::string>& args, const PackCliOptions& options, const CliIo& io);

// The file that defines strata-pack's flags, whose every flag --help lists.
inline constexpr absl::string_view kPackCliFlagFile = "strata_pack_main.cc";

// The --help text: commands, every flag with its default, exit codes (HelpText).
std::string PackCliUsage();

}  // namespace strata::services

#endif  // STRATA_SERVICES_PACK_CLI_H_
