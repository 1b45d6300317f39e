// The filters and tests of jinja_builtins.h.

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/chat/jinja_builtins.h"
#include "engine/status_macros.h"

namespace strata::chat::jinja {
namespace {

const Value* ArgAt(const CallArgs& args, size_t index, std::string_view name) {
  if (index < args.positional.size()) return &args.positional[index];
  return args.Keyword(name);
}

absl::Status FilterError(std::string_view filter, std::string_view what) {
  return absl::InvalidArgumentError(Cat("filter '", filter, "': ", what));
}

// The arguments from `first` on, as positional arguments of another call (a test or a filter).
CallArgs RestArgs(const CallArgs& args, size_t first) {
  CallArgs rest;
  for (size_t i = first; i < args.positional.size(); ++i) rest.positional.push_back(args.positional[i]);
  return rest;
}

absl::StatusOr<int64_t> Length(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return 0;
    case Value::Kind::kString:
      return static_cast<int64_t>(CodePoints(v.str()).size());
    case Value::Kind::kList:
      return static_cast<int64_t>(v.list().size());
    case Value::Kind::kDict:
    case Value::Kind::kNamespace:
      return static_cast<int64_t>(v.dict().items.size());
    default:
      return FilterError("length", Cat("a ", v.TypeName(), " has no length"));
  }
}

absl::StatusOr<Value> ToJsonFilter(const Value& input, const CallArgs& args) {
  JsonOptions o;
  if (const Value* indent = ArgAt(args, 0, "indent"); indent != nullptr && !indent->is_none()) {
    if (!indent->is_number()) return FilterError("tojson", "indent must be an integer");
    o.indent = static_cast<int>(std::max<int64_t>(0, indent->integer()));
    o.item_separator = ",";
  }
  if (const Value* v = args.Keyword("ensure_ascii"); v != nullptr) o.ensure_ascii = v->Truthy();
  if (const Value* v = args.Keyword("sort_keys"); v != nullptr) o.sort_keys = v->Truthy();
  if (const Value* v = args.Keyword("separators"); v != nullptr && !v->is_none()) {
    if (!v->is_list() || v->list().size() != 2 || !v->list()[0].is_string() || !v->list()[1].is_string()) {
      return FilterError("tojson", "separators must be a pair of strings");
    }
    o.item_separator = v->list()[0].str();
    o.key_separator = v->list()[1].str();
  }
  ASSIGN_OR_RETURN(std::string json, ToJson(input, o));
  return Value::String(std::move(json));
}

// The items of `input` for which test(attribute of item, args...) is `keep` (selectattr, rejectattr,
// select, reject). `attribute` empty: the item itself.
absl::StatusOr<Value> SelectItems(std::string_view filter, const Value& input, const CallArgs& args, bool by_attribute,
                                  bool keep) {
  size_t next = 0;
  std::string attribute;
  if (by_attribute) {
    const Value* a = ArgAt(args, next++, "attribute");
    if (a == nullptr || !a->is_string()) return FilterError(filter, "expected an attribute name");
    attribute = a->str();
  }
  std::string test;
  if (next < args.positional.size()) {
    if (!args.positional[next].is_string()) return FilterError(filter, "the test must be named by a string");
    test = args.positional[next++].str();
    if (!IsKnownTest(test)) return FilterError(filter, Cat("unsupported test '", test, "'"));
  }
  const CallArgs test_args = RestArgs(args, next);
  ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(input));
  ValueList out;
  for (const Value& item : items) {
    Value subject = item;
    if (by_attribute) {
      ASSIGN_OR_RETURN(subject, GetItem(item, Value::String(attribute)));
    }
    bool pass;
    if (test.empty()) {
      pass = subject.Truthy();
    } else {
      ASSIGN_OR_RETURN(pass, ApplyTest(test, subject, test_args));
    }
    if (pass == keep) out.push_back(item);
  }
  return Value::List(std::move(out));
}

absl::StatusOr<Value> MapFilter(const Value& input, const CallArgs& args) {
  ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(input));
  ValueList out;
  if (const Value* attribute = args.Keyword("attribute"); attribute != nullptr) {
    const Value* def = args.Keyword("default");
    for (const Value& item : items) {
      ASSIGN_OR_RETURN(Value v, GetItem(item, *attribute));
      out.push_back(v.is_undefined() && def != nullptr ? *def : v);
    }
    return Value::List(std::move(out));
  }
  if (args.positional.empty() || !args.positional[0].is_string()) {
    return FilterError("map", "expected a filter name or attribute=");
  }
  const std::string filter = args.positional[0].str();
  if (!IsKnownFilter(filter)) return FilterError("map", Cat("unsupported filter '", filter, "'"));
  const CallArgs rest = RestArgs(args, 1);
  for (const Value& item : items) {
    ASSIGN_OR_RETURN(Value v, ApplyFilter(filter, item, rest));
    out.push_back(std::move(v));
  }
  return Value::List(std::move(out));
}

absl::StatusOr<Value> JoinFilter(const Value& input, const CallArgs& args) {
  const Value* sep = ArgAt(args, 0, "d");
  const Value* attribute = ArgAt(args, 1, "attribute");
  ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(input));
  std::vector<std::string> parts;
  for (const Value& item : items) {
    Value v = item;
    if (attribute != nullptr) {
      ASSIGN_OR_RETURN(v, GetItem(item, *attribute));
    }
    parts.push_back(v.ToString());
  }
  return Value::String(absl::StrJoin(parts, sep != nullptr ? sep->ToString() : ""));
}

absl::StatusOr<Value> FirstOrLast(const Value& input, bool first) {
  ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(input));
  if (items.empty()) return Value::Undefined(Cat("filter '", first ? "first" : "last", "': no items"));
  return first ? items.front() : items.back();
}

// str -> str filters, applied through the str method of the same name.
absl::StatusOr<Value> CallStrMethod(std::string_view method, const Value& input, const CallArgs& args) {
  ASSIGN_OR_RETURN(Value fn, GetAttribute(Value::String(input.ToString()), method));
  return fn.function()(args);
}

}  // namespace

bool IsKnownFilter(std::string_view name) {
  static const auto* kFilters = new absl::flat_hash_set<std::string_view>{
      "tojson", "length", "count", "string", "list", "join", "selectattr", "rejectattr", "select", "reject",
      "map", "first", "last", "trim", "lower", "upper", "title", "capitalize", "replace", "default", "d",
      "items", "reverse", "int", "float", "abs", "safe", "unique"};
  return kFilters->contains(name);
}

bool IsKnownTest(std::string_view name) {
  static const auto* kTests = new absl::flat_hash_set<std::string_view>{
      "defined", "undefined", "none", "string", "number", "integer", "float", "boolean", "true", "false",
      "mapping", "iterable", "sequence", "callable", "equalto", "eq", "sameas", "ne", "lt", "le", "gt",
      "ge", "in", "odd", "even", "divisibleby", "lower", "upper"};
  return kTests->contains(name);
}

absl::StatusOr<Value> ApplyFilter(std::string_view name, const Value& input, const CallArgs& args) {
  if (name == "tojson") return ToJsonFilter(input, args);
  if (name == "length" || name == "count") {
    ASSIGN_OR_RETURN(int64_t n, Length(input));
    return Value::Int(n);
  }
  if (name == "string") return Value::String(input.ToString());
  if (name == "safe") return input;
  if (name == "list") {
    ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(input));
    return Value::List(std::move(items));
  }
  if (name == "join") return JoinFilter(input, args);
  if (name == "selectattr" || name == "rejectattr") {
    return SelectItems(name, input, args, /*by_attribute=*/true, name == "selectattr");
  }
  if (name == "select" || name == "reject") return SelectItems(name, input, args, false, name == "select");
  if (name == "map") return MapFilter(input, args);
  if (name == "first" || name == "last") return FirstOrLast(input, name == "first");
  if (name == "trim") return CallStrMethod("strip", input, args);
  if (name == "lower" || name == "upper" || name == "title" || name == "capitalize" || name == "replace") {
    return CallStrMethod(name, input, args);
  }
  if (name == "default" || name == "d") {
    const Value* def = ArgAt(args, 0, "default_value");
    const Value* boolean = ArgAt(args, 1, "boolean");
    const bool use_default = input.is_undefined() || (boolean != nullptr && boolean->Truthy() && !input.Truthy());
    if (!use_default) return input;
    return def != nullptr ? *def : Value::String("");
  }
  if (name == "items") {
    if (input.is_undefined()) return Value::List({});
    if (!input.is_dict()) return FilterError("items", Cat("expected a dict, found ", input.TypeName()));
    ASSIGN_OR_RETURN(Value fn, GetAttribute(input, "items"));
    return fn.function()(CallArgs{});
  }
  if (name == "reverse") {
    if (input.is_string()) {
      std::vector<std::string_view> cps = CodePoints(input.str());
      std::string out;
      for (auto it = cps.rbegin(); it != cps.rend(); ++it) out += *it;
      return Value::String(std::move(out));
    }
    ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(input));
    std::reverse(items.begin(), items.end());
    return Value::List(std::move(items));
  }
  if (name == "unique") {
    ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(input));
    ValueList out;
    for (const Value& item : items) {
      if (std::none_of(out.begin(), out.end(), [&](const Value& o) { return ValuesEqual(o, item); })) {
        out.push_back(item);
      }
    }
    return Value::List(std::move(out));
  }
  if (name == "int" || name == "float") {
    const Value* def = ArgAt(args, 0, "default");
    const Value fallback = def != nullptr ? *def : (name == "int" ? Value::Int(0) : Value::Float(0));
    double d;
    if (input.is_number()) {
      d = input.real();
    } else if (input.is_string()) {
      char* end = nullptr;
      const std::string s(StripPython(input.str(), true, true));
      d = std::strtod(s.c_str(), &end);
      if (s.empty() || end != s.c_str() + s.size()) return fallback;
    } else {
      return fallback;
    }
    if (name == "int") return Value::Int(static_cast<int64_t>(std::trunc(d)));
    return Value::Float(d);
  }
  if (name == "abs") {
    if (!input.is_number()) return FilterError("abs", Cat("expected a number, found ", input.TypeName()));
    if (input.kind() == Value::Kind::kFloat) return Value::Float(std::fabs(input.real()));
    return Value::Int(std::llabs(input.integer()));
  }
  return absl::InvalidArgumentError(Cat("unsupported filter '", name, "'"));
}

absl::StatusOr<bool> ApplyTest(std::string_view name, const Value& v, const CallArgs& args) {
  using Kind = Value::Kind;
  const Value* arg = args.positional.empty() ? nullptr : &args.positional[0];
  const auto need_arg = [&]() -> absl::Status {
    if (arg == nullptr) return absl::InvalidArgumentError(Cat("test '", name, "': missing its argument"));
    return absl::OkStatus();
  };
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "string") return v.is_string();
  if (name == "number") return v.is_number();
  if (name == "integer") return v.kind() == Kind::kInt;
  if (name == "float") return v.kind() == Kind::kFloat;
  if (name == "boolean") return v.kind() == Kind::kBool;
  if (name == "true") return v.kind() == Kind::kBool && v.boolean();
  if (name == "false") return v.kind() == Kind::kBool && !v.boolean();
  if (name == "mapping") return v.is_dict();
  if (name == "iterable") return v.is_undefined() || v.is_string() || v.is_list() || v.is_dict();
  if (name == "sequence") return v.is_string() || v.is_list() || v.is_dict();
  if (name == "callable") return v.kind() == Kind::kFunction;
  if (name == "lower" || name == "upper") {
    if (!v.is_string()) return false;
    bool cased = false;
    for (char c : v.str()) {
      if (c >= 'a' && c <= 'z') {
        if (name == "upper") return false;
        cased = true;
      }
      if (c >= 'A' && c <= 'Z') {
        if (name == "lower") return false;
        cased = true;
      }
    }
    return cased;
  }
  if (name == "odd" || name == "even" || name == "divisibleby") {
    if (!v.is_number()) return absl::InvalidArgumentError(Cat("test '", name, "': expected a number"));
    if (name == "divisibleby") {
      RETURN_IF_ERROR(need_arg());
      if (!arg->is_number() || arg->integer() == 0) {
        return absl::InvalidArgumentError("test 'divisibleby': expected a non-zero number");
      }
      return v.integer() % arg->integer() == 0;
    }
    return (v.integer() % 2 != 0) == (name == "odd");
  }
  RETURN_IF_ERROR(need_arg());
  if (name == "equalto" || name == "eq") return ValuesEqual(v, *arg);
  if (name == "ne") return !ValuesEqual(v, *arg);
  if (name == "sameas") {
    if (v.kind() != arg->kind()) return false;
    return ValuesEqual(v, *arg);
  }
  if (name == "in") return Contains(*arg, v);
  if (name == "lt") return ValueLess(v, *arg);
  if (name == "gt") return ValueLess(*arg, v);
  if (name == "le") {
    ASSIGN_OR_RETURN(bool greater, ValueLess(*arg, v));
    return !greater;
  }
  if (name == "ge") {
    ASSIGN_OR_RETURN(bool less, ValueLess(v, *arg));
    return !less;
  }
  return absl::InvalidArgumentError(Cat("unsupported test '", name, "'"));
}

}  // namespace strata::chat::jinja
