#ifndef STRATA_SERVICES_METRICS_REGISTRY_H_
#define STRATA_SERVICES_METRICS_REGISTRY_H_

// A small metrics registry rendered in Prometheus' text exposition format (version 0.0.4): counters,
// gauges and histograms with fixed buckets, each a family of series told apart by label values, plus
// "function" series whose value is read when the registry is rendered (for figures another component
// already keeps, such as the engine's counters).
//
// The registry owns every family and series; the references it hands out stay valid for its lifetime.
// Thread-safe: families are added, series looked up, updated and the whole rendered from any thread.
// Updates of a series are lock-free (atomics); Render holds the registry's lock and calls the read
// functions under it, so those must not call back into the registry.

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace strata::services {

// A value that only goes up (requests, tokens, bytes).
class Counter {
 public:
  void Increment(double amount = 1);  // negative amounts are ignored: a counter never goes down
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

// A value that goes up and down (queue depth).
class Gauge {
 public:
  void Set(double value) { value_.store(value, std::memory_order_relaxed); }
  void Add(double amount);
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

// Observations counted into fixed buckets (upper bounds, ascending; +Inf is implicit), with their sum.
class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  void Observe(double value);

  struct Snapshot {
    std::vector<double> upper_bounds;
    std::vector<uint64_t> cumulative;  // per bound, then one for +Inf (== count)
    double sum = 0;
    uint64_t count = 0;
  };
  Snapshot snapshot() const;

 private:
  const std::vector<double> upper_bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> buckets_;  // per bound and +Inf, not cumulative
  std::atomic<double> sum_{0};
  std::atomic<uint64_t> count_{0};
};

// A status as a label value: "ok", "invalid_argument", "resource_exhausted", ... (the code in lower case).
std::string StatusLabel(absl::StatusCode code);

// Buckets `start`, start*factor, ... (`count` of them).
std::vector<double> ExponentialBuckets(double start, double factor, int count);

template <typename Series>
class MetricFamily;

class MetricsRegistry {
 public:
  MetricsRegistry();
  MetricsRegistry(const MetricsRegistry&) = delete;
  MetricsRegistry& operator=(const MetricsRegistry&) = delete;
  ~MetricsRegistry();

  // Adds a family. `name` follows Prometheus' conventions (strata_ prefix, base units, _total for
  // counters); `label_names` are the labels every series of it has (possibly none). A name added twice
  // returns the family added first.
  MetricFamily<Counter>& AddCounter(const std::string& name, const std::string& help,
                                    std::vector<std::string> label_names = {});
  MetricFamily<Gauge>& AddGauge(const std::string& name, const std::string& help,
                                std::vector<std::string> label_names = {});
  MetricFamily<Histogram>& AddHistogram(const std::string& name, const std::string& help,
                                        std::vector<double> upper_bounds, std::vector<std::string> label_names = {});

  // A series without labels whose value `read` returns at render time; nullopt leaves it out (e.g. not
  // known yet). `read` runs under the registry's lock, on the rendering thread.
  void AddGaugeFunction(const std::string& name, const std::string& help, std::function<std::optional<double>()> read);
  void AddCounterFunction(const std::string& name, const std::string& help,
                          std::function<std::optional<double>()> read);

  // The text exposition format: per family "# HELP", "# TYPE", then its series sorted by label values.
  std::string Render() const;

  // Content-Type of Render's output.
  static constexpr const char* kContentType = "text/plain; version=0.0.4; charset=utf-8";

 private:
  struct Family;
  Family& AddFamily(const std::string& name, const std::string& help, const char* type,
                    std::vector<std::string> label_names) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  std::vector<std::unique_ptr<Family>> families_ ABSL_GUARDED_BY(mu_);  // in the order added
};

// The series of one family, created on first use of their label values.
template <typename Series>
class MetricFamily {
 public:
  // The series with these label values (one per label name, in order); created on first use. A wrong
  // number of values is a programming error: the values are padded or cut to the label names.
  Series& WithLabels(std::vector<std::string> values);
  // The family's series when it has no labels.
  Series& Get() { return WithLabels({}); }

 private:
  friend class MetricsRegistry;
  MetricFamily(std::vector<std::string> label_names, std::function<std::unique_ptr<Series>()> make)
      : label_names_(std::move(label_names)), make_(std::move(make)) {}

  const std::vector<std::string> label_names_;
  const std::function<std::unique_ptr<Series>()> make_;
  mutable absl::Mutex mu_;
  std::map<std::vector<std::string>, std::unique_ptr<Series>> series_ ABSL_GUARDED_BY(mu_);
};

template <typename Series>
Series& MetricFamily<Series>::WithLabels(std::vector<std::string> values) {
  values.resize(label_names_.size());
  absl::MutexLock lock(&mu_);
  std::unique_ptr<Series>& series = series_[values];
  if (series == nullptr) series = make_();
  return *series;
}

}  // namespace strata::services

#endif  // STRATA_SERVICES_METRICS_REGISTRY_H_
