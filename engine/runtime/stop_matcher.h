#ifndef STRATA_ENGINE_RUNTIME_STOP_MATCHER_H_
#define STRATA_ENGINE_RUNTIME_STOP_MATCHER_H_

// Finds stop strings in streamed text and decides what of the text may be sent to the client.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace strata::runtime {

struct StopResult {
  std::string emit;      // text that can be sent now
  bool stopped = false;  // a stop string matched: generation ends, nothing more is emitted
};

// Consumes generated text piece by piece. A stop string is found wherever it lies, across any number of
// pieces, and neither it nor anything after it is emitted. Text that might still turn out to be the start
// of a stop string is held back until it cannot (then emitted) or the stream ends (Flush).
//
// The stream stops at the first byte that completes a stop string; if several complete at that byte,
// the longest (the earliest starting) is the match. So the result depends only on the concatenated text,
// never on how it was cut into pieces. Matching is on bytes; feed it text that is already cut at UTF-8
// boundaries, and since a stop string is valid UTF-8 whatever is emitted is too.
//
// One matcher per sequence; not thread-safe. Empty stop strings are ignored.
class StopMatcher {
 public:
  explicit StopMatcher(const std::vector<std::string>& stop_strings);

  // Adds the next piece of text. After a stop every further Push returns {"", true}.
  StopResult Push(std::string_view piece);

  // Ends the stream: returns the held-back text (nothing after a stop).
  std::string Flush();

  bool stopped() const { return stopped_; }
  // The stop string that matched; empty until one does.
  const std::string& matched() const { return matched_; }
  size_t held_bytes() const { return held_.size(); }

 private:
  // A Knuth-Morris-Pratt automaton for one stop string; `state` is the length of the longest prefix of
  // `text` that ends the stream so far.
  struct Pattern {
    std::string text;
    std::vector<uint32_t> failure;  // failure[i]: longest proper border of text[0, i]
    uint32_t state = 0;
  };

  std::vector<Pattern> patterns_;
  std::string held_;  // unemitted text: always at least the longest live prefix of a stop string
  bool stopped_ = false;
  std::string matched_;
};

}  // namespace strata::runtime

#endif  // STRATA_ENGINE_RUNTIME_STOP_MATCHER_H_
