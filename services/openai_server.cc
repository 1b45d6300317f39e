#include "services/openai_server.h"

#include <ctime>
#include <optional>
#include <utility>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "services/client_connection.h"
#include "spdlog/spdlog.h"

namespace strata::services {
namespace {

using nlohmann::json;

// How often a handler waiting for tokens looks whether its client is still there.
constexpr absl::Duration kPollInterval = absl::Milliseconds(50);

absl::Status NotLoaded() {
  return absl::UnavailableError("the model is still loading; retry once /health answers 200");
}

absl::Status ShuttingDown() { return absl::UnavailableError("the server is shutting down"); }

std::string NewId(absl::string_view prefix) {
  static absl::Mutex mu(absl::kConstInit);
  static absl::BitGen* gen = new absl::BitGen();
  absl::MutexLock lock(&mu);
  return absl::StrFormat("%s-%016x%08x", prefix, absl::Uniform<uint64_t>(*gen), absl::Uniform<uint32_t>(*gen));
}

void SetJson(const json& body, int status, httplib::Response& response) {
  response.status = status;
  response.set_content(DumpJson(body), "application/json");
}

}  // namespace

void SetOpenAiError(const OpenAiError& error, httplib::Response& response) {
  SetJson(OpenAiErrorJson(error), error.http_status, response);
}

// One generation, between the engine's callbacks (a compute thread) and the handler waiting for them (an
// httplib worker). Shared by both; whoever drops it last frees it.
class OpenAiServer::Generation {
 public:
  enum class Cancel { kNone, kClient, kShutdown };

  runtime::GenerateCallbacks Callbacks(const std::shared_ptr<Generation>& self) {
    runtime::GenerateCallbacks callbacks;
    callbacks.on_tokens = [self](const runtime::TokenEvent& event) {
      absl::MutexLock lock(&self->mu_);
      self->events_.push_back(event);
    };
    callbacks.on_done = [self](const runtime::GenerationResult& result) {
      absl::MutexLock lock(&self->mu_);
      self->result_ = result;
      self->result_->prompt_logits.clear();
    };
    return callbacks;
  }

  void SetHandle(std::shared_ptr<runtime::RequestHandle> handle) {
    absl::MutexLock lock(&mu_);
    handle_ = std::move(handle);
    if (cancel_ != Cancel::kNone) handle_->Cancel();
  }

  // The first reason sticks.
  void CancelFor(Cancel why) {
    absl::MutexLock lock(&mu_);
    if (cancel_ != Cancel::kNone) return;
    cancel_ = why;
    if (handle_ != nullptr) handle_->Cancel();
  }

  Cancel cancelled_for() {
    absl::MutexLock lock(&mu_);
    return cancel_;
  }

  // What the finished generation answers: OK for a normal end, else the status to report.
  absl::Status EndStatus(const runtime::GenerationResult& result) {
    if (result.reason == runtime::FinishReason::kError) return result.status;
    if (result.reason != runtime::FinishReason::kCancelled) return absl::OkStatus();
    if (cancelled_for() == Cancel::kClient) return absl::CancelledError("cancelled: the client went away");
    return ShuttingDown();
  }

  // Waits up to `timeout` for tokens or the end; moves what arrived into `events` and, once the engine is
  // done, the result into `result`.
  void Wait(absl::Duration timeout, std::vector<runtime::TokenEvent>* events,
            std::optional<runtime::GenerationResult>* result) {
    absl::MutexLock lock(&mu_);
    auto news = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return !events_.empty() || result_.has_value(); };
    mu_.AwaitWithTimeout(absl::Condition(&news), timeout);
    for (runtime::TokenEvent& event : events_) events->push_back(std::move(event));
    events_.clear();
    if (result_.has_value()) *result = std::move(result_);
    result_.reset();
  }

 private:
  absl::Mutex mu_;
  std::shared_ptr<runtime::RequestHandle> handle_ ABSL_GUARDED_BY(mu_);
  Cancel cancel_ ABSL_GUARDED_BY(mu_) = Cancel::kNone;
  std::vector<runtime::TokenEvent> events_ ABSL_GUARDED_BY(mu_);
  std::optional<runtime::GenerationResult> result_ ABSL_GUARDED_BY(mu_);
};

OpenAiServer::OpenAiServer(OpenAiServerOptions options, std::function<runtime::Engine*()> engine,
                           InferenceMetrics* metrics)
    : options_(std::move(options)), engine_(std::move(engine)), metrics_(metrics), created_(std::time(nullptr)) {}

OpenAiServer::~OpenAiServer() { Shutdown(); }

void OpenAiServer::Shutdown() {
  absl::MutexLock lock(&mu_);
  shutting_down_ = true;
  for (const std::shared_ptr<Generation>& generation : running_) generation->CancelFor(Generation::Cancel::kShutdown);
}

void OpenAiServer::Track(const std::shared_ptr<Generation>& generation, bool add) {
  absl::MutexLock lock(&mu_);
  if (add) {
    running_.insert(generation);
    if (shutting_down_) generation->CancelFor(Generation::Cancel::kShutdown);
  } else {
    running_.erase(generation);
  }
}

absl::Status OpenAiServer::Authorize(const httplib::Request& request) const {
  if (!options_.authorize) return absl::OkStatus();
  return options_.authorize(request.get_header_value("Authorization"));
}

std::unique_ptr<httplib::Server> OpenAiServer::MakeHttpServer() {
  auto server = std::make_unique<httplib::Server>();
  const int threads = options_.worker_threads;
  server->new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
  server->set_payload_max_length(options_.max_body_bytes);
  server->Get("/health", [this](const httplib::Request& q, httplib::Response& r) { HandleHealth(q, r); });
  server->Get("/v1/models", [this](const httplib::Request& q, httplib::Response& r) { HandleModels(q, r); });
  server->Post("/v1/completions", [this](const httplib::Request& q, httplib::Response& r) {
    HandleGeneration(OpenAiEndpoint::kCompletions, q, r);
  });
  server->Post("/v1/chat/completions", [this](const httplib::Request& q, httplib::Response& r) {
    HandleGeneration(OpenAiEndpoint::kChatCompletions, q, r);
  });
  // Anything that ended in an error without a body (no such route, a body over the limit) gets OpenAI's
  // error shape too.
  server->set_error_handler(httplib::Server::HandlerWithResponse([](const httplib::Request& q, httplib::Response& r) {
    if (!r.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    OpenAiError error;
    error.http_status = r.status;
    error.type = "invalid_request_error";
    if (r.status == 404) {
      error.message = absl::StrCat("no route ", q.method, " ", q.path,
                                   "; this server serves GET /v1/models, POST "
                                   "/v1/completions, POST /v1/chat/completions and GET /health");
      error.code = "not_found";
    } else if (r.status == 413) {
      error.message = "the request body is larger than this server accepts";
      error.code = "request_too_large";
    } else {
      error.message = absl::StrCat("HTTP ", r.status);
    }
    SetOpenAiError(error, r);
    return httplib::Server::HandlerResponse::Handled;
  }));
  server->set_exception_handler([](const httplib::Request& q, httplib::Response& r, std::exception_ptr e) {
    std::string what = "unknown exception";
    try {
      if (e) std::rethrow_exception(e);
    } catch (const std::exception& ex) {
      what = ex.what();
    } catch (...) {
    }
    spdlog::error("HTTP {} {}: {}", q.method, q.path, what);
    SetOpenAiError(OpenAiErrorFromStatus(absl::InternalError(absl::StrCat("internal error: ", what))), r);
  });
  return server;
}

void OpenAiServer::HandleHealth(const httplib::Request&, httplib::Response& response) {
  if (engine_() == nullptr) {
    SetOpenAiError(OpenAiErrorFromStatus(NotLoaded()), response);
    return;
  }
  SetJson(json{{"status", "ok"}}, 200, response);
}

void OpenAiServer::HandleModels(const httplib::Request& request, httplib::Response& response) {
  if (absl::Status status = Authorize(request); !status.ok()) {
    SetOpenAiError(OpenAiErrorFromStatus(status), response);
    return;
  }
  json model = {{"id", options_.model_id}, {"object", "model"}, {"created", created_}, {"owned_by", "strata"}};
  if (const runtime::Engine* engine = engine_(); engine != nullptr) model["max_model_len"] = engine->info().max_ctx;
  SetJson(json{{"object", "list"}, {"data", json::array({model})}}, 200, response);
}

void OpenAiServer::HandleGeneration(OpenAiEndpoint endpoint, const httplib::Request& request,
                                    httplib::Response& response) {
  auto refuse = [&](const absl::Status& status) {
    if (metrics_ != nullptr) metrics_->CountRefused("http", status);
    SetOpenAiError(OpenAiErrorFromStatus(status), response);
  };
  if (absl::Status status = Authorize(request); !status.ok()) return refuse(status);
  std::shared_ptr<void> admission;  // held until the generation ends
  if (options_.admit) {
    const bool v6 = request.remote_addr.find(':') != std::string::npos;
    const std::string peer = v6 ? absl::StrCat("ipv6:[", request.remote_addr, "]:", request.remote_port)
                                : absl::StrCat("ipv4:", request.remote_addr, ":", request.remote_port);
    absl::StatusOr<std::shared_ptr<void>> admitted = options_.admit(peer, request.get_header_value("Authorization"));
    if (!admitted.ok()) return refuse(admitted.status());
    admission = *std::move(admitted);
  }
  runtime::Engine* engine = engine_();
  if (engine == nullptr) return refuse(NotLoaded());
  absl::StatusOr<OpenAiRequest> parsed = ParseOpenAiRequest(endpoint, request.body);
  if (!parsed.ok()) return refuse(parsed.status());
  if (!parsed->model.empty() && parsed->model != options_.model_id) {
    OpenAiError error = OpenAiErrorFromStatus(absl::NotFoundError(
        absl::StrCat("the model '", parsed->model, "' does not exist; this server serves '", options_.model_id, "'")));
    error.param = "model";
    error.code = "model_not_found";
    if (metrics_ != nullptr) metrics_->CountRefused("http", absl::NotFoundError(""));
    return SetOpenAiError(error, response);
  }
  if (endpoint == OpenAiEndpoint::kChatCompletions) {
    if (!options_.render_chat) {
      OpenAiError error = OpenAiErrorFromStatus(absl::UnimplementedError(
          absl::StrCat("the model's chat template is not available: this server cannot turn messages into a "
                       "prompt yet; use /v1/completions with a prompt")));
      error.code = "chat_template_unavailable";
      if (metrics_ != nullptr) metrics_->CountRefused("http", absl::UnimplementedError(""));
      return SetOpenAiError(error, response);
    }
    absl::StatusOr<RenderedChat> rendered = options_.render_chat(parsed->messages);
    if (!rendered.ok()) return refuse(rendered.status());
    parsed->generate.prompt = std::move(rendered->prompt);
    parsed->generate.add_special = rendered->add_special;
    parsed->generate.parse_special = true;
  }
  if (options_.check_limits) {
    if (absl::Status status = options_.check_limits(parsed->generate); !status.ok()) return refuse(status);
  }
  {
    absl::MutexLock lock(&mu_);
    if (shutting_down_) return refuse(ShuttingDown());
  }

  const bool logprobs = parsed->generate.sampling.logprobs;
  auto generation = std::make_shared<Generation>();
  runtime::GenerateCallbacks callbacks = generation->Callbacks(generation);
  if (metrics_ != nullptr) callbacks = metrics_->Observe("http", std::move(callbacks));
  // Engine::Submit checks every field, as it does for the gRPC API (INVALID_ARGUMENT naming the field,
  // RESOURCE_EXHAUSTED for a full queue).
  absl::StatusOr<std::shared_ptr<runtime::RequestHandle>> handle =
      engine->Submit(std::move(parsed->generate), std::move(callbacks));
  if (!handle.ok()) return refuse(handle.status());
  generation->SetHandle(*std::move(handle));
  Track(generation, true);

  const tokenizer::Tokenizer& tokenizer = engine->tokenizer();
  CompletionHeader header;
  header.id = NewId(endpoint == OpenAiEndpoint::kCompletions ? "cmpl" : "chatcmpl");
  header.created = std::time(nullptr);
  header.model = options_.model_id;
  auto connection = std::make_shared<ClientConnection>(request.remote_addr, request.remote_port, request.local_port);
  if (!connection->found()) {
    spdlog::warn(
        "HTTP {}:{}: cannot find the connection's socket; a client that leaves is noticed only when a "
        "write to it fails",
        request.remote_addr, request.remote_port);
  }

  if (!parsed->stream) {
    std::string text;
    std::vector<runtime::SampleResult> samples;
    std::optional<runtime::GenerationResult> result;
    while (!result.has_value()) {
      std::vector<runtime::TokenEvent> events;
      generation->Wait(kPollInterval, &events, &result);
      for (runtime::TokenEvent& event : events) {
        text += event.text;
        for (runtime::SampleResult& sample : event.logprobs) samples.push_back(std::move(sample));
      }
      if (!result.has_value() && connection->Closed()) {
        generation->CancelFor(Generation::Cancel::kClient);
      }
    }
    Track(generation, false);
    if (absl::Status status = generation->EndStatus(*result); !status.ok()) {
      return SetOpenAiError(OpenAiErrorFromStatus(status), response);
    }
    json logprobs_json = logprobs ? LogprobsJson(endpoint, samples, tokenizer, 0) : json(nullptr);
    SetJson(CompletionJson(endpoint, header, text, std::move(logprobs_json), OpenAiFinishReason(result->reason),
                           result->usage),
            200, response);
    return;
  }

  struct StreamState {
    bool first = true;
    bool done = false;
    int64_t text_offset = 0;
  };
  auto state = std::make_shared<StreamState>();
  const bool include_usage = parsed->include_usage;
  auto write_event = [](httplib::DataSink& sink, const std::string& data) {
    const std::string event = absl::StrCat("data: ", data, "\n\n");
    return sink.write(event.data(), event.size());
  };
  response.set_header("Cache-Control", "no-cache");
  response.set_header("X-Accel-Buffering", "no");  // proxies (nginx) pass events on as they come
  response.set_chunked_content_provider(
      "text/event-stream",
      [=, &tokenizer](size_t, httplib::DataSink& sink) {
        if (state->done) return false;
        auto chunk = [&](const std::string& text, json lp, absl::string_view finish) {
          json out = CompletionChunkJson(endpoint, header, text, std::move(lp), finish, state->first);
          state->first = false;
          if (include_usage) out["usage"] = nullptr;
          return write_event(sink, DumpJson(out));
        };
        if (state->first && endpoint == OpenAiEndpoint::kChatCompletions && !chunk("", nullptr, "")) {
          generation->CancelFor(Generation::Cancel::kClient);
          return false;
        }
        std::vector<runtime::TokenEvent> events;
        std::optional<runtime::GenerationResult> result;
        generation->Wait(kPollInterval, &events, &result);
        for (const runtime::TokenEvent& event : events) {
          if (event.text.empty() && (event.logprobs.empty() || !logprobs)) continue;
          json lp = nullptr;
          if (logprobs) {
            lp = LogprobsJson(endpoint, event.logprobs, tokenizer, state->text_offset);
            for (const runtime::SampleResult& s : event.logprobs)
              state->text_offset += tokenizer.TokenPiece(s.token).size();
          }
          if (!chunk(event.text, std::move(lp), "")) {
            generation->CancelFor(Generation::Cancel::kClient);
            return false;
          }
        }
        if (!result.has_value()) {
          if (connection->Closed()) {
            generation->CancelFor(Generation::Cancel::kClient);
            return false;
          }
          return true;
        }
        state->done = true;
        const absl::Status status = generation->EndStatus(*result);
        if (generation->cancelled_for() == Generation::Cancel::kClient) return false;
        bool ok = true;
        if (!status.ok()) {
          ok = write_event(sink, DumpJson(OpenAiErrorJson(OpenAiErrorFromStatus(status))));
        } else {
          ok = chunk("", nullptr, OpenAiFinishReason(result->reason));
          if (ok && include_usage) ok = write_event(sink, DumpJson(UsageChunkJson(endpoint, header, result->usage)));
        }
        if (ok) ok = write_event(sink, "[DONE]");
        if (ok) sink.done();
        return ok;
      },
      [this, generation, admission](bool success) mutable {
        // The stream ended: on a failed write or a server stop mid-stream the generation is still running.
        if (!success) generation->CancelFor(Generation::Cancel::kClient);
        Track(generation, false);
        admission.reset();
      });
}

}  // namespace strata::services
