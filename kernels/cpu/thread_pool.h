#ifndef STRATA_KERNELS_CPU_THREAD_POOL_H_
#define STRATA_KERNELS_CPU_THREAD_POOL_H_

// A fixed set of threads that runs the tasks of one ParallelFor at a time, for work issued per layer and
// token where a few microseconds of dispatch matter.
//
// ParallelFor runs on num_threads threads: the calling thread plus num_threads - 1 workers the pool owns.
// Tasks are handed out one at a time from a shared counter, so uneven tasks balance. Idle workers spin for
// spin_us after their last job, then sleep on a futex until the next one. ParallelFor may be called from
// one thread at a time (any thread, but never concurrently and never from inside a task); the pool is
// otherwise not thread-safe. The destructor joins the workers and must not race a ParallelFor.

#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"

namespace strata::kernels {

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

 private:
  ThreadPool(int num_threads, int spin_us);
  void WorkerLoop();
  // Claims and runs tasks of the current job until none are left.
  void RunTasks();
  // Spins until pred() holds, yielding the core once the spin budget is spent.
  template <typename Pred>
  void WaitUntil(Pred pred) const;

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
  std::atomic<bool> stop_{false};
};

}  // namespace strata::kernels

#endif  // STRATA_KERNELS_CPU_THREAD_POOL_H_
