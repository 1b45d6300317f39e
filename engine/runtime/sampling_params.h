#ifndef STRATA_ENGINE_RUNTIME_SAMPLING_PARAMS_H_
#define STRATA_ENGINE_RUNTIME_SAMPLING_PARAMS_H_

// What a request asks of token selection and of when generation ends, and why a sequence ended.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"

namespace strata::runtime {

// Why a sequence stopped generating. Shared by the engine and the services.
enum class FinishReason {
  kNone,       // still running
  kStop,       // a stop string or stop token id matched
  kLength,     // max_tokens reached, or the context is full
  kEos,        // the model produced an end-of-generation token
  kCancelled,  // the client went away or cancelled
  kError,      // the request failed; see its status
};

// "none", "stop", "length", "eos", "cancelled", "error".
std::string_view FinishReasonName(FinishReason reason);

inline constexpr int kMaxTopLogprobs = 20;
inline constexpr int kMaxStopStrings = 16;
inline constexpr int kMaxStopStringBytes = 512;
inline constexpr int kMaxStopTokenIds = 64;

// The one set of sampling defaults: strata-run's flags, the client's flags and the server's fallbacks for
// unset request fields all take them from here (SamplingParams()). They select plain sampling from the
// model's distribution (temperature 1, no filters, no penalties), as OpenAI's API and vLLM do. Each "off"
// value below makes its stage a no-op.
struct SamplingParams {
  float temperature = 1.0f;  // 0 selects greedy decoding (argmax after penalties)
  int32_t top_k = 0;         // keep the k most likely tokens; 0 = off
  float top_p = 1.0f;        // keep the smallest set whose probability reaches p; 1 = off
  float min_p = 0.0f;        // drop tokens below min_p * (probability of the best token); 0 = off

  // Penalties over the last `penalty_last_n` accepted tokens (prompt included); -1 = whole context,
  // 0 = none. repetition_penalty (CTRL / llama.cpp): a seen token's logit l becomes l / r when l > 0,
  // else l * r; 1 = off. Then (OpenAI): l -= presence_penalty * (count > 0) + frequency_penalty * count.
  float repetition_penalty = 1.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  int32_t penalty_last_n = 64;

  // The same seed with the same logits gives the same tokens; 0 is a seed like any other. Unset: the engine
  // draws a random one at submission and reports it in Usage::seed, so the result can be reproduced.
  std::optional<uint64_t> seed;

  int32_t max_tokens = 256;                 // generated tokens at most; >= 1
  std::vector<std::string> stop;            // stop strings; matched text is not returned
  std::vector<int32_t> stop_token_ids;      // generation ends after any of these (not returned as text)
  bool ignore_eos = false;                  // keep generating past end-of-generation tokens
  bool logprobs = false;                    // return the chosen token's log-probability
  int32_t top_logprobs = 0;                 // and this many alternatives (0..20); needs logprobs
};

// OK, or INVALID_ARGUMENT naming the first offending field and the value it had. `n_vocab` is the size
// of the model's vocabulary (stop_token_ids must lie in [0, n_vocab)).
absl::Status ValidateSamplingParams(const SamplingParams& params, int n_vocab);

}  // namespace strata::runtime

#endif  // STRATA_ENGINE_RUNTIME_SAMPLING_PARAMS_H_
