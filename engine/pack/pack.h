#ifndef STRATA_ENGINE_PACK_PACK_H_
#define STRATA_ENGINE_PACK_PACK_H_

// An opened pack: its checked manifest, its dense.gguf (mapped) and the path of experts.bin.
// Opening checks the manifest and that experts.bin has exactly the size the manifest says, so later
// reads of any blob stay inside the file. Immutable after Open; safe to read from any thread.

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "engine/gguf/gguf_file.h"
#include "engine/pack/pack_format.h"
#include "strata/pack/v1/manifest.pb.h"

namespace strata::pack {

class Pack {
 public:
  static absl::StatusOr<std::unique_ptr<Pack>> Open(const std::string& dir);

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

 private:
  Pack() = default;
  std::string dir_;
  v1::Manifest manifest_;
  BlobLayout layout_;
  std::unique_ptr<gguf::GgufFile> dense_;
  std::vector<uint64_t> blob_hashes_;
};

}  // namespace strata::pack

#endif  // STRATA_ENGINE_PACK_PACK_H_
