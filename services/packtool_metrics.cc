#include "services/packtool_metrics.h"

namespace strata::services {

PackToolMetrics::PackToolMetrics(MetricsRegistry* registry)
    : conversions_(registry->AddCounter("strata_packtool_conversions_total",
                                        "GGUF to pack conversions ended, by outcome (ok, cancelled, not_found, "
                                        "invalid_argument, ...)",
                                        {"outcome"})),
      validations_(registry->AddCounter(
          "strata_packtool_validations_total",
          "Pack validations ended, by outcome (valid, invalid, not_found, cancelled, ...)", {"outcome"})) {}

void PackToolMetrics::CountConversion(const absl::Status& status) {
  conversions_.WithLabels({StatusLabel(status.code())}).Increment();
}

void PackToolMetrics::CountValidation(const absl::Status& status, bool problems_found) {
  const std::string outcome = !status.ok() ? StatusLabel(status.code()) : (problems_found ? "invalid" : "valid");
  validations_.WithLabels({outcome}).Increment();
}

}  // namespace strata::services
