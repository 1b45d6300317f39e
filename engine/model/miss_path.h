#ifndef STRATA_ENGINE_MODEL_MISS_PATH_H_
#define STRATA_ENGINE_MODEL_MISS_PATH_H_

// Where the offload tier computes the routed experts that are not in VRAM (its misses):
//  - gpu:  the GPU reads them in place from the page-locked arena over PCIe (zero-copy);
//  - cpu:  host threads compute them from the arena (the activation goes down, the expert's output comes up);
//  - both: a share of each layer's misses on the host, the rest on the GPU at once, the share balanced
//          while serving so that neither side waits for the other.
// Long prompts always stream their layers' misses through VRAM, whatever the path.

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace strata::model {

enum class MissPath { kGpu, kCpu, kBoth };

// Path both: the host's next share of a step's misses from the last step's layers, `posted` of which gave the
// host a share, the GPU having had to wait for `waited` of those. Balanced when the GPU waits in about half
// of them: the share falls when it waits more, rises when it waits less, by at most `gain` a step, within
// [0, 1]. No posted layers: unchanged.
float NextHostShare(float share, int64_t posted, int64_t waited, double gain = 0.05);

// INVALID_ARGUMENT naming the accepted values for anything else.
absl::StatusOr<MissPath> ParseMissPath(absl::string_view name);
absl::string_view MissPathName(MissPath path);

}  // namespace strata::model

#endif  // STRATA_ENGINE_MODEL_MISS_PATH_H_
