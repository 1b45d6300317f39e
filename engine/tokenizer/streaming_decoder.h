#ifndef STRATA_ENGINE_TOKENIZER_STREAMING_DECODER_H_
#define STRATA_ENGINE_TOKENIZER_STREAMING_DECODER_H_

// Turns generated token ids into text as they arrive, never emitting part of a UTF-8 code point: a token
// may carry only some bytes of a character (byte tokens, or byte-level BPE pieces of an emoji), so bytes
// that could still become a character are held back until a later token completes them. Everything
// returned is valid UTF-8: a sequence that turns out invalid, or that is still incomplete at Flush,
// becomes U+FFFD. One decoder per stream; not thread-safe. It reads the tokenizer, which must outlive it.

#include <cstdint>
#include <string>

#include "engine/tokenizer/tokenizer.h"

namespace strata::tokenizer {

class StreamingDecoder {
 public:
  // The default options suit generated text: control tokens render as nothing and a leading space is
  // kept (the stream continues a prompt).
  explicit StreamingDecoder(const Tokenizer* tokenizer,
                            DecodeOptions options = {.render_special = false, .strip_leading_space = false})
      : tokenizer_(tokenizer), options_(options) {}

  // Adds token `id` and returns the text it completes (possibly empty).
  std::string Add(int32_t id);

  // Returns what is held back (U+FFFD for an incomplete sequence) and starts a new stream.
  std::string Flush();

  size_t held_bytes() const { return held_.size(); }

 private:
  const Tokenizer* tokenizer_;
  DecodeOptions options_;
  bool first_ = true;
  std::string held_;  // a valid but incomplete UTF-8 prefix, at most 3 bytes
};

}  // namespace strata::tokenizer

#endif  // STRATA_ENGINE_TOKENIZER_STREAMING_DECODER_H_
