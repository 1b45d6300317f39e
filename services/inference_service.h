#ifndef STRATA_SERVICES_INFERENCE_SERVICE_H_
#define STRATA_SERVICES_INFERENCE_SERVICE_H_

// strata.v1.Inference over a runtime::Engine, with the gRPC callback API.
//
// The service is registered with a server before its engine exists (the pack loads after the server
// starts, so health checks can see NOT_SERVING meanwhile); until AttachEngine every call is UNAVAILABLE.
// Generate hands the request to Engine::Submit, whose status (INVALID_ARGUMENT naming the field,
// RESOURCE_EXHAUSTED when the queue is full) ends the call at once when it refuses. Otherwise the
// engine's callbacks (run by a compute thread between parallel jobs, off the decode's critical path)
// queue messages in the call's reactor and start a write when none is in flight; events that arrive
// during a write go out together in the next message.
// A client cancellation or a passed deadline cancels the engine's sequence, which frees it at its next
// step; the call then ends with CANCELLED or DEADLINE_EXCEEDED.
//
// Every call passes the CallGate first (draining, bearer token, per-client limit) and the RequestLimits
// next; a refusal does no work. Each Generate call logs one FormatRequestLog line at info level when it
// ends. CancelGenerations ends the running streams with UNAVAILABLE and a reason (the end of a drain).
//
// Thread-safe. Lifetimes: the engine (owned by the service) must outlive every call, so shut the server
// down and wait for it before destroying the service; Server::Shutdown cancels running generations.

#include <atomic>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "engine/runtime/engine.h"
#include "grpcpp/server.h"
#include "services/inference_metrics.h"
#include "services/call_gate.h"
#include "services/request_limits.h"
#include "strata/v1/inference.grpc.pb.h"

namespace strata::services {

struct InferenceServiceOptions {
  CallGate* gate = nullptr;  // not owned, outlives the service; null: every call admitted
  RequestLimits limits;
};

class GenerateReactor;

class InferenceServiceImpl final : public v1::Inference::CallbackService {
 public:
  explicit InferenceServiceImpl(InferenceServiceOptions options = {}) : options_(std::move(options)) {}
  ~InferenceServiceImpl() override;
  InferenceServiceImpl(const InferenceServiceImpl&) = delete;
  InferenceServiceImpl& operator=(const InferenceServiceImpl&) = delete;

  // Starts serving with `engine`. Call at most once.
  void AttachEngine(std::unique_ptr<runtime::Engine> engine);
  // Measures Generate calls from now on (metrics must outlive the service). Any thread.
  void SetMetrics(InferenceMetrics* metrics) { metrics_.store(metrics, std::memory_order_release); }
  // Null until AttachEngine.
  runtime::Engine* engine() const { return engine_.load(std::memory_order_acquire); }

  // Cancels every running Generate call; each ends with UNAVAILABLE and `reason` (after the tokens it has
  // streamed). Returns how many were running.
  int CancelGenerations(const std::string& reason) ABSL_LOCKS_EXCLUDED(mu_);
  int active_generations() const ABSL_LOCKS_EXCLUDED(mu_);

  grpc::ServerWriteReactor<v1::GenerateResponse>* Generate(grpc::CallbackServerContext* context,
                                                           const v1::GenerateRequest* request) override;
  // Renders the conversation with Engine::PrepareChat (refusals end the call at once), then streams as
  // Generate.
  grpc::ServerWriteReactor<v1::GenerateResponse>* Chat(grpc::CallbackServerContext* context,
                                                       const v1::ChatRequest* request) override;
  grpc::ServerUnaryReactor* Tokenize(grpc::CallbackServerContext* context, const v1::TokenizeRequest* request,
                                     v1::TokenizeResponse* response) override;
  grpc::ServerUnaryReactor* Detokenize(grpc::CallbackServerContext* context, const v1::DetokenizeRequest* request,
                                       v1::DetokenizeResponse* response) override;
  grpc::ServerUnaryReactor* GetModelInfo(grpc::CallbackServerContext* context,
                                         const v1::GetModelInfoRequest* request, v1::ModelInfo* response) override;
  grpc::ServerUnaryReactor* GetStats(grpc::CallbackServerContext* context, const v1::GetStatsRequest* request,
                                     v1::EngineStats* response) override;

 private:
  friend class GenerateReactor;
  // OK, or the gate's refusal (the ticket is then empty).
  absl::Status Admit(const grpc::CallbackServerContext& context, CallGate::Ticket* ticket);
  void Register(GenerateReactor* reactor) ABSL_LOCKS_EXCLUDED(mu_);
  void Unregister(GenerateReactor* reactor) ABSL_LOCKS_EXCLUDED(mu_);
  std::string RequestId(const grpc::CallbackServerContext& context);

  const InferenceServiceOptions options_;
  std::unique_ptr<runtime::Engine> owned_engine_;  // written once, by AttachEngine, before engine_
  std::atomic<runtime::Engine*> engine_{nullptr};
  std::atomic<InferenceMetrics*> metrics_{nullptr};
  std::atomic<uint64_t> next_request_id_{1};

  mutable absl::Mutex mu_;
  absl::flat_hash_set<GenerateReactor*> generations_ ABSL_GUARDED_BY(mu_);  // running Generate calls
};

// Reports the whole server and strata.v1.Inference as SERVING or NOT_SERVING in grpc.health.v1.
void SetInferenceServing(grpc::Server* server, bool serving);

}  // namespace strata::services

#endif  // STRATA_SERVICES_INFERENCE_SERVICE_H_
