#include "services/openai_server.h"

#include <atomic>
#include <memory>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "services/http_listener.h"
#include "services/inference_metrics.h"
#include "services/metrics_endpoint.h"
#include "tests/services/inference_test_util.h"
#include "tests/services/metrics_test_util.h"
#include "tests/testing/wait.h"

namespace strata::services {
namespace {

using nlohmann::json;
using ::strata::services::testing::ParsePrometheusText;
using ::strata::services::testing::TinyEngineOptions;
using ::testing::HasSubstr;

// strata-server's HTTP side in this process: an engine, the OpenAI API and /metrics on loopback ports.
class HttpTestServer {
 public:
  explicit HttpTestServer(runtime::EngineOptions engine_options, OpenAiServerOptions options = {}, bool load = true)
      : engine_options_(std::move(engine_options)) {
    metrics_ = std::make_unique<InferenceMetrics>(&registry_, [this] { return engine_ptr_.load(); });
    options.model_id = "tiny";
    api_ = std::make_unique<OpenAiServer>(
        std::move(options), [this] { return engine_ptr_.load(); }, metrics_.get());
    auto api = HttpListener::Start(api_->MakeHttpServer(), "127.0.0.1:0", "--http-listen");
    EXPECT_TRUE(api.ok()) << api.status();
    api_listener_ = *std::move(api);
    auto scrape = HttpListener::Start(MakeMetricsHttpServer(&registry_), "127.0.0.1:0", "--metrics-listen");
    EXPECT_TRUE(scrape.ok()) << scrape.status();
    metrics_listener_ = *std::move(scrape);
    if (load) Load();
  }
  ~HttpTestServer() {
    api_->Shutdown();
    api_listener_->Stop();
    metrics_listener_->Stop();
    engine_ptr_.store(nullptr);
    engine_.reset();
  }

  void Load() {
    auto engine = runtime::Engine::Create(engine_options_);
    ASSERT_TRUE(engine.ok()) << engine.status();
    engine_ = *std::move(engine);
    engine_ptr_.store(engine_.get());
  }

  runtime::Engine& engine() { return *engine_; }
  OpenAiServer& api() { return *api_; }
  httplib::Client Client() const { return httplib::Client("127.0.0.1", api_listener_->port()); }

  testing::ParsedMetrics Scrape() const {
    httplib::Client client("127.0.0.1", metrics_listener_->port());
    auto response = client.Get("/metrics");
    EXPECT_TRUE(response) << httplib::to_string(response.error());
    if (!response) return {};
    EXPECT_EQ(response->status, 200);
    EXPECT_THAT(response->get_header_value("Content-Type"), HasSubstr("text/plain; version=0.0.4"));
    auto parsed = ParsePrometheusText(response->body);
    EXPECT_TRUE(parsed.ok()) << parsed.status() << "\n" << response->body;
    return parsed.ok() ? *parsed : testing::ParsedMetrics();
  }

  bool WaitUntilIdle() {
    return strata::testing::WaitUntil([&] {
      const runtime::EngineStats s = engine_->stats();
      return s.active == 0 && s.queued == 0 && s.kv_bytes_in_use == 0;
    });
  }

 private:
  runtime::EngineOptions engine_options_;
  std::unique_ptr<runtime::Engine> engine_;
  std::atomic<runtime::Engine*> engine_ptr_{nullptr};
  MetricsRegistry registry_;
  std::unique_ptr<InferenceMetrics> metrics_;
  std::unique_ptr<OpenAiServer> api_;
  std::unique_ptr<HttpListener> api_listener_;
  std::unique_ptr<HttpListener> metrics_listener_;
};

template <typename ClientT>
json Post(ClientT&& client, const std::string& path, const json& body, int* status,
          const httplib::Headers& headers = {}) {
  auto response = client.Post(path.c_str(), headers, body.dump(), "application/json");
  EXPECT_TRUE(response) << httplib::to_string(response.error());
  if (!response) return json();
  *status = response->status;
  EXPECT_THAT(response->get_header_value("Content-Type"), HasSubstr("application/json"));
  return json::parse(response->body);
}

// The "data: ..." payloads of a server-sent event stream, in order.
std::vector<std::string> Events(const std::string& body) {
  std::vector<std::string> events;
  for (absl::string_view block : absl::StrSplit(body, "\n\n", absl::SkipEmpty())) {
    EXPECT_TRUE(absl::StartsWith(block, "data: ")) << block;
    events.emplace_back(block.substr(6));
  }
  return events;
}

json GreedyCompletion(int max_tokens) {
  return json{{"model", "tiny"},
              {"prompt", "The quick brown fox"},
              {"max_tokens", max_tokens},
              {"temperature", 0},
              {"ignore_eos", true}};
}

std::string DirectText(runtime::Engine& engine, const std::string& prompt, int max_tokens, bool chat = false) {
  runtime::GenerateRequest request;
  request.prompt = prompt;
  request.sampling.temperature = 0;
  request.sampling.max_tokens = max_tokens;
  request.sampling.ignore_eos = true;
  if (chat) {
    request.add_special = false;
    request.parse_special = true;
  }
  auto done = engine.Generate(request);
  EXPECT_TRUE(done.ok()) << done.status();
  return done.ok() ? done->text : "";
}

TEST(OpenAiServerTest, CompletionEqualsTheEnginesOwnOutput) {
  HttpTestServer server(TinyEngineOptions());
  int status = 0;
  const json body = Post(server.Client(), "/v1/completions", GreedyCompletion(12), &status);
  ASSERT_EQ(status, 200) << body.dump();
  EXPECT_EQ(body["object"], "text_completion");
  EXPECT_EQ(body["model"], "tiny");
  EXPECT_TRUE(absl::StartsWith(body["id"].get<std::string>(), "cmpl-"));
  EXPECT_EQ(body["choices"][0]["text"], DirectText(server.engine(), "The quick brown fox", 12));
  EXPECT_EQ(body["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(body["usage"]["completion_tokens"], 12);
  EXPECT_GT(body["usage"]["prompt_tokens"].get<int>(), 0);
  EXPECT_EQ(body["usage"]["total_tokens"].get<int>(),
            body["usage"]["prompt_tokens"].get<int>() + body["usage"]["completion_tokens"].get<int>());
}

TEST(OpenAiServerTest, StreamedCompletionAddsUpToTheWholeOne) {
  HttpTestServer server(TinyEngineOptions());
  json request = GreedyCompletion(16);
  request["stream"] = true;
  request["stream_options"] = {{"include_usage", true}};
  auto response = server.Client().Post("/v1/completions", request.dump(), "application/json");
  ASSERT_TRUE(response);
  ASSERT_EQ(response->status, 200) << response->body;
  EXPECT_THAT(response->get_header_value("Content-Type"), HasSubstr("text/event-stream"));
  const std::vector<std::string> events = Events(response->body);
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events.back(), "[DONE]");
  const json usage = json::parse(events[events.size() - 2]);
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["completion_tokens"], 16);
  std::string text;
  std::string finish;
  for (size_t i = 0; i + 2 < events.size(); ++i) {
    const json chunk = json::parse(events[i]);
    EXPECT_EQ(chunk["object"], "text_completion");
    EXPECT_TRUE(chunk["usage"].is_null());  // include_usage: null on every chunk but the last
    text += chunk["choices"][0]["text"].get<std::string>();
    if (!chunk["choices"][0]["finish_reason"].is_null()) finish = chunk["choices"][0]["finish_reason"];
  }
  EXPECT_EQ(finish, "length");
  EXPECT_EQ(text, DirectText(server.engine(), "The quick brown fox", 16));
}

TEST(OpenAiServerTest, LogprobsComeInTheCompletionsShape) {
  HttpTestServer server(TinyEngineOptions());
  json request = GreedyCompletion(4);
  request["logprobs"] = 2;
  int status = 0;
  const json body = Post(server.Client(), "/v1/completions", request, &status);
  ASSERT_EQ(status, 200) << body.dump();
  const json& logprobs = body["choices"][0]["logprobs"];
  ASSERT_EQ(logprobs["tokens"].size(), 4u);
  ASSERT_EQ(logprobs["token_logprobs"].size(), 4u);
  EXPECT_LE(logprobs["token_logprobs"][0].get<double>(), 0);
  // Alternatives are keyed by their text, so two tokens that read the same share an entry.
  EXPECT_GE(logprobs["top_logprobs"][0].size(), 1u);
  EXPECT_LE(logprobs["top_logprobs"][0].size(), 2u);
  EXPECT_EQ(logprobs["text_offset"][0], 0);
}

TEST(OpenAiServerTest, ChatWithoutATemplateSaysSo) {
  HttpTestServer server(TinyEngineOptions());
  int status = 0;
  const json body = Post(server.Client(), "/v1/chat/completions",
                         json{{"messages", {{{"role", "user"}, {"content", "Hi"}}}}}, &status);
  EXPECT_EQ(status, 501);
  EXPECT_EQ(body["error"]["code"], "chat_template_unavailable");
  EXPECT_THAT(body["error"]["message"].get<std::string>(), HasSubstr("chat template is not available"));
}

TEST(OpenAiServerTest, ChatStreamsThroughTheRenderer) {
  OpenAiServerOptions options;
  std::vector<ChatMessage> seen;
  std::mutex seen_mu;
  options.render_chat = [&](const std::vector<ChatMessage>& messages) -> absl::StatusOr<RenderedChat> {
    std::lock_guard<std::mutex> lock(seen_mu);
    seen = messages;
    std::string prompt;
    for (const ChatMessage& m : messages) prompt += m.role + ": " + m.content + "\n";
    return RenderedChat{prompt + "assistant:", false};
  };
  HttpTestServer server(TinyEngineOptions(), options);
  const json request = {
      {"model", "tiny"},
      {"messages", {{{"role", "system"}, {"content", "Be brief."}}, {{"role", "user"}, {"content", "Hi"}}}},
      {"max_tokens", 10},
      {"temperature", 0},
      {"ignore_eos", true},
      {"stream", true}};
  auto response = server.Client().Post("/v1/chat/completions", request.dump(), "application/json");
  ASSERT_TRUE(response);
  ASSERT_EQ(response->status, 200) << response->body;
  const std::vector<std::string> events = Events(response->body);
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events.back(), "[DONE]");
  const json first = json::parse(events[0]);
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  std::string text;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    const json chunk = json::parse(events[i]);
    EXPECT_EQ(chunk["object"], "chat.completion.chunk");
    EXPECT_TRUE(absl::StartsWith(chunk["id"].get<std::string>(), "chatcmpl-"));
    if (chunk["choices"][0]["delta"].contains("content"))
      text += chunk["choices"][0]["delta"]["content"].get<std::string>();
  }
  EXPECT_EQ(json::parse(events[events.size() - 2])["choices"][0]["finish_reason"], "length");
  {
    std::lock_guard<std::mutex> lock(seen_mu);
    ASSERT_EQ(seen.size(), 2u);
    EXPECT_EQ(seen[1].content, "Hi");
  }
  EXPECT_EQ(text, DirectText(server.engine(), "system: Be brief.\nuser: Hi\nassistant:", 10, /*chat=*/true));

  // Not streamed: one chat.completion with the same text.
  json whole_request = request;
  whole_request["stream"] = false;
  int status = 0;
  const json whole = Post(server.Client(), "/v1/chat/completions", whole_request, &status);
  ASSERT_EQ(status, 200) << whole.dump();
  EXPECT_EQ(whole["object"], "chat.completion");
  EXPECT_EQ(whole["choices"][0]["message"]["content"], text);
}

TEST(OpenAiServerTest, BadRequestsGetOpenAiErrorsNamingTheField) {
  HttpTestServer server(TinyEngineOptions());
  httplib::Client client = server.Client();
  auto raw = client.Post("/v1/completions", "{oops", "application/json");
  ASSERT_TRUE(raw);
  EXPECT_EQ(raw->status, 400);
  EXPECT_THAT(json::parse(raw->body)["error"]["message"].get<std::string>(), HasSubstr("not valid JSON"));

  int status = 0;
  json request = GreedyCompletion(0);  // checked by the engine, as for the gRPC API
  json body = Post(client, "/v1/completions", request, &status);
  EXPECT_EQ(status, 400);
  EXPECT_EQ(body["error"]["param"], "max_tokens");
  EXPECT_EQ(body["error"]["type"], "invalid_request_error");

  request = GreedyCompletion(4);
  request["top_p"] = 1.5;
  body = Post(client, "/v1/completions", request, &status);
  EXPECT_EQ(status, 400);
  EXPECT_EQ(body["error"]["param"], "top_p");

  request = GreedyCompletion(4);
  request["n"] = 2;
  body = Post(client, "/v1/completions", request, &status);
  EXPECT_EQ(status, 400);
  EXPECT_EQ(body["error"]["param"], "n");

  request = GreedyCompletion(4);
  request["model"] = "gpt-4";
  body = Post(client, "/v1/completions", request, &status);
  EXPECT_EQ(status, 404);
  EXPECT_EQ(body["error"]["code"], "model_not_found");
  EXPECT_EQ(body["error"]["param"], "model");

  auto missing = client.Get("/v1/nothing");
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 404);
  EXPECT_THAT(json::parse(missing->body)["error"]["message"].get<std::string>(), HasSubstr("no route GET /v1/nothing"));
}

TEST(OpenAiServerTest, TheAuthorizerGuardsTheApiButNotHealth) {
  OpenAiServerOptions options;
  options.authorize = [](absl::string_view header) {
    return header == "Bearer secret" ? absl::OkStatus() : absl::UnauthenticatedError("missing or unknown bearer token");
  };
  HttpTestServer server(TinyEngineOptions(), options);
  int status = 0;
  json body = Post(server.Client(), "/v1/completions", GreedyCompletion(2), &status);
  EXPECT_EQ(status, 401);
  EXPECT_EQ(body["error"]["type"], "authentication_error");
  auto models = server.Client().Get("/v1/models");
  ASSERT_TRUE(models);
  EXPECT_EQ(models->status, 401);
  body = Post(server.Client(), "/v1/completions", GreedyCompletion(2), &status, {{"Authorization", "Bearer secret"}});
  EXPECT_EQ(status, 200) << body.dump();
  auto health = server.Client().Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
}

TEST(OpenAiServerTest, TheServersLimitsAreCheckedBeforeSubmit) {
  OpenAiServerOptions options;
  options.check_limits = [](const runtime::GenerateRequest& request) {
    return request.sampling.max_tokens > 3 ? absl::InvalidArgumentError("max_tokens: 4 tokens exceed the limit of 3")
                                           : absl::OkStatus();
  };
  HttpTestServer server(TinyEngineOptions(), options);
  int status = 0;
  json body = Post(server.Client(), "/v1/completions", GreedyCompletion(4), &status);
  EXPECT_EQ(status, 400) << body.dump();
  EXPECT_EQ(body["error"]["param"], "max_tokens");
  body = Post(server.Client(), "/v1/completions", GreedyCompletion(3), &status);
  EXPECT_EQ(status, 200) << body.dump();
}

TEST(OpenAiServerTest, TheAdmissionIsAskedFirstAndHeldUntilTheGenerationEnds) {
  auto held = std::make_shared<std::atomic<int>>(0);
  auto peers = std::make_shared<std::vector<std::string>>();
  bool refuse = false;
  OpenAiServerOptions options;
  options.admit = [held, peers, &refuse](std::string_view peer,
                                         std::string_view authorization) -> absl::StatusOr<std::shared_ptr<void>> {
    if (refuse) return absl::ResourceExhaustedError("this client already has 1 call running (--max-calls-per-client)");
    peers->push_back(std::string(peer));
    held->fetch_add(1);
    return std::shared_ptr<void>(nullptr, [held](void*) { held->fetch_sub(1); });
  };
  HttpTestServer server(TinyEngineOptions(), options);
  int status = 0;
  json body = Post(server.Client(), "/v1/completions", GreedyCompletion(3), &status);
  EXPECT_EQ(status, 200) << body.dump();
  json stream = GreedyCompletion(3);
  stream["stream"] = true;
  auto streamed = server.Client().Post("/v1/completions", stream.dump(), "application/json");
  ASSERT_TRUE(streamed);
  EXPECT_EQ(streamed->status, 200);
  ASSERT_EQ(peers->size(), 2u);
  EXPECT_EQ((*peers)[0].rfind("ipv4:127.0.0.1:", 0), 0u) << (*peers)[0];
  for (int i = 0; i < 200 && held->load() != 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(held->load(), 0) << "an admission outlived its generation";
  refuse = true;
  body = Post(server.Client(), "/v1/completions", GreedyCompletion(3), &status);
  EXPECT_EQ(status, 429) << body.dump();
}

TEST(OpenAiServerTest, HealthAndGenerationWaitForTheModel) {
  HttpTestServer server(TinyEngineOptions(), {}, /*load=*/false);
  auto health = server.Client().Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 503);
  int status = 0;
  json body = Post(server.Client(), "/v1/completions", GreedyCompletion(2), &status);
  EXPECT_EQ(status, 503);
  EXPECT_THAT(body["error"]["message"].get<std::string>(), HasSubstr("still loading"));
  auto models = server.Client().Get("/v1/models");
  ASSERT_TRUE(models);
  EXPECT_EQ(json::parse(models->body)["data"][0]["id"], "tiny");

  server.Load();
  health = server.Client().Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  EXPECT_EQ(json::parse(health->body)["status"], "ok");
  models = server.Client().Get("/v1/models");
  ASSERT_TRUE(models);
  const json list = json::parse(models->body);
  EXPECT_EQ(list["object"], "list");
  EXPECT_EQ(list["data"][0]["object"], "model");
  EXPECT_EQ(list["data"][0]["max_model_len"], 256);
}

// A generation long enough (a slow expert source, many tokens) that the client leaves while it runs.
json LongCompletion(bool stream) {
  json request = GreedyCompletion(200);
  request["stream"] = stream;
  return request;
}

TEST(OpenAiServerTest, AClientLeavingAStreamCancelsItsGeneration) {
  HttpTestServer server(TinyEngineOptions(8, /*slow=*/true));
  int chunks = 0;
  httplib::Client client = server.Client();
  httplib::Request request;
  request.method = "POST";
  request.path = "/v1/completions";
  request.body = LongCompletion(true).dump();
  request.set_header("Content-Type", "application/json");
  request.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) { return ++chunks < 2; };
  auto result = client.send(request);
  EXPECT_FALSE(result);  // the receiver stopped it
  EXPECT_GE(chunks, 2);
  client.stop();
  ASSERT_TRUE(server.WaitUntilIdle());
  EXPECT_LT(server.engine().stats().tokens_generated, 200u);
  EXPECT_TRUE(strata::testing::WaitUntil(
      [&] { return server.Scrape().ValueOr0("strata_requests_total{api=\"http\",status=\"cancelled\"}") == 1; }));
}

TEST(OpenAiServerTest, AClientLeavingAWholeCompletionCancelsItsGeneration) {
  HttpTestServer server(TinyEngineOptions(8, /*slow=*/true));
  httplib::Client client = server.Client();
  client.set_read_timeout(std::chrono::milliseconds(300));
  auto result = client.Post("/v1/completions", LongCompletion(false).dump(), "application/json");
  EXPECT_FALSE(result);  // timed out: the client closed the connection
  client.stop();
  ASSERT_TRUE(server.WaitUntilIdle());
  EXPECT_LT(server.engine().stats().tokens_generated, 200u);
  EXPECT_TRUE(strata::testing::WaitUntil(
      [&] { return server.Scrape().ValueOr0("strata_requests_total{api=\"http\",status=\"cancelled\"}") == 1; }));
}

TEST(OpenAiServerTest, ShutdownEndsRunningStreamsWithAnError) {
  HttpTestServer server(TinyEngineOptions(8, /*slow=*/true));
  std::string body;
  std::atomic<int> chunks{0};
  std::thread reader([&] {
    httplib::Client client = server.Client();
    httplib::Request request;
    request.method = "POST";
    request.path = "/v1/completions";
    request.body = LongCompletion(true).dump();
    request.set_header("Content-Type", "application/json");
    request.content_receiver = [&](const char* data, size_t size, uint64_t, uint64_t) {
      body.append(data, size);
      ++chunks;
      return true;
    };
    client.send(request);
  });
  ASSERT_TRUE(strata::testing::WaitUntil([&] { return chunks.load() >= 1; }));
  server.api().Shutdown();
  reader.join();
  EXPECT_THAT(body, HasSubstr("shutting down"));
  EXPECT_THAT(body, HasSubstr("data: [DONE]"));
  int status = 0;
  const json refused = Post(server.Client(), "/v1/completions", GreedyCompletion(2), &status);
  EXPECT_EQ(status, 503);
  EXPECT_LT(server.engine().stats().tokens_generated, 200u);
}

TEST(OpenAiServerTest, MetricsFollowTheRequests) {
  HttpTestServer server(TinyEngineOptions());
  testing::ParsedMetrics before = server.Scrape();
  EXPECT_EQ(before.ValueOr0("strata_requests_total{api=\"http\",status=\"ok\"}"), 0);
  EXPECT_EQ(before.Value("strata_model_loaded"), 1);
  EXPECT_EQ(before.Value("strata_queue_depth"), 0);
  EXPECT_EQ(before.Value("strata_active_sequences"), 0);
  EXPECT_EQ(before.Value("strata_arena_pinned"), 0);
  EXPECT_GT(before.Value("strata_model_load_seconds").value_or(0), 0);

  int status = 0;
  for (int i = 0; i < 2; ++i) {
    Post(server.Client(), "/v1/completions", GreedyCompletion(5), &status);
    EXPECT_EQ(status, 200);
  }
  Post(server.Client(), "/v1/completions", GreedyCompletion(0), &status);
  EXPECT_EQ(status, 400);

  testing::ParsedMetrics after = server.Scrape();
  EXPECT_EQ(after.ValueOr0("strata_requests_total{api=\"http\",status=\"ok\"}"), 2);
  EXPECT_EQ(after.ValueOr0("strata_requests_total{api=\"http\",status=\"invalid_argument\"}"), 1);
  EXPECT_EQ(after.ValueOr0("strata_time_to_first_token_seconds_count"), 2);
  EXPECT_EQ(after.ValueOr0("strata_inter_token_latency_seconds_count"), 8);  // 4 gaps per request
  EXPECT_EQ(after.ValueOr0("strata_generated_tokens_total{api=\"http\"}"), 10);
  EXPECT_GT(after.ValueOr0("strata_prompt_tokens_total{api=\"http\"}"), 0);
  EXPECT_GT(after.ValueOr0("strata_engine_steps_total"), 0);
  EXPECT_GT(after.ValueOr0("strata_expert_read_bytes_total"), 0);
  EXPECT_EQ(after.types.at("strata_time_to_first_token_seconds"), "histogram");
}

}  // namespace
}  // namespace strata::services
