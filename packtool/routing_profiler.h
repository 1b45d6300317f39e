#ifndef STRATA_PACKTOOL_ROUTING_PROFILER_H_
#define STRATA_PACKTOOL_ROUTING_PROFILER_H_

// Makes a pack's routing profile (engine/pack/routing_profile.h): runs prompts through the pack's model on
// the CPU, each prompt then `decode_tokens` tokens generated greedily (the most likely token each step), and
// counts the router's picks per (MoE layer, expert) over every token run through the model. One prompt at a
// time, the model's batch being the prompt (in chunks) and then one token a step. ProfilePack is called by
// one thread; it runs the model on its own pool of `threads` threads.

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/pack/routing_profile.h"

namespace strata::packtool {

struct ProfileOptions {
  std::string pack_dir;
  std::string prompts_path;     // text, one prompt a line (see ReadPrompts)
  // Instead of prompts_path: the prompts as token ids, run as they are (nothing added, no chat), for a
  // benchmark to profile the very tokens it runs. Exactly one of prompts_path and prompt_tokens is given.
  std::vector<std::vector<int32_t>> prompt_tokens;
  int64_t decode_tokens = 32;   // generated after each prompt, and counted (0: the prompts only)
  bool chat = false;            // each prompt is a user message, rendered by the model's chat template
  int threads = 0;              // compute threads; 0 = one per core this process may use
  const std::atomic<bool>* cancel = nullptr;  // when it turns true (any thread), ProfilePack stops: CANCELLED
};

// Most tokens a prompt may be followed by (--tokens).
inline constexpr int64_t kMaxDecodeTokens = 1 << 20;

// The one options check: INVALID_ARGUMENT naming the field (pack_dir, prompts_path or prompt_tokens,
// decode_tokens, threads, chat).
absl::Status CheckProfileOptions(const ProfileOptions& options);

// The prompts of `path`: one a line ("\n" or "\r\n"); lines of only white space are skipped. NOT_FOUND
// naming the file when it cannot be read, INVALID_ARGUMENT naming it when it holds no prompt.
struct Prompt {
  int64_t line = 0;  // 1-based, for messages
  std::string text;
};
absl::StatusOr<std::vector<Prompt>> ReadPrompts(const std::string& path);

struct ProfileProgress {
  uint64_t prompts_done = 0;
  uint64_t prompts = 0;
  uint64_t tokens = 0;  // run through the model so far
  double seconds = 0;   // since the model was loaded
};

struct ProfileResult {
  pack::RoutingProfile profile;
  double load_seconds = 0;  // opening the pack and loading the model
  double seconds = 0;       // running the prompts
};

// Checks the options, reads the prompts, runs them and writes the profile into the pack
// (pack::WriteRoutingProfile: atomically, replacing any earlier profile, even a malformed one). `progress`
// (may be empty) is called on the calling thread after each step of the model. Errors: the options'
// (INVALID_ARGUMENT), the prompts file's, the pack's, INVALID_ARGUMENT naming the file and line of a prompt
// (prompt_tokens[i] for token prompts) longer than the model's context (or with no token, or a token id
// outside the vocabulary) or that the chat template refuses,
// FAILED_PRECONDITION for `chat` with a model without a chat template, CANCELLED (the pack is left as it
// was).
absl::StatusOr<ProfileResult> ProfilePack(const ProfileOptions& options,
                                          const std::function<void(const ProfileProgress&)>& progress);

// How uneven a profile's routing is, for people: over every (layer, expert), the ratio of the most picked
// expert's count to its layer's mean count, and how many experts were never picked.
struct ProfileSkew {
  double hottest_over_mean = 0;  // the largest count / its layer's mean count (1 for uniform routing)
  uint32_t hottest_layer = 0, hottest_expert = 0;
  uint64_t never_picked = 0;
};
ProfileSkew MeasureSkew(const pack::RoutingProfile& profile);

}  // namespace strata::packtool

#endif  // STRATA_PACKTOOL_ROUTING_PROFILER_H_
