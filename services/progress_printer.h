#ifndef STRATA_SERVICES_PROGRESS_PRINTER_H_
#define STRATA_SERVICES_PROGRESS_PRINTER_H_

// Shows conversion progress for a person. On a terminal: one bar redrawn in place with \r, at most ~10 times
// a second, with the pack bytes written, the rate the source is read at and the ETA. Elsewhere (a log, a
// pipe): a plain line at each phase change, each 5% of the expert bytes and at least every 10 s. One thread
// calls it; the stream is borrowed.

#include <cstdint>
#include <functional>
#include <ostream>
#include <string>

#include "absl/time/time.h"
#include "packtool/convert.h"

namespace strata::services {

// "812 B", "12.3 KB", "4.56 MB", "1.23 GB" (decimal units).
std::string FormatBytes(double bytes);

class ProgressPrinter {
 public:
  using Clock = std::function<absl::Time()>;

  ProgressPrinter(std::ostream* out, bool terminal, Clock clock = &absl::Now);

  void Update(const packtool::ConvertProgress& progress);

  // Ends the bar's line on a terminal. Call once, when the job has ended however it ended.
  void Finish();

 private:
  // The one-line description of `progress` at `now`, without line ending.
  std::string Describe(const packtool::ConvertProgress& progress, absl::Time now);

  std::ostream* const out_;
  const bool terminal_;
  const Clock clock_;

  std::string phase_;  // of the last update
  absl::Time last_print_ = absl::InfinitePast();
  int last_percent_step_ = -1;                       // last 5% step printed (plain mode)
  absl::Time experts_start_ = absl::InfinitePast();  // first expert bytes seen, for the ETA
  uint64_t experts_start_bytes_ = 0;
  size_t bar_width_ = 0;  // characters of the bar on screen (terminal mode)
};

}  // namespace strata::services

#endif  // STRATA_SERVICES_PROGRESS_PRINTER_H_
