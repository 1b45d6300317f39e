#ifndef STRATA_ENGINE_CHAT_JINJA_LEXER_H_
#define STRATA_ENGINE_CHAT_JINJA_LEXER_H_

// Splits a Jinja template into text and the tokens of its tags, as Jinja2's lexer does in the environment
// chat templates are written for (Hugging Face's: trim_blocks and lstrip_blocks on, keep_trailing_newline
// off): line endings become "\n" and one final newline is dropped; `{%-` / `-%}` (and the same for `{{`,
// `{#`) strip the whitespace before / after the tag; the newline after a `%}` or `#}` is dropped; spaces
// and tabs before a `{%` or `{#` alone at the start of its line are dropped (not with `{%+`). Comments
// produce no tokens.

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace strata::chat::jinja {

struct Token {
  enum class Kind {
    kText,        // template text, already stripped as the whitespace rules say
    kVarBegin,    // {{
    kVarEnd,      // }}
    kBlockBegin,  // {%
    kBlockEnd,    // %}
    kName,
    kString,      // value: the decoded string
    kInt,
    kFloat,
    kOp,          // value: the operator, e.g. "==", "(", "|"
    kEof,
  };
  Kind kind;
  std::string value;
  int line;
};

// Errors (an unterminated tag, comment or string, a character no token starts with) name the line.
absl::StatusOr<std::vector<Token>> Lex(std::string_view source);

}  // namespace strata::chat::jinja

#endif  // STRATA_ENGINE_CHAT_JINJA_LEXER_H_
