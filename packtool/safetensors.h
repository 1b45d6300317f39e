#ifndef STRATA_PACKTOOL_SAFETENSORS_H_
#define STRATA_PACKTOOL_SAFETENSORS_H_

// Reads Hugging Face .safetensors files: an 8-byte little-endian header length N, N bytes of JSON
// (tensor name -> {"dtype", "shape", "data_offsets": [begin, end]}, plus an optional "__metadata__" object
// of strings), then the data section the offsets are relative to. F16, BF16 and F32 tensors are read, and
// the byte dtypes of quantized checkpoints: F8_E4M3 (FP8 block-scaled weights, DeepSeek-V3) and U8 (MXFP4
// blocks and scales, gpt-oss), which the Hugging Face importer decodes.
// Every length and offset is checked against the file before any data is touched.

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "engine/gguf/ggml_types.h"

namespace strata::packtool {

// The largest JSON header accepted (the format's own limit is 100 MB).
inline constexpr uint64_t kMaxSafetensorsHeader = 100ull << 20;

struct SafetensorsTensor {
  std::string name;
  std::string dtype;           // "F16", "BF16", "F32", "F8_E4M3" or "U8", as written in the header
  std::optional<gguf::GgmlType> type;  // F16, BF16 and F32's; none for F8_E4M3 and U8
  std::vector<int64_t> shape;  // row-major, outermost first (the reverse of ggml's ne)
  std::span<const uint8_t> data;  // inside the mapping; valid while the owning file lives
  int shard = 0;               // index of the file holding it (SafetensorsCheckpoint)

  int64_t n_elements() const;
};

// Parses a header and checks every tensor against a data section of `data_size` bytes. `json` is the
// header's text; `name` is used in error messages. The tensors' data spans start at `data` (which may be
// null when only the header is checked).
absl::StatusOr<std::vector<SafetensorsTensor>> ParseSafetensorsHeader(std::string_view json, const uint8_t* data,
                                                                      uint64_t data_size, const std::string& name);

class SafetensorsFile {
 public:
  // Maps and validates `path`; errors name the file and the field.
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }

 private:
  friend class SafetensorsCheckpoint;  // numbers the shards of its files' tensors
  SafetensorsFile() = default;
  std::string path_;
  void* map_ = nullptr;
  uint64_t size_ = 0;
  std::vector<SafetensorsTensor> tensors_;
};

// Every *.safetensors file of a directory (sorted by name, so model-00001-of-00003 ... come in order), with
// one index over all their tensors. A name held by two files is refused.
class SafetensorsCheckpoint {
 public:
  static absl::StatusOr<std::unique_ptr<SafetensorsCheckpoint>> Open(const std::string& dir);

  const std::vector<std::unique_ptr<SafetensorsFile>>& files() const { return files_; }
  // Null when absent.
  const SafetensorsTensor* Find(std::string_view name) const;
  // Every tensor, file by file in header order.
  std::vector<const SafetensorsTensor*> tensors() const;

 private:
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  absl::flat_hash_map<std::string, const SafetensorsTensor*> index_;
};

}  // namespace strata::packtool

#endif  // STRATA_PACKTOOL_SAFETENSORS_H_
