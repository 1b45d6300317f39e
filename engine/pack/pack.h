#ifndef STRATA_ENGINE_PACK_PACK_H_
#define STRATA_ENGINE_PACK_PACK_H_

// An opened pack: its checked manifest, its dense.gguf (mapped), the path of experts.bin and its routing
// profile, if it has one. Opening checks the manifest, that experts.bin has exactly the size the manifest
// says (so later reads of any blob stay inside the file) and the routing profile. Immutable after Open;
// safe to read from any thread.

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/gguf/gguf_file.h"
#include "engine/pack/pack_format.h"
#include "engine/pack/routing_profile.h"
#include "strata/pack/v1/manifest.pb.h"

namespace strata::pack {

struct PackOpenOptions {
  // Leave routing_profile.bin unread (strata-pack profile replaces it, even a malformed one).
  bool ignore_routing_profile = false;
};

class Pack {
 public:
  // A malformed routing profile, or one of another geometry, is refused like any other bad file of the pack,
  // naming the file and the field.
  static absl::StatusOr<std::unique_ptr<Pack>> Open(const std::string& dir, const PackOpenOptions& options = {});

  const std::string& dir() const { return dir_; }
  const v1::Manifest& manifest() const { return manifest_; }
  const BlobLayout& layout() const { return layout_; }
  const gguf::GgufFile& dense() const { return *dense_; }
  std::string experts_path() const;
  uint64_t n_blobs() const { return static_cast<uint64_t>(manifest_.blob_xxh3_size()); }
  // Expected xxh3 of blob `index`.
  uint64_t blob_hash(uint64_t index) const { return blob_hashes_[index]; }
  // Whether blob_bytes bytes at `blob` are blob `index` as the manifest records it: DATA_LOSS naming the
  // blob (moe layer, expert) and both checksums otherwise.
  absl::Status CheckBlob(uint64_t index, const uint8_t* blob) const;

  // The routing profile (routing_profile.bin), or null when the pack has none.
  const RoutingProfile* routing_profile() const {
    return routing_profile_.has_value() ? &*routing_profile_ : nullptr;
  }
  // How often the router picked each blob (index moe_layer * n_expert + expert) over the profiled tokens,
  // or an empty span when the pack has no profile.
  std::span<const uint64_t> routing_counts() const {
    return routing_profile_.has_value() ? std::span<const uint64_t>(routing_profile_->counts)
                                        : std::span<const uint64_t>();
  }

 private:
  Pack() = default;
  std::string dir_;
  v1::Manifest manifest_;
  BlobLayout layout_;
  std::unique_ptr<gguf::GgufFile> dense_;
  std::vector<uint64_t> blob_hashes_;
  std::optional<RoutingProfile> routing_profile_;
};

}  // namespace strata::pack

#endif  // STRATA_ENGINE_PACK_PACK_H_
