// strata-pack: synthesizes, converts, validates, inspects and profiles packs (see services/pack_cli.h).

#include <unistd.h>

#include <cstdint>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "engine/log.h"
#include "services/cli_flags.h"
#include "services/pack_cli.h"

ABSL_FLAG(std::string, server, "", "address of a strata-packd to run convert/validate/inspect on");
ABSL_FLAG(std::string, log_level, "warn", "debug, info, warn, error or off");
ABSL_FLAG(std::string, arch, "qwen3moe", "synth: architecture (qwen3moe, mixtral, qwen2moe, olmoe, glm4moe, gpt-oss or deepseek2)");
ABSL_FLAG(std::string, preset, "tiny", "synth: geometry preset (tiny, small or seed)");
ABSL_FLAG(std::string, out, "", "synth: the GGUF file (or pack directory with --pack-only) to write");
ABSL_FLAG(std::optional<int64_t>, layers, std::nullopt, "synth: transformer blocks");
ABSL_FLAG(std::optional<int64_t>, experts, std::nullopt, "synth: routed experts per layer");
ABSL_FLAG(std::optional<int64_t>, experts_used, std::nullopt, "synth: experts used per token");
ABSL_FLAG(std::optional<int64_t>, embd, std::nullopt, "synth: embedding width");
ABSL_FLAG(std::optional<int64_t>, expert_ff, std::nullopt, "synth: hidden width of one expert");
ABSL_FLAG(std::optional<int64_t>, shared_ff, std::nullopt, "synth: hidden width of the shared expert (qwen2moe)");
ABSL_FLAG(std::optional<int64_t>, heads, std::nullopt, "synth: attention heads");
ABSL_FLAG(std::optional<int64_t>, kv_heads, std::nullopt, "synth: key/value heads");
ABSL_FLAG(std::optional<int64_t>, head_dim, std::nullopt, "synth: width of one head");
ABSL_FLAG(std::optional<int64_t>, vocab_size, std::nullopt, "synth: vocabulary size");
ABSL_FLAG(std::optional<int64_t>, ctx, std::nullopt, "synth: context length");
ABSL_FLAG(std::optional<int64_t>, mtp_layers, std::nullopt,
          "synth (glm4moe, deepseek2; GGUF only): multi-token-prediction blocks after the layers, as GLM-4.5's "
          "GGUFs carry (nextn_predict_layers); default 0");
ABSL_FLAG(bool, qk_norm, false, "synth (glm4moe): GLM-4.5's per-head q/k RMSNorm, which GLM-4.5-Air has not");
ABSL_FLAG(std::string, type, "f16", "synth: type of the dense weights");
ABSL_FLAG(std::string, expert_type, "f16", "synth: type of the expert weights in the GGUF");
ABSL_FLAG(uint64_t, seed, 1, "synth: random seed");
ABSL_FLAG(std::string, vocab, "", "synth: GGUF file to copy the tokenizer from");
ABSL_FLAG(bool, pack_only, false, "synth: write a pack directly instead of a GGUF");
ABSL_FLAG(std::string, scheme, "auto",
          "convert, synth --pack-only: expert scheme (auto, f16, s8, s4, s2 or mxfp4); auto: the one the source's expert "
          "types call for (synth: s4)");
ABSL_FLAG(int, threads, 0, "worker threads; 0: all cores (or the server's default)");
ABSL_FLAG(std::string, dense_type, "keep", "convert: type of the dense weight matrices (keep, f16, bf16 or q8_0)");
ABSL_FLAG(std::string, tokenizer_gguf, "",
          "convert of a Hugging Face directory: take the tokenizer from this GGUF instead of tokenizer.json");
ABSL_FLAG(bool, quick, false, "validate: skip the per-expert checksums");
ABSL_FLAG(std::string, prompts, "", "profile: text file of prompts, one a line");
ABSL_FLAG(int64_t, tokens, 32, "profile: tokens generated (greedily) after each prompt and profiled too");
ABSL_FLAG(bool, chat, false, "profile: run each prompt as a user message through the model's chat template");
ABSL_FLAG(bool, exact_quantize, false,
          "synth --pack-only: make f32 weights and quantize them (slow; reports the quantization error) instead "
          "of writing random codes and scales directly");

ABSL_FLAG(double, router_skew, 0,
          "synth: make expert popularity follow a Zipf law with this exponent over a seeded order of each layer's "
          "experts (qwen3moe, mixtral, qwen2moe, olmoe, glm4moe); 0: uniform. Hottest expert over the mean, top-10 of 512 "
          "(seed preset): 0.18 -> 2.5x, 0.32 -> 5x, 0.42 -> 8x");

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("strata-pack <synth|convert|validate|inspect|profile> [arguments] [flags]");
  std::vector<std::string> args(argv, argv + argc);
  if (strata::services::WantsHelp(args)) {
    std::cout << strata::services::PackCliUsage();
    return strata::services::kExitOk;
  }
  absl::StatusOr<std::vector<std::string>> parsed = strata::services::ParseFlags(std::move(args));
  if (!parsed.ok()) {
    std::cerr << "strata-pack: error: " << parsed.status().message() << " (see strata-pack --help)\n";
    return strata::services::kExitUsage;
  }
  const std::vector<std::string>& positional = *parsed;
  if (absl::Status status = strata::services::CheckLogLevel(absl::GetFlag(FLAGS_log_level)); !status.ok()) {
    std::cerr << "strata-pack: error: " << status.message() << " (see strata-pack --help)\n";
    return strata::services::kExitUsage;
  }
  strata::InitLogging(absl::GetFlag(FLAGS_log_level));

  strata::services::PackCliOptions options;
  options.server = absl::GetFlag(FLAGS_server);
  options.arch = absl::GetFlag(FLAGS_arch);
  options.preset = absl::GetFlag(FLAGS_preset);
  options.out = absl::GetFlag(FLAGS_out);
  options.layers = absl::GetFlag(FLAGS_layers);
  options.experts = absl::GetFlag(FLAGS_experts);
  options.experts_used = absl::GetFlag(FLAGS_experts_used);
  options.embd = absl::GetFlag(FLAGS_embd);
  options.expert_ff = absl::GetFlag(FLAGS_expert_ff);
  options.shared_ff = absl::GetFlag(FLAGS_shared_ff);
  options.heads = absl::GetFlag(FLAGS_heads);
  options.kv_heads = absl::GetFlag(FLAGS_kv_heads);
  options.head_dim = absl::GetFlag(FLAGS_head_dim);
  options.vocab_size = absl::GetFlag(FLAGS_vocab_size);
  options.ctx = absl::GetFlag(FLAGS_ctx);
  options.mtp_layers = absl::GetFlag(FLAGS_mtp_layers);
  options.qk_norm = absl::GetFlag(FLAGS_qk_norm);
  options.type = absl::GetFlag(FLAGS_type);
  options.expert_type = absl::GetFlag(FLAGS_expert_type);
  options.seed = absl::GetFlag(FLAGS_seed);
  options.vocab = absl::GetFlag(FLAGS_vocab);
  options.pack_only = absl::GetFlag(FLAGS_pack_only);
  options.scheme = absl::GetFlag(FLAGS_scheme);
  options.threads = absl::GetFlag(FLAGS_threads);
  options.dense_type = absl::GetFlag(FLAGS_dense_type);
  options.tokenizer_gguf = absl::GetFlag(FLAGS_tokenizer_gguf);
  options.quick = absl::GetFlag(FLAGS_quick);
  options.exact_quantize = absl::GetFlag(FLAGS_exact_quantize);
  options.router_skew = absl::GetFlag(FLAGS_router_skew);
  options.prompts = absl::GetFlag(FLAGS_prompts);
  options.tokens = absl::GetFlag(FLAGS_tokens);
  options.chat = absl::GetFlag(FLAGS_chat);

  strata::services::CliIo io;
  io.out = &std::cout;
  io.err = &std::cerr;
  io.err_is_terminal = isatty(STDERR_FILENO) == 1;
  io.cancel = strata::services::CancelOnSignal();
  return strata::services::RunPackCli(std::vector<std::string>(positional.begin() + 1, positional.end()), options, io);
}
