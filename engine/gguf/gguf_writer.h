#ifndef STRATA_ENGINE_GGUF_GGUF_WRITER_H_
#define STRATA_ENGINE_GGUF_GGUF_WRITER_H_

// Writes GGUF v3 files that llama.cpp's loader and GgufFile read back.
//
// Metadata and tensor declarations are collected first; WriteFile then writes the header, then asks each
// tensor's filler for its bytes one tensor at a time, so peak memory is one tensor, not the model.
// Not thread-safe: one thread builds and writes a writer.

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/gguf/gguf_file.h"

namespace strata::gguf {

// Fills `dst` (exactly the tensor's byte size) with the tensor's data.
using TensorFiller = std::function<absl::Status(std::span<uint8_t> dst)>;

class GgufWriter {
 public:
  explicit GgufWriter(uint64_t alignment = 32);

  // Adds or replaces a metadata key (kept in first-insertion order). `general.alignment` is written
  // automatically when the alignment is not 32.
  void Set(std::string key, Value value);
  void SetString(std::string key, std::string v) { Set(std::move(key), Value::String(std::move(v))); }
  void SetUint32(std::string key, uint32_t v) { Set(std::move(key), Value::Uint32(v)); }
  void SetInt32(std::string key, int32_t v) { Set(std::move(key), Value::Int32(v)); }
  void SetUint64(std::string key, uint64_t v) { Set(std::move(key), Value::Uint64(v)); }
  void SetFloat32(std::string key, float v) { Set(std::move(key), Value::Float32(v)); }
  void SetBool(std::string key, bool v) { Set(std::move(key), Value::Bool(v)); }
  void SetStringArray(std::string key, const std::vector<std::string>& v);
  void SetFloat32Array(std::string key, const std::vector<float>& v);
  void SetInt32Array(std::string key, const std::vector<int32_t>& v);

  // Declares a tensor. `ne` in ggml order. The filler runs during WriteFile.
  absl::Status AddTensor(std::string name, GgmlType type, std::vector<int64_t> ne, TensorFiller fill);
  // Declares a tensor whose bytes are already at hand (copied when written; `data` must outlive WriteFile).
  absl::Status AddTensorData(std::string name, GgmlType type, std::vector<int64_t> ne,
                             std::span<const uint8_t> data);

  // Writes everything to `path` (truncating it). Errors name the path and the failing tensor.
  absl::Status WriteFile(const std::string& path);

  // Bytes WriteFile will produce.
  uint64_t PlannedFileSize() const;

 private:
  struct PendingTensor {
    std::string name;
    GgmlType type;
    std::vector<int64_t> ne;
    uint64_t bytes;
    TensorFiller fill;
  };
  uint64_t alignment_;
  Metadata metadata_;
  std::vector<PendingTensor> tensors_;
};

}  // namespace strata::gguf

#endif  // STRATA_ENGINE_GGUF_GGUF_WRITER_H_
