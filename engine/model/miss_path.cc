#include "engine/model/miss_path.h"

#include <algorithm>

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

float NextHostShare(float share, int64_t posted, int64_t waited, double gain) {
  if (posted <= 0) return share;
  const double waited_fraction = std::clamp(static_cast<double>(waited) / static_cast<double>(posted), 0.0, 1.0);
  return static_cast<float>(std::clamp(share + gain * (0.5 - waited_fraction), 0.0, 1.0));
}

}  // namespace strata::model
