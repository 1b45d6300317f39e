#ifndef STRATA_ENGINE_MODEL_EXPERT_CACHE_POLICY_H_
#define STRATA_ENGINE_MODEL_EXPERT_CACHE_POLICY_H_

// Which experts a fixed number of fast-memory slots (VRAM) hold, decided from the routing the engine
// observes. Pure bookkeeping: no device code, so the policies are tested and benchmarked on any machine;
// the GPU offload dispatch executes its decisions (copies, blob-table entries).
//
// Experts are "blobs": blob = moe_layer * n_expert + expert. A blob is in the host memory only, being
// filled into a slot, or resident. After each step, Observe takes the step's routing and returns the
// admissions it plans: each takes a slot (free, or evicting its owner, which goes back to the host at
// once); the caller copies the blob and calls Landed when the copy is complete, and only then is the blob
// resident (a slot being filled is never read). A victim is never a blob being filled or one the step
// just used.
//
// Policies: lru evicts the resident blob unused longest; lfu-decay keeps usage counts halved every
// `decay_tokens` tokens and admits a missed blob only when it outscores the coldest resident one; static
// keeps the blobs it started with.
// Not thread-safe: one thread (the scheduler) at a time.

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace strata::model {

enum class CachePolicy { kLru, kLfuDecay, kStatic };

// "lru", "lfu-decay" or "static"; INVALID_ARGUMENT naming the value otherwise.
absl::StatusOr<CachePolicy> ParseCachePolicy(const std::string& name);
const char* CachePolicyName(CachePolicy policy);

struct CacheOptions {
  int64_t slots = 0;  // fast-memory slots (0: every expert is a miss)
  CachePolicy policy = CachePolicy::kLfuDecay;
  int64_t decay_tokens = 256;   // lfu-decay: counts halve after this many tokens
  int max_fills_per_step = 32;  // admissions planned after one step
  // A routing profile to start warm from (WarmStart's and Place's counts): one score per blob, index
  // moe_layer * n_expert + expert; empty: none (the warm start is round robin over the layers).
  std::vector<double> warm_counts;
};

class ExpertCachePolicy {
 public:
  struct Admission {
    uint64_t blob;
    int64_t slot;
    int64_t victim;  // the blob evicted from the slot, or -1 for a free slot
  };

  // n_slots is options.slots clamped to [0, n_moe_layers * n_expert]. The slots start empty.
  ExpertCachePolicy(const CacheOptions& options, int64_t n_moe_layers, int64_t n_expert);

  // The blobs a warm start puts in the slots, in slot order: the hottest by `counts` (one count per blob,
  // n_moe_layers * n_expert of them; ties to the lower blob), or, with no counts, expert 0 of every layer,
  // then expert 1, ... INVALID_ARGUMENT when counts has the wrong size.
  absl::StatusOr<std::vector<uint64_t>> WarmStart(std::span<const double> counts) const;

  // Marks `blobs` resident in slots 0, 1, ... (a warm start whose copies are complete) and seeds the usage
  // scores with `counts` when given. INVALID_ARGUMENT for more blobs than slots, a blob out of range or
  // listed twice, or counts of the wrong size.
  absl::Status Place(std::span<const uint64_t> blobs, std::span<const double> counts);

  // After a step: ids[l] holds layer l's n_tokens * k routed experts (ids outside [0, n_expert) are
  // skipped). Updates usage and returns the planned admissions; their victims are already back in host
  // memory and the admitted blobs are filling. `missed_blobs` (optional) receives the step's distinct
  // non-resident blobs, in order of first use.
  std::vector<Admission> Observe(int64_t n_moe_layers, const int32_t* const* ids, int n_tokens, int k,
                                 std::vector<uint64_t>* missed_blobs = nullptr);

  // The copy of an admitted blob is complete: it is resident from now on.
  void Landed(uint64_t blob);

  bool resident(uint64_t blob) const { return state_[blob] == kResident; }
  bool filling(uint64_t blob) const { return state_[blob] == kFilling; }
  int64_t slot_of(uint64_t blob) const { return slot_of_[blob]; }
  int64_t n_slots() const { return n_slots_; }
  uint64_t n_blobs() const { return n_blobs_; }
  const CacheOptions& options() const { return options_; }

 private:
  enum State : uint8_t { kHost, kFilling, kResident };

  CacheOptions options_;
  int64_t n_expert_ = 0;
  uint64_t n_blobs_ = 0;
  int64_t n_slots_ = 0;
  std::vector<int64_t> slot_of_;  // per blob: its slot or -1
  std::vector<int64_t> owner_;    // per slot: its blob or -1
  std::vector<State> state_;      // per blob
  std::vector<double> score_;     // per blob: lfu count
  std::vector<uint64_t> last_used_;  // per blob: step of last use
  uint64_t step_ = 0;
  uint64_t tokens_since_decay_ = 0;
};

}  // namespace strata::model

#endif  // STRATA_ENGINE_MODEL_EXPERT_CACHE_POLICY_H_
