#ifndef STRATA_PACKTOOL_HF_TENSORS_H_
#define STRATA_PACKTOOL_HF_TENSORS_H_

// The tensors of a Hugging Face checkpoint as the importer (packtool/hf_checkpoint.h) takes them into a GGUF:
// each one taken is marked, so that the import refuses any left over rather than drop it silently.

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/gguf/ggml_types.h"
#include "engine/gguf/gguf_writer.h"
#include "packtool/hf_config.h"
#include "packtool/safetensors.h"

namespace strata::packtool {

// A checkpoint tensor as the GGUF gets it: F16/BF16/F32 as they are, FP8 block-scaled dequantized to BF16
// (packtool/hf_fp8.h). Points into the checkpoint's mapping, which must outlive it; Fill is pure, any thread.
struct HfTensorSource {
  const SafetensorsTensor* tensor = nullptr;
  const SafetensorsTensor* scale_inv = nullptr;  // FP8 only
  gguf::GgmlType type = gguf::GgmlType::kF32;     // what it is written as: F32, F16 or BF16

  uint64_t element_bytes() const { return type == gguf::GgmlType::kF32 ? 4 : 2; }
  uint64_t bytes() const { return static_cast<uint64_t>(tensor->n_elements()) * element_bytes(); }
  // Writes bytes() bytes into `dst`.
  absl::Status Fill(std::span<uint8_t> dst) const;
  // Writes the values widened to f32 (n_elements() * 4 bytes) into `dst`. Not for FP8 (scale_inv set).
  absl::Status FillF32(std::span<uint8_t> dst) const;
};

// Lookups into one checkpoint that mark what they take. Borrows the checkpoint and config, which must
// outlive it; one thread (the importer's).
class HfCheckpointTensors {
 public:
  HfCheckpointTensors(const SafetensorsCheckpoint& checkpoint, const HfModelConfig& config, std::string dir);

  const SafetensorsCheckpoint& checkpoint() const { return checkpoint_; }
  const std::string& FileOf(const SafetensorsTensor& t) const;
  // Tensor `name` of ggml shape `ne` (a vector may be a [1, n] matrix: a linear layer of one output), taken.
  absl::StatusOr<const SafetensorsTensor*> Take(const std::string& name, std::span<const int64_t> ne);
  // Take(), then its source; an FP8 tensor takes its `_scale_inv` too, checked against its shape and
  // config.json's quantization_config.
  absl::StatusOr<HfTensorSource> TakeSource(const std::string& name, std::span<const int64_t> ne);
  // UNIMPLEMENTED naming `t` unless it is U8 (`u8`) or F16/BF16/F32 (not `u8`).
  absl::Status RequireDtype(const SafetensorsTensor& t, bool u8) const;
  // UNIMPLEMENTED naming the first tensor never taken, bar rotary_emb.inv_freq buffers and the
  // multi-token-prediction layers (HfModelConfig::n_mtp_layers), which llama.cpp's converter leaves out.
  absl::Status CheckAllTaken() const;

 private:
  const SafetensorsCheckpoint& checkpoint_;
  const HfModelConfig& config_;
  const std::string dir_;
  absl::flat_hash_set<std::string> taken_;
};

// Adds a tensor to the GGUF being written (its filler checks for cancellation first).
using HfTensorAdder = std::function<absl::Status(const std::string& name, gguf::GgmlType type,
                                                 const std::vector<int64_t>& ne, gguf::TensorFiller fill)>;

}  // namespace strata::packtool

#endif  // STRATA_PACKTOOL_HF_TENSORS_H_
