#ifndef STRATA_ENGINE_TOKENIZER_SPM_H_
#define STRATA_ENGINE_TOKENIZER_SPM_H_

// SentencePiece-style BPE (tokenizer.ggml.model = "llama"), as llama.cpp implements it: spaces become
// U+2581, the text is split into characters, and the adjacent pair whose concatenation is the
// highest-scoring token (the leftmost among equals) is merged until no pair forms a token. A symbol left
// that is not a token is emitted as byte tokens (<0xXX>), so any bytes round-trip. The caller adds the leading space
// (add_space_prefix). An SpmModel is immutable and safe to use from any number of threads; it reads the
// index and scores it was given, which must outlive it.

#include <array>
#include <cstdint>
#include <string_view>
#include <vector>

#include "engine/tokenizer/token_index.h"

namespace strata::tokenizer {

class SpmModel {
 public:
  // `scores` has one entry per token id. `byte_tokens[b]` is the token for byte b (-1 when the
  // vocabulary has none; `unk_id` is used then, and nothing when that is -1 too).
  SpmModel(const TokenIndex* index, const std::vector<float>* scores, std::array<int32_t, 256> byte_tokens,
           int32_t unk_id)
      : index_(index), scores_(scores), byte_tokens_(byte_tokens), unk_id_(unk_id) {}

  // Appends the ids of `text` (raw bytes; spaces are escaped here).
  void Encode(std::string_view text, std::vector<int32_t>* out) const;

 private:
  int32_t Find(std::string_view text) const;

  const TokenIndex* index_;
  const std::vector<float>* scores_;
  std::array<int32_t, 256> byte_tokens_;
  int32_t unk_id_;
};

}  // namespace strata::tokenizer

#endif  // STRATA_ENGINE_TOKENIZER_SPM_H_
