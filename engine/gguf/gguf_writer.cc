#include "engine/gguf/gguf_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/status_macros.h"

namespace strata::gguf {
namespace {

constexpr uint32_t kVersion = 3;
constexpr uint64_t kDefaultAlignment = 32;
constexpr std::string_view kAlignmentKey = "general.alignment";
// ggml keeps tensor names in a 64-byte buffer with a terminating NUL.
constexpr size_t kMaxNameBytes = 63;
constexpr int kMaxDims = 4;

std::string TypeNameOf(ValueType t) { return std::string(ValueTypeName(t)); }

uint64_t Pad(uint64_t n, uint64_t alignment) { return (alignment - n % alignment) % alignment; }

// Checks that `v` holds the variant alternative its type calls for, in range for the stored width, and
// that array elements all have the declared element type.
absl::Status ValidateValue(const Value& v, const std::string& context) {
  auto fail = [&](absl::string_view detail) {
    return absl::InvalidArgumentError(absl::StrCat(context, ": ", detail));
  };
  auto check_uint = [&](uint64_t max) -> absl::Status {
    const uint64_t* u = std::get_if<uint64_t>(&v.data);
    if (u == nullptr) return fail(absl::StrCat(TypeNameOf(v.type), " value does not hold an unsigned integer"));
    if (*u > max) return fail(absl::StrCat(*u, " does not fit in ", TypeNameOf(v.type)));
    return absl::OkStatus();
  };
  auto check_int = [&](int64_t min, int64_t max) -> absl::Status {
    const int64_t* s = std::get_if<int64_t>(&v.data);
    if (s == nullptr) return fail(absl::StrCat(TypeNameOf(v.type), " value does not hold a signed integer"));
    if (*s < min || *s > max) return fail(absl::StrCat(*s, " does not fit in ", TypeNameOf(v.type)));
    return absl::OkStatus();
  };
  switch (v.type) {
    case ValueType::kUint8: return check_uint(0xff);
    case ValueType::kUint16: return check_uint(0xffff);
    case ValueType::kUint32: return check_uint(0xffffffff);
    case ValueType::kUint64: return check_uint(std::numeric_limits<uint64_t>::max());
    case ValueType::kInt8: return check_int(-128, 127);
    case ValueType::kInt16: return check_int(-32768, 32767);
    case ValueType::kInt32: return check_int(std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max());
    case ValueType::kInt64: return check_int(std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max());
    case ValueType::kFloat32:
    case ValueType::kFloat64:
      return std::holds_alternative<double>(v.data) ? absl::OkStatus() : fail("float value does not hold a double");
    case ValueType::kBool:
      return std::holds_alternative<bool>(v.data) ? absl::OkStatus() : fail("bool value does not hold a bool");
    case ValueType::kString:
      return std::holds_alternative<std::string>(v.data) ? absl::OkStatus() : fail("string value does not hold a string");
    case ValueType::kArray: {
      const Array* array = std::get_if<Array>(&v.data);
      if (array == nullptr) return fail("array value does not hold an array");
      for (size_t i = 0; i < array->elements.size(); ++i) {
        const Value& e = array->elements[i];
        const std::string element_context = absl::StrCat(context, "[", i, "]");
        if (e.type != array->element_type) {
          return absl::InvalidArgumentError(absl::StrCat(element_context, ": element is ", TypeNameOf(e.type),
                                                         " in an array of ", TypeNameOf(array->element_type)));
        }
        RETURN_IF_ERROR(ValidateValue(e, element_context));
      }
      return absl::OkStatus();
    }
  }
  return fail(absl::StrCat("unknown value type id ", static_cast<uint32_t>(v.type)));
}

// Little-endian serialization into a growing buffer.
class Encoder {
 public:
  template <typename T>
  void Put(T v) {
    char raw[sizeof(T)];
    std::memcpy(raw, &v, sizeof(T));
    out_.append(raw, sizeof(T));
  }
  void PutString(std::string_view s) {
    Put<uint64_t>(s.size());
    out_.append(s);
  }
  // Writes the payload of `v` (no type tag), which ValidateValue has accepted.
  void PutValue(const Value& v) {
    switch (v.type) {
      case ValueType::kUint8: Put(static_cast<uint8_t>(std::get<uint64_t>(v.data))); return;
      case ValueType::kUint16: Put(static_cast<uint16_t>(std::get<uint64_t>(v.data))); return;
      case ValueType::kUint32: Put(static_cast<uint32_t>(std::get<uint64_t>(v.data))); return;
      case ValueType::kUint64: Put(std::get<uint64_t>(v.data)); return;
      case ValueType::kInt8: Put(static_cast<int8_t>(std::get<int64_t>(v.data))); return;
      case ValueType::kInt16: Put(static_cast<int16_t>(std::get<int64_t>(v.data))); return;
      case ValueType::kInt32: Put(static_cast<int32_t>(std::get<int64_t>(v.data))); return;
      case ValueType::kInt64: Put(std::get<int64_t>(v.data)); return;
      case ValueType::kFloat32: Put(static_cast<float>(std::get<double>(v.data))); return;
      case ValueType::kFloat64: Put(std::get<double>(v.data)); return;
      case ValueType::kBool: Put<uint8_t>(std::get<bool>(v.data) ? 1 : 0); return;
      case ValueType::kString: PutString(std::get<std::string>(v.data)); return;
      case ValueType::kArray: {
        const Array& array = std::get<Array>(v.data);
        Put(static_cast<uint32_t>(array.element_type));
        Put<uint64_t>(array.elements.size());
        for (const Value& e : array.elements) PutValue(e);
        return;
      }
    }
  }
  std::string& bytes() { return out_; }

 private:
  std::string out_;
};

// Bytes PutValue writes for `v` (without the type tag).
uint64_t EncodedBytes(const Value& v) {
  uint64_t size = MinEncodedBytes(v.type);
  if (const std::string* s = std::get_if<std::string>(&v.data); v.type == ValueType::kString && s != nullptr) {
    size += s->size();
  }
  if (const Array* array = std::get_if<Array>(&v.data); v.type == ValueType::kArray && array != nullptr) {
    for (const Value& e : array->elements) size += EncodedBytes(e);
  }
  return size;
}

absl::Status WriteAll(int fd, const void* data, size_t size) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd, p, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::InternalError(absl::StrCat("write failed: ", std::strerror(errno)));
    }
    p += n;
    size -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::Status WritePadding(int fd, uint64_t n) {
  static const char kZeros[256] = {};
  while (n > 0) {
    const size_t chunk = std::min<uint64_t>(n, sizeof(kZeros));
    RETURN_IF_ERROR(WriteAll(fd, kZeros, chunk));
    n -= chunk;
  }
  return absl::OkStatus();
}

}  // namespace

GgufWriter::GgufWriter(uint64_t alignment) : alignment_(alignment) {}

void GgufWriter::Set(std::string key, Value value) { metadata_.Add(std::move(key), std::move(value)); }

void GgufWriter::SetStringArray(std::string key, const std::vector<std::string>& v) {
  std::vector<Value> elements;
  elements.reserve(v.size());
  for (const std::string& s : v) elements.push_back(Value::String(s));
  Set(std::move(key), Value::MakeArray(ValueType::kString, std::move(elements)));
}

void GgufWriter::SetFloat32Array(std::string key, const std::vector<float>& v) {
  std::vector<Value> elements;
  elements.reserve(v.size());
  for (float f : v) elements.push_back(Value::Float32(f));
  Set(std::move(key), Value::MakeArray(ValueType::kFloat32, std::move(elements)));
}

void GgufWriter::SetInt32Array(std::string key, const std::vector<int32_t>& v) {
  std::vector<Value> elements;
  elements.reserve(v.size());
  for (int32_t i : v) elements.push_back(Value::Int32(i));
  Set(std::move(key), Value::MakeArray(ValueType::kInt32, std::move(elements)));
}

absl::Status GgufWriter::AddTensor(std::string name, GgmlType type, std::vector<int64_t> ne, TensorFiller fill) {
  const std::string context = absl::StrCat("tensor '", name, "'");
  auto fail = [&](absl::string_view detail) { return absl::InvalidArgumentError(absl::StrCat(context, ": ", detail)); };
  if (name.empty()) return absl::InvalidArgumentError("tensor name is empty");
  if (name.size() > kMaxNameBytes) {
    return fail(absl::StrFormat("name is %d bytes, ggml allows at most %d", name.size(), kMaxNameBytes));
  }
  for (const PendingTensor& t : tensors_) {
    if (t.name == name) return fail("already added");
  }
  if (ne.empty() || ne.size() > kMaxDims) {
    return fail(absl::StrFormat("has %d dimensions, expected 1 to %d", ne.size(), kMaxDims));
  }
  for (size_t d = 0; d < ne.size(); ++d) {
    if (ne[d] <= 0) return fail(absl::StrFormat("ne[%d] is %d, expected a positive size", d, ne[d]));
  }
  absl::StatusOr<GgmlTypeInfo> info = LookupType(static_cast<uint32_t>(type));
  if (!info.ok()) return fail(info.status().message());
  absl::StatusOr<uint64_t> bytes = TensorBytes(type, ne);
  if (!bytes.ok()) return fail(absl::StrCat("type ", std::string(info->name), ": ", bytes.status().message()));
  if (!fill) return fail("no filler");
  tensors_.push_back(PendingTensor{std::move(name), type, std::move(ne), *bytes, std::move(fill)});
  return absl::OkStatus();
}

absl::Status GgufWriter::AddTensorData(std::string name, GgmlType type, std::vector<int64_t> ne,
                                       std::span<const uint8_t> data) {
  absl::StatusOr<uint64_t> bytes = TensorBytes(type, ne);
  if (bytes.ok() && *bytes != data.size()) {
    return absl::InvalidArgumentError(absl::StrFormat("tensor '%s': %d bytes given, a %s tensor of this shape takes %d",
                                                      name, data.size(), TypeName(static_cast<uint32_t>(type)), *bytes));
  }
  return AddTensor(std::move(name), type, std::move(ne), [data](std::span<uint8_t> dst) {
    std::memcpy(dst.data(), data.data(), dst.size());
    return absl::OkStatus();
  });
}

uint64_t GgufWriter::PlannedFileSize() const {
  uint64_t size = 4 + 4 + 8 + 8;
  for (const auto& [key, value] : metadata_.entries()) {
    size += 8 + key.size() + 4 + (key == kAlignmentKey ? 4 : EncodedBytes(value));
  }
  if (alignment_ != kDefaultAlignment && !metadata_.Has(kAlignmentKey)) size += 8 + kAlignmentKey.size() + 4 + 4;
  for (const PendingTensor& t : tensors_) size += 8 + t.name.size() + 4 + 8 * t.ne.size() + 4 + 8;
  const uint64_t alignment = alignment_ == 0 ? 1 : alignment_;
  size += Pad(size, alignment);
  for (const PendingTensor& t : tensors_) size += t.bytes + Pad(t.bytes, alignment);
  return size;
}

absl::Status GgufWriter::WriteFile(const std::string& path) {
  auto fail = [&](const absl::Status& s) { return WithContext(s, path); };
  if (alignment_ == 0 || (alignment_ & (alignment_ - 1)) != 0 || alignment_ > 0x80000000u) {
    return fail(absl::InvalidArgumentError(
        absl::StrFormat("alignment %d is not a power of two between 1 and 2^31", alignment_)));
  }
  for (const auto& [key, value] : metadata_.entries()) {
    if (key == kAlignmentKey) continue;  // written from alignment_
    absl::Status status = ValidateValue(value, absl::StrCat("metadata key '", key, "'"));
    if (!status.ok()) return fail(status);
  }

  const bool append_alignment = alignment_ != kDefaultAlignment && !metadata_.Has(kAlignmentKey);
  Encoder header;
  header.Put<uint32_t>(0x46554747);  // "GGUF"
  header.Put<uint32_t>(kVersion);
  header.Put<uint64_t>(tensors_.size());
  header.Put<uint64_t>(metadata_.entries().size() + (append_alignment ? 1 : 0));
  const Value alignment_value = Value::Uint32(static_cast<uint32_t>(alignment_));
  for (const auto& [key, value] : metadata_.entries()) {
    const Value& written = key == kAlignmentKey ? alignment_value : value;
    header.PutString(key);
    header.Put(static_cast<uint32_t>(written.type));
    header.PutValue(written);
  }
  if (append_alignment) {
    header.PutString(kAlignmentKey);
    header.Put(static_cast<uint32_t>(ValueType::kUint32));
    header.PutValue(alignment_value);
  }
  uint64_t offset = 0;
  for (const PendingTensor& t : tensors_) {
    header.PutString(t.name);
    header.Put<uint32_t>(static_cast<uint32_t>(t.ne.size()));
    for (int64_t d : t.ne) header.Put(d);
    header.Put(static_cast<uint32_t>(t.type));
    header.Put(offset);
    offset += t.bytes + Pad(t.bytes, alignment_);
  }
  header.bytes().append(Pad(header.bytes().size(), alignment_), '\0');

  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return fail(absl::InternalError(absl::StrCat("cannot create: ", std::strerror(errno))));
  auto abandon = [&](const absl::Status& s) {
    ::close(fd);
    ::unlink(path.c_str());
    return fail(s);
  };
  absl::Status status = WriteAll(fd, header.bytes().data(), header.bytes().size());
  if (!status.ok()) return abandon(status);
  header.bytes().clear();
  header.bytes().shrink_to_fit();

  std::vector<uint8_t> buffer;
  for (const PendingTensor& t : tensors_) {
    buffer.assign(t.bytes, 0);
    status = t.fill(std::span<uint8_t>(buffer));
    if (status.ok()) status = WriteAll(fd, buffer.data(), buffer.size());
    if (status.ok()) status = WritePadding(fd, Pad(t.bytes, alignment_));
    if (!status.ok()) {
      return abandon(WithContext(status, absl::StrCat("tensor '", t.name, "'")));
    }
  }
  if (::close(fd) != 0) {
    const int err = errno;
    ::unlink(path.c_str());
    return fail(absl::InternalError(absl::StrCat("close failed: ", std::strerror(err))));
  }
  return absl::OkStatus();
}

}  // namespace strata::gguf
