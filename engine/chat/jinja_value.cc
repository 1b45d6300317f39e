#include "engine/chat/jinja_value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/status_macros.h"
#include "engine/tokenizer/utf8.h"

namespace strata::chat::jinja {

const Value* ValueDict::Find(std::string_view key) const {
  for (const auto& [k, v] : items) {
    if (k == key) return &v;
  }
  return nullptr;
}

void ValueDict::Set(std::string key, Value value) {
  for (auto& [k, v] : items) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  items.emplace_back(std::move(key), std::move(value));
}

const Value* CallArgs::Keyword(std::string_view name) const {
  for (const auto& [k, v] : keyword) {
    if (k == name) return &v;
  }
  return nullptr;
}

Value Value::Undefined(std::string name) {
  Value v;
  v.str_ = std::move(name);
  return v;
}
Value Value::None() {
  Value v;
  v.kind_ = Kind::kNone;
  return v;
}
Value Value::Bool(bool b) {
  Value v;
  v.kind_ = Kind::kBool;
  v.bool_ = b;
  return v;
}
Value Value::Int(int64_t i) {
  Value v;
  v.kind_ = Kind::kInt;
  v.int_ = i;
  return v;
}
Value Value::Float(double d) {
  Value v;
  v.kind_ = Kind::kFloat;
  v.float_ = d;
  return v;
}
Value Value::String(std::string s) {
  Value v;
  v.kind_ = Kind::kString;
  v.str_ = std::move(s);
  return v;
}
Value Value::List(ValueList items) {
  Value v;
  v.kind_ = Kind::kList;
  v.list_ = std::make_shared<const ValueList>(std::move(items));
  return v;
}
Value Value::Dict(ValueDict dict) {
  Value v;
  v.kind_ = Kind::kDict;
  v.dict_ = std::make_shared<ValueDict>(std::move(dict));
  return v;
}
Value Value::Namespace(ValueDict attributes) {
  Value v = Dict(std::move(attributes));
  v.kind_ = Kind::kNamespace;
  return v;
}
Value Value::Func(std::string name, Function fn) {
  Value v;
  v.kind_ = Kind::kFunction;
  v.str_ = std::move(name);
  v.fn_ = std::make_shared<const Function>(std::move(fn));
  return v;
}

bool Value::Truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return bool_;
    case Kind::kInt:
      return int_ != 0;
    case Kind::kFloat:
      return float_ != 0;
    case Kind::kString:
      return !str_.empty();
    case Kind::kList:
      return !list_->empty();
    case Kind::kDict:
      return !dict_->items.empty();
    case Kind::kNamespace:
    case Kind::kFunction:
      return true;
  }
  return false;
}

std::string_view Value::TypeName() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "undefined";
    case Kind::kNone:
      return "NoneType";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "str";
    case Kind::kList:
      return "list";
    case Kind::kDict:
      return "dict";
    case Kind::kNamespace:
      return "Namespace";
    case Kind::kFunction:
      return "function";
  }
  return "?";
}

std::string PythonFloatRepr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  const std::string sci(buf, res.ptr);  // e.g. "-1.2345e+02"
  const size_t e = sci.find('e');
  const int exponent = std::stoi(sci.substr(e + 1));
  std::string mantissa = sci.substr(0, e);
  const bool negative = mantissa[0] == '-';
  if (negative) mantissa.erase(0, 1);
  std::string digits;
  for (char c : mantissa) {
    if (c != '.') digits.push_back(c);
  }
  std::string out = negative ? "-" : "";
  if (exponent < -4 || exponent >= 16) {
    out += digits.substr(0, 1);
    if (digits.size() > 1) Append(&out, ".", digits.substr(1));
    char exp_buf[16];
    std::snprintf(exp_buf, sizeof(exp_buf), "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
    return out + exp_buf;
  }
  if (exponent < 0) {
    return Cat(out, "0.", std::string(static_cast<size_t>(-exponent - 1), '0'), digits);
  }
  const size_t int_digits = static_cast<size_t>(exponent) + 1;
  if (digits.size() <= int_digits) {
    return Cat(out, digits, std::string(int_digits - digits.size(), '0'), ".0");
  }
  return Cat(out, digits.substr(0, int_digits), ".", digits.substr(int_digits));
}

std::vector<std::string_view> CodePoints(std::string_view s) {
  std::vector<std::string_view> out;
  size_t pos = 0;
  while (pos < s.size()) {
    const tokenizer::Utf8Scan scan = tokenizer::ScanUtf8(s, pos);
    const size_t n = scan.kind == tokenizer::Utf8Scan::kValid ? scan.length : 1;
    out.push_back(s.substr(pos, n));
    pos += n;
  }
  return out;
}

bool IsPythonSpace(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0d) || (cp >= 0x1c && cp <= 0x20) || cp == 0x85 || cp == 0xa0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 || cp == 0x202f || cp == 0x205f ||
         cp == 0x3000;
}

std::string_view StripPython(std::string_view s, bool left, bool right, const std::string* chars) {
  std::vector<std::string_view> strip_set;
  if (chars != nullptr) strip_set = CodePoints(*chars);
  const auto strippable = [&](std::string_view cp) {
    if (chars != nullptr) return std::find(strip_set.begin(), strip_set.end(), cp) != strip_set.end();
    const tokenizer::Utf8Scan scan = tokenizer::ScanUtf8(cp, 0);
    return scan.kind == tokenizer::Utf8Scan::kValid && IsPythonSpace(scan.code_point);
  };
  const std::vector<std::string_view> cps = CodePoints(s);
  size_t begin = 0, end = cps.size();
  if (left) {
    while (begin < end && strippable(cps[begin])) ++begin;
  }
  if (right) {
    while (end > begin && strippable(cps[end - 1])) --end;
  }
  if (begin == end) return s.substr(0, 0);
  const size_t from = static_cast<size_t>(cps[begin].data() - s.data());
  const size_t to = static_cast<size_t>(cps[end - 1].data() + cps[end - 1].size() - s.data());
  return s.substr(from, to - from);
}

namespace {

std::string ReprString(const std::string& s) {
  const bool use_double = s.find('\'') != std::string::npos && s.find('"') == std::string::npos;
  const char quote = use_double ? '"' : '\'';
  std::string out(1, quote);
  size_t pos = 0;
  while (pos < s.size()) {
    const tokenizer::Utf8Scan scan = tokenizer::ScanUtf8(s, pos);
    if (scan.kind != tokenizer::Utf8Scan::kValid) {
      Append(&out, "\\x", absl::Hex(static_cast<uint8_t>(s[pos]), absl::kZeroPad2));
      ++pos;
      continue;
    }
    const uint32_t cp = scan.code_point;
    if (cp == '\\') {
      out += "\\\\";
    } else if (cp == static_cast<uint32_t>(quote)) {
      out += std::string("\\") + quote;
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp == '\t') {
      out += "\\t";
    } else if (cp < 0x20 || (cp >= 0x7f && cp <= 0xa0) || cp == 0xad) {
      Append(&out, "\\x", absl::Hex(cp, absl::kZeroPad2));
    } else {
      out.append(s, pos, scan.length);
    }
    pos += scan.length;
  }
  out.push_back(quote);
  return out;
}

std::string DictBody(const ValueDict& dict) {
  std::string out = "{";
  bool first = true;
  for (const auto& [k, v] : dict.items) {
    if (!first) out += ", ";
    first = false;
    Append(&out, ReprString(k), ": ", v.Repr());
  }
  return out + "}";
}

}  // namespace

std::string Value::ToString() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "";
    case Kind::kString:
      return str_;
    default:
      return Repr();
  }
}

std::string Value::Repr() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "";
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return bool_ ? "True" : "False";
    case Kind::kInt:
      return Cat(int_);
    case Kind::kFloat:
      return PythonFloatRepr(float_);
    case Kind::kString:
      return ReprString(str_);
    case Kind::kList: {
      std::string out = "[";
      for (size_t i = 0; i < list_->size(); ++i) {
        if (i > 0) out += ", ";
        out += (*list_)[i].Repr();
      }
      return out + "]";
    }
    case Kind::kDict:
      return DictBody(*dict_);
    case Kind::kNamespace:
      return Cat("<Namespace ", DictBody(*dict_), ">");
    case Kind::kFunction:
      return Cat("<function ", str_, ">");
  }
  return "";
}

bool ValuesEqual(const Value& a, const Value& b) {
  using K = Value::Kind;
  if (a.is_number() && b.is_number()) {
    if (a.kind() == K::kFloat || b.kind() == K::kFloat) return a.real() == b.real();
    return a.integer() == b.integer();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case K::kUndefined:
    case K::kNone:
      return true;
    case K::kString:
      return a.str() == b.str();
    case K::kList: {
      if (a.list().size() != b.list().size()) return false;
      for (size_t i = 0; i < a.list().size(); ++i) {
        if (!ValuesEqual(a.list()[i], b.list()[i])) return false;
      }
      return true;
    }
    case K::kDict: {
      const ValueDict& da = a.dict();
      const ValueDict& db = b.dict();
      if (da.items.size() != db.items.size()) return false;
      for (const auto& [k, v] : da.items) {
        const Value* other = db.Find(k);
        if (other == nullptr || !ValuesEqual(v, *other)) return false;
      }
      return true;
    }
    case K::kNamespace:
      return &a.dict() == &b.dict();
    case K::kFunction:
      return &a.function() == &b.function();
    default:
      return false;
  }
}

absl::StatusOr<bool> ValueLess(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.kind() == Value::Kind::kFloat || b.kind() == Value::Kind::kFloat) return a.real() < b.real();
    return a.integer() < b.integer();
  }
  if (a.is_string() && b.is_string()) return a.str() < b.str();
  if (a.is_list() && b.is_list()) {
    const size_t n = std::min(a.list().size(), b.list().size());
    for (size_t i = 0; i < n; ++i) {
      if (ValuesEqual(a.list()[i], b.list()[i])) continue;
      return ValueLess(a.list()[i], b.list()[i]);
    }
    return a.list().size() < b.list().size();
  }
  return absl::InvalidArgumentError(Cat("cannot order a ", a.TypeName(), " and a ", b.TypeName()));
}

namespace {

void AppendJsonString(std::string_view s, bool ensure_ascii, std::string* out) {
  out->push_back('"');
  size_t pos = 0;
  while (pos < s.size()) {
    const tokenizer::Utf8Scan scan = tokenizer::ScanUtf8(s, pos);
    const uint32_t cp = scan.kind == tokenizer::Utf8Scan::kValid ? scan.code_point : 0xFFFD;
    const size_t len = scan.kind == tokenizer::Utf8Scan::kValid ? scan.length : 1;
    switch (cp) {
      case '"':
        *out += "\\\"";
        break;
      case '\\':
        *out += "\\\\";
        break;
      case '\n':
        *out += "\\n";
        break;
      case '\r':
        *out += "\\r";
        break;
      case '\t':
        *out += "\\t";
        break;
      case '\b':
        *out += "\\b";
        break;
      case '\f':
        *out += "\\f";
        break;
      default:
        if (cp < 0x20) {
          Append(out, "\\u", absl::Hex(cp, absl::kZeroPad4));
        } else if (cp < 0x80 || !ensure_ascii) {
          if (scan.kind == tokenizer::Utf8Scan::kValid) {
            out->append(s.substr(pos, len));
          } else {
            tokenizer::AppendUtf8(0xFFFD, out);
          }
        } else if (cp < 0x10000) {
          Append(out, "\\u", absl::Hex(cp, absl::kZeroPad4));
        } else {
          const uint32_t v = cp - 0x10000;
          Append(out, "\\u", absl::Hex(0xD800 + (v >> 10), absl::kZeroPad4), "\\u",
                          absl::Hex(0xDC00 + (v & 0x3FF), absl::kZeroPad4));
        }
    }
    pos += len;
  }
  out->push_back('"');
}

absl::Status AppendJson(const Value& v, const JsonOptions& o, int depth, std::string* out) {
  const auto newline = [&](int level) {
    if (o.indent < 0) return;
    out->push_back('\n');
    out->append(static_cast<size_t>(o.indent * level), ' ');
  };
  switch (v.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      *out += "null";
      return absl::OkStatus();
    case Value::Kind::kBool:
      *out += v.boolean() ? "true" : "false";
      return absl::OkStatus();
    case Value::Kind::kInt:
      Append(out, v.integer());
      return absl::OkStatus();
    case Value::Kind::kFloat: {
      const double d = v.real();
      if (std::isnan(d)) {
        *out += "NaN";
      } else if (std::isinf(d)) {
        *out += d > 0 ? "Infinity" : "-Infinity";
      } else {
        *out += PythonFloatRepr(d);
      }
      return absl::OkStatus();
    }
    case Value::Kind::kString:
      AppendJsonString(v.str(), o.ensure_ascii, out);
      return absl::OkStatus();
    case Value::Kind::kList: {
      if (v.list().empty()) {
        *out += "[]";
        return absl::OkStatus();
      }
      out->push_back('[');
      for (size_t i = 0; i < v.list().size(); ++i) {
        if (i > 0) *out += o.item_separator;
        newline(depth + 1);
        RETURN_IF_ERROR(AppendJson(v.list()[i], o, depth + 1, out));
      }
      newline(depth);
      out->push_back(']');
      return absl::OkStatus();
    }
    case Value::Kind::kDict: {
      if (v.dict().items.empty()) {
        *out += "{}";
        return absl::OkStatus();
      }
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& item : v.dict().items) items.push_back(&item);
      if (o.sort_keys) {
        std::stable_sort(items.begin(), items.end(), [](auto* a, auto* b) { return a->first < b->first; });
      }
      out->push_back('{');
      for (size_t i = 0; i < items.size(); ++i) {
        if (i > 0) *out += o.item_separator;
        newline(depth + 1);
        AppendJsonString(items[i]->first, o.ensure_ascii, out);
        *out += o.key_separator;
        RETURN_IF_ERROR(AppendJson(items[i]->second, o, depth + 1, out));
      }
      newline(depth);
      out->push_back('}');
      return absl::OkStatus();
    }
    default:
      return absl::InvalidArgumentError(Cat("tojson: a ", v.TypeName(), " is not JSON serializable"));
  }
}

}  // namespace

absl::StatusOr<std::string> ToJson(const Value& value, const JsonOptions& options) {
  std::string out;
  RETURN_IF_ERROR(AppendJson(value, options, 0, &out));
  return out;
}

}  // namespace strata::chat::jinja
