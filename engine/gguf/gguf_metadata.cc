// Metadata lookup and typed getters (gguf_file.h).

#include <limits>

#include "absl/strings/str_cat.h"
#include "engine/gguf/gguf_file.h"

namespace strata::gguf {
namespace {

bool IsUnsignedType(ValueType t) {
  return t == ValueType::kUint8 || t == ValueType::kUint16 || t == ValueType::kUint32 ||
         t == ValueType::kUint64;
}

bool IsSignedType(ValueType t) {
  return t == ValueType::kInt8 || t == ValueType::kInt16 || t == ValueType::kInt32 || t == ValueType::kInt64;
}

bool IsFloatType(ValueType t) { return t == ValueType::kFloat32 || t == ValueType::kFloat64; }

// Debian's Abseil has its own string_view, which std::string_view does not convert to implicitly.
absl::string_view Sv(std::string_view s) { return absl::string_view(s.data(), s.size()); }

absl::Status WrongType(std::string_view key, std::string_view expected, const Value& v) {
  return absl::InvalidArgumentError(absl::StrCat("metadata key '", Sv(key), "': expected ", Sv(expected), ", found ",
                                                 Sv(ValueTypeName(v.type))));
}

absl::Status Missing(std::string_view key) {
  return absl::NotFoundError(absl::StrCat("metadata key '", Sv(key), "' is missing"));
}

// The value's integer as int64/uint64 pair; false when it holds no integer (wrong alternative).
bool IntegerParts(const Value& v, bool* negative, uint64_t* magnitude) {
  if (IsUnsignedType(v.type)) {
    const uint64_t* u = std::get_if<uint64_t>(&v.data);
    if (u == nullptr) return false;
    *negative = false;
    *magnitude = *u;
    return true;
  }
  if (IsSignedType(v.type)) {
    const int64_t* s = std::get_if<int64_t>(&v.data);
    if (s == nullptr) return false;
    *negative = *s < 0;
    *magnitude = *negative ? 0 - static_cast<uint64_t>(*s) : static_cast<uint64_t>(*s);
    return true;
  }
  return false;
}

absl::StatusOr<uint64_t> ValueAsUint(std::string_view key, const Value& v) {
  bool negative;
  uint64_t magnitude;
  if (!IntegerParts(v, &negative, &magnitude)) return WrongType(key, "an unsigned integer", v);
  if (negative) {
    return absl::InvalidArgumentError(absl::StrCat("metadata key '", Sv(key), "': expected a non-negative integer, found -",
                                                   magnitude));
  }
  return magnitude;
}

absl::StatusOr<int64_t> ValueAsInt(std::string_view key, const Value& v) {
  bool negative;
  uint64_t magnitude;
  if (!IntegerParts(v, &negative, &magnitude)) return WrongType(key, "an integer", v);
  if (negative) return std::get<int64_t>(v.data);
  if (magnitude > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return absl::InvalidArgumentError(
        absl::StrCat("metadata key '", Sv(key), "': ", magnitude, " does not fit in a signed 64-bit integer"));
  }
  return static_cast<int64_t>(magnitude);
}

absl::StatusOr<double> ValueAsFloat(std::string_view key, const Value& v) {
  if (IsFloatType(v.type)) {
    const double* d = std::get_if<double>(&v.data);
    if (d != nullptr) return *d;
    return WrongType(key, "a number", v);
  }
  bool negative;
  uint64_t magnitude;
  if (!IntegerParts(v, &negative, &magnitude)) return WrongType(key, "a number", v);
  const double m = static_cast<double>(magnitude);
  return negative ? -m : m;
}

const Array* AsArray(const Value& v) {
  if (v.type != ValueType::kArray) return nullptr;
  return std::get_if<Array>(&v.data);
}

}  // namespace

uint64_t MinEncodedBytes(ValueType type) {
  switch (type) {
    case ValueType::kUint8:
    case ValueType::kInt8:
    case ValueType::kBool:
      return 1;
    case ValueType::kUint16:
    case ValueType::kInt16:
      return 2;
    case ValueType::kUint32:
    case ValueType::kInt32:
    case ValueType::kFloat32:
      return 4;
    case ValueType::kUint64:
    case ValueType::kInt64:
    case ValueType::kFloat64:
    case ValueType::kString:
      return 8;
    case ValueType::kArray:
      return 4 + 8;
  }
  return 1;
}

std::string_view ValueTypeName(ValueType type) {
  switch (type) {
    case ValueType::kUint8: return "uint8";
    case ValueType::kInt8: return "int8";
    case ValueType::kUint16: return "uint16";
    case ValueType::kInt16: return "int16";
    case ValueType::kUint32: return "uint32";
    case ValueType::kInt32: return "int32";
    case ValueType::kFloat32: return "float32";
    case ValueType::kBool: return "bool";
    case ValueType::kString: return "string";
    case ValueType::kArray: return "array";
    case ValueType::kUint64: return "uint64";
    case ValueType::kInt64: return "int64";
    case ValueType::kFloat64: return "float64";
  }
  return "unknown type";
}

void Metadata::Add(std::string key, Value value) {
  auto it = index_.find(Sv(key));
  if (it != index_.end()) {
    entries_[it->second].second = std::move(value);
    return;
  }
  index_.emplace(key, entries_.size());
  entries_.emplace_back(std::move(key), std::move(value));
}

const Value* Metadata::Find(std::string_view key) const {
  auto it = index_.find(Sv(key));
  return it == index_.end() ? nullptr : &entries_[it->second].second;
}

absl::StatusOr<std::string> Metadata::GetString(std::string_view key) const {
  const Value* v = Find(key);
  if (v == nullptr) return Missing(key);
  const std::string* s = v->type == ValueType::kString ? std::get_if<std::string>(&v->data) : nullptr;
  if (s == nullptr) return WrongType(key, "string", *v);
  return *s;
}

absl::StatusOr<uint64_t> Metadata::GetUint(std::string_view key) const {
  const Value* v = Find(key);
  if (v == nullptr) return Missing(key);
  return ValueAsUint(key, *v);
}

absl::StatusOr<int64_t> Metadata::GetInt(std::string_view key) const {
  const Value* v = Find(key);
  if (v == nullptr) return Missing(key);
  return ValueAsInt(key, *v);
}

absl::StatusOr<double> Metadata::GetFloat(std::string_view key) const {
  const Value* v = Find(key);
  if (v == nullptr) return Missing(key);
  return ValueAsFloat(key, *v);
}

absl::StatusOr<bool> Metadata::GetBool(std::string_view key) const {
  const Value* v = Find(key);
  if (v == nullptr) return Missing(key);
  const bool* b = v->type == ValueType::kBool ? std::get_if<bool>(&v->data) : nullptr;
  if (b == nullptr) return WrongType(key, "bool", *v);
  return *b;
}

absl::StatusOr<std::vector<std::string>> Metadata::GetStringArray(std::string_view key) const {
  const Value* v = Find(key);
  if (v == nullptr) return Missing(key);
  const Array* array = AsArray(*v);
  if (array == nullptr) return WrongType(key, "array of string", *v);
  std::vector<std::string> out;
  out.reserve(array->elements.size());
  for (const Value& e : array->elements) {
    const std::string* s = e.type == ValueType::kString ? std::get_if<std::string>(&e.data) : nullptr;
    if (s == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("metadata key '", Sv(key), "': expected array of string, found array of ",
                                                     Sv(ValueTypeName(e.type))));
    }
    out.push_back(*s);
  }
  return out;
}

namespace {

// The elements of the array `v` (null: missing) under `key`, each read by `as`; a bad element is named
// key[i].
template <typename T, typename As>
absl::StatusOr<std::vector<T>> ArrayOf(std::string_view key, const Value* v, std::string_view expected, As as) {
  if (v == nullptr) return Missing(key);
  const Array* array = AsArray(*v);
  if (array == nullptr) return WrongType(key, expected, *v);
  std::vector<T> out;
  out.reserve(array->elements.size());
  for (size_t i = 0; i < array->elements.size(); ++i) {
    auto element = as(key, array->elements[i]);
    if (!element.ok()) return as(absl::StrCat(Sv(key), "[", i, "]"), array->elements[i]).status();
    out.push_back(static_cast<T>(*element));
  }
  return out;
}

}  // namespace

absl::StatusOr<std::vector<float>> Metadata::GetFloatArray(std::string_view key) const {
  return ArrayOf<float>(key, Find(key), "array of numbers", ValueAsFloat);
}

absl::StatusOr<std::vector<int64_t>> Metadata::GetIntArray(std::string_view key) const {
  return ArrayOf<int64_t>(key, Find(key), "array of integers", ValueAsInt);
}

absl::StatusOr<uint64_t> Metadata::GetUintOr(std::string_view key, uint64_t fallback) const {
  const Value* v = Find(key);
  if (v == nullptr) return fallback;
  return ValueAsUint(key, *v);
}

absl::StatusOr<double> Metadata::GetFloatOr(std::string_view key, double fallback) const {
  const Value* v = Find(key);
  if (v == nullptr) return fallback;
  return ValueAsFloat(key, *v);
}

absl::StatusOr<bool> Metadata::GetBoolOr(std::string_view key, bool fallback) const {
  if (Find(key) == nullptr) return fallback;
  return GetBool(key);
}

}  // namespace strata::gguf
