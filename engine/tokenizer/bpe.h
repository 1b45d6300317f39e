#ifndef STRATA_ENGINE_TOKENIZER_BPE_H_
#define STRATA_ENGINE_TOKENIZER_BPE_H_

// Byte-level BPE (tokenizer.ggml.model = "gpt2"): the text is split into words by the pre-tokenizer, each
// word's bytes are mapped to the GPT-2 byte alphabet, and adjacent symbols are merged by merge rank (the
// lowest rank first, the leftmost among equals) until no ranked pair remains, as Hugging Face and
// llama.cpp do. A BpeModel is immutable after Create and safe to use from any number of threads; it
// reads the token index it was given, which must outlive it.

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/tokenizer/pre_tokenizer.h"
#include "engine/tokenizer/token_index.h"

namespace strata::tokenizer {

class BpeModel {
 public:
  // `merges` are "left right" strings, highest priority first; a repeated pair keeps its first rank.
  // `unk_id` (or -1) stands in for a symbol that is not a token, which a consistent vocabulary never has.
  static absl::StatusOr<std::unique_ptr<BpeModel>> Create(const std::vector<std::string>& merges,
                                                          const TokenIndex* index, int32_t unk_id,
                                                          const PreTokenizerSpec& pre);

  // Appends the ids of `text` (any bytes: invalid UTF-8 is replaced by U+FFFD first, as llama.cpp does).
  void Encode(std::string_view text, std::vector<int32_t>* out) const;

  size_t n_merges() const { return ranks_.size(); }

 private:
  BpeModel() = default;
  int32_t Rank(std::string_view left, std::string_view right) const;
  int32_t Find(std::string_view text) const;
  void EncodeWord(std::string_view word, std::vector<int32_t>* out) const;

  const TokenIndex* index_ = nullptr;
  int32_t unk_id_ = -1;
  bool ignore_merges_ = false;
  std::unique_ptr<PreTokenizer> pre_tokenizer_;
  TextPairMap<int32_t> ranks_;
};

}  // namespace strata::tokenizer

#endif  // STRATA_ENGINE_TOKENIZER_BPE_H_
