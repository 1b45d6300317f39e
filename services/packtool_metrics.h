#ifndef STRATA_SERVICES_PACKTOOL_METRICS_H_
#define STRATA_SERVICES_PACKTOOL_METRICS_H_

// strata-packd's metrics: conversions and validations by outcome. Registers its families in a
// MetricsRegistry that must outlive it. Thread-safe.

#include "absl/status/status.h"
#include "services/metrics_registry.h"

namespace strata::services {

class PackToolMetrics {
 public:
  explicit PackToolMetrics(MetricsRegistry* registry);

  // A conversion that ended (or was refused) with `status`: outcome "ok" or the status's code.
  void CountConversion(const absl::Status& status);
  // A validation: "valid", "invalid" (it ran and found problems), or the status's code when it could not
  // run to the end (not_found, cancelled, ...).
  void CountValidation(const absl::Status& status, bool problems_found);

 private:
  MetricFamily<Counter>& conversions_;
  MetricFamily<Counter>& validations_;
};

}  // namespace strata::services

#endif  // STRATA_SERVICES_PACKTOOL_METRICS_H_
