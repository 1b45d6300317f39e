#include "engine/gguf/gguf_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "engine/status_macros.h"

namespace strata::gguf {
namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian uint32
constexpr uint64_t kDefaultAlignment = 32;
constexpr int kMaxDims = 4;
// Arrays of arrays are allowed; this bounds the recursion a hostile file can cause.
constexpr int kMaxArrayDepth = 8;
// Array elements a file may hold in all. Each is held as a Value (tens of bytes, against 1-8 in the file),
// so a corrupted count must not turn a multi-GB file into a many-times larger allocation; real files hold
// a few million at most (vocabulary, scores, types, merges).
constexpr uint64_t kMaxArrayElements = uint64_t{1} << 24;
// Fewest bytes a metadata entry (key length, empty key, type, one-byte value) and a tensor info (name
// length, empty name, n_dims, one dimension, type, offset) can occupy: counts are checked against them
// before anything is allocated.
constexpr uint64_t kMinEntryBytes = 8 + 4 + 1;
constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 8 + 4 + 8;

// A key or tensor name as it appears in an error: quoted, escaped and shortened, since a damaged file
// can hold binary or megabyte-long "names".
std::string Quoted(const std::string& s) {
  constexpr size_t kMaxShown = 80;
  const absl::string_view shown(s.data(), std::min(s.size(), kMaxShown));
  std::string out = absl::StrCat("'", absl::CHexEscape(shown), "'");
  if (s.size() > kMaxShown) absl::StrAppend(&out, "... (", s.size(), " bytes)");
  return out;
}

// Bounds-checked little-endian reads from the file image.
class Cursor {
 public:
  explicit Cursor(std::span<const uint8_t> bytes) : bytes_(bytes) {}

  uint64_t offset() const { return pos_; }
  uint64_t remaining() const { return bytes_.size() - pos_; }

  // Takes `count` elements from the file's budget of array elements; false once it is spent.
  bool TakeArrayElements(uint64_t count) {
    if (count > array_elements_left_) return false;
    array_elements_left_ -= count;
    return true;
  }

  template <typename T>
  absl::Status Read(T* out) {
    if (remaining() < sizeof(T)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "needs %d bytes at offset %d but the file ends at %d", sizeof(T), pos_, bytes_.size()));
    }
    std::memcpy(out, bytes_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return absl::OkStatus();
  }

  absl::Status ReadString(std::string* out) {
    const uint64_t at = pos_;
    uint64_t length = 0;
    RETURN_IF_ERROR(WithContext(Read(&length), "string length"));
    if (length > remaining()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "string length %d at offset %d exceeds the %d bytes left in the file", length, at, remaining()));
    }
    out->assign(reinterpret_cast<const char*>(bytes_.data() + pos_), length);
    pos_ += length;
    return absl::OkStatus();
  }

 private:
  std::span<const uint8_t> bytes_;
  uint64_t pos_ = 0;
  uint64_t array_elements_left_ = kMaxArrayElements;
};

absl::StatusOr<ValueType> ReadValueType(Cursor& cursor) {
  const uint64_t at = cursor.offset();
  uint32_t id = 0;
  RETURN_IF_ERROR(WithContext(cursor.Read(&id), "value type"));
  if (id > static_cast<uint32_t>(ValueType::kFloat64)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("value type id %d at offset %d is not a GGUF type (expected 0 to 12)", id, at));
  }
  return static_cast<ValueType>(id);
}

template <typename Stored, typename Widened>
absl::Status ReadScalar(Cursor& cursor, ValueType type, Value* out) {
  Stored v{};
  RETURN_IF_ERROR(cursor.Read(&v));
  out->type = type;
  out->data = static_cast<Widened>(v);
  return absl::OkStatus();
}

absl::Status ReadValue(Cursor& cursor, ValueType type, int depth, Value* out);

absl::Status ReadArray(Cursor& cursor, int depth, Value* out) {
  absl::StatusOr<ValueType> element_type = ReadValueType(cursor);
  if (!element_type.ok()) return WithContext(element_type.status(), "array element type");
  if (*element_type == ValueType::kArray && depth + 1 >= kMaxArrayDepth) {
    return absl::InvalidArgumentError(
        absl::StrFormat("arrays nest deeper than %d levels at offset %d", kMaxArrayDepth, cursor.offset()));
  }
  const uint64_t at = cursor.offset();
  uint64_t count = 0;
  RETURN_IF_ERROR(WithContext(cursor.Read(&count), "array length"));
  const uint64_t min_bytes = MinEncodedBytes(*element_type);
  if (count > cursor.remaining() / min_bytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "array length %d at offset %d cannot fit: %s elements take at least %d bytes each and %d bytes are left",
        count, at, ValueTypeName(*element_type), min_bytes, cursor.remaining()));
  }
  if (!cursor.TakeArrayElements(count)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "array length %d at offset %d takes the file past %d array elements in all", count, at, kMaxArrayElements));
  }
  Array array;
  array.element_type = *element_type;
  // Values are far larger than their encodings; grow with what is actually read.
  array.elements.reserve(std::min<uint64_t>(count, 4096));
  for (uint64_t i = 0; i < count; ++i) {
    Value element;
    absl::Status status = ReadValue(cursor, *element_type, depth + 1, &element);
    if (!status.ok()) return WithContext(status, absl::StrCat("element ", i));
    array.elements.push_back(std::move(element));
  }
  out->type = ValueType::kArray;
  out->data = std::move(array);
  return absl::OkStatus();
}

absl::Status ReadValue(Cursor& cursor, ValueType type, int depth, Value* out) {
  switch (type) {
    case ValueType::kUint8: return ReadScalar<uint8_t, uint64_t>(cursor, type, out);
    case ValueType::kInt8: return ReadScalar<int8_t, int64_t>(cursor, type, out);
    case ValueType::kUint16: return ReadScalar<uint16_t, uint64_t>(cursor, type, out);
    case ValueType::kInt16: return ReadScalar<int16_t, int64_t>(cursor, type, out);
    case ValueType::kUint32: return ReadScalar<uint32_t, uint64_t>(cursor, type, out);
    case ValueType::kInt32: return ReadScalar<int32_t, int64_t>(cursor, type, out);
    case ValueType::kUint64: return ReadScalar<uint64_t, uint64_t>(cursor, type, out);
    case ValueType::kInt64: return ReadScalar<int64_t, int64_t>(cursor, type, out);
    case ValueType::kFloat32: return ReadScalar<float, double>(cursor, type, out);
    case ValueType::kFloat64: return ReadScalar<double, double>(cursor, type, out);
    case ValueType::kBool: {
      uint8_t v = 0;
      RETURN_IF_ERROR(cursor.Read(&v));
      *out = Value::Bool(v != 0);
      return absl::OkStatus();
    }
    case ValueType::kString: {
      std::string s;
      RETURN_IF_ERROR(cursor.ReadString(&s));
      *out = Value::String(std::move(s));
      return absl::OkStatus();
    }
    case ValueType::kArray:
      return ReadArray(cursor, depth, out);
  }
  return absl::InvalidArgumentError("unknown value type");
}

std::string ShapeString(const std::vector<int64_t>& ne) { return absl::StrCat("[", absl::StrJoin(ne, ", "), "]"); }

// Everything the header holds, validated against the file size.
struct Header {
  uint32_t version = 0;
  uint64_t alignment = kDefaultAlignment;
  uint64_t data_offset = 0;
  Metadata metadata;
  std::vector<TensorInfo> tensors;
  absl::flat_hash_map<std::string, size_t> tensor_index;
};

absl::Status ReadPreamble(Cursor& cursor, uint64_t file_size, Header* h, uint64_t* n_tensors, uint64_t* n_kv) {
  uint32_t magic = 0;
  if (file_size < 4) {
    return absl::InvalidArgumentError(absl::StrFormat("file is %d bytes, too short for the GGUF magic", file_size));
  }
  RETURN_IF_ERROR(cursor.Read(&magic));
  if (magic != kMagic) {
    return absl::InvalidArgumentError(
        absl::StrFormat("bad magic 0x%08x, expected 0x%08x (\"GGUF\"); not a GGUF file", magic, kMagic));
  }
  RETURN_IF_ERROR(WithContext(cursor.Read(&h->version), "version"));
  if (h->version != 2 && h->version != 3) {
    const uint32_t swapped = __builtin_bswap32(h->version);
    if (swapped == 2 || swapped == 3) {
      return absl::UnimplementedError(
          absl::StrFormat("GGUF version field reads %d: a big-endian file, which Strata cannot read", h->version));
    }
    return absl::UnimplementedError(
        absl::StrFormat("GGUF version %d is not supported (Strata reads versions 2 and 3)", h->version));
  }
  RETURN_IF_ERROR(WithContext(cursor.Read(n_tensors), "tensor count"));
  RETURN_IF_ERROR(WithContext(cursor.Read(n_kv), "metadata count"));
  if (*n_kv > cursor.remaining() / kMinEntryBytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "metadata count %d cannot fit: each entry takes at least %d bytes and %d bytes follow the header",
        *n_kv, kMinEntryBytes, cursor.remaining()));
  }
  if (*n_tensors > cursor.remaining() / kMinTensorInfoBytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "tensor count %d cannot fit: each tensor info takes at least %d bytes and %d bytes follow the header",
        *n_tensors, kMinTensorInfoBytes, cursor.remaining()));
  }
  return absl::OkStatus();
}

absl::Status ReadMetadata(Cursor& cursor, uint64_t n_kv, Header* h) {
  for (uint64_t i = 0; i < n_kv; ++i) {
    std::string key;
    RETURN_IF_ERROR(WithContext(cursor.ReadString(&key), absl::StrCat("metadata entry ", i, " key")));
    const std::string context = absl::StrCat("metadata entry ", i, " ", Quoted(key));
    if (h->metadata.Has(key)) return absl::InvalidArgumentError(absl::StrCat(context, ": duplicate key"));
    absl::StatusOr<ValueType> type = ReadValueType(cursor);
    if (!type.ok()) return WithContext(type.status(), context);
    Value value;
    RETURN_IF_ERROR(WithContext(ReadValue(cursor, *type, 0, &value), context));
    h->metadata.Add(std::move(key), std::move(value));
  }
  ASSIGN_OR_RETURN(h->alignment, h->metadata.GetUintOr("general.alignment", kDefaultAlignment));
  if (h->alignment == 0 || (h->alignment & (h->alignment - 1)) != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("general.alignment is %d, expected a non-zero power of two", h->alignment));
  }
  return absl::OkStatus();
}

absl::Status ReadTensorInfo(Cursor& cursor, uint64_t index, Header* h) {
  TensorInfo t;
  RETURN_IF_ERROR(WithContext(cursor.ReadString(&t.name), absl::StrCat("tensor ", index, " name")));
  const std::string context = absl::StrCat("tensor ", index, " ", Quoted(t.name));
  auto fail = [&](absl::string_view detail) { return absl::InvalidArgumentError(absl::StrCat(context, ": ", detail)); };
  uint32_t n_dims = 0;
  RETURN_IF_ERROR(WithContext(cursor.Read(&n_dims), absl::StrCat(context, ": n_dims")));
  if (n_dims == 0 || n_dims > kMaxDims) {
    return fail(absl::StrFormat("has %d dimensions, expected 1 to %d", n_dims, kMaxDims));
  }
  t.ne.resize(n_dims);
  for (uint32_t d = 0; d < n_dims; ++d) {
    RETURN_IF_ERROR(WithContext(cursor.Read(&t.ne[d]), absl::StrCat(context, ": ne[", d, "]")));
    if (t.ne[d] <= 0) return fail(absl::StrFormat("ne[%d] is %d, expected a positive size", d, t.ne[d]));
  }
  uint32_t type_id = 0;
  RETURN_IF_ERROR(WithContext(cursor.Read(&type_id), absl::StrCat(context, ": type")));
  absl::StatusOr<GgmlTypeInfo> info = LookupType(type_id);
  if (!info.ok()) return fail(absl::StrFormat("type id %d is not a ggml type", type_id));
  t.type = static_cast<GgmlType>(type_id);
  RETURN_IF_ERROR(WithContext(cursor.Read(&t.offset), absl::StrCat(context, ": offset")));
  absl::StatusOr<uint64_t> bytes = TensorBytes(t.type, t.ne);
  if (!bytes.ok()) {
    return fail(absl::StrCat("shape ", ShapeString(t.ne), " of type ", std::string(info->name), ": ", bytes.status().message()));
  }
  t.bytes = *bytes;
  auto [it, inserted] = h->tensor_index.emplace(t.name, h->tensors.size());
  if (!inserted) return fail(absl::StrCat("duplicate name (also tensor ", it->second, ")"));
  h->tensors.push_back(std::move(t));
  return absl::OkStatus();
}

// Places the data section and checks each tensor lies inside it at an aligned offset.
absl::Status PlaceTensors(uint64_t header_end, std::span<const uint8_t> bytes, Header* h) {
  const uint64_t padding = (h->alignment - header_end % h->alignment) % h->alignment;
  h->data_offset = header_end + padding;
  if (h->tensors.empty()) return absl::OkStatus();
  if (h->data_offset > bytes.size()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the data section would start at offset %d (header end %d aligned to %d), past the end of the %d-byte file",
        h->data_offset, header_end, h->alignment, bytes.size()));
  }
  const uint64_t data_size = bytes.size() - h->data_offset;
  for (size_t i = 0; i < h->tensors.size(); ++i) {
    TensorInfo& t = h->tensors[i];
    if (t.offset % h->alignment != 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "tensor %d %s: offset %d is not a multiple of the alignment %d", i, Quoted(t.name), t.offset, h->alignment));
    }
    if (t.offset > data_size || t.bytes > data_size - t.offset) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "tensor %d %s: offset %d + %d bytes runs past the end of the %d-byte data section (file offset %d)", i,
          Quoted(t.name), t.offset, t.bytes, data_size, h->data_offset));
    }
    t.data = bytes.data() + h->data_offset + t.offset;
  }
  // Tensors must not share bytes: a corrupted offset that lands on another tensor would otherwise read
  // that tensor's data without complaint.
  std::vector<size_t> by_offset(h->tensors.size());
  for (size_t i = 0; i < by_offset.size(); ++i) by_offset[i] = i;
  std::sort(by_offset.begin(), by_offset.end(),
            [h](size_t a, size_t b) { return h->tensors[a].offset < h->tensors[b].offset; });
  for (size_t k = 1; k < by_offset.size(); ++k) {
    const TensorInfo& prev = h->tensors[by_offset[k - 1]];
    const TensorInfo& t = h->tensors[by_offset[k]];
    if (t.offset < prev.offset + prev.bytes) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "tensor %d %s at offset %d overlaps tensor %d %s (offset %d, %d bytes)", by_offset[k], Quoted(t.name),
          t.offset, by_offset[k - 1], Quoted(prev.name), prev.offset, prev.bytes));
    }
  }
  return absl::OkStatus();
}

absl::Status ParseHeader(std::span<const uint8_t> bytes, Header* h) {
  Cursor cursor(bytes);
  uint64_t n_tensors = 0, n_kv = 0;
  RETURN_IF_ERROR(ReadPreamble(cursor, bytes.size(), h, &n_tensors, &n_kv));
  RETURN_IF_ERROR(ReadMetadata(cursor, n_kv, h));
  for (uint64_t i = 0; i < n_tensors; ++i) RETURN_IF_ERROR(ReadTensorInfo(cursor, i, h));
  return PlaceTensors(cursor.offset(), bytes, h);
}

absl::Status ErrnoError(const std::string& path, absl::string_view what, int err) {
  const std::string message = absl::StrCat(path, ": ", what, ": ", std::strerror(err));
  if (err == ENOENT || err == ENOTDIR) return absl::NotFoundError(message);
  if (err == EACCES || err == EPERM) return absl::PermissionDeniedError(message);
  return absl::InternalError(message);
}

}  // namespace

int64_t TensorInfo::n_elements() const {
  int64_t n = 1;
  for (int64_t d : ne) n *= d;  // validated at parse time not to overflow
  return n;
}

int64_t TensorInfo::n_rows() const {
  int64_t n = 1;
  for (size_t i = 1; i < ne.size(); ++i) n *= ne[i];
  return n;
}

absl::StatusOr<std::unique_ptr<GgufFile>> GgufFile::Parse(std::string name, std::span<const uint8_t> bytes) {
  Header h;
  absl::Status status = ParseHeader(bytes, &h);
  if (!status.ok()) return WithContext(status, name);
  std::unique_ptr<GgufFile> file(new GgufFile());
  file->path_ = std::move(name);
  file->version_ = h.version;
  file->alignment_ = h.alignment;
  file->data_offset_ = h.data_offset;
  file->metadata_ = std::move(h.metadata);
  file->tensors_ = std::move(h.tensors);
  file->tensor_index_ = std::move(h.tensor_index);
  file->bytes_ = bytes;
  return file;
}

absl::StatusOr<std::unique_ptr<GgufFile>> GgufFile::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError(path, "cannot open", errno);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return ErrnoError(path, "cannot stat", err);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));
  }
  const size_t size = static_cast<size_t>(st.st_size);
  void* map = nullptr;
  if (size > 0) {
    map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      return ErrnoError(path, "cannot map", err);
    }
  }
  ::close(fd);  // the mapping keeps the file alive
  std::span<const uint8_t> bytes(static_cast<const uint8_t*>(map), size);
  absl::StatusOr<std::unique_ptr<GgufFile>> file = Parse(path, bytes);
  if (!file.ok()) {
    if (map != nullptr) ::munmap(map, size);
    return file.status();
  }
  (*file)->map_ = map;
  (*file)->map_size_ = size;
  return file;
}

GgufFile::~GgufFile() {
  if (map_ != nullptr) ::munmap(map_, map_size_);
}

const TensorInfo* GgufFile::FindTensor(std::string_view name) const {
  auto it = tensor_index_.find(absl::string_view(name.data(), name.size()));
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

absl::Status CheckDecodable(const TensorInfo& tensor) {
  absl::StatusOr<GgmlTypeInfo> info = GetTypeInfo(static_cast<uint32_t>(tensor.type));
  if (info.ok()) return absl::OkStatus();
  return absl::Status(info.status().code(),
                      absl::StrCat("tensor '", tensor.name, "' has type ", TypeName(static_cast<uint32_t>(tensor.type)),
                                   ", which Strata cannot decode"));
}

absl::StatusOr<std::vector<float>> DequantizeTensor(const TensorInfo& tensor) {
  RETURN_IF_ERROR(CheckDecodable(tensor));
  if (tensor.data == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("tensor '", tensor.name, "' has no data mapped"));
  }
  std::vector<float> out(static_cast<size_t>(tensor.n_elements()));
  RETURN_IF_ERROR(WithContext(Dequantize(tensor.type, tensor.data, out.data(), tensor.n_elements()),
                           absl::StrCat("tensor '", tensor.name, "'")));
  return out;
}

}  // namespace strata::gguf
