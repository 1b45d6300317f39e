#ifndef STRATA_ENGINE_RUNTIME_REQUEST_H_
#define STRATA_ENGINE_RUNTIME_REQUEST_H_

// What a client asks the engine for and what it gets back, independent of any transport.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/chat/chat_template.h"
#include "engine/runtime/sampler.h"
#include "engine/runtime/sampling_params.h"

namespace strata::runtime {

struct GenerateRequest {
  std::string prompt;                  // text; used when prompt_tokens is empty
  std::vector<int32_t> prompt_tokens;  // token ids, taken as they are
  bool add_special = true;             // text prompts: add BOS/EOS as the vocabulary asks
  bool parse_special = false;          // text prompts: recognise control tokens written in the text
  SamplingParams sampling;
  bool prompt_logits = false;          // also return the logits of every prompt position
};

// A conversation to continue: Engine::PrepareChat renders it with the model's chat template into a
// GenerateRequest (special tokens in the rendered text parsed as special).
struct ChatRequest {
  std::vector<chat::ChatMessage> messages;
  std::string system_prompt;  // when non-empty, a system message put before `messages`
  chat::ChatOptions options;
  SamplingParams sampling;
};

// A piece of a streamed generation: the tokens sampled in one step and the text they complete.
struct TokenEvent {
  std::vector<int32_t> tokens;
  std::string text;                  // UTF-8 safe; stop strings and anything after them are withheld
  std::vector<SampleResult> logprobs;  // one per token when requested
};

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  double queue_seconds = 0;         // from submission to the start of prompt processing
  double time_to_first_token = 0;   // seconds from submission to the first sampled token
  double prefill_tokens_per_second = 0;
  double decode_tokens_per_second = 0;  // completion tokens after the first, over the time they took
  uint64_t expert_bytes = 0;        // expert weight bytes read on this sequence's behalf (its share of each step)
  uint64_t dense_bytes = 0;
  double expert_hit_rate = 0;       // fraction of routed experts served from the GPU cache (0 without one)
  uint64_t seed = 0;                // the sampling seed used (given or drawn): pass it back to reproduce
};

struct GenerationResult {
  FinishReason reason = FinishReason::kNone;
  absl::Status status;  // non-OK exactly when reason == kError
  Usage usage;
  std::vector<int32_t> tokens;  // every generated token id
  std::vector<float> prompt_logits;  // [prompt_tokens][n_vocab] when asked for
};

// Called on one of the engine's compute threads while it is between parallel jobs (or on the scheduler
// thread when the engine runs single-threaded). A request's calls come one at a time, in the order the
// scheduler produced them: its on_tokens calls, then its on_done; calls of different requests may run at
// the same time on different threads. They must not block for long (a blocked callback keeps a compute
// thread out of the decode) and must not call back into the engine except RequestHandle::Cancel.
struct GenerateCallbacks {
  std::function<void(const TokenEvent&)> on_tokens;     // may be empty
  std::function<void(const GenerationResult&)> on_done;  // called exactly once
  // After each step that ran some of the prompt: prompt tokens processed so far and the prompt's length
  // (the last call, before the first on_tokens, has done == total). May be empty.
  std::function<void(int64_t done, int64_t total)> on_prompt_progress;
};

}  // namespace strata::runtime

#endif  // STRATA_ENGINE_RUNTIME_REQUEST_H_
