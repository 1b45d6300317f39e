#ifndef STRATA_ENGINE_EXEC_THREAD_POOL_H_
#define STRATA_ENGINE_EXEC_THREAD_POOL_H_

// A fixed set of threads that runs the tasks of one ParallelFor at a time, for work issued per layer and
// token where a few microseconds of dispatch matter.
//
// ParallelFor runs on num_threads threads: the calling thread plus num_threads - 1 workers the pool owns.
// Tasks are handed out one at a time from a shared counter, so uneven tasks balance. Idle workers spin for
// spin_us after their last job (yielding the core every few microseconds to any other thread queued on
// it), then sleep on a futex until the next one. ParallelFor may be called from
// one thread at a time (any thread, but never concurrently and never from inside a task).
//
// Post queues side work (e.g. handing results to a network stack) that workers run between jobs, off the
// critical path: the job goes on without those workers instead of waiting for a thread the side work
// displaced mid-task. Work is posted under an order key: one key's work runs one item at a time, in the
// order posted, while different keys' work may run at the same time on different workers. Post and
// RunPosted may be called from any thread, including from posted work. The destructor runs what is still
// posted, then joins the workers; it must not race a ParallelFor.

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace strata::exec {

class ThreadPool {
 public:
  static constexpr int kMaxThreads = 1024;

  // num_threads in [1, kMaxThreads]; 1 runs every task on the caller. spin_us >= 0.
  static absl::StatusOr<std::unique_ptr<ThreadPool>> Create(int num_threads, int spin_us = 50);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Runs fn(i) once for every i in [0, n_tasks) across the threads and returns when all have finished.
  // Tasks must not throw.
  void ParallelFor(int64_t n_tasks, absl::FunctionRef<void(int64_t)> fn);

  // Queues work to run soon on a worker that is between jobs (waking one if all sleep), never inside a
  // ParallelFor task. Work under one `order` key runs one item at a time in the order posted; keys run in
  // the order they became ready, one item per turn. A pool without workers runs the work on the posting
  // threads: on the caller before Post returns, unless another thread running posted work takes it first
  // or that key's work is running elsewhere (then that thread runs it before it returns), or the caller is
  // itself running posted work (it runs the item once the current one and the keys ready before are done).
  void Post(uint64_t order, std::function<void()> work);

  // Returns once no posted work is left, queued or running: it runs ready items on the calling thread and
  // waits for those other threads run. Work posted meanwhile (also by the items themselves) is waited for
  // too, so it returns once posting has stopped. Called from posted work, it runs the items ready there and
  // then, nested in the current one, without waiting for other threads' items or for later items of its
  // own key (they wait for it).
  void RunPosted();

  // Posted items run so far and the time spent in them, summed over threads (an item that runs others
  // nested, through RunPosted, counts their time too).
  struct PostedStats {
    uint64_t items = 0;
    double seconds = 0;
  };
  PostedStats posted_stats() const;

 private:
  ThreadPool(int num_threads, int spin_us);
  void WorkerLoop();
  // Claims and runs tasks of the current job until none are left.
  void RunTasks();
  // Spins until pred() holds, yielding the core once the spin budget is spent.
  template <typename Pred>
  void WaitUntil(Pred pred) const;
  // Runs ready posted work until none is left unclaimed, or, given the last job a worker saw, until a
  // newer job is published (the worker then joins it and comes back for the rest); true if it ran any.
  bool RunReadyPosted(const uint32_t* worker_seen_job = nullptr);
  // Wakes sleeping workers (all, or one) after a job was published or work posted.
  void WakeSleepers(bool all);

  const int64_t spin_ns_;
  std::vector<std::thread> workers_;

  // The job: written by ParallelFor only while no worker is inside it (active_ == 0 after `generation_`
  // went odd), read by workers that joined it.
  const absl::FunctionRef<void(int64_t)>* fn_ = nullptr;
  int64_t n_tasks_ = 0;

  // Even: a job (or nothing) is published; odd: ParallelFor is writing the next job.
  alignas(64) std::atomic<uint32_t> generation_{0};
  alignas(64) std::atomic<int64_t> next_task_{0};
  alignas(64) std::atomic<int64_t> done_tasks_{0};
  alignas(64) std::atomic<int> active_{0};    // workers inside a job
  alignas(64) std::atomic<int> sleepers_{0};  // workers asleep or about to be
  alignas(64) std::atomic<uint32_t> wakeups_{0};  // sleeping workers wait for this to change
  std::atomic<bool> stop_{false};

  // Posted work. A key is in ready_ (once) while it has queued items and none of its items is running;
  // has_posted_ mirrors !ready_.empty() for lock-free checks in the workers' wait loop.
  struct OrderedQueue {
    std::deque<std::function<void()>> items;
    bool running = false;
  };
  alignas(64) std::atomic<bool> has_posted_{false};
  alignas(64) mutable absl::Mutex posted_mu_;
  absl::flat_hash_map<uint64_t, OrderedQueue> posted_ ABSL_GUARDED_BY(posted_mu_);
  std::deque<uint64_t> ready_ ABSL_GUARDED_BY(posted_mu_);
  int running_posted_ ABSL_GUARDED_BY(posted_mu_) = 0;  // items being run now
  uint64_t posted_items_run_ ABSL_GUARDED_BY(posted_mu_) = 0;
  int64_t posted_ns_ ABSL_GUARDED_BY(posted_mu_) = 0;
};

// One iteration of a spin-wait: a pause that lets the sibling hyperthread run.
inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// The CPUs this process may run on (its affinity mask, as taskset or a container sets it), at least 1;
// what "one thread per core" means everywhere.
int AvailableCores();

// `threads` when positive, else AvailableCores(): how every thread-count option reads 0.
inline int ResolveThreads(int threads) { return threads > 0 ? threads : AvailableCores(); }

// Runs fn(i) for every i in [0, n_tasks): on `pool`, or on the caller when `pool` is null.
void ParallelFor(ThreadPool* pool, int64_t n_tasks, absl::FunctionRef<void(int64_t)> fn);

}  // namespace strata::exec

#endif  // STRATA_ENGINE_EXEC_THREAD_POOL_H_
