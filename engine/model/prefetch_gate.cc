#include "engine/model/prefetch_gate.h"

#include <algorithm>

namespace strata::model {

PrefetchGate::PrefetchGate(int max_experts, double min_right, int64_t window)
    : max_experts_(std::max(0, max_experts)),
      min_right_(min_right),
      window_(static_cast<uint64_t>(std::max<int64_t>(window, 2 * kMinSample))) {}

double PrefetchGate::right_fraction() const { return guessed_ > 0 ? right_ / guessed_ : 0.0; }

int PrefetchGate::Observe(uint64_t guessed, uint64_t right) {
  guessed_ += static_cast<double>(guessed);
  right_ += static_cast<double>(std::min(right, guessed));
  if (guessed_ >= static_cast<double>(kMinSample)) {
    const double fraction = right_fraction();
    if (open_ && fraction < min_right_) open_ = false;
    if (!open_ && fraction >= min_right_ + kHysteresis) open_ = true;
  }
  if (guessed_ >= static_cast<double>(window_)) {
    guessed_ /= 2;
    right_ /= 2;
  }
  return limit();
}

}  // namespace strata::model
