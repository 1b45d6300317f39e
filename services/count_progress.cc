#include "services/count_progress.h"

#include <algorithm>

#include "absl/strings/str_format.h"
#include "services/progress_printer.h"

namespace strata::services {

CountProgress::CountProgress(std::string what, Unit unit, Sink sink, absl::Duration delay, absl::Duration interval,
                             Clock clock)
    : what_(std::move(what)),
      unit_(unit),
      sink_(std::move(sink)),
      delay_(delay),
      interval_(interval),
      clock_(std::move(clock)),
      start_(clock_()) {}

std::string CountProgress::Line(uint64_t done, uint64_t total, absl::Duration elapsed) const {
  const double seconds = absl::ToDoubleSeconds(elapsed);
  const double rate = seconds > 0 ? static_cast<double>(done) / seconds : 0;
  const double percent = total > 0 ? 100.0 * static_cast<double>(std::min(done, total)) / static_cast<double>(total) : 100;
  if (unit_ == Unit::kBytes) {
    return absl::StrFormat("%s: %s of %s (%.0f%%), %s/s", what_, FormatBytes(static_cast<double>(done)),
                           FormatBytes(static_cast<double>(total)), percent, FormatBytes(rate));
  }
  return absl::StrFormat("%s: %d of %d tokens (%.0f%%), %.0f tokens/s", what_, done, total, percent, rate);
}

void CountProgress::Update(uint64_t done, uint64_t total) {
  const absl::Time now = clock_();
  absl::MutexLock lock(&mu_);
  if (ended_) return;
  const bool last = done >= total;
  const bool printed_before = last_print_ != absl::InfinitePast();
  if (!printed_before && now - start_ < delay_) {
    if (last) ended_ = true;  // quick: nothing to show
    return;
  }
  if (!last && printed_before && now - last_print_ < interval_) return;
  sink_(Line(done, total, now - start_));
  last_print_ = now;
  if (last) ended_ = true;
}

}  // namespace strata::services
