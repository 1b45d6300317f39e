#ifndef STRATA_PACKTOOL_BUILTIN_VOCAB_H_
#define STRATA_PACKTOOL_BUILTIN_VOCAB_H_

// A small byte-level BPE vocabulary (GPT-2 style, qwen2 pre-tokenizer) so synth needs no other file:
// 256 byte tokens, a few hundred merges of common English pairs, three control tokens and a ChatML chat
// template.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/gguf/gguf_file.h"
#include "engine/gguf/gguf_writer.h"

namespace strata::packtool {

struct VocabMetadata {
  std::vector<std::pair<std::string, gguf::Value>> entries;  // tokenizer.* keys, in order
  int64_t n_tokens = 0;
};

// The chat template the built-in vocabulary carries (tokenizer.chat_template): ChatML, over its
// <|im_start|> and <|im_end|> control tokens, as Qwen's models use.
inline constexpr char kBuiltinChatTemplate[] =
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";

// The built-in vocabulary, padded with unused "[PAD<i>]" tokens up to `n_vocab` when that is larger.
absl::StatusOr<VocabMetadata> BuiltinVocab(int64_t n_vocab);

// The tokenizer.* keys of a GGUF file (e.g. tests/data/vocab/ggml-vocab-qwen2.gguf.gz, unpacked).
absl::StatusOr<VocabMetadata> VocabFromGguf(const std::string& path);

}  // namespace strata::packtool

#endif  // STRATA_PACKTOOL_BUILTIN_VOCAB_H_
