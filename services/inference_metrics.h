#ifndef STRATA_SERVICES_INFERENCE_METRICS_H_
#define STRATA_SERVICES_INFERENCE_METRICS_H_

// The inference server's metrics, shared by its gRPC and HTTP front ends: requests by API and status,
// prompt and generated tokens, time to first token, inter-token latency and per-request decode speed
// (measured by wrapping a request's engine callbacks), and the engine's own figures read at render time
// (queue depth, active sequences, decode steps, expert hits and misses, bytes over PCIe, KV cache use, load time,
// pinned arena).
//
// Registers its families in a MetricsRegistry that must outlive it. Thread-safe.

#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "engine/runtime/engine.h"
#include "engine/runtime/request.h"
#include "services/metrics_registry.h"

namespace strata::services {

class InferenceMetrics {
 public:
  // `engine` returns the engine being served, or null while the pack loads (the engine's series are left
  // out then); it is called on the thread rendering the registry.
  InferenceMetrics(MetricsRegistry* registry, std::function<const runtime::Engine*()> engine);

  // `callbacks` wrapped so that the request is measured; `api` labels it ("grpc" or "http"). The
  // returned callbacks keep the engine's contract (on_done exactly once) and add no blocking.
  runtime::GenerateCallbacks Observe(absl::string_view api, runtime::GenerateCallbacks callbacks);

  // Counts a request refused before it ran (a bad field, a full queue, no engine yet).
  void CountRefused(absl::string_view api, const absl::Status& status);

 private:
  void CountStatus(absl::string_view api, absl::string_view status);

  MetricFamily<Counter>& requests_;
  MetricFamily<Histogram>& time_to_first_token_;
  MetricFamily<Histogram>& inter_token_latency_;
  MetricFamily<Counter>& prompt_tokens_;
  MetricFamily<Counter>& generated_tokens_;
  MetricFamily<Histogram>& decode_speed_;
};

}  // namespace strata::services

#endif  // STRATA_SERVICES_INFERENCE_METRICS_H_
