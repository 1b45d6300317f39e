#ifndef STRATA_ENGINE_CHAT_JINJA_BUILTINS_H_
#define STRATA_ENGINE_CHAT_JINJA_BUILTINS_H_

// What Jinja2 and Python give a chat template beyond its own code: operators on values, attribute and
// item lookup (with the str and dict methods templates call), iteration, and the filters, tests and
// global functions chat templates use. Each behaves as Jinja2 3.x in Hugging Face's chat environment
// (where tojson is json.dumps without HTML escaping and keeps key order). Errors say what was unsupported
// or wrong, e.g. "filter 'join': a int is not iterable". Pure functions, callable from any thread.

#include <ctime>
#include <functional>
#include <optional>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/chat/jinja_value.h"

namespace strata::chat::jinja {

bool IsKnownFilter(std::string_view name);
bool IsKnownTest(std::string_view name);

// obj.name: a dict's method (items, keys, values, get) or item, a str method, a namespace attribute;
// Undefined (saying what was missing) otherwise. An error for an attribute of Undefined.
absl::StatusOr<Value> GetAttribute(const Value& obj, std::string_view name);
// obj[key]: list and str indices (negative from the end), dict keys; Undefined when absent.
absl::StatusOr<Value> GetItem(const Value& obj, const Value& key);
// obj[start:stop:step] of a list or str, with Python's rules.
absl::StatusOr<Value> GetSlice(const Value& obj, const Value& start, const Value& stop, const Value& step);

// What a for loop over `v` visits: list items, dict keys, str code points; nothing for Undefined.
absl::StatusOr<std::vector<Value>> Iterate(const Value& v);

// + - * / // % ** and ~ (string concatenation).
absl::StatusOr<Value> BinaryOp(std::string_view op, const Value& a, const Value& b);
// `item in container`.
absl::StatusOr<bool> Contains(const Value& container, const Value& item);

absl::StatusOr<Value> ApplyFilter(std::string_view name, const Value& input, const CallArgs& args);
absl::StatusOr<bool> ApplyTest(std::string_view name, const Value& input, const CallArgs& args);

// The global functions: range, namespace, dict, raise_exception (fails the render with the template's
// message, as INVALID_ARGUMENT with kRaisedPrefix before it) and strftime_now (formats `now()`).
inline constexpr char kRaisedPrefix[] = "the chat template refused the conversation: ";
ValueDict BuiltinGlobals(std::function<std::tm()> now);

}  // namespace strata::chat::jinja

#endif  // STRATA_ENGINE_CHAT_JINJA_BUILTINS_H_
