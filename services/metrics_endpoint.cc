#include "services/metrics_endpoint.h"

namespace strata::services {

std::unique_ptr<httplib::Server> MakeMetricsHttpServer(const MetricsRegistry* registry) {
  auto server = std::make_unique<httplib::Server>();
  // Scrapes are short: a couple of threads serve them.
  server->new_task_queue = [] { return new httplib::ThreadPool(2); };
  server->Get("/metrics", [registry](const httplib::Request&, httplib::Response& response) {
    response.set_content(registry->Render(), MetricsRegistry::kContentType);
  });
  return server;
}

}  // namespace strata::services
