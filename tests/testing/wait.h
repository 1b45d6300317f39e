#ifndef STRATA_TESTS_TESTING_WAIT_H_
#define STRATA_TESTS_TESTING_WAIT_H_

// Waiting in tests. Every wait has a deadline, so a bug that stops something from happening fails the test
// instead of hanging it. The deadline is a hang guard, never a speed bound: what a test waits for happens
// within milliseconds on any machine, and the deadline is minutes away from that.
// Header-only: the test binaries compile *_test.cc files and test_support only.

#include <chrono>
#include <thread>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace strata::testing {

// How long a test waits for an event before calling it a hang.
inline constexpr absl::Duration kHangDeadline = absl::Seconds(60);

// Polls `done` until it returns true or `timeout` has passed; returns its last value. It yields the core
// between the first polls, then sleeps 100 us between them, so that a long wait leaves the core to the
// threads it waits for. `done` is called from this thread only.
template <typename Pred>
bool WaitUntil(Pred done, absl::Duration timeout = kHangDeadline) {
  const absl::Time end = absl::Now() + timeout;
  for (int polls = 0;; ++polls) {
    if (done()) return true;
    if (absl::Now() >= end) return done();
    if (polls < 1000) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }
}

}  // namespace strata::testing

#endif  // STRATA_TESTS_TESTING_WAIT_H_
