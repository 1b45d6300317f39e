#ifndef STRATA_ENGINE_CHAT_JINJA_INTERPRETER_H_
#define STRATA_ENGINE_CHAT_JINJA_INTERPRETER_H_

// Runs a parsed template (jinja_parser.h) with Jinja2's semantics: for loops open a scope (a `set` inside
// one is not seen after it: templates use namespace() for that) and provide `loop` (index, index0,
// revindex, revindex0, first, last, length, previtem, nextitem); macros see the template's top-level
// names and their own arguments; Undefined prints as "" and fails when its attributes are read.
//
// Stateless: each call renders with its own values; the template may be rendered from many threads.

#include <string>

#include "absl/status/statusor.h"
#include "engine/chat/jinja_ast.h"
#include "engine/chat/jinja_value.h"

namespace strata::chat::jinja {

// `globals` (functions) and `variables` (the template's inputs) are the top-level names; variables win.
// Errors name the template line where evaluation failed, except those raise_exception makes.
absl::StatusOr<std::string> RenderTemplate(const Body& body, const ValueDict& globals, const ValueDict& variables);

}  // namespace strata::chat::jinja

#endif  // STRATA_ENGINE_CHAT_JINJA_INTERPRETER_H_
