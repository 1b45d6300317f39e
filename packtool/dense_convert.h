#ifndef STRATA_PACKTOOL_DENSE_CONVERT_H_
#define STRATA_PACKTOOL_DENSE_CONVERT_H_

// Writes a pack's dense.gguf from a source model: every non-expert tensor of the blocks that run, and the
// metadata, with the dense weight matrices stored in the type the user asked for (convert --dense-type).
// Pure function of its inputs; one thread.

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/gguf/gguf_file.h"
#include "strata/pack/v1/manifest.pb.h"

namespace strata::packtool {

// What convert does to the dense weight matrices (every 2-D non-expert tensor except the router, which the
// engine reads in f32 whatever its type; norms and other vectors are always copied as they are).
enum class DenseTarget { kKeep, kF16, kBF16, kQ8_0 };

// "keep", "f16", "bf16" or "q8_0"; INVALID_ARGUMENT naming `field` and the choices otherwise.
absl::StatusOr<DenseTarget> ParseDenseTarget(std::string_view name, std::string_view field);
std::string_view DenseTargetName(DenseTarget target);

// The role name under which a manifest's quant_error reports the error added to the dense matrices.
inline constexpr std::string_view kDenseRoleName = "dense";

// Whether `t` is a dense weight matrix that --dense-type converts (and not an expert tensor, which the
// caller leaves out).
bool IsConvertibleDenseMatrix(const gguf::TensorInfo& t);

// Writes every tensor of `model` for which `is_expert(name)` is false into `path` with the model's metadata
// (less the split keys), leaving out the multi-token-prediction blocks (model::ReadBlockCount) whole: the
// metadata's block_count then counts the others and nextn_predict_layers is dropped. Converting the dense matrices to `target`. When any matrix changed type, appends
// to `errors` one entry, role kDenseRoleName, with the error added against the source's decoded values
// (rel_rms over all converted matrices, max_abs). Q8_0 needs rows that are a multiple of 32 weights:
// another row length is INVALID_ARGUMENT naming the tensor. Drops the source's mapped pages as it goes.
absl::Status WriteDenseGguf(const gguf::GgufModel& model, bool (*is_expert)(std::string_view name),
                            DenseTarget target, const std::string& path, std::vector<pack::v1::RoleError>* errors);

}  // namespace strata::packtool

#endif  // STRATA_PACKTOOL_DENSE_CONVERT_H_
