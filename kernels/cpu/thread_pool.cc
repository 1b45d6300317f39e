#include "kernels/cpu/thread_pool.h"

#include <chrono>

#include "absl/strings/str_cat.h"

namespace strata::kernels {
namespace {

inline int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

inline void CpuRelax() { __builtin_ia32_pause(); }

}  // namespace

absl::StatusOr<std::unique_ptr<ThreadPool>> ThreadPool::Create(int num_threads, int spin_us) {
  if (num_threads < 1 || num_threads > kMaxThreads) {
    return absl::InvalidArgumentError(
        absl::StrCat("thread pool size ", num_threads, ": expected 1 to ", kMaxThreads));
  }
  if (spin_us < 0) return absl::InvalidArgumentError(absl::StrCat("spin_us is ", spin_us, ": expected >= 0"));
  return std::unique_ptr<ThreadPool>(new ThreadPool(num_threads, spin_us));
}

ThreadPool::ThreadPool(int num_threads, int spin_us) : spin_ns_(int64_t{spin_us} * 1000) {
  workers_.reserve(num_threads - 1);
  for (int i = 1; i < num_threads; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

ThreadPool::~ThreadPool() {
  RunPosted();
  stop_.store(true, std::memory_order_seq_cst);
  generation_.fetch_add(2, std::memory_order_seq_cst);
  WakeSleepers(/*all=*/true);
  for (std::thread& w : workers_) w.join();
}

void ThreadPool::WakeSleepers(bool all) {
  // Pairs with the sleepers' increment of sleepers_ and their loads of wakeups_ (all seq_cst): a worker
  // that counted itself before this load is woken; one that counts itself after will see the new state.
  if (sleepers_.load(std::memory_order_seq_cst) == 0) return;
  wakeups_.fetch_add(1, std::memory_order_seq_cst);
  if (all) {
    wakeups_.notify_all();
  } else {
    wakeups_.notify_one();
  }
}

void ThreadPool::Post(std::function<void()> work) {
  {
    absl::MutexLock lock(&posted_mu_);
    posted_.push_back(std::move(work));
    has_posted_.store(true, std::memory_order_seq_cst);
  }
  if (workers_.empty()) {
    TryRunPosted();
  } else {
    WakeSleepers(/*all=*/false);
  }
}

namespace {
// The pool whose posted work the current thread is running, if any.
thread_local const ThreadPool* t_running_posted_of = nullptr;
}  // namespace

void ThreadPool::RunQueuedPosted() {
  const ThreadPool* outer = t_running_posted_of;
  t_running_posted_of = this;
  for (;;) {
    std::function<void()> work;
    {
      absl::MutexLock lock(&posted_mu_);
      if (posted_.empty()) {
        has_posted_.store(false, std::memory_order_seq_cst);
        break;
      }
      work = std::move(posted_.front());
      posted_.pop_front();
    }
    work();
  }
  t_running_posted_of = outer;
}

bool ThreadPool::TryRunPosted() {
  bool ran = false;
  // The load first keeps waiting workers from hammering the flag's cache line while another thread runs.
  // It is seq_cst (a plain load on x86) so that a Post that finds the flag held is ordered before the
  // holder's release below, like a failed exchange.
  while (!running_posted_.load(std::memory_order_seq_cst) &&
         !running_posted_.exchange(true, std::memory_order_seq_cst)) {
    ran = true;
    RunQueuedPosted();
    running_posted_.store(false, std::memory_order_seq_cst);
    // A Post between the empty check and the release found the flag held and left its work queued; its
    // has_posted_ store precedes its failed exchange, so it is seen here (all seq_cst) and run now.
    if (!has_posted_.load(std::memory_order_seq_cst)) break;
  }
  return ran;
}

void ThreadPool::RunPosted() {
  if (t_running_posted_of == this) {
    // Called from posted work, which holds running_posted_: waiting would wait for itself.
    RunQueuedPosted();
    return;
  }
  // Done when nothing is queued and nobody runs an item; an item posted by the last one keeps it going.
  WaitUntil([this] {
    if (has_posted_.load(std::memory_order_seq_cst)) TryRunPosted();
    return !has_posted_.load(std::memory_order_seq_cst) && !running_posted_.load(std::memory_order_acquire);
  });
}

void ThreadPool::RunTasks() {
  const int64_t n = n_tasks_;
  for (;;) {
    const int64_t i = next_task_.fetch_add(1, std::memory_order_relaxed);
    if (i >= n) return;
    (*fn_)(i);
    done_tasks_.fetch_add(1, std::memory_order_release);
  }
}

void ThreadPool::WorkerLoop() {
  uint32_t seen = 0;
  auto no_job = [&seen](uint32_t g) { return g == seen || (g & 1) != 0; };
  for (;;) {
    // Wait for a published job newer than the last one seen, running posted work meanwhile: spin, then
    // sleep.
    uint32_t g = generation_.load(std::memory_order_acquire);
    int64_t spin_until = NowNs() + spin_ns_;
    for (uint64_t i = 1; no_job(g); ++i) {
      if (has_posted_.load(std::memory_order_relaxed) && TryRunPosted()) spin_until = NowNs() + spin_ns_;
      if ((i & 63) == 0) {
        if (NowNs() > spin_until) break;
        // Every few microseconds without a job, let a thread the kernel queued on this core run (e.g. a
        // gRPC thread woken while every core spins). Otherwise it waits for the end of this thread's time
        // slice (milliseconds), or preempts it later in the middle of a task, which stalls the whole job.
        std::this_thread::yield();
      }
      CpuRelax();
      g = generation_.load(std::memory_order_acquire);
    }
    if (no_job(g)) {
      sleepers_.fetch_add(1, std::memory_order_seq_cst);
      for (;;) {
        const uint32_t w = wakeups_.load(std::memory_order_seq_cst);
        g = generation_.load(std::memory_order_seq_cst);
        // Posted work that a thread is running already is that thread's to finish (it runs the queue
        // empty and looks again after letting go), so only unclaimed work keeps this worker up.
        if (!no_job(g) || (has_posted_.load(std::memory_order_seq_cst) &&
                           !running_posted_.load(std::memory_order_seq_cst))) {
          break;
        }
        wakeups_.wait(w, std::memory_order_seq_cst);
      }
      sleepers_.fetch_sub(1, std::memory_order_relaxed);
      if (no_job(g)) continue;  // woken for posted work: the spin loop runs it
    }
    seen = g;
    if (stop_.load(std::memory_order_acquire)) return;
    // Join the job, unless ParallelFor has started writing the next one meanwhile (it waits for every
    // worker that joined before it turned the generation odd).
    active_.fetch_add(1, std::memory_order_seq_cst);
    if (generation_.load(std::memory_order_seq_cst) == g) RunTasks();
    active_.fetch_sub(1, std::memory_order_release);
  }
}

template <typename Pred>
void ThreadPool::WaitUntil(Pred pred) const {
  const int64_t spin_until = NowNs() + spin_ns_;
  for (uint64_t i = 1; !pred(); ++i) {
    // Past the spin budget the thread we wait for is probably descheduled: give it the core.
    if ((i & 63) == 0 && NowNs() > spin_until) {
      std::this_thread::yield();
    } else {
      CpuRelax();
    }
  }
}

void ThreadPool::ParallelFor(int64_t n_tasks, absl::FunctionRef<void(int64_t)> fn) {
  if (n_tasks <= 0) return;
  if (workers_.empty() || n_tasks == 1) {
    for (int64_t i = 0; i < n_tasks; ++i) fn(i);
    return;
  }
  const uint32_t g = generation_.load(std::memory_order_relaxed);
  generation_.store(g + 1, std::memory_order_seq_cst);
  // Workers still inside the previous job only find its counter exhausted; wait until they leave.
  WaitUntil([this] { return active_.load(std::memory_order_seq_cst) == 0; });
  fn_ = &fn;
  n_tasks_ = n_tasks;
  next_task_.store(0, std::memory_order_relaxed);
  done_tasks_.store(0, std::memory_order_relaxed);
  generation_.store(g + 2, std::memory_order_seq_cst);
  WakeSleepers(/*all=*/true);

  RunTasks();
  WaitUntil([this, n_tasks] { return done_tasks_.load(std::memory_order_acquire) == n_tasks; });
}

void ParallelFor(ThreadPool* pool, int64_t n_tasks, absl::FunctionRef<void(int64_t)> fn) {
  if (pool == nullptr) {
    for (int64_t i = 0; i < n_tasks; ++i) fn(i);
  } else {
    pool->ParallelFor(n_tasks, fn);
  }
}

}  // namespace strata::kernels
