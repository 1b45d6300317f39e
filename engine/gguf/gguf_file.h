#ifndef STRATA_ENGINE_GGUF_GGUF_FILE_H_
#define STRATA_ENGINE_GGUF_GGUF_FILE_H_

// Read-only access to GGUF files (v2 and v3) and split models.
//
// GgufFile maps one file and validates its whole header at Open: every length, count, offset and tensor
// size is checked against the file before anything is exposed, so a GgufFile that opened can be read
// without further bounds checks. GgufModel joins the shards of a split model. Both are immutable after
// creation and safe to read from any number of threads.

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/gguf/ggml_types.h"

namespace strata::gguf {

// GGUF metadata value types, with GGUF's numeric ids.
enum class ValueType : uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};

std::string_view ValueTypeName(ValueType type);

// Fewest bytes one value of `type` takes in a file (without its type tag): a scalar's size, 8 for a
// string (its length, before the bytes) and 12 for an array (element type and count, before the elements).
uint64_t MinEncodedBytes(ValueType type);

struct Value;

// An array value: all elements share `element_type` (which may itself be kArray).
struct Array {
  ValueType element_type = ValueType::kUint8;
  std::vector<Value> elements;
};

// One metadata value. Integers are held widened (signed in int64_t, unsigned in uint64_t) with `type`
// recording the stored width, so a writer can reproduce the file exactly.
struct Value {
  ValueType type = ValueType::kUint8;
  std::variant<uint64_t, int64_t, double, bool, std::string, Array> data;

  static Value Uint8(uint8_t v) { return {ValueType::kUint8, uint64_t{v}}; }
  static Value Uint16(uint16_t v) { return {ValueType::kUint16, uint64_t{v}}; }
  static Value Uint32(uint32_t v) { return {ValueType::kUint32, uint64_t{v}}; }
  static Value Uint64(uint64_t v) { return {ValueType::kUint64, v}; }
  static Value Int8(int8_t v) { return {ValueType::kInt8, int64_t{v}}; }
  static Value Int16(int16_t v) { return {ValueType::kInt16, int64_t{v}}; }
  static Value Int32(int32_t v) { return {ValueType::kInt32, int64_t{v}}; }
  static Value Int64(int64_t v) { return {ValueType::kInt64, v}; }
  static Value Float32(float v) { return {ValueType::kFloat32, double{v}}; }
  static Value Float64(double v) { return {ValueType::kFloat64, v}; }
  static Value Bool(bool v) { return {ValueType::kBool, v}; }
  static Value String(std::string v) { return {ValueType::kString, std::move(v)}; }
  static Value MakeArray(ValueType element_type, std::vector<Value> elements) {
    return {ValueType::kArray, Array{element_type, std::move(elements)}};
  }
};

// Metadata in file order, with lookup by key.
class Metadata {
 public:
  void Add(std::string key, Value value);  // replaces an existing key in place
  const Value* Find(std::string_view key) const;
  bool Has(std::string_view key) const { return Find(key) != nullptr; }
  const std::vector<std::pair<std::string, Value>>& entries() const { return entries_; }

  // Typed getters. Each fails with NOT_FOUND naming the key when absent, and INVALID_ARGUMENT naming the
  // key, the expected and the actual type when the value does not fit (integers of any width convert when
  // in range; GetFloat accepts float32/float64 and integers).
  absl::StatusOr<std::string> GetString(std::string_view key) const;
  absl::StatusOr<uint64_t> GetUint(std::string_view key) const;
  absl::StatusOr<int64_t> GetInt(std::string_view key) const;
  absl::StatusOr<double> GetFloat(std::string_view key) const;
  absl::StatusOr<bool> GetBool(std::string_view key) const;
  absl::StatusOr<std::vector<std::string>> GetStringArray(std::string_view key) const;
  absl::StatusOr<std::vector<float>> GetFloatArray(std::string_view key) const;
  absl::StatusOr<std::vector<int64_t>> GetIntArray(std::string_view key) const;

  // Defaults when absent (errors only on a wrong type).
  absl::StatusOr<uint64_t> GetUintOr(std::string_view key, uint64_t fallback) const;
  absl::StatusOr<double> GetFloatOr(std::string_view key, double fallback) const;
  absl::StatusOr<bool> GetBoolOr(std::string_view key, bool fallback) const;

 private:
  std::vector<std::pair<std::string, Value>> entries_;
  absl::flat_hash_map<std::string, size_t> index_;
};

struct TensorInfo {
  std::string name;
  std::vector<int64_t> ne;  // ggml order: ne[0] is the contiguous (row) dimension
  GgmlType type = GgmlType::kF32;
  uint64_t offset = 0;      // from the start of the file's data section
  uint64_t bytes = 0;       // TensorBytes(type, ne)
  const uint8_t* data = nullptr;  // inside the mapping; valid while the owning file lives
  int shard = 0;            // index of the shard holding it (GgufModel), 0 for a single file

  int64_t n_elements() const;
  int64_t n_rows() const;   // product of ne[1..]
};

class GgufFile {
 public:
  // Maps and validates `path`. Errors name the file, the field (e.g. "tensor 'blk.0.attn_q.weight' offset")
  // and what was expected.
  static absl::StatusOr<std::unique_ptr<GgufFile>> Open(const std::string& path);

  // Parses a file image held in memory (not copied: `bytes` must outlive the result). `name` is used in
  // error messages. This is what the fuzz target drives.
  static absl::StatusOr<std::unique_ptr<GgufFile>> Parse(std::string name, std::span<const uint8_t> bytes);

  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t file_size() const { return bytes_.size(); }
  uint64_t data_offset() const { return data_offset_; }  // start of the data section in the file
  const Metadata& metadata() const { return metadata_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* FindTensor(std::string_view name) const;
  std::span<const uint8_t> bytes() const { return bytes_; }

 private:
  GgufFile() = default;

  std::string path_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  Metadata metadata_;
  std::vector<TensorInfo> tensors_;
  absl::flat_hash_map<std::string, size_t> tensor_index_;
  std::span<const uint8_t> bytes_;
  void* map_ = nullptr;  // owned mapping, or null when parsed from borrowed memory
  size_t map_size_ = 0;
};

// A model in one GGUF file or split into shards named `<base>-NNNNN-of-MMMMM.gguf`. Opening any shard
// opens all of them; `split.no`, `split.count` and `split.tensors.count` are checked (every shard present,
// tensor names unique across shards, total count right). Metadata comes from the first shard.
class GgufModel {
 public:
  static absl::StatusOr<std::unique_ptr<GgufModel>> Open(const std::string& path);

  const Metadata& metadata() const { return shards_.front()->metadata(); }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }  // shard order, then file order
  const TensorInfo* FindTensor(std::string_view name) const;
  const std::vector<std::unique_ptr<GgufFile>>& shards() const { return shards_; }
  uint64_t total_bytes() const;  // sum of the shards' file sizes

 private:
  std::vector<std::unique_ptr<GgufFile>> shards_;
  std::vector<TensorInfo> tensors_;
  absl::flat_hash_map<std::string, size_t> tensor_index_;
};

// OK when Strata can decode `tensor`'s type; otherwise UNIMPLEMENTED naming the tensor and the type
// ("tensor 'x' has type iq2_xxs, which Strata cannot decode").
absl::Status CheckDecodable(const TensorInfo& tensor);

// The whole tensor decoded to f32 (n_elements() values, ggml order). Errors as CheckDecodable.
absl::StatusOr<std::vector<float>> DequantizeTensor(const TensorInfo& tensor);

// Shard file names for a split model: "<prefix>-00001-of-00003.gguf". Returns an empty vector when `path`
// does not follow that pattern.
std::vector<std::string> SplitShardPaths(const std::string& path);

}  // namespace strata::gguf

#endif  // STRATA_ENGINE_GGUF_GGUF_FILE_H_
