#include "packtool/source_scheme.h"

#include <limits>
#include <memory>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "engine/gguf/gguf_file.h"
#include "engine/model/model_config.h"
#include "engine/status_macros.h"
#include "packtool/hf_checkpoint.h"
#include "packtool/safetensors.h"

namespace strata::packtool {
namespace {

// Schemes in the order of the precision they keep.
int Rank(kernels::Scheme s) {
  switch (s) {
    case kernels::Scheme::kS2:
      return 0;
    case kernels::Scheme::kS4:
      return 1;
    case kernels::Scheme::kMxfp4:  // between s4 and s8: 4 bits on an uneven grid with a power-of-two scale
      return 2;
    case kernels::Scheme::kS8:
      return 3;
    case kernels::Scheme::kF16:
      return 4;
  }
  return 4;
}

bool IsExpertTensorName(const std::string& name) {
  return absl::StartsWith(name, "blk.") &&
         (absl::EndsWith(name, ".ffn_gate_exps.weight") || absl::EndsWith(name, ".ffn_up_exps.weight") ||
          absl::EndsWith(name, ".ffn_down_exps.weight"));
}

}  // namespace

absl::StatusOr<kernels::Scheme> DefaultSchemeFor(gguf::GgmlType type) {
  switch (type) {
    case gguf::GgmlType::kF32:
    case gguf::GgmlType::kF16:
    case gguf::GgmlType::kBF16:
    case gguf::GgmlType::kQ4_0:
    case gguf::GgmlType::kQ4_1:
    case gguf::GgmlType::kQ4_K:
      return kernels::Scheme::kS4;
    case gguf::GgmlType::kQ3_K:
    case gguf::GgmlType::kQ2_K:
    case gguf::GgmlType::kQ5_0:
    case gguf::GgmlType::kQ5_1:
    case gguf::GgmlType::kQ5_K:
    case gguf::GgmlType::kQ6_K:
    case gguf::GgmlType::kQ8_0:
      return kernels::Scheme::kS8;
    case gguf::GgmlType::kMXFP4:  // its own codes and exponents, byte for byte
      return kernels::Scheme::kMxfp4;
    default:
      return absl::UnimplementedError(absl::StrCat("expert type ", gguf::TypeName(static_cast<uint32_t>(type)),
                                                   " is not one Strata decodes"));
  }
}

absl::StatusOr<kernels::Scheme> DefaultSchemeForModel(const std::string& input) {
  if (IsHfCheckpointDir(input)) {
    // The experts' dtype (F16, BF16 or F32): every one maps to the same default as in a GGUF. FP8 block-scaled
    // experts are imported as BF16 (packtool/hf_fp8.h), gpt-oss's U8 blocks as MXFP4 (packtool/hf_gpt_oss.h).
    ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsCheckpoint> ckpt, SafetensorsCheckpoint::Open(input));
    for (const SafetensorsTensor* t : ckpt->tensors()) {
      if (!absl::StrContains(t->name, ".experts.") || absl::EndsWith(t->name, "_bias") ||
          absl::EndsWith(t->name, "_scales") || absl::EndsWith(t->name, "_scale_inv")) {
        continue;
      }
      if (t->dtype == "F8_E4M3") return DefaultSchemeFor(gguf::GgmlType::kBF16);
      if (t->dtype == "U8" && absl::EndsWith(t->name, "_blocks")) return DefaultSchemeFor(gguf::GgmlType::kMXFP4);
      if (!t->type.has_value()) {
        return absl::UnimplementedError(absl::StrCat(input, ": tensor '", t->name, "' is ", t->dtype,
                                                     ", which Strata does not read for experts"));
      }
      return DefaultSchemeFor(*t->type);
    }
    return absl::InvalidArgumentError(absl::StrCat(input, ": no expert tensors (model.layers.N.*.experts.E.*): not a MoE model"));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<gguf::GgufModel> model, gguf::GgufModel::Open(input));
  // The experts of multi-token-prediction blocks are not converted: their types do not count. (Bad keys are
  // convert's to report.)
  int64_t n_run = std::numeric_limits<int64_t>::max();
  if (auto arch = model->metadata().GetString("general.architecture"); arch.ok()) {
    if (auto blocks = model::ReadBlockCount(model->metadata(), *arch); blocks.ok()) n_run = blocks->run();
  }
  bool found = false;
  kernels::Scheme best = kernels::Scheme::kS2;
  for (const gguf::TensorInfo& t : model->tensors()) {
    if (!IsExpertTensorName(t.name)) continue;
    if (model::TensorBlock(t.name) >= n_run) continue;
    absl::StatusOr<kernels::Scheme> s = DefaultSchemeFor(t.type);
    if (!s.ok()) return absl::UnimplementedError(absl::StrCat(input, ": tensor '", t.name, "': ", s.status().message()));
    if (!found || Rank(*s) > Rank(best)) best = *s;
    found = true;
  }
  if (!found) {
    return absl::InvalidArgumentError(
        absl::StrCat(input, ": no expert tensors (blk.N.ffn_gate_exps.weight ...): not a MoE model"));
  }
  return best;
}

absl::StatusOr<std::optional<kernels::Scheme>> ParseSchemeChoice(std::string_view name, std::string_view field) {
  if (name == "auto") return std::optional<kernels::Scheme>();
  absl::StatusOr<kernels::Scheme> s = kernels::ParseScheme(name);
  if (!s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(std::string(field), ": unknown '", std::string(name),
                                                   "'; expected auto, f16, s8, s4, s2 or mxfp4"));
  }
  return std::optional<kernels::Scheme>(*s);
}

}  // namespace strata::packtool
