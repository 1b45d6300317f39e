#include "engine/exec/thread_pool.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"

namespace strata::exec {
namespace {

inline int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

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

namespace {
// The pool whose posted work the current thread is running, if any.
thread_local const ThreadPool* t_running_posted_of = nullptr;
}  // namespace

void ThreadPool::Post(uint64_t order, std::function<void()> work) {
  bool became_ready = false;
  {
    absl::MutexLock lock(&posted_mu_);
    OrderedQueue& queue = posted_[order];
    queue.items.push_back(std::move(work));
    if (!queue.running && queue.items.size() == 1) {
      ready_.push_back(order);
      has_posted_.store(true, std::memory_order_seq_cst);
      became_ready = true;
    }
  }
  // An item queued behind others of its key is run by the thread that runs them: nobody to wake.
  if (!became_ready) return;
  if (!workers_.empty()) {
    WakeSleepers(/*all=*/false);
  } else if (t_running_posted_of != this) {
    RunReadyPosted();
  }
}

bool ThreadPool::RunReadyPosted(const uint32_t* worker_seen_job) {
  const ThreadPool* outer = t_running_posted_of;
  t_running_posted_of = this;
  bool ran = false;
  uint64_t order = 0;
  std::function<void()> work;
  posted_mu_.Lock();
  while (!ready_.empty()) {
    order = ready_.front();
    ready_.pop_front();
    has_posted_.store(!ready_.empty(), std::memory_order_seq_cst);
    OrderedQueue& queue = posted_[order];
    work = std::move(queue.items.front());
    queue.items.pop_front();
    queue.running = true;
    ++running_posted_;
    posted_mu_.Unlock();

    const int64_t start_ns = NowNs();
    work();
    work = nullptr;  // destroyed outside the lock too
    const int64_t ns = NowNs() - start_ns;
    ran = true;

    posted_mu_.Lock();
    --running_posted_;
    ++posted_items_run_;
    posted_ns_ += ns;
    auto it = posted_.find(order);
    it->second.running = false;
    if (it->second.items.empty()) {
      posted_.erase(it);
    } else {
      ready_.push_back(order);  // behind the keys that were waiting
      has_posted_.store(true, std::memory_order_seq_cst);
    }
    // A job published meanwhile goes first; the worker's wait loop comes back for the rest.
    if (worker_seen_job != nullptr && generation_.load(std::memory_order_acquire) != *worker_seen_job) break;
  }
  posted_mu_.Unlock();
  t_running_posted_of = outer;
  return ran;
}

void ThreadPool::RunPosted() {
  if (t_running_posted_of == this) {
    // Called from posted work: waiting for the running items would wait for this one.
    RunReadyPosted();
    return;
  }
  // Done when nothing is ready and nobody runs an item; an item posted by a running one keeps it going.
  WaitUntil([this] {
    if (has_posted_.load(std::memory_order_seq_cst)) RunReadyPosted();
    absl::MutexLock lock(&posted_mu_);
    return ready_.empty() && running_posted_ == 0;
  });
}

ThreadPool::PostedStats ThreadPool::posted_stats() const {
  absl::MutexLock lock(&posted_mu_);
  return {posted_items_run_, static_cast<double>(posted_ns_) * 1e-9};
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
  pthread_setname_np(pthread_self(), "strata-pool");  // for top, perf and the benches' accounting
  uint32_t seen = 0;
  auto no_job = [&seen](uint32_t g) { return g == seen || (g & 1) != 0; };
  for (;;) {
    // Wait for a published job newer than the last one seen, running posted work meanwhile: spin, then
    // sleep.
    uint32_t g = generation_.load(std::memory_order_acquire);
    int64_t spin_until = NowNs() + spin_ns_;
    for (uint64_t i = 1; no_job(g); ++i) {
      if (has_posted_.load(std::memory_order_relaxed) && RunReadyPosted(&seen)) spin_until = NowNs() + spin_ns_;
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
        // Only unclaimed work keeps this worker up: a running item's later items are that thread's to run.
        if (!no_job(g) || has_posted_.load(std::memory_order_seq_cst)) break;
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

int AvailableCores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    const int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

void ParallelFor(ThreadPool* pool, int64_t n_tasks, absl::FunctionRef<void(int64_t)> fn) {
  if (pool == nullptr) {
    for (int64_t i = 0; i < n_tasks; ++i) fn(i);
  } else {
    pool->ParallelFor(n_tasks, fn);
  }
}

}  // namespace strata::exec
