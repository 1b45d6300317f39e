#ifndef STRATA_ENGINE_TOKENIZER_TOKENIZER_H_
#define STRATA_ENGINE_TOKENIZER_TOKENIZER_H_

// Text <-> token ids for the vocabulary a GGUF file carries, reproducing llama.cpp's tokenizer.
//
// Supported: byte-level BPE (tokenizer.ggml.model "gpt2") with the pre-tokenizers of pre_tokenizer.h
// (qwen2, gpt-2, llama3/llama-bpe, the "default" chain when tokenizer.ggml.pre is absent, and a few more),
// and SentencePiece-style BPE ("llama") with byte fallback and the U+2581 space handling.
//
// Special tokens: control and unknown tokens written in the text are recognised only when
// EncodeOptions::parse_special is set; user-defined tokens (e.g. Qwen3's <think>) are always recognised,
// as in llama.cpp and Hugging Face. BOS/EOS are added only with EncodeOptions::add_special, and then as
// tokenizer.ggml.add_bos_token / add_eos_token say (defaults as llama.cpp's: SentencePiece adds BOS, BPE
// does not except for the llama3 family).
//
// A Tokenizer is immutable after creation; Encode, Decode and every accessor may be called from any
// number of threads at once.

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/gguf/gguf_file.h"
#include "engine/tokenizer/token_index.h"
#include "engine/tokenizer/vocab.h"

namespace strata::tokenizer {

class BpeModel;
class SpmModel;

struct EncodeOptions {
  bool add_special = false;    // add BOS / EOS as the vocabulary asks
  bool parse_special = false;  // recognise control tokens such as <|im_start|> or <s> in the text
};

struct DecodeOptions {
  bool render_special = false;      // control and unknown tokens as their text (otherwise nothing)
  bool strip_leading_space = true;  // drop one leading space of the first piece when the vocabulary
                                    // adds a space prefix (SentencePiece); turn off for a continuation
};

class Tokenizer {
 public:
  enum class Model { kBpe, kSpm };

  // Reads tokenizer.ggml.* (see vocab.h) and builds the tokenizer. Errors name the key and the value.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromMetadata(const gguf::Metadata& metadata);
  static absl::StatusOr<std::unique_ptr<Tokenizer>> Create(TokenizerVocab vocab);

  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // Any bytes are accepted: BPE replaces invalid UTF-8 by U+FFFD, SentencePiece emits byte tokens.
  std::vector<int32_t> Encode(std::string_view text, const EncodeOptions& options = {}) const;

  // The concatenated pieces (raw bytes, not necessarily valid UTF-8 for a partial sequence). Ids outside
  // the vocabulary contribute nothing.
  std::string Decode(std::span<const int32_t> ids, const DecodeOptions& options = {}) const;

  // The bytes token `id` stands for: byte-level decoded for BPE, U+2581 -> space and <0xXX> -> the byte
  // for SentencePiece, the text itself for special tokens (or "" for control and unknown tokens when
  // !render_special). Unused and out-of-range ids give "". The view lives as long as the tokenizer.
  std::string_view TokenPiece(int32_t id, bool render_special = true) const;

  // The vocabulary entry itself (tokenizer.ggml.tokens[id]), "" when out of range.
  std::string_view TokenText(int32_t id) const;
  // The id whose vocabulary entry is exactly `text`, or -1.
  int32_t TokenId(std::string_view text) const;

  bool IsValid(int32_t id) const { return id >= 0 && id < n_vocab(); }
  bool IsControl(int32_t id) const { return IsValid(id) && (attrs_[id] & kAttrControl) != 0; }
  bool IsEog(int32_t id) const { return IsValid(id) && (attrs_[id] & kAttrEog) != 0; }
  const std::vector<int32_t>& eog_ids() const { return eog_ids_; }

  Model model() const { return model_; }
  const std::string& pre() const { return pre_; }  // the pre-tokenizer family ("" for SentencePiece)
  int32_t n_vocab() const { return static_cast<int32_t>(tokens_.size()); }
  // Special ids, -1 when the vocabulary has none.
  int32_t bos() const { return bos_; }
  int32_t eos() const { return eos_; }
  int32_t eot() const { return eot_; }
  int32_t pad() const { return pad_; }
  int32_t unk() const { return unk_; }
  bool add_bos() const { return add_bos_; }
  bool add_eos() const { return add_eos_; }
  bool add_space_prefix() const { return add_space_prefix_; }

 private:
  // Token attributes (a bit set, as llama.cpp keeps them: a token may be both normal and control).
  enum : uint8_t {
    kAttrNormal = 1,
    kAttrUnknown = 2,
    kAttrControl = 4,
    kAttrUserDefined = 8,
    kAttrUnused = 16,
    kAttrByte = 32,
    kAttrEog = 64,
  };
  struct Fragment {
    int32_t token;  // -1 for text
    size_t begin;
    size_t length;
  };

  Tokenizer() = default;
  static uint8_t AttrForType(TokenType type);
  absl::Status Init(TokenizerVocab vocab);
  absl::Status InitSpecialIds(const TokenizerVocab& vocab);
  void InitEog();
  void InitPieces();
  void Partition(std::string_view text, bool parse_special, std::vector<Fragment>* fragments) const;

  Model model_ = Model::kBpe;
  std::string pre_;
  std::vector<std::string> tokens_;
  std::vector<float> scores_;
  std::vector<uint8_t> attrs_;
  std::string piece_blob_;            // every piece, back to back
  std::vector<size_t> piece_offsets_;  // piece i is [offsets[i], offsets[i + 1]) of the blob
  TokenIndex index_;  // views tokens_
  std::vector<int32_t> specials_;  // control / user-defined / unknown ids, longest text first
  std::vector<int32_t> eog_ids_;
  int32_t bos_ = -1, eos_ = -1, eot_ = -1, pad_ = -1, unk_ = -1;
  bool add_bos_ = false, add_eos_ = false, add_space_prefix_ = false;
  std::unique_ptr<BpeModel> bpe_;
  std::unique_ptr<SpmModel> spm_;
};

}  // namespace strata::tokenizer

#endif  // STRATA_ENGINE_TOKENIZER_TOKENIZER_H_
