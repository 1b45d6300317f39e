#include "services/inference_service.h"

#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "engine/tokenizer/utf8.h"
#include "grpcpp/health_check_service_interface.h"
#include "services/grpc_status.h"
#include "services/inference_protos.h"
#include "services/count_progress.h"
#include "spdlog/spdlog.h"

namespace strata::services {
namespace {

using Clock = std::chrono::system_clock;

absl::Status NotLoaded() {
  return absl::UnavailableError("the model is still loading; retry once the server reports SERVING");
}

grpc::ServerUnaryReactor* FinishUnary(grpc::CallbackServerContext* context, const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

// Ends a Generate call that was refused before anything was submitted.
class RefusedGenerate final : public grpc::ServerWriteReactor<v1::GenerateResponse> {
 public:
  explicit RefusedGenerate(const absl::Status& status) { Finish(ToGrpcStatus(status)); }
  void OnDone() override { delete this; }
};

// One Generate call. The engine's callbacks (an engine thread) and gRPC's reactions (its threads) meet
// under mu_: each updates the state and, in the same critical section, decides the next stream operation
// (a write of everything pending, or the finish), which it starts after unlocking as the last thing it
// does. Finish is called exactly once, after the engine's on_done and with no write in flight, so the
// engine never calls into a deleted reactor; the reactor deletes itself in OnDone.
class GenerateReactor final : public grpc::ServerWriteReactor<v1::GenerateResponse> {
 public:
  GenerateReactor(runtime::Engine* engine, Clock::time_point deadline, InferenceMetrics* metrics)
      : engine_(engine), deadline_(deadline), metrics_(metrics) {}

  // Submits the request; a refusal ends the call with the engine's status. Called once, before the reactor
  // is returned to gRPC (so OnDone cannot run before Start returns).
  void Start(runtime::GenerateRequest request) {
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
      if (metrics_ != nullptr) metrics_->CountRefused("grpc", handle.status());
      Finish(ToGrpcStatus(handle.status()));
      return;
    }
    absl::MutexLock lock(&mu_);
    handle_ = *std::move(handle);
    if (cancel_ != Cancel::kNone) handle_->Cancel();
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

  void OnDone() override { delete this; }

 private:
  enum class Cancel { kNone, kClient, kDeadline };
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
      if (cancel_ == Cancel::kNone && (!event.tokens.empty() || !event.text.empty())) {
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
      if (cancel_ == Cancel::kDeadline) {
        final_status_ = grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                                     absl::StrCat("deadline exceeded after ", result.tokens.size(), " tokens"));
      } else if (cancel_ == Cancel::kClient) {
        final_status_ = grpc::Status(grpc::StatusCode::CANCELLED, "cancelled by the client");
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
      if (cancel_ != Cancel::kNone) has_pending_ = false;  // nobody is listening
      op = NextOpLocked();
    }
    Run(op);
  }

  void CancelLocked(Cancel why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (cancel_ != Cancel::kNone || engine_done_) return;
    cancel_ = why;
    has_pending_ = false;
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

  runtime::Engine* const engine_;
  const Clock::time_point deadline_;
  InferenceMetrics* const metrics_;  // may be null

  absl::Mutex mu_;
  std::shared_ptr<runtime::RequestHandle> handle_ ABSL_GUARDED_BY(mu_);
  Cancel cancel_ ABSL_GUARDED_BY(mu_) = Cancel::kNone;
  v1::GenerateResponse pending_ ABSL_GUARDED_BY(mu_);  // events not yet written, coalesced
  bool has_pending_ ABSL_GUARDED_BY(mu_) = false;
  bool write_in_flight_ ABSL_GUARDED_BY(mu_) = false;
  bool stream_broken_ ABSL_GUARDED_BY(mu_) = false;
  bool engine_done_ ABSL_GUARDED_BY(mu_) = false;
  bool finish_started_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status final_status_ ABSL_GUARDED_BY(mu_);
  v1::GenerateResponse writing_;  // owned by the write in flight
};

}  // namespace

InferenceServiceImpl::~InferenceServiceImpl() = default;

void InferenceServiceImpl::AttachEngine(std::unique_ptr<runtime::Engine> engine) {
  owned_engine_ = std::move(engine);
  engine_.store(owned_engine_.get(), std::memory_order_release);
}

grpc::ServerWriteReactor<v1::GenerateResponse>* InferenceServiceImpl::Generate(grpc::CallbackServerContext* context,
                                                                              const v1::GenerateRequest* request) {
  runtime::Engine* engine = this->engine();
  InferenceMetrics* metrics = metrics_.load(std::memory_order_acquire);
  if (engine == nullptr) {
    if (metrics != nullptr) metrics->CountRefused("grpc", NotLoaded());
    return new RefusedGenerate(NotLoaded());
  }
  auto* reactor = new GenerateReactor(engine, context->deadline(), metrics);
  reactor->Start(GenerateRequestFromProto(*request));
  return reactor;
}

grpc::ServerWriteReactor<v1::GenerateResponse>* InferenceServiceImpl::Chat(grpc::CallbackServerContext* context,
                                                                          const v1::ChatRequest* request) {
  runtime::Engine* engine = this->engine();
  if (engine == nullptr) return new RefusedGenerate(NotLoaded());
  absl::StatusOr<runtime::GenerateRequest> generate = engine->PrepareChat(ChatRequestFromProto(*request));
  if (!generate.ok()) return new RefusedGenerate(generate.status());
  auto* reactor = new GenerateReactor(engine, context->deadline());
  reactor->Start(*std::move(generate));
  return reactor;
}

grpc::ServerUnaryReactor* InferenceServiceImpl::Tokenize(grpc::CallbackServerContext* context,
                                                         const v1::TokenizeRequest* request,
                                                         v1::TokenizeResponse* response) {
  runtime::Engine* engine = this->engine();
  if (engine == nullptr) return FinishUnary(context, NotLoaded());
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
  runtime::Engine* engine = this->engine();
  if (engine == nullptr) return FinishUnary(context, NotLoaded());
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
  runtime::Engine* engine = this->engine();
  if (engine == nullptr) return FinishUnary(context, NotLoaded());
  *response = ModelInfoToProto(engine->info(), engine->tokenizer());
  return FinishUnary(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* InferenceServiceImpl::GetStats(grpc::CallbackServerContext* context,
                                                         const v1::GetStatsRequest* request,
                                                         v1::EngineStats* response) {
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
