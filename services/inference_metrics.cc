#include "services/inference_metrics.h"

#include <chrono>
#include <memory>
#include <optional>
#include <utility>

namespace strata::services {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// Per request, touched only by its callbacks, which the engine calls one at a time.
struct RequestTiming {
  Clock::time_point submitted = Clock::now();
  std::optional<Clock::time_point> last_token;
};

}  // namespace

InferenceMetrics::InferenceMetrics(MetricsRegistry* registry, std::function<const runtime::Engine*()> engine)
    : requests_(registry->AddCounter("strata_requests_total",
                                     "Generation requests ended, by API (grpc, http) and status (ok, cancelled, "
                                     "invalid_argument, resource_exhausted, unavailable, ...)",
                                     {"api", "status"})),
      time_to_first_token_(registry->AddHistogram("strata_time_to_first_token_seconds",
                                                  "Time from a request's submission to its first token",
                                                  ExponentialBuckets(0.005, 2, 14))),
      inter_token_latency_(registry->AddHistogram("strata_inter_token_latency_seconds",
                                                  "Time between a request's successive tokens",
                                                  ExponentialBuckets(0.001, 2, 14))),
      prompt_tokens_(
          registry->AddCounter("strata_prompt_tokens_total", "Prompt tokens of the requests that ended", {"api"})),
      generated_tokens_(registry->AddCounter("strata_generated_tokens_total",
                                             "Tokens generated and sent (rate() of it is the tokens per second)",
                                             {"api"})),
      decode_speed_(registry->AddHistogram("strata_request_decode_tokens_per_second",
                                           "Decode speed of each finished request (its tokens after the first)",
                                           ExponentialBuckets(0.5, 2, 14))) {
  auto stat = [engine](auto field) {
    return [engine, field]() -> std::optional<double> {
      const runtime::Engine* e = engine();
      if (e == nullptr) return std::nullopt;
      return field(e->stats());
    };
  };
  using Stats = runtime::EngineStats;
  registry->AddGaugeFunction("strata_model_loaded", "1 once the model has loaded and requests are served",
                             [engine]() -> std::optional<double> { return engine() != nullptr ? 1 : 0; });
  registry->AddGaugeFunction("strata_queue_depth", "Requests waiting for a sequence slot",
                             stat([](const Stats& s) { return s.queued; }));
  registry->AddGaugeFunction("strata_active_sequences", "Sequences being prefilled or decoded",
                             stat([](const Stats& s) { return s.active; }));
  registry->AddCounterFunction("strata_engine_steps_total", "Decode steps the scheduler ran",
                               stat([](const Stats& s) { return static_cast<double>(s.steps); }));
  registry->AddCounterFunction("strata_expert_hits_total", "Routed experts served from VRAM",
                               stat([](const Stats& s) { return static_cast<double>(s.expert_hits); }));
  registry->AddCounterFunction("strata_expert_misses_total", "Routed experts computed from host memory",
                               stat([](const Stats& s) { return static_cast<double>(s.expert_misses); }));
  registry->AddGaugeFunction("strata_expert_hit_ratio",
                             "Fraction of routed experts served from VRAM since start (0 before any)",
                             stat([](const Stats& s) {
                               const double total = static_cast<double>(s.expert_hits + s.expert_misses);
                               return total > 0 ? static_cast<double>(s.expert_hits) / total : 0.0;
                             }));
  registry->AddCounterFunction("strata_expert_read_bytes_total", "Expert weight bytes read by the decode",
                               stat([](const Stats& s) { return static_cast<double>(s.expert_bytes); }));
  registry->AddCounterFunction("strata_pcie_bytes_total", "Bytes copied from host to device over PCIe",
                               stat([](const Stats& s) { return static_cast<double>(s.cache.pcie_bytes); }));
  registry->AddGaugeFunction("strata_host_miss_share",
                             "Share of a decode step's VRAM misses the host's threads compute (GPU offload)",
                             stat([](const Stats& s) { return s.cache.host_share; }));
  registry->AddCounterFunction("strata_host_expert_computations_total",
                               "Expert computations the host's threads did for the GPU (offload misses)",
                               stat([](const Stats& s) { return static_cast<double>(s.cache.host_experts); }));
  registry->AddCounterFunction("strata_guessed_experts_total",
                               "Decode misses guessed one layer early (--prefetch-experts)",
                               stat([](const Stats& s) { return static_cast<double>(s.cache.guessed); }));
  registry->AddCounterFunction("strata_guessed_experts_right_total", "Guessed misses their layer then routed",
                               stat([](const Stats& s) { return static_cast<double>(s.cache.guessed_right); }));
  registry->AddCounterFunction("strata_prefetched_experts_total", "Guessed misses copied into VRAM ahead",
                               stat([](const Stats& s) { return static_cast<double>(s.cache.prefetched); }));
  registry->AddCounterFunction("strata_prefetched_experts_used_total", "Copies ahead their layer then used",
                               stat([](const Stats& s) { return static_cast<double>(s.cache.prefetch_used); }));
  registry->AddGaugeFunction("strata_kv_cache_bytes", "KV cache bytes in use",
                             stat([](const Stats& s) { return static_cast<double>(s.kv_bytes_in_use); }));
  registry->AddGaugeFunction("strata_kv_cache_budget_bytes", "KV cache bytes available in all",
                             stat([](const Stats& s) { return static_cast<double>(s.kv_bytes_budget); }));
  registry->AddGaugeFunction("strata_model_load_seconds", "Time the model took to load",
                             [engine]() -> std::optional<double> {
                               const runtime::Engine* e = engine();
                               if (e == nullptr) return std::nullopt;
                               return e->info().load_seconds;
                             });
  registry->AddGaugeFunction("strata_arena_pinned", "1 when the expert arena is page-locked for the GPU, else 0",
                             [engine]() -> std::optional<double> {
                               const runtime::Engine* e = engine();
                               if (e == nullptr) return std::nullopt;
                               return e->info().source.pinned ? 1 : 0;
                             });
}

void InferenceMetrics::CountStatus(absl::string_view api, absl::string_view status) {
  requests_.WithLabels({std::string(api), std::string(status)}).Increment();
}

void InferenceMetrics::CountRefused(absl::string_view api, const absl::Status& status) {
  CountStatus(api, StatusLabel(status.code()));
}

runtime::GenerateCallbacks InferenceMetrics::Observe(absl::string_view api, runtime::GenerateCallbacks callbacks) {
  auto timing = std::make_shared<RequestTiming>();
  runtime::GenerateCallbacks observed;
  Counter& generated = generated_tokens_.WithLabels({std::string(api)});
  Counter& prompt = prompt_tokens_.WithLabels({std::string(api)});
  observed.on_tokens = [this, timing, &generated,
                        on_tokens = std::move(callbacks.on_tokens)](const runtime::TokenEvent& event) {
    if (!event.tokens.empty()) {
      generated.Increment(static_cast<double>(event.tokens.size()));
      const Clock::time_point now = Clock::now();
      if (!timing->last_token.has_value()) {
        time_to_first_token_.Get().Observe(Seconds(now - timing->submitted));
      } else {
        // Tokens that arrive together share the gap since the previous ones.
        const double each = Seconds(now - *timing->last_token) / static_cast<double>(event.tokens.size());
        for (size_t i = 0; i < event.tokens.size(); ++i) inter_token_latency_.Get().Observe(each);
      }
      timing->last_token = now;
    }
    if (on_tokens) on_tokens(event);
  };
  observed.on_done = [this, &prompt, api = std::string(api),
                      on_done = std::move(callbacks.on_done)](const runtime::GenerationResult& result) {
    prompt.Increment(static_cast<double>(result.usage.prompt_tokens));
    if (result.reason == runtime::FinishReason::kCancelled) {
      CountStatus(api, "cancelled");
    } else if (result.reason == runtime::FinishReason::kError) {
      CountStatus(api, StatusLabel(result.status.code()));
    } else {
      CountStatus(api, "ok");
      if (result.usage.completion_tokens > 1 && result.usage.decode_tokens_per_second > 0) {
        decode_speed_.Get().Observe(result.usage.decode_tokens_per_second);
      }
    }
    if (on_done) on_done(result);
  };
  return observed;
}

}  // namespace strata::services
