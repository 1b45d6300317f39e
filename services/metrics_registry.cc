#include "services/metrics_registry.h"

#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace strata::services {
namespace {

void AtomicAdd(std::atomic<double>& target, double amount) {
  double current = target.load(std::memory_order_relaxed);
  while (!target.compare_exchange_weak(current, current + amount, std::memory_order_relaxed)) {
  }
}

// Prometheus' float syntax: integers without a fraction, "+Inf", "-Inf", "NaN".
std::string FormatValue(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  if (value == std::floor(value) && std::fabs(value) < 1e15) return absl::StrFormat("%.0f", value);
  return absl::StrFormat("%.17g", value);
}

// Label values escape backslash, double quote and newline; HELP text escapes backslash and newline.
std::string Escape(const std::string& text, bool quotes) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '"' && quotes) {
      out += "\\\"";
    } else {
      out += c;
    }
  }
  return out;
}

// "{a="x",b="y"}" (with `extra` appended, e.g. le="0.5"), or "" without labels.
std::string LabelSet(const std::vector<std::string>& names, const std::vector<std::string>& values,
                     const std::string& extra = "") {
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) {
    absl::StrAppend(&out, out.empty() ? "" : ",", names[i], "=\"", Escape(values[i], true), "\"");
  }
  if (!extra.empty()) absl::StrAppend(&out, out.empty() ? "" : ",", extra);
  return out.empty() ? "" : absl::StrCat("{", out, "}");
}

}  // namespace

void Counter::Increment(double amount) {
  if (amount > 0) AtomicAdd(value_, amount);
}

void Gauge::Add(double amount) { AtomicAdd(value_, amount); }

Histogram::Histogram(std::vector<double> upper_bounds)
    : upper_bounds_(std::move(upper_bounds)), buckets_(new std::atomic<uint64_t>[upper_bounds_.size() + 1]) {
  for (size_t i = 0; i <= upper_bounds_.size(); ++i) buckets_[i].store(0);
}

void Histogram::Observe(double value) {
  size_t bucket = 0;
  while (bucket < upper_bounds_.size() && value > upper_bounds_[bucket]) ++bucket;
  buckets_[bucket].fetch_add(1, std::memory_order_relaxed);
  AtomicAdd(sum_, value);
  count_.fetch_add(1, std::memory_order_relaxed);
}

Histogram::Snapshot Histogram::snapshot() const {
  Snapshot s;
  s.upper_bounds = upper_bounds_;
  uint64_t running = 0;
  for (size_t i = 0; i <= upper_bounds_.size(); ++i) {
    running += buckets_[i].load(std::memory_order_relaxed);
    s.cumulative.push_back(running);
  }
  // Observations racing with this read may be in a bucket and not yet in the count (or the reverse); the
  // exposition wants +Inf == count, so the count is the buckets' total.
  s.count = running;
  s.sum = sum_.load(std::memory_order_relaxed);
  return s;
}

std::string StatusLabel(absl::StatusCode code) { return absl::AsciiStrToLower(absl::StatusCodeToString(code)); }

std::vector<double> ExponentialBuckets(double start, double factor, int count) {
  std::vector<double> bounds;
  double bound = start;
  for (int i = 0; i < count; ++i, bound *= factor) bounds.push_back(bound);
  return bounds;
}

struct MetricsRegistry::Family {
  std::string name;
  std::string help;
  const char* type = "";
  std::vector<std::string> label_names;
  std::unique_ptr<MetricFamily<Counter>> counters;
  std::unique_ptr<MetricFamily<Gauge>> gauges;
  std::unique_ptr<MetricFamily<Histogram>> histograms;
  std::function<std::optional<double>()> read;
};

MetricsRegistry::MetricsRegistry() = default;
MetricsRegistry::~MetricsRegistry() = default;

MetricsRegistry::Family& MetricsRegistry::AddFamily(const std::string& name, const std::string& help, const char* type,
                                                    std::vector<std::string> label_names) {
  for (const std::unique_ptr<Family>& family : families_) {
    if (family->name == name) return *family;
  }
  auto family = std::make_unique<Family>();
  family->name = name;
  family->help = help;
  family->type = type;
  family->label_names = std::move(label_names);
  families_.push_back(std::move(family));
  return *families_.back();
}

MetricFamily<Counter>& MetricsRegistry::AddCounter(const std::string& name, const std::string& help,
                                                   std::vector<std::string> label_names) {
  absl::MutexLock lock(&mu_);
  Family& family = AddFamily(name, help, "counter", label_names);
  if (family.counters == nullptr) {
    family.counters.reset(new MetricFamily<Counter>(label_names, [] { return std::make_unique<Counter>(); }));
  }
  return *family.counters;
}

MetricFamily<Gauge>& MetricsRegistry::AddGauge(const std::string& name, const std::string& help,
                                               std::vector<std::string> label_names) {
  absl::MutexLock lock(&mu_);
  Family& family = AddFamily(name, help, "gauge", label_names);
  if (family.gauges == nullptr) {
    family.gauges.reset(new MetricFamily<Gauge>(label_names, [] { return std::make_unique<Gauge>(); }));
  }
  return *family.gauges;
}

MetricFamily<Histogram>& MetricsRegistry::AddHistogram(const std::string& name, const std::string& help,
                                                       std::vector<double> upper_bounds,
                                                       std::vector<std::string> label_names) {
  absl::MutexLock lock(&mu_);
  Family& family = AddFamily(name, help, "histogram", label_names);
  if (family.histograms == nullptr) {
    family.histograms.reset(
        new MetricFamily<Histogram>(label_names, [upper_bounds] { return std::make_unique<Histogram>(upper_bounds); }));
  }
  return *family.histograms;
}

void MetricsRegistry::AddGaugeFunction(const std::string& name, const std::string& help,
                                       std::function<std::optional<double>()> read) {
  absl::MutexLock lock(&mu_);
  Family& family = AddFamily(name, help, "gauge", {});
  if (!family.read) family.read = std::move(read);
}

void MetricsRegistry::AddCounterFunction(const std::string& name, const std::string& help,
                                         std::function<std::optional<double>()> read) {
  absl::MutexLock lock(&mu_);
  Family& family = AddFamily(name, help, "counter", {});
  if (!family.read) family.read = std::move(read);
}

std::string MetricsRegistry::Render() const {
  absl::MutexLock lock(&mu_);
  std::string out;
  for (const std::unique_ptr<Family>& family : families_) {
    absl::StrAppend(&out, "# HELP ", family->name, " ", Escape(family->help, false), "\n");
    absl::StrAppend(&out, "# TYPE ", family->name, " ", family->type, "\n");
    const std::vector<std::string>& names = family->label_names;
    if (family->read) {
      if (std::optional<double> value = family->read(); value.has_value()) {
        absl::StrAppend(&out, family->name, " ", FormatValue(*value), "\n");
      }
    }
    if (family->counters != nullptr) {
      absl::MutexLock series_lock(&family->counters->mu_);
      for (const auto& [values, counter] : family->counters->series_) {
        absl::StrAppend(&out, family->name, LabelSet(names, values), " ", FormatValue(counter->value()), "\n");
      }
    }
    if (family->gauges != nullptr) {
      absl::MutexLock series_lock(&family->gauges->mu_);
      for (const auto& [values, gauge] : family->gauges->series_) {
        absl::StrAppend(&out, family->name, LabelSet(names, values), " ", FormatValue(gauge->value()), "\n");
      }
    }
    if (family->histograms != nullptr) {
      absl::MutexLock series_lock(&family->histograms->mu_);
      for (const auto& [values, histogram] : family->histograms->series_) {
        const Histogram::Snapshot s = histogram->snapshot();
        for (size_t i = 0; i <= s.upper_bounds.size(); ++i) {
          const std::string le = i < s.upper_bounds.size() ? FormatValue(s.upper_bounds[i]) : std::string("+Inf");
          absl::StrAppend(&out, family->name, "_bucket", LabelSet(names, values, absl::StrCat("le=\"", le, "\"")), " ",
                          s.cumulative[i], "\n");
        }
        absl::StrAppend(&out, family->name, "_sum", LabelSet(names, values), " ", FormatValue(s.sum), "\n");
        absl::StrAppend(&out, family->name, "_count", LabelSet(names, values), " ", s.count, "\n");
      }
    }
  }
  return out;
}

}  // namespace strata::services
