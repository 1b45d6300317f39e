// strata: the command-line client of strata-server (see services/generate_client.h).


#include <cmath>
#include <cstdlib>
#include <cstdint>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "engine/log.h"
#include "engine/runtime/sampling_params.h"
#include "services/cli_flags.h"
#include "services/generate_client.h"
#include "services/pack_cli.h"
#include "services/tls_credentials.h"

ABSL_FLAG(std::string, server, "127.0.0.1:50051", "address of the strata-server, host:port");
ABSL_FLAG(double, timeout, 0, "deadline of the call in seconds; 0: none for generate, 60 s otherwise");
ABSL_FLAG(std::string, log_level, "warn", "debug, info, warn, error or off");
// Sampling defaults: the engine's one set (runtime::SamplingParams), the server's for unset fields too.
ABSL_FLAG(std::optional<int>, max_tokens, strata::runtime::SamplingParams().max_tokens, "tokens to generate at most");
ABSL_FLAG(std::optional<double>, temperature, strata::runtime::SamplingParams().temperature,
          "sampling temperature; 0 = greedy");
ABSL_FLAG(std::optional<int>, top_k, strata::runtime::SamplingParams().top_k, "keep the k most likely tokens (0 = off)");
ABSL_FLAG(std::optional<double>, top_p, strata::runtime::SamplingParams().top_p, "nucleus sampling threshold (1 = off)");
ABSL_FLAG(std::optional<double>, min_p, strata::runtime::SamplingParams().min_p,
          "drop tokens below min_p x the best one's probability (0 = off)");
ABSL_FLAG(std::optional<double>, repeat_penalty, strata::runtime::SamplingParams().repetition_penalty,
          "repetition penalty (1 = off)");
ABSL_FLAG(std::optional<double>, presence_penalty, strata::runtime::SamplingParams().presence_penalty,
          "presence penalty");
ABSL_FLAG(std::optional<double>, frequency_penalty, strata::runtime::SamplingParams().frequency_penalty,
          "frequency penalty");
ABSL_FLAG(std::optional<int>, penalty_last_n, strata::runtime::SamplingParams().penalty_last_n,
          "tokens the penalties look back over (-1 = all)");
ABSL_FLAG(std::optional<uint64_t>, seed, std::nullopt,
          "sampling seed; none: the server draws a random one, printed in the summary so that a result can be "
          "repeated");
ABSL_FLAG(std::vector<std::string>, stop, {}, "stop strings, comma-separated");
ABSL_FLAG(std::string, stop_token_ids, "", "stop token ids, comma-separated");
ABSL_FLAG(bool, ignore_eos, false, "keep generating past end-of-generation tokens");
ABSL_FLAG(std::optional<int>, logprobs, std::nullopt, "print each token's log-probability and N alternatives");
ABSL_FLAG(std::string, tokens, "", "generate: a prompt of comma-separated token ids instead of text");
ABSL_FLAG(bool, add_special, true, "add BOS/EOS to a text prompt as the vocabulary asks");
ABSL_FLAG(bool, parse_special, false, "recognise control tokens written in the text");
ABSL_FLAG(bool, render_special, false, "detokenize: write control tokens as their text");
ABSL_FLAG(bool, quiet, false, "generate, chat: print only the summary");
ABSL_FLAG(std::string, system, "", "chat: a system prompt, sent as the first message");
ABSL_FLAG(std::optional<bool>, thinking, std::nullopt,
          "chat: enable_thinking for templates that read it (Qwen3, DeepSeek-V3.1, GLM-4.6)");
ABSL_FLAG(bool, tls, false, "connect with TLS (implied by the other --tls-* flags)");
ABSL_FLAG(std::string, tls_ca, "", "TLS: the CA that signs the server's certificate (PEM); default: the system's roots");
ABSL_FLAG(std::string, tls_cert, "", "mutual TLS: this client's certificate (PEM), with --tls-key");
ABSL_FLAG(std::string, tls_key, "", "mutual TLS: this client's private key (PEM)");
ABSL_FLAG(std::string, tls_server_name, "", "TLS: the name the server's certificate must carry, if not the host dialled");
ABSL_FLAG(std::string, auth_token, "", "bearer token; default: the STRATA_AUTH_TOKEN environment variable");

int main(int argc, char** argv) {
  using strata::services::kExitUsage;
  absl::SetProgramUsageMessage("strata <generate|chat|tokenize|detokenize|info|stats> [arguments] [flags]");
  std::vector<std::string> args(argv, argv + argc);
  if (strata::services::WantsHelp(args)) {
    std::cout << strata::services::ClientUsage();
    return strata::services::kExitOk;
  }
  absl::StatusOr<std::vector<std::string>> parsed = strata::services::ParseFlags(std::move(args));
  if (!parsed.ok()) {
    std::cerr << "strata: error: " << parsed.status().message() << " (see strata --help)\n";
    return kExitUsage;
  }
  const std::vector<std::string>& positional = *parsed;
  if (absl::Status status = strata::services::CheckLogLevel(absl::GetFlag(FLAGS_log_level)); !status.ok()) {
    std::cerr << "strata: error: " << status.message() << " (see strata --help)\n";
    return kExitUsage;
  }
  strata::InitLogging(absl::GetFlag(FLAGS_log_level));

  strata::services::ClientOptions options;
  options.server = absl::GetFlag(FLAGS_server);
  options.timeout_seconds = absl::GetFlag(FLAGS_timeout);
  // A deadline is held in microseconds of int64; a year is far more than any call needs.
  if (!std::isfinite(options.timeout_seconds) || options.timeout_seconds < 0 || options.timeout_seconds > 3.2e7) {
    std::cerr << "strata: --timeout: " << options.timeout_seconds << " is not a number of seconds in 0 .. 3.2e7\n";
    return kExitUsage;
  }
  strata::v1::SamplingParams& s = options.sampling;
  if (auto v = absl::GetFlag(FLAGS_max_tokens)) s.set_max_tokens(*v);
  if (auto v = absl::GetFlag(FLAGS_temperature)) s.set_temperature(static_cast<float>(*v));
  if (auto v = absl::GetFlag(FLAGS_top_k)) s.set_top_k(*v);
  if (auto v = absl::GetFlag(FLAGS_top_p)) s.set_top_p(static_cast<float>(*v));
  if (auto v = absl::GetFlag(FLAGS_min_p)) s.set_min_p(static_cast<float>(*v));
  if (auto v = absl::GetFlag(FLAGS_repeat_penalty)) s.set_repetition_penalty(static_cast<float>(*v));
  if (auto v = absl::GetFlag(FLAGS_presence_penalty)) s.set_presence_penalty(static_cast<float>(*v));
  if (auto v = absl::GetFlag(FLAGS_frequency_penalty)) s.set_frequency_penalty(static_cast<float>(*v));
  if (auto v = absl::GetFlag(FLAGS_penalty_last_n)) s.set_penalty_last_n(*v);
  if (auto v = absl::GetFlag(FLAGS_seed)) s.set_seed(*v);
  for (const std::string& stop : absl::GetFlag(FLAGS_stop)) s.add_stop(stop);
  s.set_ignore_eos(absl::GetFlag(FLAGS_ignore_eos));
  if (auto v = absl::GetFlag(FLAGS_logprobs)) {
    s.set_logprobs(true);
    s.set_top_logprobs(*v);
  }
  options.stop_token_ids = absl::GetFlag(FLAGS_stop_token_ids);
  options.tokens = absl::GetFlag(FLAGS_tokens);
  options.add_special = absl::GetFlag(FLAGS_add_special);
  options.parse_special = absl::GetFlag(FLAGS_parse_special);
  options.render_special = absl::GetFlag(FLAGS_render_special);
  options.quiet = absl::GetFlag(FLAGS_quiet);
  options.system_prompt = absl::GetFlag(FLAGS_system);
  options.enable_thinking = absl::GetFlag(FLAGS_thinking);
  if (options.server.empty()) {
    std::cerr << "strata: error: --server is empty (see strata --help)\n";
    return kExitUsage;
  }

  options.auth_token = absl::GetFlag(FLAGS_auth_token);
  if (options.auth_token.empty()) {
    if (const char* env = std::getenv("STRATA_AUTH_TOKEN"); env != nullptr) options.auth_token = env;
  }
  const strata::services::ClientTlsOptions tls{.enabled = absl::GetFlag(FLAGS_tls),
                                               .ca = absl::GetFlag(FLAGS_tls_ca),
                                               .cert = absl::GetFlag(FLAGS_tls_cert),
                                               .key = absl::GetFlag(FLAGS_tls_key),
                                               .server_name = absl::GetFlag(FLAGS_tls_server_name)};
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = strata::services::MakeClientChannel(options.server, tls);
  if (!channel.ok()) {
    std::cerr << "strata: error: " << channel.status().message() << " (see strata --help)\n";
    return kExitUsage;
  }

  strata::services::ClientIo io;
  io.out = &std::cout;
  io.err = &std::cerr;
  io.in = &std::cin;
  io.cancel = strata::services::CancelOnSignal();
  return strata::services::RunClient(std::vector<std::string>(positional.begin() + 1, positional.end()), options,
                                     *channel, io);
}
