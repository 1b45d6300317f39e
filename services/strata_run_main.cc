// strata-run: generate from a pack on this machine, without a server.
//
//   strata-run --pack DIR [sampling flags] "prompt"
//   strata-run --pack DIR --tokens 1,2,3 [--dump-logits FILE] [--kl-against DIR]
//   strata-run --tokenize (--pack DIR | --gguf FILE) "text"

#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_join.h"
#include "engine/log.h"
#include "engine/model/expert_cache_policy.h"
#include "engine/model/miss_path.h"
#include "engine/runtime/model_factory.h"
#include "services/cli_flags.h"
#include "services/run_cli.h"
#include "services/sampling_flags.h"

ABSL_FLAG(std::string, pack, "", "pack directory");
ABSL_FLAG(std::string, gguf, "", "GGUF file (with --tokenize)");
ABSL_FLAG(std::string, tokens, "", "comma-separated token ids instead of a text prompt");
ABSL_FLAG(bool, tokenize, false, "only print the token ids of the text");
ABSL_FLAG(bool, add_special, true, "add BOS/EOS to a text prompt as the vocabulary asks");
ABSL_FLAG(bool, parse_special, false, "recognise control tokens written in the prompt text");
ABSL_FLAG(std::string, dump_logits, "", "write float32 logits [n_prompt][n_vocab] of every prompt position");
ABSL_FLAG(std::string, kl_against, "", "second pack: report KL divergence and top-1 agreement on the prompt");
ABSL_FLAG(bool, quiet, false, "do not print the generated text");
ABSL_FLAG(int, threads, 0, "compute threads (0 = all cores)");
ABSL_FLAG(int64_t, ctx, 0, "context positions per sequence (0 = the model's, at most 8192)");
ABSL_FLAG(std::string, expert_source, "arena", "where experts are read from: arena or mmap");
ABSL_FLAG(bool, verify, false, "check every expert blob's checksum");
ABSL_FLAG(std::string, device, "auto", "where the model runs: auto (cuda when a CUDA device is present), cpu or cuda");
ABSL_FLAG(double, vram_gib, 0, "device memory the model may use, GiB; 0: what is free less a margin");
ABSL_FLAG(int64_t, vram_experts, -1,
          "experts kept in VRAM; -1: all of them when they fit, else as many as fit (the rest are read from the "
          "page-locked arena over PCIe)");
ABSL_FLAG(std::string, cache_policy, "lfu-decay", "VRAM expert cache policy: lru, lfu-decay or static");
ABSL_FLAG(std::string, miss_path, "both",
          "where experts not in VRAM are computed: gpu (read over PCIe), cpu (host threads) or both at once");
ABSL_FLAG(int, prefetch_experts, strata::runtime::DeviceOptions().prefetch_experts,
          "decode: experts not in VRAM copied ahead per layer, from a guess of its routing made one layer early "
          "(0 = none; copies stop while the guesses are mostly wrong)");
ABSL_FLAG(std::string, prompt_math, strata::runtime::DeviceOptions().prompt_math,
          "CUDA prompt steps' F16/BF16 dense products: fp32 (cuBLAS SGEMM, the CPU's numbers) or split-tf32 (TF32 "
          "tensor cores, about 11-16% faster prefill on an H200, logits a little further from the CPU's)");
ABSL_FLAG(bool, pin_arena, true, "page-lock the expert arena for the GPU (--nopin-arena: as if locking were refused)");
// Sampling defaults: the engine's one set (runtime::SamplingParams), as the server and strata use.
ABSL_FLAG(int, max_tokens, strata::runtime::SamplingParams().max_tokens, "tokens to generate at most");
ABSL_FLAG(double, temperature, strata::runtime::SamplingParams().temperature, "sampling temperature; 0 = greedy");
ABSL_FLAG(int, top_k, strata::runtime::SamplingParams().top_k, "keep the k most likely tokens (0 = off)");
ABSL_FLAG(double, top_p, strata::runtime::SamplingParams().top_p, "nucleus sampling threshold (1 = off)");
ABSL_FLAG(double, min_p, strata::runtime::SamplingParams().min_p,
          "drop tokens below min_p x the best token's probability (0 = off)");
ABSL_FLAG(double, repeat_penalty, strata::runtime::SamplingParams().repetition_penalty, "repetition penalty (1 = off)");
ABSL_FLAG(double, presence_penalty, strata::runtime::SamplingParams().presence_penalty, "presence penalty");
ABSL_FLAG(double, frequency_penalty, strata::runtime::SamplingParams().frequency_penalty, "frequency penalty");
ABSL_FLAG(int, penalty_last_n, strata::runtime::SamplingParams().penalty_last_n, "tokens the penalties look back over (-1 = all)");
ABSL_FLAG(std::optional<uint64_t>, seed, std::nullopt,
          "sampling seed; none: a random one, printed with the results so that a run can be repeated");
ABSL_FLAG(std::vector<std::string>, stop, {}, "stop strings, comma-separated");
ABSL_FLAG(std::string, stop_token_ids, "", "stop token ids, comma-separated");
ABSL_FLAG(bool, ignore_eos, false, "keep generating past end-of-generation tokens");
ABSL_FLAG(std::string, log_level, "warn", "log level: debug, info, warn, error, off");

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("strata-run --pack DIR [flags] \"prompt\"");
  std::vector<std::string> args(argv, argv + argc);
  if (strata::services::WantsHelp(args)) {
    std::cout << strata::services::HelpText(
        "usage: strata-run --pack DIR [flags] \"prompt\"        generate from a pack on this machine\n"
        "       strata-run --pack DIR --tokens 1,2,3 [--dump-logits FILE] [--kl-against DIR]\n"
        "       strata-run --tokenize (--pack DIR | --gguf FILE) \"text\"\n"
        "Every path flag is checked before the pack is loaded.\n",
        {"strata_run_main.cc"});
    return 0;
  }
  absl::StatusOr<std::vector<std::string>> parsed = strata::services::ParseFlags(std::move(args));
  if (!parsed.ok()) {
    std::cerr << "strata-run: error: " << parsed.status().message() << " (see strata-run --help)\n";
    return 2;
  }
  const std::vector<std::string>& positional = *parsed;
  if (absl::Status status = strata::services::CheckLogLevel(absl::GetFlag(FLAGS_log_level)); !status.ok()) {
    std::cerr << "strata-run: error: " << status.message() << "\n";
    return 2;
  }
  strata::InitLogging(absl::GetFlag(FLAGS_log_level));
  strata::services::RunOptions o;
  o.pack_dir = absl::GetFlag(FLAGS_pack);
  o.gguf_path = absl::GetFlag(FLAGS_gguf);
  if (positional.size() > 2) {
    std::cerr << "strata-run: one prompt expected, got " << positional.size() - 1 << " arguments (quote it)\n";
    return 2;
  }
  if (positional.size() == 2) o.prompt = positional[1];
  if (const std::string t = absl::GetFlag(FLAGS_tokens); !t.empty() && !strata::services::ParseTokenList(t, &o.tokens)) {
    std::cerr << "strata-run: --tokens: expected comma-separated integers, got '" << t << "'\n";
    return 2;
  }
  if (!o.prompt.empty() && !o.tokens.empty()) {
    std::cerr << "strata-run: give a prompt or --tokens, not both\n";
    return 2;
  }
  o.tokenize_only = absl::GetFlag(FLAGS_tokenize);
  o.add_special = absl::GetFlag(FLAGS_add_special);
  o.parse_special = absl::GetFlag(FLAGS_parse_special);
  o.dump_logits_path = absl::GetFlag(FLAGS_dump_logits);
  o.kl_against_dir = absl::GetFlag(FLAGS_kl_against);
  o.quiet = absl::GetFlag(FLAGS_quiet);
  o.engine.threads = absl::GetFlag(FLAGS_threads);
  o.engine.max_ctx = absl::GetFlag(FLAGS_ctx);
  o.engine.max_seqs = 1;
  o.engine.experts.kind = absl::GetFlag(FLAGS_expert_source);
  o.engine.experts.verify = absl::GetFlag(FLAGS_verify);
  o.engine.device.device = absl::GetFlag(FLAGS_device);
  o.engine.device.vram_gib = absl::GetFlag(FLAGS_vram_gib);
  o.engine.device.vram_experts = absl::GetFlag(FLAGS_vram_experts);
  o.engine.device.cache_policy = absl::GetFlag(FLAGS_cache_policy);
  o.engine.device.miss_path = absl::GetFlag(FLAGS_miss_path);
  o.engine.device.pin_arena = absl::GetFlag(FLAGS_pin_arena);
  o.engine.device.prefetch_experts = absl::GetFlag(FLAGS_prefetch_experts);
  o.engine.device.prompt_math = absl::GetFlag(FLAGS_prompt_math);
  if (o.engine.device.device != "auto" && o.engine.device.device != "cpu" && o.engine.device.device != "cuda") {
    std::cerr << "strata-run: --device: '" << o.engine.device.device << "' is not auto, cpu or cuda\n";
    return 2;
  }
  if (!(o.engine.device.vram_gib >= 0)) {
    std::cerr << "strata-run: --vram-gib: must be a number >= 0\n";
    return 2;
  }
  if (o.engine.device.vram_experts < -1) {
    std::cerr << "strata-run: --vram-experts: must be -1 (auto) or a count\n";
    return 2;
  }
  if (absl::StatusOr<strata::runtime::PromptMath> m = strata::runtime::ParsePromptMath(o.engine.device.prompt_math);
      !m.ok()) {
    std::cerr << "strata-run: --prompt-math: " << m.status().message() << "\n";
    return 2;
  }
  if (o.engine.device.prefetch_experts < 0 || o.engine.device.prefetch_experts > strata::runtime::kMaxPrefetchExperts) {
    std::cerr << "strata-run: --prefetch-experts: must be a count from 0 to " << strata::runtime::kMaxPrefetchExperts
              << "\n";
    return 2;
  }
  if (absl::StatusOr<strata::model::CachePolicy> p = strata::model::ParseCachePolicy(o.engine.device.cache_policy);
      !p.ok()) {
    std::cerr << "strata-run: --cache-policy: " << p.status().message() << "\n";
    return 2;
  }
  if (absl::StatusOr<strata::model::MissPath> p = strata::model::ParseMissPath(o.engine.device.miss_path); !p.ok()) {
    std::cerr << "strata-run: --miss-path: " << p.status().message() << "\n";
    return 2;
  }
  strata::runtime::SamplingParams& s = o.sampling;
  s.max_tokens = absl::GetFlag(FLAGS_max_tokens);
  s.temperature = static_cast<float>(absl::GetFlag(FLAGS_temperature));
  s.top_k = absl::GetFlag(FLAGS_top_k);
  s.top_p = static_cast<float>(absl::GetFlag(FLAGS_top_p));
  s.min_p = static_cast<float>(absl::GetFlag(FLAGS_min_p));
  s.repetition_penalty = static_cast<float>(absl::GetFlag(FLAGS_repeat_penalty));
  s.presence_penalty = static_cast<float>(absl::GetFlag(FLAGS_presence_penalty));
  s.frequency_penalty = static_cast<float>(absl::GetFlag(FLAGS_frequency_penalty));
  s.penalty_last_n = absl::GetFlag(FLAGS_penalty_last_n);
  s.seed = absl::GetFlag(FLAGS_seed);
  s.stop = absl::GetFlag(FLAGS_stop);
  if (const std::string ids = absl::GetFlag(FLAGS_stop_token_ids);
      !ids.empty() && !strata::services::ParseTokenList(ids, &s.stop_token_ids)) {
    std::cerr << "strata-run: --stop-token-ids: expected comma-separated integers, got '" << ids << "'\n";
    return 2;
  }
  s.ignore_eos = absl::GetFlag(FLAGS_ignore_eos);
  if (absl::Status status = strata::services::CheckSamplingFlags(s); !status.ok()) {
    std::cerr << "strata-run: error: " << status.message() << " (see strata-run --help)\n";
    return 2;
  }
  return strata::services::RunCommand(o, std::cout, std::cerr);
}
