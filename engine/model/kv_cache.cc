#include "engine/model/kv_cache.h"

#include <cstdlib>
#include <new>

#include "absl/strings/str_cat.h"

namespace strata::model {
namespace {

int64_t RoundPositions(int64_t positions) { return (positions + 63) / 64 * 64; }

class HostMemory : public KvMemory {
 public:
  absl::StatusOr<void*> Allocate(size_t bytes) override {
    void* p = ::operator new(bytes, std::align_val_t{64}, std::nothrow);
    if (p == nullptr) return absl::ResourceExhaustedError(absl::StrCat("KV cache: ", bytes, " bytes of host memory"));
    return p;
  }
  void Free(void* data) override { ::operator delete(data, std::align_val_t{64}); }
  bool host_accessible() const override { return true; }
};

}  // namespace

KvMemory* HostKvMemory() {
  static HostMemory* memory = new HostMemory();
  return memory;
}

KvCache::KvCache(KvCachePool* pool, int64_t n_layer, int64_t capacity, KvLayout layout, uint64_t bytes, void* data)
    : pool_(pool),
      capacity_(capacity),
      layout_(layout),
      bytes_(bytes),
      data_(data),
      keys_(static_cast<float*>(data)),
      values_(static_cast<float*>(data) + n_layer * capacity * layout.key_dim) {}

KvCache::~KvCache() {
  pool_->memory_->Free(data_);
  pool_->in_use_.fetch_sub(bytes_);
}

KvCachePool::KvCachePool(int64_t n_layer, KvLayout layout, uint64_t budget_bytes, KvMemory* memory)
    : n_layer_(n_layer), layout_(layout), budget_(budget_bytes), memory_(memory) {}

uint64_t KvCachePool::BytesFor(int64_t n_layer, KvLayout layout, int64_t positions) {
  return static_cast<uint64_t>(n_layer * RoundPositions(positions) * (layout.key_dim + layout.value_dim)) *
         sizeof(float);
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
  absl::StatusOr<void*> data = memory_->Allocate(need);
  if (!data.ok()) {
    in_use_.fetch_sub(need);
    return data.status();
  }
  return std::unique_ptr<KvCache>(new KvCache(this, n_layer_, RoundPositions(positions), layout_, need, *data));
}

}  // namespace strata::model
