#include "packtool/dense_convert.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <variant>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/gguf/ggml_types.h"
#include "engine/gguf/gguf_writer.h"
#include "engine/model/model_config.h"
#include "engine/status_macros.h"
#include "packtool/pack_writer.h"

namespace strata::packtool {
namespace {

constexpr std::pair<std::string_view, DenseTarget> kTargets[] = {
    {"keep", DenseTarget::kKeep}, {"f16", DenseTarget::kF16}, {"bf16", DenseTarget::kBF16}, {"q8_0", DenseTarget::kQ8_0}};

gguf::GgmlType TargetType(DenseTarget target) {
  switch (target) {
    case DenseTarget::kF16:
      return gguf::GgmlType::kF16;
    case DenseTarget::kBF16:
      return gguf::GgmlType::kBF16;
    default:
      return gguf::GgmlType::kQ8_0;
  }
}

struct ErrorSums {
  double err2 = 0, ref2 = 0, max_abs = 0;
  bool any = false;  // a matrix changed type
};

// Re-encodes `t` (a matrix of whole rows) into `dst` as `type`, one row at a time so that memory stays at
// two rows whatever the tensor's size, and adds the error against the decoded source to `sums`.
absl::Status ConvertMatrix(const gguf::TensorInfo& t, gguf::GgmlType type, std::span<uint8_t> dst, ErrorSums* sums) {
  const int64_t cols = t.ne[0], rows = t.n_rows();
  ASSIGN_OR_RETURN(const uint64_t src_row_bytes, gguf::RowBytes(t.type, cols));
  ASSIGN_OR_RETURN(const uint64_t dst_row_bytes, gguf::RowBytes(type, cols));
  std::vector<float> row(static_cast<size_t>(cols)), back(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* src = t.data + static_cast<uint64_t>(r) * src_row_bytes;
    uint8_t* out = dst.data() + static_cast<uint64_t>(r) * dst_row_bytes;
    RETURN_IF_ERROR(gguf::Dequantize(t.type, src, row.data(), cols));
    for (int64_t c = 0; c < cols; ++c) {
      if (!std::isfinite(row[c])) {
        return absl::InvalidArgumentError(absl::StrCat("tensor '", t.name, "' row ", r, " column ", c,
                                                       " is not a finite number (", row[c], ")"));
      }
    }
    RETURN_IF_ERROR(gguf::Quantize(type, row.data(), out, cols));
    RETURN_IF_ERROR(gguf::Dequantize(type, out, back.data(), cols));
    for (int64_t c = 0; c < cols; ++c) {
      const double ref = row[c], err = ref - back[c];
      sums->err2 += err * err;
      sums->ref2 += ref * ref;
      sums->max_abs = std::max(sums->max_abs, std::fabs(err));
    }
  }
  sums->any = true;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<DenseTarget> ParseDenseTarget(std::string_view name, std::string_view field) {
  for (const auto& [n, t] : kTargets) {
    if (n == name) return t;
  }
  return absl::InvalidArgumentError(
      absl::StrCat(std::string(field), ": unknown '", std::string(name), "'; expected keep, f16, bf16 or q8_0"));
}

std::string_view DenseTargetName(DenseTarget target) {
  for (const auto& [n, t] : kTargets) {
    if (t == target) return n;
  }
  return "?";
}

bool IsConvertibleDenseMatrix(const gguf::TensorInfo& t) {
  // The router and biases (gpt-oss's per-expert ones are 2-D) stay as they are, f32 in llama.cpp's files.
  return t.ne.size() == 2 && !absl::EndsWith(t.name, "ffn_gate_inp.weight") && !absl::EndsWith(t.name, ".bias");
}

absl::Status WriteDenseGguf(const gguf::GgufModel& model, bool (*is_expert)(std::string_view name),
                            DenseTarget target, const std::string& path, std::vector<pack::v1::RoleError>* errors) {
  // Multi-token-prediction blocks (the last <arch>.nextn_predict_layers) are left out whole, and the metadata
  // says so: the result is the model without them.
  std::string block_count_key, mtp_key;
  model::BlockCount blocks{.total = -1};
  if (auto arch = model.metadata().GetString("general.architecture");
      arch.ok() && model.metadata().Has(*arch + ".nextn_predict_layers")) {
    ASSIGN_OR_RETURN(blocks, model::ReadBlockCount(model.metadata(), *arch));
    block_count_key = *arch + ".block_count", mtp_key = *arch + ".nextn_predict_layers";
  }
  gguf::GgufWriter writer(model.shards().front()->alignment());
  for (const auto& [key, value] : model.metadata().entries()) {
    if (absl::StartsWith(key, "split.") || key == "general.alignment" || key == mtp_key) continue;
    if (key == block_count_key) {  // in the source's integer type
      gguf::Value run = value;
      if (std::holds_alternative<int64_t>(run.data)) {
        run.data = blocks.run();
      } else {
        run.data = static_cast<uint64_t>(blocks.run());
      }
      writer.Set(key, run);
      continue;
    }
    writer.Set(key, value);
  }
  ErrorSums sums;
  for (const gguf::TensorInfo& t : model.tensors()) {
    if (is_expert(t.name) || (blocks.mtp > 0 && model::TensorBlock(t.name) >= blocks.run())) continue;
    const gguf::TensorInfo* info = &t;
    const bool convert = target != DenseTarget::kKeep && IsConvertibleDenseMatrix(t) && TargetType(target) != t.type;
    if (!convert) {
      RETURN_IF_ERROR(writer.AddTensor(t.name, t.type, t.ne, [info](std::span<uint8_t> dst) {
        std::memcpy(dst.data(), info->data, info->bytes);
        ReleaseMappedRange(info->data, info->bytes);
        return absl::OkStatus();
      }));
      continue;
    }
    const gguf::GgmlType type = TargetType(target);
    RETURN_IF_ERROR(gguf::CheckDecodable(t));
    if (!gguf::RowBytes(type, t.ne[0]).ok()) {
      return absl::InvalidArgumentError(absl::StrCat("dense type ", std::string(DenseTargetName(target)), ": tensor '", t.name,
                                                     "' has rows of ", t.ne[0],
                                                     " weights, not a multiple of 32; choose f16 or bf16"));
    }
    RETURN_IF_ERROR(writer.AddTensor(t.name, type, t.ne, [info, type, &sums](std::span<uint8_t> dst) {
      RETURN_IF_ERROR(ConvertMatrix(*info, type, dst, &sums));
      ReleaseMappedRange(info->data, info->bytes);
      return absl::OkStatus();
    }));
  }
  RETURN_IF_ERROR(writer.WriteFile(path));
  if (sums.any) {
    pack::v1::RoleError& e = errors->emplace_back();
    e.set_role(std::string(kDenseRoleName));
    e.set_rel_rms(sums.ref2 > 0 ? std::sqrt(sums.err2 / sums.ref2) : 0.0);
    e.set_max_abs(sums.max_abs);
  }
  return absl::OkStatus();
}

}  // namespace strata::packtool
