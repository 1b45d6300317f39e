#include "engine/model/kv_cache.h"

#include <algorithm>
#include <cstdlib>
#include <new>

#include "absl/strings/str_cat.h"

namespace strata::model {
namespace {

int64_t RoundPositions(int64_t positions) { return (positions + 63) / 64 * 64; }

int64_t WindowOf(const KvShape& shape, int64_t layer) {
  return layer < static_cast<int64_t>(shape.windows.size()) ? shape.windows[layer] : 0;
}

// Slots of `layer` in a cache of `capacity` (rounded) positions.
int64_t SlotsOfLayer(const KvShape& shape, int64_t layer, int64_t capacity) {
  const int64_t window = WindowOf(shape, layer);
  if (window <= 0) return capacity;
  return std::min(capacity, window + std::max<int64_t>(1, shape.step_positions) - 1);
}

int64_t TotalSlots(const KvShape& shape, int64_t capacity) {
  int64_t total = 0;
  for (int64_t l = 0; l < shape.n_layer; ++l) total += SlotsOfLayer(shape, l, capacity);
  return total;
}

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

KvShape CacheShape(const ModelConfig& config, int64_t step_positions) {
  KvShape shape;
  shape.n_layer = config.n_layer;
  shape.layout = CacheLayout(config);
  shape.step_positions = std::max<int64_t>(1, step_positions);
  for (int64_t l = 0; l < config.n_layer; ++l) {
    if (AttentionWindow(config, l) > 0) {
      shape.windows.resize(config.n_layer, 0);
      shape.windows[l] = AttentionWindow(config, l);
    }
  }
  return shape;
}

KvMemory* HostKvMemory() {
  static HostMemory* memory = new HostMemory();
  return memory;
}

KvCache::KvCache(KvCachePool* pool, const KvShape& shape, int64_t capacity, uint64_t bytes, void* data)
    : pool_(pool),
      capacity_(capacity),
      layout_(shape.layout),
      step_positions_(capacity),
      bytes_(bytes),
      data_(data),
      keys_(static_cast<float*>(data)),
      values_(static_cast<float*>(data) + TotalSlots(shape, capacity) * shape.layout.key_dim) {
  int64_t first = 0;
  layers_.resize(shape.n_layer);
  for (int64_t l = 0; l < shape.n_layer; ++l) {
    LayerSlots& layer = layers_[l];
    layer.first = first;
    layer.slots = SlotsOfLayer(shape, l, capacity);
    layer.window = WindowOf(shape, l);
    layer.ring = layer.slots < capacity;
    if (layer.ring) {
      windowed_ = true;
      step_positions_ = std::min(step_positions_, layer.slots - layer.window + 1);
    }
    first += layer.slots;
  }
}

KvCache::~KvCache() {
  pool_->memory_->Free(data_);
  pool_->in_use_.fetch_sub(bytes_);
}

KvCachePool::KvCachePool(KvShape shape, uint64_t budget_bytes, KvMemory* memory)
    : shape_(std::move(shape)), budget_(budget_bytes), memory_(memory) {}

uint64_t KvCachePool::BytesFor(const KvShape& shape, int64_t positions) {
  return static_cast<uint64_t>(TotalSlots(shape, RoundPositions(positions)) *
                               (shape.layout.key_dim + shape.layout.value_dim)) *
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
  return std::unique_ptr<KvCache>(new KvCache(this, shape_, RoundPositions(positions), need, *data));
}

}  // namespace strata::model
