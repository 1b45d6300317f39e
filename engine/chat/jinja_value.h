#ifndef STRATA_ENGINE_CHAT_JINJA_VALUE_H_
#define STRATA_ENGINE_CHAT_JINJA_VALUE_H_

// The values a chat template computes with, behaving as the Python objects Jinja2 would hand it: None,
// bool, int, float, str (UTF-8; lengths, indices and slices count code points), list, dict (insertion
// ordered, string keys), namespace() objects, callables (macros, globals, bound methods) and Jinja2's
// Undefined. Lists, dicts and namespaces are shared by reference, as Python objects are, so that
// `set ns.x = ...` is seen through every copy of `ns`.
//
// Values are not thread-safe; each render builds its own.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace strata::chat::jinja {

// absl::StrCat / StrAppend taking std::string_view pieces too (this Abseil's string_view is its own type).
inline std::string CatPiece(std::string_view v) { return std::string(v); }
template <typename T>
const T& CatPiece(const T& v) {
  return v;
}
template <typename... T>
std::string Cat(const T&... pieces) {
  return absl::StrCat(CatPiece(pieces)...);
}
template <typename... T>
void Append(std::string* out, const T&... pieces) {
  absl::StrAppend(out, CatPiece(pieces)...);
}

class Value;
using ValueList = std::vector<Value>;

// A dict with string keys in insertion order (what templates see of JSON objects and kwargs).
struct ValueDict {
  std::vector<std::pair<std::string, Value>> items;
  const Value* Find(std::string_view key) const;
  void Set(std::string key, Value value);
};

// Arguments of a call: positional ones, then keyword ones in the order written.
struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
  // The keyword argument `name`, or null.
  const Value* Keyword(std::string_view name) const;
};
using Function = std::function<absl::StatusOr<Value>(const CallArgs& args)>;

class Value {
 public:
  enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kNamespace, kFunction };

  Value() = default;  // Undefined
  static Value Undefined(std::string name);  // `name` says what was looked up, for error messages
  static Value None();
  static Value Bool(bool b);
  static Value Int(int64_t i);
  static Value Float(double d);
  static Value String(std::string s);
  static Value List(ValueList items);
  static Value Dict(ValueDict dict);
  static Value Namespace(ValueDict attributes);
  static Value Func(std::string name, Function fn);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_number() const { return kind_ == Kind::kInt || kind_ == Kind::kFloat || kind_ == Kind::kBool; }
  bool is_list() const { return kind_ == Kind::kList; }
  bool is_dict() const { return kind_ == Kind::kDict; }

  bool boolean() const { return bool_; }
  int64_t integer() const { return kind_ == Kind::kBool ? (bool_ ? 1 : 0) : int_; }
  double real() const { return kind_ == Kind::kFloat ? float_ : static_cast<double>(integer()); }
  // The string, or for Undefined the name that was looked up.
  const std::string& str() const { return str_; }
  const ValueList& list() const { return *list_; }
  // For kDict and kNamespace. A namespace's attributes may be changed through any copy of it.
  ValueDict& dict() const { return *dict_; }
  const Function& function() const { return *fn_; }
  // The name a function was made with (for error messages).
  const std::string& function_name() const { return str_; }

  // Python's bool(value); Undefined is false.
  bool Truthy() const;
  // Python's str(value) as Jinja2 prints it; Undefined prints as "".
  std::string ToString() const;
  // Python's repr(value) (how str() shows items of a list or dict).
  std::string Repr() const;
  // The Python type name, for error messages ("str", "int", "list", "dict", "undefined", ...).
  std::string_view TypeName() const;

 private:
  Kind kind_ = Kind::kUndefined;
  bool bool_ = false;
  int64_t int_ = 0;
  double float_ = 0;
  std::string str_;
  std::shared_ptr<const ValueList> list_;
  std::shared_ptr<ValueDict> dict_;
  std::shared_ptr<const Function> fn_;
};

// Python's ==, with Jinja2's Undefined equal only to Undefined.
bool ValuesEqual(const Value& a, const Value& b);
// Python's <: numbers with numbers, str with str (code point order), lists element by element.
absl::StatusOr<bool> ValueLess(const Value& a, const Value& b);

struct JsonOptions {
  int indent = -1;          // -1: one line
  bool ensure_ascii = false;
  bool sort_keys = false;
  std::string item_separator = ", ";  // Python's json.dumps defaults (", " becomes "," with an indent)
  std::string key_separator = ": ";
};
// Python's json.dumps(value, ...). Undefined and None are null; functions and namespaces are refused.
absl::StatusOr<std::string> ToJson(const Value& value, const JsonOptions& options);

// Python's float repr ("1.0", "0.1", "1e+16", "inf", "nan").
std::string PythonFloatRepr(double d);

// Code points of a UTF-8 string (invalid bytes count as one each).
std::vector<std::string_view> CodePoints(std::string_view s);

// Python's str.isspace() for one code point.
bool IsPythonSpace(uint32_t code_point);
// Python's str.strip / lstrip / rstrip: removes from the chosen ends the code points in `chars`, or
// whitespace when `chars` is null.
std::string_view StripPython(std::string_view s, bool left, bool right, const std::string* chars = nullptr);

}  // namespace strata::chat::jinja

#endif  // STRATA_ENGINE_CHAT_JINJA_VALUE_H_
