#ifndef STRATA_SERVICES_GGUF_PACK_CACHE_H_
#define STRATA_SERVICES_GGUF_PACK_CACHE_H_

// strata-server --model X.gguf: the pack converted from a GGUF, cached beside it as X.gguf.strata-pack/ and
// reused while the GGUF is unchanged (same size and modification time, recorded in the cache's
// source.stamp). A conversion goes through packtool's ConvertGguf (which writes <cache>.partial/ and
// renames it only when complete) and is then validated in full; the stamp is written last, so a cache cut
// short anywhere (no stamp, or a stale one) is converted again, never reused. Called from one thread.

#include <atomic>
#include <string>

#include "absl/status/statusor.h"
#include "packtool/convert.h"

namespace strata::services {

struct PackCacheResult {
  std::string pack_dir;
  bool reused = false;  // the cache was valid; nothing was converted
};

// The cache directory of `gguf_path`.
std::string PackCacheDir(const std::string& gguf_path);

// The pack for `gguf_path` (s4 experts), converting it when the cache is absent or stale. `progress` and
// `cancel` are passed to the conversion and may be null.
absl::StatusOr<PackCacheResult> PackForGguf(const std::string& gguf_path, const packtool::ConvertProgressFn& progress,
                                            const std::atomic<bool>* cancel);

}  // namespace strata::services

#endif  // STRATA_SERVICES_GGUF_PACK_CACHE_H_
