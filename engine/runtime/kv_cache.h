#ifndef STRATA_ENGINE_RUNTIME_KV_CACHE_H_
#define STRATA_ENGINE_RUNTIME_KV_CACHE_H_

// Per-sequence attention caches, allocated from a pool with a global memory budget.
//
// A KvCache holds keys and values (f32) of every layer for `capacity` positions of one sequence; it is
// used by one thread at a time (the scheduler). The pool may be used from any thread: Allocate fails with
// RESOURCE_EXHAUSTED rather than exceed the budget, and a cache returns its bytes when destroyed. The pool
// must outlive its caches.

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"

namespace strata::runtime {

class KvCachePool;

class KvCache {
 public:
  ~KvCache();
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  int64_t capacity() const { return capacity_; }
  int64_t kv_dim() const { return kv_dim_; }
  // kv_dim floats for (layer, pos); pos < capacity.
  float* key(int64_t layer, int64_t pos) { return keys_.get() + (layer * capacity_ + pos) * kv_dim_; }
  float* value(int64_t layer, int64_t pos) { return values_.get() + (layer * capacity_ + pos) * kv_dim_; }
  const float* key(int64_t layer, int64_t pos) const { return keys_.get() + (layer * capacity_ + pos) * kv_dim_; }
  const float* value(int64_t layer, int64_t pos) const {
    return values_.get() + (layer * capacity_ + pos) * kv_dim_;
  }
  uint64_t bytes() const { return bytes_; }

 private:
  friend class KvCachePool;
  KvCache(KvCachePool* pool, int64_t n_layer, int64_t capacity, int64_t kv_dim);
  KvCachePool* pool_;
  int64_t capacity_;
  int64_t kv_dim_;
  uint64_t bytes_;
  // Not zeroed: attention reads positions up to the one being written, all written before. Zeroing a
  // large cache would also touch every page on the scheduler thread, stalling the other sequences.
  std::unique_ptr<float[]> keys_, values_;
};

class KvCachePool {
 public:
  KvCachePool(int64_t n_layer, int64_t kv_dim, uint64_t budget_bytes);

  // A cache for `positions` positions (rounded up to a multiple of 64).
  absl::StatusOr<std::unique_ptr<KvCache>> Allocate(int64_t positions);

  uint64_t BytesFor(int64_t positions) const { return BytesFor(n_layer_, kv_dim_, positions); }
  static uint64_t BytesFor(int64_t n_layer, int64_t kv_dim, int64_t positions);
  uint64_t budget() const { return budget_; }
  uint64_t in_use() const { return in_use_.load(); }

 private:
  friend class KvCache;
  int64_t n_layer_;
  int64_t kv_dim_;
  uint64_t budget_;
  std::atomic<uint64_t> in_use_{0};
};

}  // namespace strata::runtime

#endif  // STRATA_ENGINE_RUNTIME_KV_CACHE_H_
