#ifndef STRATA_ENGINE_PACK_EXPERT_SOURCE_H_
#define STRATA_ENGINE_PACK_EXPERT_SOURCE_H_

// Where the bytes of a routed expert come from.
//
// The dispatch step asks a source for the blob of (moe_layer, expert) and computes from the bytes it
// returns. A source either returns the whole blob or an error; it never returns a partly filled buffer.
// The sources here keep every blob resident for their lifetime, so a returned pointer stays valid until
// the source is destroyed. A caching tier (the VRAM cache) sits in front of a source, not inside it.
// All methods may be called from any number of threads at once.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "engine/pack/pack.h"

namespace strata::pack {

class ExpertSource {
 public:
  virtual ~ExpertSource() = default;

  // The blob_bytes bytes of (moe_layer, expert). OUT_OF_RANGE for a blob the pack does not have;
  // DATA_LOSS for bytes that fail their checksum (when verification is on) or cannot be read.
  virtual absl::StatusOr<const uint8_t*> Blob(int64_t moe_layer, int64_t expert) = 0;

  // "arena" or "mmap" (tests may add others).
  virtual std::string_view kind() const = 0;
  // Whether blobs lie in page-locked memory registered with CUDA (direct DMA to the GPU).
  virtual bool pinned() const { return false; }
  virtual uint64_t blob_bytes() const = 0;
};

// Page-locks and maps host memory for a GPU (the CUDA build's model factory provides one). Pin fails with
// the driver's reason (a memlock limit, no device); Unpin undoes a successful Pin.
class HostPinner {
 public:
  virtual ~HostPinner() = default;
  virtual absl::Status Pin(void* data, size_t bytes) = 0;
  virtual void Unpin(void* data) = 0;
};

struct ExpertSourceOptions {
  std::string kind = "arena";  // "arena" (resident anonymous memory) or "mmap"
  bool verify = false;         // check each blob's xxh3 (arena: all at load; mmap: on first use)
  int threads = 0;             // arena load threads; 0 = one per core this process may use
  HostPinner* pinner = nullptr;  // page-locks the arena once filled (must outlive the source); null: not pinned
  // Arena: the expert bytes read so far and the total, after each 64 MiB chunk, from the reader threads one
  // call at a time (the last has done == total). May be empty.
  std::function<void(uint64_t done, uint64_t total)> on_load_progress;
};

// What loading an arena measured, for the start-up log.
struct ExpertSourceStats {
  uint64_t bytes = 0;
  double seconds = 0;
  double gb_per_second = 0;
  bool huge_pages = false;     // MADV_HUGEPAGE accepted
  bool pinned = false;         // registered with CUDA
  std::string pin_note;        // why not pinned, when not
};

absl::StatusOr<std::unique_ptr<ExpertSource>> OpenExpertSource(const Pack& pack, const ExpertSourceOptions& options,
                                                               ExpertSourceStats* stats);

}  // namespace strata::pack

#endif  // STRATA_ENGINE_PACK_EXPERT_SOURCE_H_
