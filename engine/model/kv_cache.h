#ifndef STRATA_ENGINE_MODEL_KV_CACHE_H_
#define STRATA_ENGINE_MODEL_KV_CACHE_H_

// Per-sequence attention caches, allocated from a pool with a global memory budget.
//
// A KvCache holds keys and values (f32) of every layer of one sequence, laid out [layer][slot][key_dim] for
// keys and [layer][slot][value_dim] for values (KvLayout: GQA keeps n_head_kv heads of each, latent attention
// one latent per token and no values), in the memory of the backend that computes attention (host memory for
// the CPU, device memory for CUDA; see KvMemory). A layer that attends to every earlier position keeps
// `capacity` slots, slot = position. A sliding-window layer (AttentionWindow > 0) keeps a ring of
// window + step_positions - 1 slots (at most capacity), slot = position % ring: one forward step writes up to
// step_positions positions of a sequence before its queries attend, and the oldest of them still needs the
// window - 1 positions before it. Without windowed layers the layout and byte count are those of
// [layer][capacity][dim]. The CUDA backend indexes caches itself, through keys(), values(), capacity() and
// slots() (kernels::cuda::KvPlace: every windowed layer's ring the same length).
//
// A cache is used by one thread at a time (the scheduler). The pool may be used from any thread: Allocate
// fails with RESOURCE_EXHAUSTED rather than exceed the budget, and a cache returns its bytes when destroyed.
// The pool and its memory must outlive its caches. The contents are not zeroed: attention reads positions up
// to the one being written, all written before.

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/model_config.h"

namespace strata::model {

// What each sequence's cache holds: the per-position layout, which layers are windowed, and how many positions
// of one sequence a forward step may write.
struct KvShape {
  int64_t n_layer = 0;
  KvLayout layout;
  std::vector<int64_t> windows;  // per layer, AttentionWindow (0: every position); empty: no windowed layer
  int64_t step_positions = 1;    // the engine's prefill chunk; a step writing more is refused (Model::Forward)
};
// The shape of `config`'s caches when a forward step writes at most `step_positions` positions of a sequence.
KvShape CacheShape(const ModelConfig& config, int64_t step_positions);

// Where caches live. Allocate and Free may be called from any thread.
class KvMemory {
 public:
  virtual ~KvMemory() = default;
  // `bytes` of memory, or RESOURCE_EXHAUSTED.
  virtual absl::StatusOr<void*> Allocate(size_t bytes) = 0;
  virtual void Free(void* data) = 0;
  // Whether the memory is host memory (key() and value() may be dereferenced on the CPU).
  virtual bool host_accessible() const = 0;
};

// Plain host memory, not zeroed (zeroing a large cache would touch every page on the scheduler thread).
KvMemory* HostKvMemory();

class KvCachePool;

class KvCache {
 public:
  ~KvCache();
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  // Positions the sequence may reach: key(layer, pos) is defined for pos < capacity.
  int64_t capacity() const { return capacity_; }
  int64_t n_layer() const { return static_cast<int64_t>(layers_.size()); }
  int64_t key_dim() const { return layout_.key_dim; }
  int64_t value_dim() const { return layout_.value_dim; }
  // The start of the keys and values; [layer][capacity][dim] only when !windowed().
  float* keys() const { return keys_; }
  float* values() const { return values_; }
  // Whether some layer keeps a ring shorter than capacity (its positions older than the ring are gone).
  bool windowed() const { return windowed_; }
  // The most positions of this sequence one forward step may write without overwriting a key a query of the
  // same step attends to (with windowed layers; capacity otherwise).
  int64_t step_positions() const { return step_positions_; }
  // Slots layer `layer` keeps: capacity, or its ring's length.
  int64_t slots(int64_t layer) const { return layers_[layer].slots; }
  // The window layer `layer`'s ring was sized for (KvShape::windows), 0 for a layer that keeps every position.
  int64_t window(int64_t layer) const { return layers_[layer].ring ? layers_[layer].window : 0; }
  // key_dim (value_dim) floats for (layer, pos); pos < capacity, and for a windowed layer one of its last
  // slots(layer) positions written. Host-accessible memory only.
  float* key(int64_t layer, int64_t pos) const { return keys_ + Slot(layer, pos) * layout_.key_dim; }
  float* value(int64_t layer, int64_t pos) const { return values_ + Slot(layer, pos) * layout_.value_dim; }
  uint64_t bytes() const { return bytes_; }

 private:
  friend class KvCachePool;
  struct LayerSlots {
    int64_t first = 0;  // the layer's first slot, counted over all layers
    int64_t slots = 0;
    int64_t window = 0;
    bool ring = false;
  };
  KvCache(KvCachePool* pool, const KvShape& shape, int64_t capacity, uint64_t bytes, void* data);
  int64_t Slot(int64_t layer, int64_t pos) const {
    const LayerSlots& l = layers_[layer];
    return l.first + (l.ring ? pos % l.slots : pos);
  }
  KvCachePool* pool_;
  int64_t capacity_;
  KvLayout layout_;
  std::vector<LayerSlots> layers_;
  bool windowed_ = false;
  int64_t step_positions_;
  uint64_t bytes_;
  void* data_;  // keys then values
  float* keys_;
  float* values_;
};

class KvCachePool {
 public:
  // `memory` must outlive the pool.
  KvCachePool(KvShape shape, uint64_t budget_bytes, KvMemory* memory);

  // A cache for `positions` positions (rounded up to a multiple of 64).
  absl::StatusOr<std::unique_ptr<KvCache>> Allocate(int64_t positions);

  // The bytes Allocate(positions) takes from the budget.
  uint64_t BytesFor(int64_t positions) const { return BytesFor(shape_, positions); }
  static uint64_t BytesFor(const KvShape& shape, int64_t positions);
  const KvShape& shape() const { return shape_; }
  uint64_t budget() const { return budget_; }
  uint64_t in_use() const { return in_use_.load(); }
  bool host_accessible() const { return memory_->host_accessible(); }

 private:
  friend class KvCache;
  KvShape shape_;
  uint64_t budget_;
  KvMemory* memory_;
  std::atomic<uint64_t> in_use_{0};
};

}  // namespace strata::model

#endif  // STRATA_ENGINE_MODEL_KV_CACHE_H_
