#include "engine/runtime/kv_cache.h"

#include "absl/strings/str_cat.h"

namespace strata::runtime {
namespace {

int64_t RoundPositions(int64_t positions) { return (positions + 63) / 64 * 64; }

}  // namespace

KvCache::KvCache(KvCachePool* pool, int64_t n_layer, int64_t capacity, int64_t kv_dim)
    : pool_(pool),
      capacity_(capacity),
      kv_dim_(kv_dim),
      bytes_(static_cast<uint64_t>(2 * n_layer * capacity * kv_dim) * sizeof(float)),
      keys_(std::make_unique_for_overwrite<float[]>(static_cast<size_t>(n_layer * capacity * kv_dim))),
      values_(std::make_unique_for_overwrite<float[]>(static_cast<size_t>(n_layer * capacity * kv_dim))) {}

KvCache::~KvCache() { pool_->in_use_.fetch_sub(bytes_); }

KvCachePool::KvCachePool(int64_t n_layer, int64_t kv_dim, uint64_t budget_bytes)
    : n_layer_(n_layer), kv_dim_(kv_dim), budget_(budget_bytes) {}

uint64_t KvCachePool::BytesFor(int64_t n_layer, int64_t kv_dim, int64_t positions) {
  return static_cast<uint64_t>(2 * n_layer * RoundPositions(positions) * kv_dim) * sizeof(float);
}

absl::StatusOr<std::unique_ptr<KvCache>> KvCachePool::Allocate(int64_t positions) {
  if (positions <= 0) return absl::InvalidArgumentError(absl::StrCat("KV cache of ", positions, " positions"));
  const uint64_t need = BytesFor(positions);
  uint64_t used = in_use_.load();
  do {
    if (used + need > budget_) {
      return absl::ResourceExhaustedError(absl::StrCat("KV cache budget: ", need, " bytes for ", positions,
                                                       " positions do not fit (", used, " of ", budget_,
                                                       " bytes in use)"));
    }
  } while (!in_use_.compare_exchange_weak(used, used + need));
  return std::unique_ptr<KvCache>(new KvCache(this, n_layer_, RoundPositions(positions), kv_dim_));
}

}  // namespace strata::runtime
