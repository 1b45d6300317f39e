#ifndef STRATA_SERVICES_GENERATE_CLIENT_H_
#define STRATA_SERVICES_GENERATE_CLIENT_H_

// The `strata` command line, a client of strata-server (strata.v1.Inference):
//
//   strata generate [--server ADDR] [sampling flags] "prompt"   text as it streams, then speed and hit rate
//   strata tokenize "text" | detokenize 1,2,3 | info | stats
//
// main() parses the flags into ClientOptions and calls RunClient with a channel to the server; tests pass
// an in-process channel. Results go to `out`; the generation summary, progress and errors go to `err` (an
// error is one line, "strata: error: ..."). Exit codes as strata-pack's: 0 ok, 1 failure (refused or
// failed request, server unreachable), 2 usage. One thread calls RunClient.

#include <atomic>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

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

  // tokenize / detokenize
  bool render_special = false;
};

struct ClientIo {
  std::ostream* out = nullptr;
  std::ostream* err = nullptr;
  const std::atomic<bool>* cancel = nullptr;  // set (by a signal handler): cancel the running call
};

// `args` are the positional arguments, subcommand first (flags already removed).
int RunClient(const std::vector<std::string>& args, const ClientOptions& options,
              const std::shared_ptr<grpc::Channel>& channel, const ClientIo& io);

// Usage text for --help.
std::string ClientUsage();

}  // namespace strata::services

#endif  // STRATA_SERVICES_GENERATE_CLIENT_H_
