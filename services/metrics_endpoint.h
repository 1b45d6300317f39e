#ifndef STRATA_SERVICES_METRICS_ENDPOINT_H_
#define STRATA_SERVICES_METRICS_ENDPOINT_H_

// GET /metrics: a registry in Prometheus' text format, for --metrics-listen. Open to every client (probes
// and scrapers carry no token); anything else is 404.

#include <memory>

#include "httplib.h"
#include "services/metrics_registry.h"

namespace strata::services {

// A new httplib server serving `registry` (which must outlive it) at /metrics, for HttpListener::Start.
std::unique_ptr<httplib::Server> MakeMetricsHttpServer(const MetricsRegistry* registry);

}  // namespace strata::services

#endif  // STRATA_SERVICES_METRICS_ENDPOINT_H_
