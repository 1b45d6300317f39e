#ifndef STRATA_SERVICES_GENERATE_CLIENT_H_
#define STRATA_SERVICES_GENERATE_CLIENT_H_

// The `strata` command line, a client of strata-server (strata.v1.Inference):
//
//   strata generate [--server ADDR] [sampling flags] "prompt"   text as it streams, then speed and hit rate
//   strata chat [flags] "message" ["reply" "message" ...]       the reply through the model's chat template
//   strata chat [flags]                                         a conversation, one user line at a time
//   strata tokenize "text" | detokenize 1,2,3 | info | stats
//
// main() parses the flags into ClientOptions and calls RunClient with a channel to the server; tests pass
// an in-process channel. Results go to `out`; the generation summary, progress and errors go to `err` (an
// error is one line, "strata: error: ..."). Exit codes as strata-pack's: 0 ok, 1 failure (refused or
// failed request, server unreachable), 2 usage. One thread calls RunClient.

#include <atomic>
#include <istream>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "grpcpp/channel.h"
#include "strata/v1/inference.pb.h"

namespace strata::services {

struct ClientOptions {
  std::string server = "127.0.0.1:50051";  // for messages; the channel is made by the caller
  double timeout_seconds = 0;              // deadline of each call; 0: none for generate, 60 s otherwise
  std::string auth_token;                  // sent as "authorization: Bearer <token>" on each call; empty: none

  // generate
  v1::SamplingParams sampling;  // unset optional fields take the server's defaults
  std::string tokens;           // "1,2,3": a prompt of token ids instead of text
  std::string stop_token_ids;   // "1,2"; added to sampling.stop_token_ids
  bool add_special = true;
  bool parse_special = false;
  bool quiet = false;  // print only the summary

  // chat (sampling and quiet as generate)
  std::string system_prompt;             // when set, a system message first
  std::optional<bool> enable_thinking;  // for templates that read it; unset: the template's default

  // tokenize / detokenize
  bool render_special = false;
};

struct ClientIo {
  std::ostream* out = nullptr;
  std::ostream* err = nullptr;
  std::istream* in = nullptr;  // chat without message arguments reads the user's lines from it
  const std::atomic<bool>* cancel = nullptr;  // set (by a signal handler): cancel the running call
};

// `args` are the positional arguments, subcommand first (flags already removed).
int RunClient(const std::vector<std::string>& args, const ClientOptions& options,
              const std::shared_ptr<grpc::Channel>& channel, const ClientIo& io);

// The file that defines strata's flags, whose every flag --help lists.
inline constexpr absl::string_view kClientFlagFile = "strata_main.cc";

// The --help text: commands, every flag with its default, exit codes (HelpText).
std::string ClientUsage();

}  // namespace strata::services

#endif  // STRATA_SERVICES_GENERATE_CLIENT_H_
