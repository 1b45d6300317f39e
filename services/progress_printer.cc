#include "services/progress_printer.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace strata::services {
namespace {

constexpr absl::Duration kTerminalInterval = absl::Milliseconds(100);
constexpr absl::Duration kPlainInterval = absl::Seconds(10);
constexpr int kPlainStepPercent = 5;
constexpr int kBarCells = 30;

std::string FormatEta(double seconds) {
  const int64_t s = static_cast<int64_t>(std::llround(seconds));
  if (s >= 3600) return absl::StrFormat("%d:%02d:%02d", s / 3600, s / 60 % 60, s % 60);
  return absl::StrFormat("%d:%02d", s / 60, s % 60);
}

}  // namespace

std::string FormatBytes(double bytes) {
  if (bytes < 1e3) return absl::StrFormat("%.0f B", bytes);
  if (bytes < 1e6) return absl::StrFormat("%.1f KB", bytes / 1e3);
  if (bytes < 1e9) return absl::StrFormat("%.2f MB", bytes / 1e6);
  return absl::StrFormat("%.2f GB", bytes / 1e9);
}

ProgressPrinter::ProgressPrinter(std::ostream* out, bool terminal, Clock clock)
    : out_(out), terminal_(terminal), clock_(std::move(clock)) {}

std::string ProgressPrinter::Describe(const packtool::ConvertProgress& p, absl::Time now) {
  if (p.phase != "experts" || p.bytes_total == 0) {
    if (p.phase == "dense") return "writing dense.gguf";
    if (p.phase == "finish") return "finishing (checksums, sync, rename)";
    if (p.phase == "hf-to-gguf") return "writing the Hugging Face checkpoint as a GGUF";
    return p.phase;
  }
  const double fraction = std::min(1.0, static_cast<double>(p.bytes_done) / static_cast<double>(p.bytes_total));
  std::string eta = "--";
  const double elapsed = absl::ToDoubleSeconds(now - experts_start_);
  if (p.bytes_done > experts_start_bytes_ && elapsed > 0) {
    const double rate = static_cast<double>(p.bytes_done - experts_start_bytes_) / elapsed;
    eta = FormatEta(static_cast<double>(p.bytes_total - std::min(p.bytes_done, p.bytes_total)) / rate);
  }
  const std::string counts = absl::StrCat(FormatBytes(static_cast<double>(p.bytes_done)), " / ",
                                          FormatBytes(static_cast<double>(p.bytes_total)), ", reading ",
                                          FormatBytes(p.bytes_per_second), "/s, ETA ", eta);
  if (!terminal_) {
    return absl::StrFormat("experts %3.0f%% (%s, %u of %u experts)", fraction * 100, counts, p.experts_done,
                           p.experts_total);
  }
  const int filled = static_cast<int>(fraction * kBarCells);
  return absl::StrFormat("experts [%s%s] %3.0f%%  %s", std::string(filled, '#'), std::string(kBarCells - filled, '.'),
                         fraction * 100, counts);
}

void ProgressPrinter::Update(const packtool::ConvertProgress& progress) {
  const absl::Time now = clock_();
  const bool phase_changed = progress.phase != phase_;
  phase_ = progress.phase;
  if (progress.phase == "experts" && experts_start_ == absl::InfinitePast()) {
    experts_start_ = now;
    experts_start_bytes_ = progress.bytes_done;
  }
  if (terminal_) {
    if (!phase_changed && now - last_print_ < kTerminalInterval) return;
    std::string line = Describe(progress, now);
    const size_t width = line.size();
    // Blank what is left of a longer previous line.
    if (width < bar_width_) line.append(bar_width_ - width, ' ');
    bar_width_ = width;
    *out_ << '\r' << line << std::flush;
    last_print_ = now;
    return;
  }
  int step = -1;
  if (progress.phase == "experts" && progress.bytes_total > 0) {
    step = static_cast<int>(100.0 * static_cast<double>(progress.bytes_done) /
                            static_cast<double>(progress.bytes_total) / kPlainStepPercent);
  }
  const bool step_changed = step > last_percent_step_;
  if (!phase_changed && !step_changed && now - last_print_ < kPlainInterval) return;
  if (step_changed) last_percent_step_ = step;
  *out_ << "convert: " << Describe(progress, now) << '\n' << std::flush;
  last_print_ = now;
}

void ProgressPrinter::Finish() {
  if (terminal_ && bar_width_ > 0) *out_ << '\n' << std::flush;
  bar_width_ = 0;
}

}  // namespace strata::services
