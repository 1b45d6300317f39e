// KV caches (engine/model/kv_cache.cc): the layout and byte count of models without windowed layers, the
// sliding-window layers' rings (their slots, their bytes, the budget they free), and which positions a ring
// still holds.

#include <cstdint>
#include <memory>
#include <set>
#include <vector>

#include "engine/model/kv_cache.h"
#include "engine/model/model_config.h"
#include "gtest/gtest.h"

namespace strata::model {
namespace {

// gpt-oss-20b's attention: 24 blocks, 8 kv heads of 64, the even blocks windowed to 128 positions.
ModelConfig GptOss20b() {
  ModelConfig c;
  c.arch = "gpt-oss";
  c.n_layer = 24, c.n_head = 64, c.n_head_kv = 8, c.head_dim = 64, c.rope_dim = 64;
  c.sliding_window = 128, c.swa_pattern = 2;
  return c;
}

// The same without the window, as qwen3moe-like models are.
ModelConfig Unwindowed() {
  ModelConfig c = GptOss20b();
  c.sliding_window = 0;
  return c;
}

TEST(KvCacheTest, WithoutWindowsTheLayoutAndBytesAreLayerByPosition) {
  const KvShape shape = CacheShape(Unwindowed(), 256);
  EXPECT_TRUE(shape.windows.empty());
  // 24 layers x 8192 positions x (512 key + 512 value floats) x 4 bytes; 100 positions round up to 128.
  EXPECT_EQ(KvCachePool::BytesFor(shape, 8192), uint64_t{805306368});
  EXPECT_EQ(KvCachePool::BytesFor(shape, 100), uint64_t{24} * 128 * 1024 * 4);
  KvCachePool pool(shape, uint64_t{1} << 30, HostKvMemory());
  auto cache = pool.Allocate(100);
  ASSERT_TRUE(cache.ok()) << cache.status();
  const KvCache& c = **cache;
  EXPECT_EQ(c.capacity(), 128);
  EXPECT_FALSE(c.windowed());
  EXPECT_EQ(c.bytes(), uint64_t{24} * 128 * 1024 * 4);
  // [layer][capacity][dim], the layout the CUDA backend indexes from keys(), values() and capacity().
  EXPECT_EQ(c.values(), c.keys() + 24 * 128 * 512);
  for (int64_t layer : {0, 1, 23}) {
    EXPECT_EQ(c.slots(layer), 128);
    for (int64_t pos : {0, 1, 127}) {
      EXPECT_EQ(c.key(layer, pos), c.keys() + (layer * 128 + pos) * 512);
      EXPECT_EQ(c.value(layer, pos), c.values() + (layer * 128 + pos) * 512);
    }
  }
}

TEST(KvCacheTest, WindowedLayersKeepARingOfTheWindowAndOneStep) {
  const KvShape shape = CacheShape(GptOss20b(), 256);
  ASSERT_EQ(shape.windows.size(), 24u);
  EXPECT_EQ(shape.windows[0], 128);
  EXPECT_EQ(shape.windows[1], 0);
  // 12 full layers of 8192 positions and 12 rings of 128 + 256 - 1 = 383, x 1024 floats x 4 bytes: 52% of the
  // unwindowed 805306368.
  EXPECT_EQ(KvCachePool::BytesFor(shape, 8192), uint64_t{421478400});
  // gpt-oss's trained context: 12 x (131072 + 383) x 4096, 50.1% of 12884901888.
  EXPECT_EQ(KvCachePool::BytesFor(shape, 131072), uint64_t{6461276160});
  EXPECT_EQ(KvCachePool::BytesFor(CacheShape(Unwindowed(), 256), 131072), uint64_t{12884901888});
  // A cache no longer than the ring keeps every position in every layer: the unwindowed bytes.
  EXPECT_EQ(KvCachePool::BytesFor(shape, 300), KvCachePool::BytesFor(CacheShape(Unwindowed(), 256), 300));

  KvCachePool pool(shape, uint64_t{1} << 30, HostKvMemory());
  auto cache = pool.Allocate(1000);
  ASSERT_TRUE(cache.ok()) << cache.status();
  const KvCache& c = **cache;
  EXPECT_EQ(c.capacity(), 1024);
  EXPECT_TRUE(c.windowed());
  EXPECT_EQ(c.step_positions(), 256);
  EXPECT_EQ(c.slots(0), 383);
  EXPECT_EQ(c.slots(1), 1024);
  EXPECT_EQ(c.bytes(), uint64_t{12} * (1024 + 383) * 1024 * 4);
  EXPECT_EQ(pool.in_use(), c.bytes());
  // A windowed layer maps a position to its slot in the ring: one ring apart is the same slot.
  EXPECT_EQ(c.key(0, 5), c.key(0, 5 + 383));
  EXPECT_EQ(c.value(2, 700), c.value(2, 700 - 383));
  EXPECT_NE(c.key(1, 5), c.key(1, 5 + 383));
  // The positions one step's queries may read (the step's 256 and the 127 before its first) have distinct
  // slots, inside the layer's own keys and values.
  for (int64_t layer : {0, 1, 22, 23}) {
    std::set<const float*> keys, values;
    for (int64_t pos = 600; pos < 600 + 383; ++pos) {
      const float* key = c.key(layer, pos);
      const float* value = c.value(layer, pos);
      keys.insert(key);
      values.insert(value);
      ASSERT_GE(key, c.keys());
      ASSERT_LE(key + 512, c.values());
      ASSERT_GE(value, c.values());
      ASSERT_LE(value + 512, c.keys() + c.bytes() / sizeof(float));
    }
    EXPECT_EQ(keys.size(), 383u) << "layer " << layer;
    EXPECT_EQ(values.size(), 383u) << "layer " << layer;
  }
  // The layers do not overlap: layer 0's ring ends where layer 1 begins.
  EXPECT_EQ(c.key(1, 0), c.keys() + 383 * 512);
  EXPECT_EQ(c.key(2, 0), c.keys() + (383 + 1024) * 512);
}

TEST(KvCacheTest, TheBudgetAdmitsTheSequencesTheRingsMakeRoomFor) {
  // A budget of two unwindowed sequences of 2048 positions holds three windowed ones.
  const uint64_t budget = 2 * KvCachePool::BytesFor(CacheShape(Unwindowed(), 256), 2048);
  KvCachePool unwindowed(CacheShape(Unwindowed(), 256), budget, HostKvMemory());
  KvCachePool windowed(CacheShape(GptOss20b(), 256), budget, HostKvMemory());
  auto admitted = [](KvCachePool& pool) {
    std::vector<std::unique_ptr<KvCache>> caches;
    for (;;) {
      absl::StatusOr<std::unique_ptr<KvCache>> cache = pool.Allocate(2048);
      if (!cache.ok()) {
        EXPECT_EQ(cache.status().code(), absl::StatusCode::kResourceExhausted) << cache.status();
        return caches.size();
      }
      caches.push_back(*std::move(cache));
    }
  };
  EXPECT_EQ(admitted(unwindowed), 2u);
  EXPECT_EQ(admitted(windowed), 3u);
  EXPECT_EQ(windowed.in_use(), 0u);  // every cache returned its bytes
}

TEST(KvCacheTest, ALongerStepWidensTheRing) {
  ModelConfig c = GptOss20b();
  const KvShape one = CacheShape(c, 1);
  const KvShape chunk = CacheShape(c, 512);
  EXPECT_EQ(one.step_positions, 1);
  EXPECT_EQ(KvCachePool::BytesFor(one, 8192), uint64_t{12} * (8192 + 128) * 4096);
  EXPECT_EQ(KvCachePool::BytesFor(chunk, 8192), uint64_t{12} * (8192 + 639) * 4096);
  // A step of no positions is treated as one.
  EXPECT_EQ(CacheShape(c, 0).step_positions, 1);
  // llama.cpp's general pattern: of every 3 blocks, the first two windowed.
  c.swa_pattern = 3;
  EXPECT_EQ(KvCachePool::BytesFor(CacheShape(c, 1), 8192), uint64_t{8} * 8192 * 4096 + uint64_t{16} * 128 * 4096);
}

}  // namespace
}  // namespace strata::model
