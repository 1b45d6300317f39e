#ifndef STRATA_ENGINE_CHAT_JINJA_PARSER_H_
#define STRATA_ENGINE_CHAT_JINJA_PARSER_H_

// Parses a Jinja template into statements, with Jinja2's grammar and operator precedence, for the subset
// chat templates use: text, {{ }}, if/elif/else, for (with unpacking, an `if` filter, else, break and
// continue), set (names, namespace attributes, blocks), macro, generation, comments; expressions with
// literals, lists, dicts, tuples, attributes, subscripts and slices, calls with keyword arguments,
// filters, tests, arithmetic, comparisons, `in`, and/or/not and `x if c else y`.
//
// What is outside the subset is refused naming it and its line: other tags (include, extends, raw, call,
// ...), and filters or tests the interpreter does not have (jinja_builtins.h).

#include <string_view>

#include "absl/status/statusor.h"
#include "engine/chat/jinja_ast.h"

namespace strata::chat::jinja {

absl::StatusOr<Body> ParseTemplate(std::string_view source);

}  // namespace strata::chat::jinja

#endif  // STRATA_ENGINE_CHAT_JINJA_PARSER_H_
