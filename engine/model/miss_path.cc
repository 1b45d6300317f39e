#include "engine/model/miss_path.h"

#include "absl/strings/str_cat.h"

namespace strata::model {

absl::StatusOr<MissPath> ParseMissPath(absl::string_view name) {
  if (name == "gpu") return MissPath::kGpu;
  if (name == "cpu") return MissPath::kCpu;
  if (name == "both") return MissPath::kBoth;
  return absl::InvalidArgumentError(absl::StrCat("'", name, "' is not a miss path (gpu, cpu or both)"));
}

absl::string_view MissPathName(MissPath path) {
  switch (path) {
    case MissPath::kGpu:
      return "gpu";
    case MissPath::kCpu:
      return "cpu";
    case MissPath::kBoth:
      return "both";
  }
  return "?";
}

}  // namespace strata::model
