#ifndef STRATA_ENGINE_MODEL_KV_CACHE_H_
#define STRATA_ENGINE_MODEL_KV_CACHE_H_

// Per-sequence attention caches, allocated from a pool with a global memory budget.
//
// A KvCache holds keys and values (f32) of every layer for `capacity` positions of one sequence, laid out
// [layer][position][key_dim] for keys and [layer][position][value_dim] for values (KvLayout: GQA keeps
// n_head_kv heads of each, latent attention one latent per token and no values), in the memory of the backend
// that computes attention (host memory for the CPU, device memory for CUDA; see KvMemory). It is used by one
// thread at a time (the scheduler). The pool may be used from any thread: Allocate fails with
// RESOURCE_EXHAUSTED rather than exceed the budget, and a cache returns its bytes when destroyed. The pool and
// its memory must outlive its caches. The contents are not zeroed: attention reads positions up to the one
// being written, all written before.

#include <atomic>
#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "engine/model/model_config.h"

namespace strata::model {

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

  int64_t capacity() const { return capacity_; }
  int64_t key_dim() const { return layout_.key_dim; }
  int64_t value_dim() const { return layout_.value_dim; }
  float* keys() const { return keys_; }
  float* values() const { return values_; }
  // key_dim (value_dim) floats for (layer, pos); pos < capacity. Host-accessible memory only.
  float* key(int64_t layer, int64_t pos) const { return keys_ + (layer * capacity_ + pos) * layout_.key_dim; }
  float* value(int64_t layer, int64_t pos) const { return values_ + (layer * capacity_ + pos) * layout_.value_dim; }
  uint64_t bytes() const { return bytes_; }

 private:
  friend class KvCachePool;
  KvCache(KvCachePool* pool, int64_t n_layer, int64_t capacity, KvLayout layout, uint64_t bytes, void* data);
  KvCachePool* pool_;
  int64_t capacity_;
  KvLayout layout_;
  uint64_t bytes_;
  void* data_;  // keys then values
  float* keys_;
  float* values_;
};

class KvCachePool {
 public:
  // `memory` must outlive the pool.
  KvCachePool(int64_t n_layer, KvLayout layout, uint64_t budget_bytes, KvMemory* memory);

  // A cache for `positions` positions (rounded up to a multiple of 64).
  absl::StatusOr<std::unique_ptr<KvCache>> Allocate(int64_t positions);

  uint64_t BytesFor(int64_t positions) const { return BytesFor(n_layer_, layout_, positions); }
  static uint64_t BytesFor(int64_t n_layer, KvLayout layout, int64_t positions);
  uint64_t budget() const { return budget_; }
  uint64_t in_use() const { return in_use_.load(); }
  bool host_accessible() const { return memory_->host_accessible(); }

 private:
  friend class KvCache;
  int64_t n_layer_;
  KvLayout layout_;
  uint64_t budget_;
  KvMemory* memory_;
  std::atomic<uint64_t> in_use_{0};
};

}  // namespace strata::model

#endif  // STRATA_ENGINE_MODEL_KV_CACHE_H_
