#ifndef STRATA_SERVICES_RUN_CLI_H_
#define STRATA_SERVICES_RUN_CLI_H_

// strata-run: runs a pack on this machine (no server) and reports speed; also tokenizes, dumps logits and
// compares two packs by KL divergence. The flags are parsed in strata_run_main.cc into RunOptions.

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "engine/runtime/engine.h"

namespace strata::services {

struct RunOptions {
  std::string pack_dir;
  std::string gguf_path;             // --gguf, for --tokenize without a pack
  std::string prompt;                // positional text
  std::vector<int32_t> tokens;       // --tokens, instead of text
  bool tokenize_only = false;
  bool add_special = true;
  bool parse_special = false;
  std::string dump_logits_path;
  std::string kl_against_dir;
  bool quiet = false;                // no streamed text (benchmarks)
  runtime::SamplingParams sampling;
  runtime::EngineOptions engine;     // pack_dir is filled from pack_dir
};

// Returns the process exit code: 0 ok, 1 failure, 2 usage. Text goes to `out`, reports and errors to `err`.
int RunCommand(const RunOptions& options, std::ostream& out, std::ostream& err);

// Parses "1,2,3" into ids; false on anything else.
bool ParseTokenList(const std::string& text, std::vector<int32_t>* ids);

// KL(p || q) of the softmaxes of two logit rows, in nats.
double KlDivergence(const float* p_logits, const float* q_logits, int64_t n);

}  // namespace strata::services

#endif  // STRATA_SERVICES_RUN_CLI_H_
