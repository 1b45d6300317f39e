#ifndef STRATA_SERVICES_COUNT_PROGRESS_H_
#define STRATA_SERVICES_COUNT_PROGRESS_H_

// Rate-limited progress lines for a long job measured by a count: the expert bytes a pack load has read,
// the prompt tokens a prefill has run. A job that ends within `delay` (a small pack, a short prompt) prints
// nothing; a longer one prints a line every `interval` and a last one when the count reaches the total:
//   "loading experts: 12.30 GB of 34.00 GB (36%), 2.10 GB/s"
//   "prefill: 4096 of 15000 tokens (27%), 812 tokens/s"
// Lines go to `sink` without a line ending (stderr for strata-run, the log for strata-server). Thread-safe:
// Update may be called from any thread; the sink is called under the lock, one line at a time.

#include <cstdint>
#include <functional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace strata::services {

class CountProgress {
 public:
  enum class Unit { kBytes, kTokens };
  using Clock = std::function<absl::Time()>;
  using Sink = std::function<void(const std::string& line)>;

  // The job starts now (the rate is measured from here).
  CountProgress(std::string what, Unit unit, Sink sink, absl::Duration delay = absl::Seconds(1),
                absl::Duration interval = absl::Seconds(2), Clock clock = &absl::Now);

  // `done` of `total` so far; done >= total ends the job (its line, if any lines came before it).
  void Update(uint64_t done, uint64_t total);

 private:
  std::string Line(uint64_t done, uint64_t total, absl::Duration elapsed) const;

  const std::string what_;
  const Unit unit_;
  const Sink sink_;
  const absl::Duration delay_;
  const absl::Duration interval_;
  const Clock clock_;
  const absl::Time start_;
  absl::Mutex mu_;
  absl::Time last_print_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace strata::services

#endif  // STRATA_SERVICES_COUNT_PROGRESS_H_
