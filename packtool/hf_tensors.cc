#include "packtool/hf_tensors.h"

#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/status_macros.h"
#include "packtool/hf_fp8.h"

namespace strata::packtool {

absl::Status HfTensorSource::Fill(std::span<uint8_t> dst) const {
  if (scale_inv == nullptr) {
    std::memcpy(dst.data(), tensor->data.data(), tensor->data.size());
    return absl::OkStatus();
  }
  return DequantizeFp8Blocks(tensor->data, scale_inv->data, tensor->shape[0], tensor->shape[1], tensor->name, dst);
}

absl::Status HfTensorSource::FillF32(std::span<uint8_t> dst) const {
  if (type == gguf::GgmlType::kF32) return Fill(dst);
  std::vector<float> values(static_cast<size_t>(tensor->n_elements()));
  RETURN_IF_ERROR(gguf::Dequantize(type, tensor->data.data(), values.data(), tensor->n_elements()));
  std::memcpy(dst.data(), values.data(), values.size() * sizeof(float));
  return absl::OkStatus();
}

HfCheckpointTensors::HfCheckpointTensors(const SafetensorsCheckpoint& checkpoint, const HfModelConfig& config,
                                         std::string dir)
    : checkpoint_(checkpoint), config_(config), dir_(std::move(dir)) {}

const std::string& HfCheckpointTensors::FileOf(const SafetensorsTensor& t) const {
  return checkpoint_.files()[static_cast<size_t>(t.shard)]->path();
}

absl::StatusOr<const SafetensorsTensor*> HfCheckpointTensors::Take(const std::string& name,
                                                                   std::span<const int64_t> ne) {
  const SafetensorsTensor* t = checkpoint_.Find(name);
  if (t == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(dir_, ": tensor '", name, "' is missing from the *.safetensors files"));
  }
  taken_.insert(name);
  const std::vector<int64_t> expected(ne.rbegin(), ne.rend());  // row-major: ggml's ne reversed
  const bool row_vector = ne.size() == 1 && t->shape == std::vector<int64_t>{1, ne[0]};
  if (t->shape != expected && !row_vector) {
    return absl::InvalidArgumentError(absl::StrCat(FileOf(*t), ": tensor '", name, "' has shape [",
                                                   absl::StrJoin(t->shape, ", "), "], expected [",
                                                   absl::StrJoin(expected, ", "), "] from config.json"));
  }
  return t;
}

absl::StatusOr<HfTensorSource> HfCheckpointTensors::TakeSource(const std::string& name, std::span<const int64_t> ne) {
  ASSIGN_OR_RETURN(const SafetensorsTensor* t, Take(name, ne));
  if (t->type.has_value()) return HfTensorSource{t, nullptr, *t->type};
  const std::string where = absl::StrCat(FileOf(*t), ": tensor '", name, "' is ", t->dtype);
  if (t->dtype != "F8_E4M3") return absl::UnimplementedError(absl::StrCat(where, ", which Strata does not read here"));
  if (!config_.fp8_blocks) {
    return absl::UnimplementedError(absl::StrCat(where, " but config.json has no quantization_config ",
                                                 "(expected quant_method fp8 with weight_block_size [128, 128])"));
  }
  if (t->shape.size() != 2) {
    return absl::UnimplementedError(
        absl::StrCat(where, " of ", t->shape.size(), " dimensions; Strata reads FP8 block-scaled matrices only"));
  }
  const std::string scale_name = name + "_scale_inv";
  const SafetensorsTensor* s = checkpoint_.Find(scale_name);
  if (s == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(where, " but its block scales '", scale_name, "' are missing"));
  }
  taken_.insert(scale_name);
  const std::vector<int64_t> blocks = {(t->shape[0] + kFp8BlockSize - 1) / kFp8BlockSize,
                                       (t->shape[1] + kFp8BlockSize - 1) / kFp8BlockSize};
  if (s->dtype != "F32" || s->shape != blocks) {
    return absl::InvalidArgumentError(absl::StrCat(FileOf(*s), ": tensor '", scale_name, "' is ", s->dtype, " [",
                                                   absl::StrJoin(s->shape, ", "), "], expected F32 [",
                                                   absl::StrJoin(blocks, ", "), "]: one scale per 128 x 128 block of '",
                                                   name, "'"));
  }
  return HfTensorSource{t, s, gguf::GgmlType::kBF16};
}

absl::Status HfCheckpointTensors::RequireDtype(const SafetensorsTensor& t, bool u8) const {
  if (u8 ? t.dtype == "U8" : t.type.has_value()) return absl::OkStatus();
  return absl::UnimplementedError(absl::StrCat(FileOf(t), ": tensor '", t.name, "' is ", t.dtype, ", expected ",
                                               u8 ? "U8 (MXFP4)" : "F16, BF16 or F32"));
}

absl::Status HfCheckpointTensors::CheckAllTaken() const {
  const int64_t n_layer = config_.geometry.n_layer;
  auto is_mtp = [&](const std::string& name) {
    for (int64_t l = n_layer; l < n_layer + config_.n_mtp_layers; ++l) {
      if (absl::StartsWith(name, absl::StrCat("model.layers.", l, "."))) return true;
    }
    return false;
  };
  for (const SafetensorsTensor* t : checkpoint_.tensors()) {
    if (taken_.contains(t->name) || absl::EndsWith(t->name, "rotary_emb.inv_freq") || is_mtp(t->name)) continue;
    return absl::UnimplementedError(absl::StrCat(FileOf(*t), ": tensor '", t->name, "' has no place in a ",
                                                 std::string(config_.arch->hf_name), " model as Strata reads it"));
  }
  return absl::OkStatus();
}

}  // namespace strata::packtool
