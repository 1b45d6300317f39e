#ifndef STRATA_ENGINE_TOKENIZER_BPE_H_
#define STRATA_ENGINE_TOKENIZER_BPE_H_

// Byte-level BPE (tokenizer.ggml.model = "gpt2"): the text is split into words by the pre-tokenizer, each
// word's bytes become symbols of the GPT-2 byte alphabet, and adjacent symbols are merged by merge rank
// (the lowest rank first, the leftmost among equals) until no ranked pair remains, as Hugging Face and
// llama.cpp do. Merges are held by token id: a merge whose parts or result are not tokens can never apply
// in a vocabulary Hugging Face accepts, and is dropped with a warning.
//
// A BpeModel is immutable after Create and safe to use from any number of threads; it reads the token
// index it was given, which must outlive it.

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "engine/tokenizer/pre_tokenizer.h"
#include "engine/tokenizer/token_index.h"

namespace strata::tokenizer {

class BpeModel {
 public:
  // `merges` are "left right" strings, highest priority first; a repeated pair keeps its first rank.
  // `unk_id` (or -1 to drop it) stands in for a byte that has no token, which a sound vocabulary never has.
  static absl::StatusOr<std::unique_ptr<BpeModel>> Create(const std::vector<std::string>& merges,
                                                          const TokenIndex* index, int32_t unk_id,
                                                          const PreTokenizerSpec& pre);

  // Appends the ids of `text` (any bytes: invalid UTF-8 is replaced by U+FFFD first, as llama.cpp does).
  void Encode(std::string_view text, std::vector<int32_t>* out) const;

  size_t n_merges() const { return merges_.size(); }

 private:
  struct Merge {
    int32_t rank;
    int32_t result;  // token id of left + right
  };

  struct Scratch;  // buffers reused across the words of one Encode call

  BpeModel() = default;
  int32_t Find(std::string_view text) const;
  void EncodeWord(std::string_view word, Scratch* scratch, std::vector<int32_t>* out) const;
  static uint64_t PairKey(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
  }

  const TokenIndex* index_ = nullptr;
  int32_t unk_id_ = -1;
  bool ignore_merges_ = false;
  std::array<int32_t, 256> byte_ids_{};  // token of each byte's character in the byte alphabet, or -1
  std::unique_ptr<PreTokenizer> pre_tokenizer_;
  absl::flat_hash_map<uint64_t, Merge> merges_;  // PairKey(left id, right id) -> merge
};

}  // namespace strata::tokenizer

#endif  // STRATA_ENGINE_TOKENIZER_BPE_H_
