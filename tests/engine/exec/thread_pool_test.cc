#include "engine/exec/thread_pool.h"

#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "tests/testing/test_util.h"
#include "tests/testing/wait.h"

namespace strata::exec {
namespace {

using ::strata::testing::kHangDeadline;
using ::strata::testing::WaitUntil;

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
  // Tasks that wait for each other can only finish if they run on distinct threads; on a pool that runs
  // them one after another, each gives up at the shared deadline and the test fails instead of hanging.
  std::atomic<int> arrived{0};
  std::atomic<int> gave_up{0};
  const absl::Time deadline = absl::Now() + kHangDeadline;
  pool->ParallelFor(3, [&](int64_t) {
    {
      std::lock_guard<std::mutex> lock(mu);
      ids.push_back(std::this_thread::get_id());
    }
    arrived.fetch_add(1);
    if (!WaitUntil([&] { return arrived.load() >= 3; }, deadline - absl::Now())) gave_up.fetch_add(1);
  });
  EXPECT_EQ(gave_up.load(), 0) << "tasks waited in vain for the others to start beside them";
  ASSERT_EQ(ids.size(), 3u);
  EXPECT_NE(ids[0], ids[1]);
  EXPECT_NE(ids[1], ids[2]);
  EXPECT_NE(ids[0], ids[2]);
}

TEST(ThreadPoolTest, WakesSleepingWorkers) {
  // No spinning: every call after a pause finds the workers asleep. ParallelFor runs tasks on the caller
  // too, which alone could run all of them; so each task holds its thread until every thread of the pool
  // has taken one. A call then finishes only if it woke both workers; if it does not, the tasks give up at
  // the deadline and the test fails.
  std::unique_ptr<ThreadPool> pool = MakePool(3, 0);
  ASSERT_NE(pool, nullptr);
  const std::thread::id caller = std::this_thread::get_id();
  for (int iter = 0; iter < 20; ++iter) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    std::mutex mu;
    std::set<std::thread::id> threads;
    std::atomic<int64_t> sum{0};
    std::atomic<int> gave_up{0};
    auto all_threads_in = [&] {
      std::lock_guard<std::mutex> lock(mu);
      return threads.size() >= 3;
    };
    const absl::Time deadline = absl::Now() + kHangDeadline;
    pool->ParallelFor(100, [&](int64_t i) {
      {
        std::lock_guard<std::mutex> lock(mu);
        threads.insert(std::this_thread::get_id());
      }
      if (!WaitUntil(all_threads_in, deadline - absl::Now())) gave_up.fetch_add(1);
      sum.fetch_add(i);
    });
    ASSERT_EQ(gave_up.load(), 0) << "call " << iter << ": the tasks ran on " << threads.size()
                                 << " threads; a sleeping worker was not woken";
    ASSERT_EQ(threads.size(), 3u) << "call " << iter;
    EXPECT_EQ(threads.count(caller), 1u) << "call " << iter;
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

TEST(ThreadPoolTest, PostedWorkRunsInOrderOnAWorker) {
  for (int spin_us : {0, 50}) {  // 0: the workers sleep, so Post has to wake one
    std::unique_ptr<ThreadPool> pool = MakePool(3, spin_us);
    ASSERT_NE(pool, nullptr);
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    std::vector<int> order;  // written only by posted work of one key, which never runs concurrently
    std::atomic<int> on_caller{0};
    std::atomic<bool> done{false};
    const std::thread::id caller = std::this_thread::get_id();
    for (int i = 0; i < 200; ++i) {
      pool->Post(7, [&, i] {
        if (std::this_thread::get_id() == caller) on_caller.fetch_add(1);
        order.push_back(i);
        if (i == 199) done.store(true);
      });
    }
    // Nothing else drives the pool: the workers alone must run it.
    EXPECT_TRUE(WaitUntil([&] { return done.load(); })) << "spin_us " << spin_us;
    pool->RunPosted();
    ASSERT_EQ(order.size(), 200u);
    for (int i = 0; i < 200; ++i) ASSERT_EQ(order[i], i);
    EXPECT_EQ(on_caller.load(), 0);
  }
}

// Many keys' work interleaved with jobs: each key's items never overlap and run in the order posted,
// and every item runs once.
TEST(ThreadPoolTest, EachKeysWorkRunsOneAtATimeInOrderBesideJobs) {
  constexpr int kKeys = 6;
  std::unique_ptr<ThreadPool> pool = MakePool(4);
  ASSERT_NE(pool, nullptr);
  std::vector<std::atomic<int>> inside(kKeys);
  std::vector<std::vector<int>> order(kKeys);  // order[k] is written only by key k's work
  std::atomic<int> overlaps{0};
  std::vector<int64_t> out(64);
  for (int iter = 0; iter < 300; ++iter) {
    for (int k = 0; k < kKeys; ++k) {
      pool->Post(k, [&, k, iter] {
        if (inside[k].fetch_add(1) != 0) overlaps.fetch_add(1);
        order[k].push_back(iter);
        std::this_thread::sleep_for(std::chrono::microseconds(5));
        inside[k].fetch_sub(1);
      });
    }
    pool->ParallelFor(64, [&](int64_t i) { out[i] = i + iter; });
    for (int64_t i = 0; i < 64; ++i) ASSERT_EQ(out[i], i + iter);
  }
  pool->RunPosted();
  EXPECT_EQ(overlaps.load(), 0);
  for (int k = 0; k < kKeys; ++k) {
    ASSERT_EQ(order[k].size(), 300u) << "key " << k;
    for (int i = 0; i < 300; ++i) ASSERT_EQ(order[k][i], i) << "key " << k;
  }
}

// Work under another key does not wait for a running item: the first item can only finish once the
// second has run beside it.
TEST(ThreadPoolTest, DifferentKeysRunAtTheSameTime) {
  std::unique_ptr<ThreadPool> pool = MakePool(3);
  ASSERT_NE(pool, nullptr);
  std::atomic<bool> second_ran{false};
  std::atomic<bool> first_saw_second{false};
  std::atomic<bool> first_done{false};
  pool->Post(1, [&] {
    first_saw_second.store(WaitUntil([&] { return second_ran.load(); }));
    first_done.store(true);
  });
  pool->Post(2, [&] { second_ran.store(true); });
  // The workers alone run both; the first gives up at the deadline if the second never runs beside it.
  EXPECT_TRUE(WaitUntil([&] { return first_done.load(); }, 2 * kHangDeadline));
  pool->RunPosted();
  EXPECT_TRUE(first_saw_second.load());
}

// Work posted from posted work runs after it; RunPosted called there runs other keys' ready work at once
// instead of waiting for the item it is called from, and leaves its own key's later items for after it.
TEST(ThreadPoolTest, PostAndRunPostedFromPostedWork) {
  struct Case {
    bool run_posted_inside;
    uint64_t inner_key;
    std::vector<std::string> expected;
  };
  const std::vector<Case> cases = {
      {false, 1, {"outer begins", "outer ends", "inner"}},
      {false, 2, {"outer begins", "outer ends", "inner"}},
      {true, 1, {"outer begins", "outer ends", "inner"}},
      {true, 2, {"outer begins", "inner", "outer ends"}},
  };
  for (const Case& c : cases) {
    // Without workers, so that another key's item can only run where the test says.
    std::unique_ptr<ThreadPool> pool = MakePool(1);
    ASSERT_NE(pool, nullptr);
    std::vector<std::string> log;
    pool->Post(1, [&] {
      log.push_back("outer begins");
      pool->Post(c.inner_key, [&] { log.push_back("inner"); });
      if (c.run_posted_inside) pool->RunPosted();
      log.push_back("outer ends");
    });
    pool->RunPosted();
    EXPECT_EQ(log, c.expected) << "inner key " << c.inner_key << ", RunPosted inside: " << c.run_posted_inside;
  }
  // With workers, an item posted from posted work under the same key still runs after it.
  std::unique_ptr<ThreadPool> pool = MakePool(3);
  ASSERT_NE(pool, nullptr);
  std::vector<std::string> log;  // written by key 1's work only
  pool->Post(1, [&] {
    log.push_back("outer begins");
    pool->Post(1, [&] { log.push_back("inner"); });
    pool->RunPosted();
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    log.push_back("outer ends");
  });
  pool->RunPosted();
  EXPECT_EQ(log, (std::vector<std::string>{"outer begins", "outer ends", "inner"}));
}

TEST(ThreadPoolTest, WithoutWorkersPostFromManyThreadsLeavesNothingQueued) {
  std::unique_ptr<ThreadPool> pool = MakePool(1);
  ASSERT_NE(pool, nullptr);
  std::atomic<int> ran{0};
  std::vector<std::thread> posters;
  for (int t = 0; t < 4; ++t) {
    posters.emplace_back([&] {
      // Keys shared between the threads, so that a thread's item is often left to the thread running
      // that key's work.
      for (int i = 0; i < 2000; ++i) pool->Post(i % 3, [&] { ran.fetch_add(1); });
    });
  }
  for (std::thread& t : posters) t.join();
  // Every Post has returned and nothing else drives the pool: all of it must have run already.
  EXPECT_EQ(ran.load(), 8000);
}

TEST(ThreadPoolTest, WithoutWorkersPostRunsOnTheCaller) {
  std::unique_ptr<ThreadPool> pool = MakePool(1);
  ASSERT_NE(pool, nullptr);
  std::thread::id ran_on;
  pool->Post(0, [&] { ran_on = std::this_thread::get_id(); });
  EXPECT_EQ(ran_on, std::this_thread::get_id());
}

TEST(ThreadPoolTest, RunPostedWaitsForWorkAWorkerIsRunning) {
  std::unique_ptr<ThreadPool> pool = MakePool(2);
  ASSERT_NE(pool, nullptr);
  std::atomic<bool> started{false};
  std::atomic<bool> caller_waits{false};
  std::atomic<bool> finished{false};
  pool->Post(0, [&] {
    started.store(true);
    // Still running once the caller has gone into RunPosted (the sleep covers the step from the flag to
    // the call; a caller delayed longer can only make this test miss a bug, never fail a correct pool).
    WaitUntil([&] { return caller_waits.load(); });
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    finished.store(true);
  });
  // Not ASSERT: RunPosted below must still run, so that nothing posted outlives the variables it uses.
  EXPECT_TRUE(WaitUntil([&] { return started.load(); })) << "no worker took the posted work";
  caller_waits.store(true);
  pool->RunPosted();
  EXPECT_TRUE(finished.load());
}

TEST(ThreadPoolTest, DestructorRunsWhatIsStillPosted) {
  std::atomic<int> ran{0};
  {
    std::unique_ptr<ThreadPool> pool = MakePool(3, 0);
    ASSERT_NE(pool, nullptr);
    for (int i = 0; i < 50; ++i) {
      pool->Post(i % 5, [&] {
        std::this_thread::sleep_for(std::chrono::microseconds(100));
        ran.fetch_add(1);
      });
    }
  }
  EXPECT_EQ(ran.load(), 50);
}

}  // namespace
}  // namespace strata::exec
