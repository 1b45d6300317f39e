#include "engine/chat/jinja_builtins.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/status_macros.h"

// Filters and tests live in jinja_filters.cc; this file has operators, lookups, methods and globals.

namespace strata::chat::jinja {
namespace {

absl::Status TypeError(std::string_view what) { return absl::InvalidArgumentError(std::string(what)); }

absl::Status UndefinedError(const Value& v) {
  return absl::InvalidArgumentError(v.str().empty() ? std::string("a value is undefined") : v.str());
}

// The argument at `index` or named `name`; null when not given.
const Value* ArgAt(const CallArgs& args, size_t index, std::string_view name) {
  if (index < args.positional.size()) return &args.positional[index];
  return args.Keyword(name);
}

absl::StatusOr<std::string> StringArg(const CallArgs& args, size_t index, std::string_view name,
                                      std::string_view method) {
  const Value* v = ArgAt(args, index, name);
  if (v == nullptr || !v->is_string()) {
    return TypeError(Cat(method, "(): argument '", name, "' must be a str"));
  }
  return v->str();
}

// Python's index normalisation for one position of a sequence of `n` items.
int64_t ClampIndex(int64_t i, int64_t n, int64_t lo, int64_t hi) {
  if (i < 0) i += n;
  return std::max(lo, std::min(hi, i));
}

absl::StatusOr<Value> StrSplit(const std::string& s, const CallArgs& args) {
  const Value* sep = ArgAt(args, 0, "sep");
  const Value* max = ArgAt(args, 1, "maxsplit");
  int64_t maxsplit = max != nullptr && max->is_number() ? max->integer() : -1;
  ValueList parts;
  if (sep == nullptr || sep->is_none()) {
    std::string_view rest = StripPython(s, true, false);
    while (!rest.empty()) {
      if (maxsplit == 0) {
        parts.push_back(Value::String(std::string(StripPython(rest, false, true))));
        break;
      }
      const std::vector<std::string_view> cps = CodePoints(rest);
      size_t len = 0;
      for (std::string_view cp : cps) {
        if (StripPython(cp, true, true).empty()) break;
        len += cp.size();
      }
      parts.push_back(Value::String(std::string(rest.substr(0, len))));
      rest = StripPython(rest.substr(len), true, false);
      if (maxsplit > 0) --maxsplit;
    }
    return Value::List(std::move(parts));
  }
  if (!sep->is_string()) return TypeError("split(): the separator must be a str or None");
  if (sep->str().empty()) return TypeError("split(): empty separator");
  size_t start = 0;
  while (maxsplit != 0) {
    const size_t at = s.find(sep->str(), start);
    if (at == std::string::npos) break;
    parts.push_back(Value::String(s.substr(start, at - start)));
    start = at + sep->str().size();
    if (maxsplit > 0) --maxsplit;
  }
  parts.push_back(Value::String(s.substr(start)));
  return Value::List(std::move(parts));
}

absl::StatusOr<Value> StrAffix(const std::string& s, const CallArgs& args, bool prefix) {
  const Value* arg = ArgAt(args, 0, prefix ? "prefix" : "suffix");
  std::vector<std::string> candidates;
  if (arg != nullptr && arg->is_string()) {
    candidates.push_back(arg->str());
  } else if (arg != nullptr && arg->is_list()) {
    for (const Value& v : arg->list()) {
      if (!v.is_string()) return TypeError("startswith/endswith(): tuple items must be str");
      candidates.push_back(v.str());
    }
  } else {
    return TypeError(Cat(prefix ? "startswith" : "endswith", "(): argument must be a str or a tuple"));
  }
  for (const std::string& c : candidates) {
    if (c.size() > s.size()) continue;
    if (prefix ? s.compare(0, c.size(), c) == 0 : s.compare(s.size() - c.size(), c.size(), c) == 0) {
      return Value::Bool(true);
    }
  }
  return Value::Bool(false);
}

std::string CaseMap(std::string_view s, bool upper) {
  std::string out(s);
  for (char& c : out) {
    if (upper && c >= 'a' && c <= 'z') c = static_cast<char>(c - 32);
    if (!upper && c >= 'A' && c <= 'Z') c = static_cast<char>(c + 32);
  }
  return out;
}

// Python's str.title() for ASCII letters: a letter after a non-letter is upper case, the others lower.
std::string TitleCase(std::string_view s) {
  std::string out(s);
  bool prev_letter = false;
  for (char& c : out) {
    const bool letter = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
    if (letter) c = prev_letter ? CaseMap(std::string(1, c), false)[0] : CaseMap(std::string(1, c), true)[0];
    prev_letter = letter;
  }
  return out;
}

absl::StatusOr<Value> StrReplace(const std::string& s, const CallArgs& args) {
  ASSIGN_OR_RETURN(std::string from, StringArg(args, 0, "old", "replace"));
  ASSIGN_OR_RETURN(std::string to, StringArg(args, 1, "new", "replace"));
  const Value* count_arg = ArgAt(args, 2, "count");
  int64_t count = count_arg != nullptr && count_arg->is_number() ? count_arg->integer() : -1;
  std::string out;
  if (from.empty()) {
    for (std::string_view cp : CodePoints(s)) {
      if (count != 0) {
        out += to;
        if (count > 0) --count;
      }
      out += cp;
    }
    if (count != 0) out += to;
    return Value::String(std::move(out));
  }
  size_t start = 0;
  while (count != 0) {
    const size_t at = s.find(from, start);
    if (at == std::string::npos) break;
    out.append(s, start, at - start);
    out += to;
    start = at + from.size();
    if (count > 0) --count;
  }
  out.append(s, start);
  return Value::String(std::move(out));
}

// A bound str method, or Undefined naming it when Python's str has none this interpreter knows.
Value StrMethod(const std::string& s, std::string_view name) {
  const std::string method(name);
  auto bind = [&](auto fn) {
    return Value::Func(Cat("str.", method), [s, fn](const CallArgs& args) -> absl::StatusOr<Value> {
      return fn(s, args);
    });
  };
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    const bool left = name != "rstrip", right = name != "lstrip";
    return bind([left, right, method](const std::string& str, const CallArgs& args) -> absl::StatusOr<Value> {
      const Value* chars = ArgAt(args, 0, "chars");
      if (chars != nullptr && !chars->is_none() && !chars->is_string()) {
        return TypeError(Cat(method, "(): the characters must be a str or None"));
      }
      const std::string* set = chars != nullptr && chars->is_string() ? &chars->str() : nullptr;
      return Value::String(std::string(StripPython(str, left, right, set)));
    });
  }
  if (name == "split") return bind(StrSplit);
  if (name == "startswith" || name == "endswith") {
    const bool prefix = name == "startswith";
    return bind([prefix](const std::string& str, const CallArgs& args) { return StrAffix(str, args, prefix); });
  }
  if (name == "upper" || name == "lower") {
    const bool upper = name == "upper";
    return bind([upper](const std::string& str, const CallArgs&) -> absl::StatusOr<Value> {
      return Value::String(CaseMap(str, upper));
    });
  }
  if (name == "title") {
    return bind([](const std::string& str, const CallArgs&) -> absl::StatusOr<Value> {
      return Value::String(TitleCase(str));
    });
  }
  if (name == "capitalize") {
    return bind([](const std::string& str, const CallArgs&) -> absl::StatusOr<Value> {
      std::string out = CaseMap(str, false);
      if (!out.empty()) out[0] = CaseMap(out.substr(0, 1), true)[0];
      return Value::String(std::move(out));
    });
  }
  if (name == "replace") return bind(StrReplace);
  if (name == "find") {
    return bind([](const std::string& str, const CallArgs& args) -> absl::StatusOr<Value> {
      ASSIGN_OR_RETURN(std::string sub, StringArg(args, 0, "sub", "find"));
      const size_t at = str.find(sub);
      if (at == std::string::npos) return Value::Int(-1);
      return Value::Int(static_cast<int64_t>(CodePoints(std::string_view(str).substr(0, at)).size()));
    });
  }
  if (name == "join") {
    return bind([](const std::string& str, const CallArgs& args) -> absl::StatusOr<Value> {
      const Value* items = ArgAt(args, 0, "iterable");
      if (items == nullptr) return TypeError("join(): missing the iterable");
      ASSIGN_OR_RETURN(std::vector<Value> values, Iterate(*items));
      std::vector<std::string> parts;
      for (const Value& v : values) {
        if (!v.is_string()) return TypeError(Cat("join(): expected str items, found ", v.TypeName()));
        parts.push_back(v.str());
      }
      return Value::String(absl::StrJoin(parts, str));
    });
  }
  return Value::Undefined(Cat("unsupported: str has no method '", name, "' here"));
}

Value DictMethod(const Value& dict, std::string_view name) {
  if (name == "items" || name == "keys" || name == "values") {
    const std::string method(name);
    return Value::Func(Cat("dict.", method), [dict, method](const CallArgs&) -> absl::StatusOr<Value> {
      ValueList out;
      for (const auto& [k, v] : dict.dict().items) {
        if (method == "items") {
          out.push_back(Value::List({Value::String(k), v}));
        } else {
          out.push_back(method == "keys" ? Value::String(k) : v);
        }
      }
      return Value::List(std::move(out));
    });
  }
  if (name == "get") {
    return Value::Func("dict.get", [dict](const CallArgs& args) -> absl::StatusOr<Value> {
      const Value* key = ArgAt(args, 0, "key");
      if (key == nullptr) return TypeError("get(): missing the key");
      const Value* def = ArgAt(args, 1, "default");
      if (key->is_string()) {
        if (const Value* v = dict.dict().Find(key->str()); v != nullptr) return *v;
      }
      return def != nullptr ? *def : Value::None();
    });
  }
  return Value();
}

std::string ObjectName(const Value& v) { return Cat("'", v.TypeName(), " object'"); }

}  // namespace

absl::StatusOr<Value> GetAttribute(const Value& obj, std::string_view name) {
  switch (obj.kind()) {
    case Value::Kind::kUndefined:
      return UndefinedError(obj);
    case Value::Kind::kDict: {
      Value method = DictMethod(obj, name);
      if (!method.is_undefined()) return method;
      if (const Value* v = obj.dict().Find(name); v != nullptr) return *v;
      break;
    }
    case Value::Kind::kNamespace:
      if (const Value* v = obj.dict().Find(name); v != nullptr) return *v;
      break;
    case Value::Kind::kString:
      return StrMethod(obj.str(), name);
    default:
      break;
  }
  return Value::Undefined(Cat(ObjectName(obj), " has no attribute '", name, "'"));
}

absl::StatusOr<Value> GetItem(const Value& obj, const Value& key) {
  if (obj.is_undefined()) return UndefinedError(obj);
  if ((obj.is_list() || obj.is_string()) && key.is_number() && key.kind() != Value::Kind::kFloat) {
    if (obj.is_list()) {
      const int64_t n = static_cast<int64_t>(obj.list().size());
      const int64_t i = key.integer() < 0 ? key.integer() + n : key.integer();
      if (i >= 0 && i < n) return obj.list()[static_cast<size_t>(i)];
    } else {
      const std::vector<std::string_view> cps = CodePoints(obj.str());
      const int64_t n = static_cast<int64_t>(cps.size());
      const int64_t i = key.integer() < 0 ? key.integer() + n : key.integer();
      if (i >= 0 && i < n) return Value::String(std::string(cps[static_cast<size_t>(i)]));
    }
    return Value::Undefined(Cat(ObjectName(obj), " has no element ", key.integer()));
  }
  if ((obj.is_dict() || obj.kind() == Value::Kind::kNamespace) && key.is_string()) {
    if (const Value* v = obj.dict().Find(key.str()); v != nullptr) return *v;
  }
  if (key.is_string()) return GetAttribute(obj, key.str());
  return Value::Undefined(Cat(ObjectName(obj), " has no element ", key.Repr()));
}

absl::StatusOr<Value> GetSlice(const Value& obj, const Value& start, const Value& stop, const Value& step) {
  if (!obj.is_list() && !obj.is_string()) {
    if (obj.is_undefined()) return UndefinedError(obj);
    return TypeError(Cat("cannot slice a ", obj.TypeName()));
  }
  for (const Value* v : {&start, &stop, &step}) {
    if (!v->is_undefined() && !v->is_none() && !(v->is_number() && v->kind() != Value::Kind::kFloat)) {
      return TypeError("slice indices must be integers or None");
    }
  }
  const bool given_step = step.is_number();
  const int64_t st = given_step ? step.integer() : 1;
  if (st == 0) return TypeError("slice step cannot be zero");
  std::vector<std::string_view> cps;
  if (obj.is_string()) cps = CodePoints(obj.str());
  const int64_t n = obj.is_list() ? static_cast<int64_t>(obj.list().size()) : static_cast<int64_t>(cps.size());
  int64_t lo, hi;
  if (st > 0) {
    lo = start.is_number() ? ClampIndex(start.integer(), n, 0, n) : 0;
    hi = stop.is_number() ? ClampIndex(stop.integer(), n, 0, n) : n;
  } else {
    lo = start.is_number() ? ClampIndex(start.integer(), n, -1, n - 1) : n - 1;
    hi = stop.is_number() ? ClampIndex(stop.integer(), n, -1, n - 1) : -1;
  }
  ValueList items;
  std::string text;
  for (int64_t i = lo; st > 0 ? i < hi : i > hi; i += st) {
    if (obj.is_list()) {
      items.push_back(obj.list()[static_cast<size_t>(i)]);
    } else {
      text += cps[static_cast<size_t>(i)];
    }
  }
  return obj.is_list() ? Value::List(std::move(items)) : Value::String(std::move(text));
}

absl::StatusOr<std::vector<Value>> Iterate(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return std::vector<Value>{};
    case Value::Kind::kList:
      return v.list();
    case Value::Kind::kDict: {
      std::vector<Value> keys;
      for (const auto& item : v.dict().items) keys.push_back(Value::String(item.first));
      return keys;
    }
    case Value::Kind::kString: {
      std::vector<Value> chars;
      for (std::string_view cp : CodePoints(v.str())) chars.push_back(Value::String(std::string(cp)));
      return chars;
    }
    default:
      return TypeError(Cat("a ", v.TypeName(), " is not iterable"));
  }
}

absl::StatusOr<Value> BinaryOp(std::string_view op, const Value& a, const Value& b) {
  if (op == "~") return Value::String(a.ToString() + b.ToString());
  if (a.is_undefined()) return UndefinedError(a);
  if (b.is_undefined()) return UndefinedError(b);
  const auto unsupported = [&] {
    return TypeError(Cat("unsupported operand types for ", op, ": '", a.TypeName(), "' and '",
                                  b.TypeName(), "'"));
  };
  if (op == "+") {
    if (a.is_string() && b.is_string()) return Value::String(a.str() + b.str());
    if (a.is_list() && b.is_list()) {
      ValueList items = a.list();
      items.insert(items.end(), b.list().begin(), b.list().end());
      return Value::List(std::move(items));
    }
  }
  if (op == "*" && (a.is_string() || b.is_string()) && (a.is_number() || b.is_number())) {
    const Value& s = a.is_string() ? a : b;
    const Value& n = a.is_string() ? b : a;
    if (n.kind() == Value::Kind::kFloat) return unsupported();
    // A template must not be able to make a string bigger than any prompt could be.
    if (n.integer() > 0 && static_cast<uint64_t>(n.integer()) * std::max<size_t>(s.str().size(), 1) > (uint64_t{16} << 20)) {
      return TypeError("string repetition: the result would exceed 16 MiB");
    }
    std::string out;
    for (int64_t i = 0; i < n.integer(); ++i) out += s.str();
    return Value::String(std::move(out));
  }
  if (!a.is_number() || !b.is_number()) return unsupported();
  const bool real = a.kind() == Value::Kind::kFloat || b.kind() == Value::Kind::kFloat;
  const int64_t x = a.integer(), y = b.integer();
  const double fx = a.real(), fy = b.real();
  if (op == "+") return real ? Value::Float(fx + fy) : Value::Int(x + y);
  if (op == "-") return real ? Value::Float(fx - fy) : Value::Int(x - y);
  if (op == "*") return real ? Value::Float(fx * fy) : Value::Int(x * y);
  if (op == "**") {
    if (!real && y >= 0) {
      int64_t r = 1;
      for (int64_t i = 0; i < y && i < 64; ++i) r *= x;
      return Value::Int(r);
    }
    return Value::Float(std::pow(fx, fy));
  }
  if ((op == "/" || op == "//" || op == "%") && fy == 0) return TypeError("division by zero");
  if (op == "/") return Value::Float(fx / fy);
  if (op == "//") {
    if (real) return Value::Float(std::floor(fx / fy));
    int64_t q = x / y;
    if ((x % y != 0) && ((x < 0) != (y < 0))) --q;
    return Value::Int(q);
  }
  if (op == "%") {
    if (real) {
      double r = std::fmod(fx, fy);
      if (r != 0 && ((r < 0) != (fy < 0))) r += fy;
      return Value::Float(r);
    }
    int64_t r = x % y;
    if (r != 0 && ((r < 0) != (y < 0))) r += y;
    return Value::Int(r);
  }
  return unsupported();
}

absl::StatusOr<bool> Contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Value::Kind::kUndefined:
      return false;
    case Value::Kind::kString:
      if (!item.is_string()) return TypeError(Cat("'in <string>' requires a str, not ", item.TypeName()));
      return container.str().find(item.str()) != std::string::npos;
    case Value::Kind::kList:
      for (const Value& v : container.list()) {
        if (ValuesEqual(v, item)) return true;
      }
      return false;
    case Value::Kind::kDict:
      return item.is_string() && container.dict().Find(item.str()) != nullptr;
    default:
      return TypeError(Cat("a ", container.TypeName(), " does not support 'in'"));
  }
}

ValueDict BuiltinGlobals(std::function<std::tm()> now) {
  ValueDict g;
  g.Set("range", Value::Func("range", [](const CallArgs& args) -> absl::StatusOr<Value> {
    std::vector<int64_t> n;
    for (const Value& v : args.positional) {
      if (!v.is_number() || v.kind() == Value::Kind::kFloat) return TypeError("range(): arguments must be integers");
      n.push_back(v.integer());
    }
    if (n.empty() || n.size() > 3) return TypeError("range(): expected 1 to 3 arguments");
    const int64_t start = n.size() == 1 ? 0 : n[0];
    const int64_t stop = n.size() == 1 ? n[0] : n[1];
    const int64_t step = n.size() == 3 ? n[2] : 1;
    if (step == 0) return TypeError("range(): step must not be zero");
    ValueList out;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
      if (out.size() >= 100000) return TypeError("range(): more than 100000 items");
      out.push_back(Value::Int(i));
    }
    return Value::List(std::move(out));
  }));
  g.Set("namespace", Value::Func("namespace", [](const CallArgs& args) -> absl::StatusOr<Value> {
    ValueDict attrs;
    for (const Value& v : args.positional) {
      if (!v.is_dict()) return TypeError("namespace(): positional arguments must be dicts");
      for (const auto& [k, item] : v.dict().items) attrs.Set(k, item);
    }
    for (const auto& [k, v] : args.keyword) attrs.Set(k, v);
    return Value::Namespace(std::move(attrs));
  }));
  g.Set("dict", Value::Func("dict", [](const CallArgs& args) -> absl::StatusOr<Value> {
    ValueDict d;
    for (const auto& [k, v] : args.keyword) d.Set(k, v);
    return Value::Dict(std::move(d));
  }));
  g.Set("raise_exception", Value::Func("raise_exception", [](const CallArgs& args) -> absl::StatusOr<Value> {
    const std::string message = args.positional.empty() ? "" : args.positional[0].ToString();
    return absl::InvalidArgumentError(Cat(kRaisedPrefix, message));
  }));
  g.Set("strftime_now", Value::Func("strftime_now", [now](const CallArgs& args) -> absl::StatusOr<Value> {
    if (args.positional.size() != 1 || !args.positional[0].is_string()) {
      return TypeError("strftime_now(): expected one format string");
    }
    const std::tm tm = now();
    char buf[256];
    const size_t n = std::strftime(buf, sizeof(buf), args.positional[0].str().c_str(), &tm);
    return Value::String(std::string(buf, n));
  }));
  return g;
}

}  // namespace strata::chat::jinja
