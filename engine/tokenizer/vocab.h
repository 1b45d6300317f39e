#ifndef STRATA_ENGINE_TOKENIZER_VOCAB_H_
#define STRATA_ENGINE_TOKENIZER_VOCAB_H_

// The tokenizer's inputs as plain data: what the `tokenizer.ggml.*` metadata of a GGUF file holds, before
// any defaults are applied. Tokenizer::Create validates it; VocabFromMetadata reads it from GGUF metadata.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/gguf/gguf_file.h"

namespace strata::tokenizer {

// GGUF token types (tokenizer.ggml.token_type), with their numeric values.
enum class TokenType : int32_t {
  kUndefined = 0,
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

struct TokenizerVocab {
  std::string model;                // tokenizer.ggml.model: "gpt2" (byte-level BPE) or "llama" (SentencePiece)
  std::string pre;                  // tokenizer.ggml.pre; empty when absent
  std::vector<std::string> tokens;  // tokenizer.ggml.tokens, indexed by id
  std::vector<float> scores;        // tokenizer.ggml.scores: empty, or one per token
  std::vector<int32_t> token_types; // tokenizer.ggml.token_type (TokenType values): empty, or one per token
  std::vector<std::string> merges;  // tokenizer.ggml.merges, "left right", highest priority first

  // Special token ids and flags; unset means "absent from the metadata" (model defaults then apply).
  std::optional<int64_t> bos_id, eos_id, eot_id, eom_id, unk_id, pad_id, sep_id;
  std::optional<int64_t> fim_pad_id, fim_rep_id, fim_sep_id;
  std::optional<bool> add_bos, add_eos, add_space_prefix;
};

// Reads the tokenizer.ggml.* keys. Fails when a required key is absent (tokenizer.ggml.model,
// tokenizer.ggml.tokens) or any present key has the wrong type, naming the key.
absl::StatusOr<TokenizerVocab> VocabFromMetadata(const gguf::Metadata& metadata);

}  // namespace strata::tokenizer

#endif  // STRATA_ENGINE_TOKENIZER_VOCAB_H_
