#ifndef STRATA_ENGINE_TOKENIZER_PRE_TOKENIZER_H_
#define STRATA_ENGINE_TOKENIZER_PRE_TOKENIZER_H_

// The regex pre-tokenizers of byte-level BPE vocabularies, selected by `tokenizer.ggml.pre`.
//
// A pre-tokenizer is a chain of regexes applied the way llama.cpp applies them: the first splits the
// text into its matches and the gaps between them (both kept, in order), each later one splits every
// piece the previous produced, and a regex never sees past the piece it splits (so `(?!\S)` is true at a
// piece's end). Patterns use PCRE2 in UTF + UCP mode; `\s` and `\S` are rewritten to the exact
// white-space set llama.cpp and Hugging Face use (Unicode White_Space), which PCRE2's own `\s` misses
// (U+0085). A PreTokenizer is immutable after Create and safe to use from any number of threads.

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace strata::tokenizer {

// What a `tokenizer.ggml.pre` value implies besides its regexes (llama.cpp's per-type flags).
struct PreTokenizerSpec {
  std::string name;                   // the canonical family: "default", "gpt-2", "llama3", "qwen2", ...
  std::vector<std::string> patterns;  // applied in order, see above
  bool ignore_merges = false;         // a word that is itself a token is emitted without merging
  bool add_bos = false;               // default of tokenizer.ggml.add_bos_token for this family
};

// Looks up a `tokenizer.ggml.pre` value; an empty value selects llama.cpp's "default" chain. Unknown
// values fail with INVALID_ARGUMENT naming the key and the value.
absl::StatusOr<PreTokenizerSpec> LookupPreTokenizer(std::string_view pre);

class PreTokenizer {
 public:
  static absl::StatusOr<std::unique_ptr<PreTokenizer>> Create(const std::vector<std::string>& patterns);
  ~PreTokenizer();
  PreTokenizer(const PreTokenizer&) = delete;
  PreTokenizer& operator=(const PreTokenizer&) = delete;

  // Appends the words of `text`, which must be valid UTF-8 (callers repair it first), to `words`. The
  // words are views into `text`, non-empty, and concatenate back to it.
  void Split(std::string_view text, std::vector<std::string_view>* words) const;

 private:
  struct Regex;
  PreTokenizer() = default;
  void SplitOne(const Regex& regex, std::string_view piece, void* match_data,
                std::vector<std::string_view>* out) const;

  std::vector<std::unique_ptr<Regex>> regexes_;
};

}  // namespace strata::tokenizer

#endif  // STRATA_ENGINE_TOKENIZER_PRE_TOKENIZER_H_
