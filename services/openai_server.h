#ifndef STRATA_SERVICES_OPENAI_SERVER_H_
#define STRATA_SERVICES_OPENAI_SERVER_H_

// OpenAI's HTTP API over the engine strata-server serves: GET /v1/models, POST /v1/completions and
// /v1/chat/completions (whole, or streamed as server-sent events ending in "data: [DONE]"), GET /health.
// A thin adapter: requests become runtime::GenerateRequests (openai_protocol.h) and go to Engine::Submit,
// which checks them as it checks the gRPC API's; errors are OpenAI's JSON with the matching HTTP status.
// A client that disconnects cancels its generation. Chat messages become a prompt through a renderer the
// server is given; without one, chat requests get an error saying the chat template is not available.
//
// Handlers run on httplib's worker threads (one per connection) and block there while a generation runs.
// Thread-safe. Owns nothing of the engine: the engine must outlive the HTTP server (stop the listener after
// Shutdown(), before the engine goes).

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "engine/runtime/engine.h"
#include "httplib.h"
#include "services/inference_metrics.h"
#include "services/openai_protocol.h"

namespace strata::services {

// A chat rendered into a prompt by the model's chat template. The prompt is tokenized with control
// tokens recognised (the template writes them); add_special says whether BOS/EOS are added as the
// vocabulary asks (false when the template writes its own).
struct RenderedChat {
  std::string prompt;
  bool add_special = false;
};
using ChatRenderer = std::function<absl::StatusOr<RenderedChat>(const std::vector<ChatMessage>& messages)>;

// Checks a request's Authorization header ("" when absent): OK to serve it, UNAUTHENTICATED (or
// PERMISSION_DENIED) otherwise. The same check as the gRPC API's.
using HttpAuthorizer = std::function<absl::Status(absl::string_view authorization)>;

struct OpenAiServerOptions {
  std::string model_id;                // the served model's name in /v1/models and in every response
  size_t max_body_bytes = 256u << 20;  // larger bodies get 413
  int worker_threads = 88;             // connections served at once (each running generation holds one)
  HttpAuthorizer authorize;            // null: every request is served
  ChatRenderer render_chat;            // null: /v1/chat/completions answers that no template is available
  // The server's request limits, checked before Submit (INVALID_ARGUMENT naming the field); null: none.
  std::function<absl::Status(const runtime::GenerateRequest&)> check_limits;
  // Admits a generation request before any work, given the caller's peer ("ipv4:10.0.0.7:41234") and its
  // Authorization header: the gRPC API's CallGate (draining, tokens, the per-client limit). The holder it
  // returns is kept until the generation ends. Null: every request is admitted.
  std::function<absl::StatusOr<std::shared_ptr<void>>(std::string_view peer, std::string_view authorization)> admit;
};

class OpenAiServer {
 public:
  // `engine` returns the engine being served, or null while the pack loads (generation requests then get
  // 503). `metrics` may be null; it must outlive the server.
  OpenAiServer(OpenAiServerOptions options, std::function<runtime::Engine*()> engine, InferenceMetrics* metrics);
  ~OpenAiServer();

  // A new httplib server with this API's routes, for HttpListener::Start. This object must outlive it.
  std::unique_ptr<httplib::Server> MakeHttpServer();

  // Cancels running generations (their clients get an error) and refuses new ones with 503. Call before
  // stopping the listener.
  void Shutdown();

 private:
  class Generation;

  void HandleGeneration(OpenAiEndpoint endpoint, const httplib::Request& request, httplib::Response& response);
  void HandleModels(const httplib::Request& request, httplib::Response& response);
  void HandleHealth(const httplib::Request& request, httplib::Response& response);
  // OK, or the error to answer with.
  absl::Status Authorize(const httplib::Request& request) const;
  void Track(const std::shared_ptr<Generation>& generation, bool add);

  const OpenAiServerOptions options_;
  const std::function<runtime::Engine*()> engine_;
  InferenceMetrics* const metrics_;
  const int64_t created_;  // Unix seconds, for /v1/models

  absl::Mutex mu_;
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  absl::flat_hash_set<std::shared_ptr<Generation>> running_ ABSL_GUARDED_BY(mu_);
};

// Writes `error` as the response: its HTTP status and OpenAI's JSON body.
void SetOpenAiError(const OpenAiError& error, httplib::Response& response);

}  // namespace strata::services

#endif  // STRATA_SERVICES_OPENAI_SERVER_H_
