#include "kernels/cpu/thread_pool.h"

#include <atomic>
#include <mutex>
#include <chrono>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/test_util.h"

namespace strata::kernels {
namespace {

std::unique_ptr<ThreadPool> MakePool(int threads, int spin_us = 50) {
  absl::StatusOr<std::unique_ptr<ThreadPool>> pool = ThreadPool::Create(threads, spin_us);
  EXPECT_THAT(pool.status(), IsOk());
  return pool.ok() ? std::move(*pool) : nullptr;
}

TEST(ThreadPoolTest, RejectsBadSizes) {
  EXPECT_THAT(ThreadPool::Create(0).status(), StatusIsWith(absl::StatusCode::kInvalidArgument, "size 0"));
  EXPECT_THAT(ThreadPool::Create(-3).status(), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ThreadPool::Create(ThreadPool::kMaxThreads + 1).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ThreadPool::Create(2, -1).status(), StatusIsWith(absl::StatusCode::kInvalidArgument, "spin_us"));
}

TEST(ThreadPoolTest, RunsEveryTaskOnce) {
  for (int threads : {1, 2, 3, 8}) {
    std::unique_ptr<ThreadPool> pool = MakePool(threads);
    ASSERT_NE(pool, nullptr);
    EXPECT_EQ(pool->num_threads(), threads);
    for (int64_t n : {0, 1, 2, 7, 64, 1000}) {
      std::vector<std::atomic<int>> count(n);
      pool->ParallelFor(n, [&](int64_t i) { count[i].fetch_add(1); });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(count[i].load(), 1) << threads << " threads, task " << i;
    }
  }
}

TEST(ThreadPoolTest, ResultsVisibleAfterReturnOverManyCalls) {
  std::unique_ptr<ThreadPool> pool = MakePool(4);
  ASSERT_NE(pool, nullptr);
  std::vector<int64_t> out(37);
  for (int iter = 0; iter < 3000; ++iter) {
    const int64_t n = 1 + iter % 37;
    // Plain (non-atomic) writes by the tasks, read by the caller after ParallelFor returns.
    pool->ParallelFor(n, [&](int64_t i) { out[i] = i * 1000 + iter; });
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(out[i], i * 1000 + iter) << "call " << iter;
  }
}

TEST(ThreadPoolTest, UsesSeveralThreads) {
  std::unique_ptr<ThreadPool> pool = MakePool(3);
  ASSERT_NE(pool, nullptr);
  std::mutex mu;
  std::vector<std::thread::id> ids;
  // Tasks that wait for each other can only finish if they run on distinct threads.
  std::atomic<int> arrived{0};
  pool->ParallelFor(3, [&](int64_t) {
    {
      std::lock_guard<std::mutex> lock(mu);
      ids.push_back(std::this_thread::get_id());
    }
    arrived.fetch_add(1);
    while (arrived.load() < 3) std::this_thread::yield();
  });
  ASSERT_EQ(ids.size(), 3u);
  EXPECT_NE(ids[0], ids[1]);
  EXPECT_NE(ids[1], ids[2]);
  EXPECT_NE(ids[0], ids[2]);
}

TEST(ThreadPoolTest, WakesSleepingWorkers) {
  // No spinning: every call after a pause finds the workers asleep.
  std::unique_ptr<ThreadPool> pool = MakePool(3, 0);
  ASSERT_NE(pool, nullptr);
  for (int iter = 0; iter < 20; ++iter) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    std::atomic<int64_t> sum{0};
    pool->ParallelFor(100, [&](int64_t i) { sum.fetch_add(i); });
    ASSERT_EQ(sum.load(), 4950);
  }
}

TEST(ThreadPoolTest, UsableFromAnotherThreadAndDestroyedIdle) {
  std::unique_ptr<ThreadPool> pool = MakePool(2);
  ASSERT_NE(pool, nullptr);
  std::atomic<int> ran{0};
  std::thread caller([&] { pool->ParallelFor(10, [&](int64_t) { ran.fetch_add(1); }); });
  caller.join();
  EXPECT_EQ(ran.load(), 10);
  pool.reset();
  // A pool that never ran anything shuts down too.
  MakePool(4).reset();
}

}  // namespace
}  // namespace strata::kernels
