#ifndef STRATA_PACKTOOL_HF_TOKENIZER_H_
#define STRATA_PACKTOOL_HF_TOKENIZER_H_

// The GGUF tokenizer keys (tokenizer.ggml.*, tokenizer.chat_template) of a Hugging Face checkpoint, from its
// tokenizer.json (byte-level BPE only: model.vocab, model.merges, added_tokens, the pre-tokenizer's regex)
// and tokenizer_config.json (bos/eos/pad tokens, add_bos_token, chat_template) when present.
// SentencePiece-style tokenizers (byte_fallback BPE, Unigram) are refused: convert takes --tokenizer-gguf.

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "packtool/builtin_vocab.h"

namespace strata::packtool {

// The Split regexes of the byte-level pre-tokenizers Strata implements, as tokenizer.json writes them (a CR or
// LF character there is read as the regex escape \r or \n).
inline constexpr char kHfQwen2PreRegex[] =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
inline constexpr char kHfLlama3PreRegex[] =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// OpenAI's o200k (gpt-oss; llama.cpp's "gpt-4o"), as tiktoken defines it.
inline constexpr char kHfGpt4oPreRegex[] =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|)"
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|)"
    R"(\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// DeepSeek-V3's three Split regexes, in order (llama.cpp's "deepseek-v3"): digits, CJK and kana runs, the rest.
inline constexpr const char* kHfDeepseekV3PreRegexes[3] = {
    R"(\p{N}{1,3})",
    "[\u4E00-\u9FA5\u3040-\u309F\u30A0-\u30FF]+",
    (R"([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+|)"
     R"( ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)")};  // one regex in two lines

struct HfTokenizerOptions {
  std::string dir;                 // holds tokenizer.json (and maybe tokenizer_config.json)
  int64_t n_vocab = 0;             // config.json's vocab_size: the token list is padded up to it
  std::optional<int64_t> bos_id;   // config.json's bos_token_id / eos_token_id, used when tokenizer_config.json
  std::optional<int64_t> eos_id;   // names no such token
};

absl::StatusOr<VocabMetadata> VocabFromHfTokenizer(const HfTokenizerOptions& options);

}  // namespace strata::packtool

#endif  // STRATA_PACKTOOL_HF_TOKENIZER_H_
