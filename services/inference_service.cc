#include "services/inference_service.h"

#include <algorithm>
#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/synchronization/mutex.h"
#include "engine/tokenizer/utf8.h"
#include "grpcpp/health_check_service_interface.h"
#include "services/grpc_status.h"
#include "services/inference_protos.h"
#include "services/count_progress.h"
#include "services/request_log.h"
#include "spdlog/spdlog.h"

namespace strata::services {
namespace {

using Clock = std::chrono::system_clock;

// A longer x-request-id is not taken (the server numbers the request instead).
constexpr size_t kMaxRequestIdBytes = 128;

absl::Status NotLoaded() {
  return absl::UnavailableError("the model is still loading; retry once the server reports SERVING");
}

grpc::ServerUnaryReactor* FinishUnary(grpc::CallbackServerContext* context, const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

}  // namespace

// One Generate call. The engine's callbacks (an engine thread) and gRPC's reactions (its threads) meet
// under mu_: each updates the state and, in the same critical section, decides the next stream operation
// (a write of everything pending, or the finish), which it starts after unlocking as the last thing it
// does. Finish is called exactly once, after the engine's on_done (or at once for a refused call) and with
// no write in flight, so the engine never calls into a deleted reactor; the reactor logs its request line,
// leaves the service's registry and deletes itself in OnDone. The service may call CancelForShutdown while
// the reactor is registered.
class GenerateReactor final : public grpc::ServerWriteReactor<v1::GenerateResponse> {
 public:
  // `method`: "Generate" or "Chat", for the log line. `metrics` may be null.
  GenerateReactor(InferenceServiceImpl* service, runtime::Engine* engine, grpc::CallbackServerContext* context,
                  const char* method, InferenceMetrics* metrics)
      : service_(service),
        engine_(engine),
        deadline_(context->deadline()),
        metrics_(metrics),
        started_(absl::Now()) {
    log_.id = service->RequestId(*context);
    log_.method = method;
    log_.peer = context->peer();
  }

  // Ends the call with `status` before anything was submitted. Called once, instead of Start.
  void Refuse(const absl::Status& status) {
    if (metrics_ != nullptr) metrics_->CountRefused("grpc", status);
    {
      absl::MutexLock lock(&mu_);
      log_.status = status;
      finish_started_ = true;
    }
    Finish(ToGrpcStatus(status));
  }

  // Submits the request; a refusal ends the call with the engine's status. Called once, before the reactor
  // is returned to gRPC (so OnDone cannot run before Start returns).
  void Start(runtime::GenerateRequest request, CallGate::Ticket ticket) {
    ticket_ = std::move(ticket);
    runtime::GenerateCallbacks callbacks;
    callbacks.on_tokens = [this](const runtime::TokenEvent& event) { OnTokens(event); };
    callbacks.on_done = [this](const runtime::GenerationResult& result) { OnFinished(result); };
    // A long prompt's prefill shows in the log (nothing for one done within a second).
    auto prefill = std::make_shared<CountProgress>("prefill", CountProgress::Unit::kTokens,
                                                   [](const std::string& line) { spdlog::info("{}", line); });
    callbacks.on_prompt_progress = [prefill](int64_t done, int64_t total) {
      prefill->Update(static_cast<uint64_t>(done), static_cast<uint64_t>(total));
    };
    if (metrics_ != nullptr) callbacks = metrics_->Observe("grpc", std::move(callbacks));
    absl::StatusOr<std::shared_ptr<runtime::RequestHandle>> handle =
        engine_->Submit(std::move(request), std::move(callbacks));
    if (!handle.ok()) {
      Refuse(handle.status());
      return;
    }
    absl::MutexLock lock(&mu_);
    handle_ = *std::move(handle);
    if (cancel_ != Cancel::kNone) handle_->Cancel();
  }

  // Ends the generation early; the call then ends with UNAVAILABLE and `reason`.
  void CancelForShutdown(const std::string& reason) {
    absl::MutexLock lock(&mu_);
    if (cancel_ != Cancel::kNone || engine_done_) return;
    shutdown_reason_ = reason;
    CancelLocked(Cancel::kShutdown);
  }

  void OnWriteDone(bool ok) override {
    Op op;
    {
      absl::MutexLock lock(&mu_);
      write_in_flight_ = false;
      if (!ok) {
        // The stream is broken (the client is gone): stop generating and write nothing more.
        stream_broken_ = true;
        CancelLocked(Cancel::kClient);
      }
      op = NextOpLocked();
    }
    Run(op);
  }

  void OnCancel() override {
    Op op;
    {
      absl::MutexLock lock(&mu_);
      CancelLocked(Clock::now() >= deadline_ ? Cancel::kDeadline : Cancel::kClient);
      op = NextOpLocked();
    }
    Run(op);
  }

  void OnDone() override {
    ticket_.Release();
    RequestLogRecord record;
    {
      absl::MutexLock lock(&mu_);
      record = log_;
    }
    record.total_seconds = absl::ToDoubleSeconds(absl::Now() - started_);
    spdlog::info("{}", FormatRequestLog(record));
    service_->Unregister(this);
    delete this;
  }

 private:
  enum class Cancel { kNone, kClient, kDeadline, kShutdown };
  struct Op {
    enum Kind { kNone, kWrite, kFinish } kind = kNone;
    grpc::Status status;  // for kFinish
  };

  // Engine callback.
  void OnTokens(const runtime::TokenEvent& event) {
    Op op;
    {
      absl::MutexLock lock(&mu_);
      if (cancel_ == Cancel::kNone && Clock::now() >= deadline_) CancelLocked(Cancel::kDeadline);
      if (Listening() && (!event.tokens.empty() || !event.text.empty())) {
        AppendTokenEvent(event, engine_->tokenizer(), &pending_);
        has_pending_ = true;
      }
      op = NextOpLocked();
    }
    Run(op);
  }

  // Engine callback; the engine's last call.
  void OnFinished(const runtime::GenerationResult& result) {
    Op op;
    {
      absl::MutexLock lock(&mu_);
      engine_done_ = true;
      const bool cancelled = result.reason == runtime::FinishReason::kCancelled;
      if (cancelled && cancel_ == Cancel::kNone && Clock::now() >= deadline_) cancel_ = Cancel::kDeadline;
      log_.prompt_tokens = result.usage.prompt_tokens;
      log_.completion_tokens = result.usage.completion_tokens;
      log_.ttft_seconds = result.usage.completion_tokens > 0 ? result.usage.time_to_first_token : -1;
      log_.finish = std::string(runtime::FinishReasonName(result.reason));
      if (cancel_ == Cancel::kDeadline) {
        final_status_ = grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                                     absl::StrCat("deadline exceeded after ", result.tokens.size(), " tokens"));
      } else if (cancel_ == Cancel::kClient) {
        final_status_ = grpc::Status(grpc::StatusCode::CANCELLED, "cancelled by the client");
      } else if (cancel_ == Cancel::kShutdown) {
        final_status_ = grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                     absl::StrCat(shutdown_reason_, " (after ", result.tokens.size(), " tokens)"));
      } else {
        pending_.set_finish_reason(FinishReasonToProto(result.reason));
        *pending_.mutable_usage() = UsageToProto(result.usage);
        has_pending_ = true;
        if (result.reason == runtime::FinishReason::kError) {
          final_status_ = ToGrpcStatus(result.status);
        } else if (cancelled) {
          final_status_ = grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                       "the server is shutting down; the generation was cancelled");
        }
      }
      if (!Listening()) has_pending_ = false;
      log_.status = FromGrpcStatus(final_status_);
      op = NextOpLocked();
    }
    Run(op);
  }

  // False once the client is gone or gave up; a shutdown still sends what was generated before the reason.
  bool Listening() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return cancel_ == Cancel::kNone || cancel_ == Cancel::kShutdown;
  }

  void CancelLocked(Cancel why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (cancel_ != Cancel::kNone || engine_done_) return;
    cancel_ = why;
    if (!Listening()) has_pending_ = false;
    if (handle_ != nullptr) handle_->Cancel();  // else Start cancels once Submit has returned
  }

  Op NextOpLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Op op;
    if (write_in_flight_ || finish_started_) return op;
    if (has_pending_ && !stream_broken_) {
      writing_.Clear();
      writing_.Swap(&pending_);
      has_pending_ = false;
      write_in_flight_ = true;
      op.kind = Op::kWrite;
    } else if (engine_done_) {
      finish_started_ = true;
      op.kind = Op::kFinish;
      op.status = final_status_;
    }
    return op;
  }

  // The last thing a caller does with the reactor: after it, OnDone may already have deleted it.
  void Run(const Op& op) {
    if (op.kind == Op::kWrite) StartWrite(&writing_);  // writing_ is left alone until OnWriteDone
    if (op.kind == Op::kFinish) Finish(op.status);
  }

  InferenceServiceImpl* const service_;
  runtime::Engine* const engine_;
  const Clock::time_point deadline_;
  InferenceMetrics* const metrics_;  // may be null
  const absl::Time started_;
  CallGate::Ticket ticket_;  // set by Start, released by OnDone

  absl::Mutex mu_;
  std::shared_ptr<runtime::RequestHandle> handle_ ABSL_GUARDED_BY(mu_);
  Cancel cancel_ ABSL_GUARDED_BY(mu_) = Cancel::kNone;
  std::string shutdown_reason_ ABSL_GUARDED_BY(mu_);
  v1::GenerateResponse pending_ ABSL_GUARDED_BY(mu_);  // events not yet written, coalesced
  bool has_pending_ ABSL_GUARDED_BY(mu_) = false;
  bool write_in_flight_ ABSL_GUARDED_BY(mu_) = false;
  bool stream_broken_ ABSL_GUARDED_BY(mu_) = false;
  bool engine_done_ ABSL_GUARDED_BY(mu_) = false;
  bool finish_started_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status final_status_ ABSL_GUARDED_BY(mu_);
  RequestLogRecord log_ ABSL_GUARDED_BY(mu_);
  v1::GenerateResponse writing_;  // owned by the write in flight
};

InferenceServiceImpl::~InferenceServiceImpl() = default;

void InferenceServiceImpl::AttachEngine(std::unique_ptr<runtime::Engine> engine) {
  owned_engine_ = std::move(engine);
  engine_.store(owned_engine_.get(), std::memory_order_release);
}

absl::Status InferenceServiceImpl::Admit(const grpc::CallbackServerContext& context, CallGate::Ticket* ticket) {
  if (options_.gate == nullptr) return absl::OkStatus();
  absl::StatusOr<CallGate::Ticket> admitted = options_.gate->Admit(context);
  if (!admitted.ok()) return admitted.status();
  *ticket = *std::move(admitted);
  return absl::OkStatus();
}

std::string InferenceServiceImpl::RequestId(const grpc::CallbackServerContext& context) {
  const auto& metadata = context.client_metadata();
  if (auto it = metadata.find("x-request-id"); it != metadata.end() && it->second.size() <= kMaxRequestIdBytes) {
    return std::string(it->second.data(), it->second.size());
  }
  return absl::StrCat(next_request_id_.fetch_add(1, std::memory_order_relaxed));
}

void InferenceServiceImpl::Register(GenerateReactor* reactor) {
  absl::MutexLock lock(&mu_);
  generations_.insert(reactor);
}

void InferenceServiceImpl::Unregister(GenerateReactor* reactor) {
  absl::MutexLock lock(&mu_);
  generations_.erase(reactor);
}

int InferenceServiceImpl::CancelGenerations(const std::string& reason) {
  absl::MutexLock lock(&mu_);  // a registered reactor is not deleted meanwhile (OnDone unregisters first)
  for (GenerateReactor* reactor : generations_) reactor->CancelForShutdown(reason);
  return static_cast<int>(generations_.size());
}

int InferenceServiceImpl::active_generations() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(generations_.size());
}

grpc::ServerWriteReactor<v1::GenerateResponse>* InferenceServiceImpl::Generate(grpc::CallbackServerContext* context,
                                                                              const v1::GenerateRequest* request) {
  auto* reactor =
      new GenerateReactor(this, engine(), context, "Generate", metrics_.load(std::memory_order_acquire));
  Register(reactor);
  CallGate::Ticket ticket;
  absl::Status admitted = Admit(*context, &ticket);
  if (admitted.ok() && engine() == nullptr) admitted = NotLoaded();
  if (admitted.ok()) admitted = CheckGenerateRequest(*request, options_.limits);
  if (!admitted.ok()) {
    reactor->Refuse(admitted);
    return reactor;
  }
  runtime::GenerateRequest converted = GenerateRequestFromProto(*request);
  // An unset max_tokens takes the engine's default, which the server's limit may be below.
  if (!request->sampling().has_max_tokens()) {
    converted.sampling.max_tokens = std::min(converted.sampling.max_tokens, options_.limits.max_tokens);
  }
  reactor->Start(std::move(converted), std::move(ticket));
  return reactor;
}

grpc::ServerWriteReactor<v1::GenerateResponse>* InferenceServiceImpl::Chat(grpc::CallbackServerContext* context,
                                                                          const v1::ChatRequest* request) {
  auto* reactor = new GenerateReactor(this, engine(), context, "Chat", metrics_.load(std::memory_order_acquire));
  Register(reactor);
  CallGate::Ticket ticket;
  absl::Status admitted = Admit(*context, &ticket);
  runtime::Engine* engine = this->engine();
  if (admitted.ok() && engine == nullptr) admitted = NotLoaded();
  if (admitted.ok()) admitted = CheckChatRequest(*request, options_.limits);
  if (!admitted.ok()) {
    reactor->Refuse(admitted);
    return reactor;
  }
  absl::StatusOr<runtime::GenerateRequest> generate = engine->PrepareChat(ChatRequestFromProto(*request));
  if (!generate.ok()) {
    reactor->Refuse(generate.status());
    return reactor;
  }
  if (!request->sampling().has_max_tokens()) {
    generate->sampling.max_tokens = std::min(generate->sampling.max_tokens, options_.limits.max_tokens);
  }
  reactor->Start(*std::move(generate), std::move(ticket));
  return reactor;
}

grpc::ServerUnaryReactor* InferenceServiceImpl::Tokenize(grpc::CallbackServerContext* context,
                                                         const v1::TokenizeRequest* request,
                                                         v1::TokenizeResponse* response) {
  CallGate::Ticket ticket;
  if (absl::Status s = Admit(*context, &ticket); !s.ok()) return FinishUnary(context, s);
  runtime::Engine* engine = this->engine();
  if (engine == nullptr) return FinishUnary(context, NotLoaded());
  if (absl::Status s = CheckTokenizeRequest(*request, options_.limits); !s.ok()) return FinishUnary(context, s);
  const bool add_special = request->has_add_special() ? request->add_special() : true;
  const std::vector<int32_t> ids = engine->Tokenize(request->text(), add_special, request->parse_special());
  for (int32_t id : ids) {
    response->add_tokens(id);
    response->add_pieces(std::string(engine->tokenizer().TokenPiece(id)));
  }
  return FinishUnary(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* InferenceServiceImpl::Detokenize(grpc::CallbackServerContext* context,
                                                           const v1::DetokenizeRequest* request,
                                                           v1::DetokenizeResponse* response) {
  CallGate::Ticket ticket;
  if (absl::Status s = Admit(*context, &ticket); !s.ok()) return FinishUnary(context, s);
  runtime::Engine* engine = this->engine();
  if (engine == nullptr) return FinishUnary(context, NotLoaded());
  if (absl::Status s = CheckDetokenizeRequest(*request, options_.limits); !s.ok()) return FinishUnary(context, s);
  const tokenizer::Tokenizer& tok = engine->tokenizer();
  for (int i = 0; i < request->tokens_size(); ++i) {
    if (!tok.IsValid(request->tokens(i))) {
      return FinishUnary(context, absl::InvalidArgumentError(absl::StrCat("tokens[", i, "]: ", request->tokens(i),
                                                                          " is not a token id (the vocabulary has ",
                                                                          tok.n_vocab(), ")")));
    }
  }
  const std::vector<int32_t> ids(request->tokens().begin(), request->tokens().end());
  tokenizer::DecodeOptions options;
  options.render_special = request->render_special();
  options.strip_leading_space = !request->keep_leading_space();
  response->set_text(tokenizer::RepairUtf8(tok.Decode(ids, options)));
  return FinishUnary(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* InferenceServiceImpl::GetModelInfo(grpc::CallbackServerContext* context,
                                                             const v1::GetModelInfoRequest* request,
                                                             v1::ModelInfo* response) {
  CallGate::Ticket ticket;
  if (absl::Status s = Admit(*context, &ticket); !s.ok()) return FinishUnary(context, s);
  runtime::Engine* engine = this->engine();
  if (engine == nullptr) return FinishUnary(context, NotLoaded());
  *response = ModelInfoToProto(engine->info(), engine->tokenizer());
  return FinishUnary(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* InferenceServiceImpl::GetStats(grpc::CallbackServerContext* context,
                                                         const v1::GetStatsRequest* request,
                                                         v1::EngineStats* response) {
  CallGate::Ticket ticket;
  if (absl::Status s = Admit(*context, &ticket); !s.ok()) return FinishUnary(context, s);
  runtime::Engine* engine = this->engine();
  if (engine == nullptr) return FinishUnary(context, NotLoaded());
  *response = EngineStatsToProto(engine->stats());
  return FinishUnary(context, absl::OkStatus());
}

void SetInferenceServing(grpc::Server* server, bool serving) {
  grpc::HealthCheckServiceInterface* health = server->GetHealthCheckService();
  if (health == nullptr) {
    spdlog::warn("the server has no health check service; cannot report {}", serving ? "SERVING" : "NOT_SERVING");
    return;
  }
  health->SetServingStatus("", serving);
  health->SetServingStatus(v1::Inference::service_full_name(), serving);
}

}  // namespace strata::services
