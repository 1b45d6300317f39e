#include "engine/runtime/engine.h"

#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <set>
#include <thread>

#include "absl/strings/match.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "engine/gguf/gguf_file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "engine/gguf/gguf_writer.h"
#include "packtool/builtin_vocab.h"
#include "packtool/convert.h"
#include "packtool/synth.h"
#include "tests/testing/reference_model.h"
#include "tests/testing/test_util.h"
#include "tests/testing/wait.h"
#include "tests/engine/runtime/engine_test_util.h"

namespace strata::runtime {
namespace {

// Holds the engine's scheduler at the start of forward passes, so that a test decides how far a generation
// gets instead of racing it. Wraps the pack's expert source: a pass starts at its first expert read of MoE
// layer 0 (every block of the tiny models is a MoE block, read in order on the scheduler thread).
class ForwardGate {
 public:
  // From now on a pass starts only when Allow has made room for it; the next one is held.
  void Pause() {
    std::lock_guard<std::mutex> lock(mu_);
    paused_ = true;
    limit_ = started_;
  }
  // Lets `n` more passes start.
  void Allow(int n) {
    std::lock_guard<std::mutex> lock(mu_);
    limit_ += n;
    cv_.notify_all();
  }
  // Lets every pass run from now on.
  void Open() {
    std::lock_guard<std::mutex> lock(mu_);
    paused_ = false;
    cv_.notify_all();
  }
  // Waits until a pass is held at its start; false at the deadline.
  bool WaitUntilHeld() {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, absl::ToChronoSeconds(kHangDeadline), [&] { return held_; });
  }

  // Called by the source at the start of each pass.
  void PassStarts() {
    std::unique_lock<std::mutex> lock(mu_);
    ++started_;
    held_ = paused_ && started_ > limit_;
    cv_.notify_all();
    cv_.wait(lock, [&] { return !paused_ || started_ <= limit_; });
    held_ = false;
  }

  // An EngineOptions::source_factory whose sources report to this gate.
  std::function<std::unique_ptr<pack::ExpertSource>(const pack::Pack&)> SourceFactory();

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool paused_ = false;
  bool held_ = false;
  int64_t started_ = 0;  // passes started
  int64_t limit_ = 0;    // while paused, passes up to this one may start
};

class GatedSource : public pack::ExpertSource {
 public:
  GatedSource(std::unique_ptr<pack::ExpertSource> inner, ForwardGate* gate) : inner_(std::move(inner)), gate_(gate) {}
  absl::StatusOr<const uint8_t*> Blob(int64_t layer, int64_t expert) override {
    if (layer == 0 && last_layer_ != 0) gate_->PassStarts();
    last_layer_ = layer;
    return inner_->Blob(layer, expert);
  }
  std::string_view kind() const override { return inner_->kind(); }
  uint64_t blob_bytes() const override { return inner_->blob_bytes(); }

 private:
  std::unique_ptr<pack::ExpertSource> inner_;
  ForwardGate* const gate_;
  int64_t last_layer_ = -1;  // scheduler thread only
};

std::function<std::unique_ptr<pack::ExpertSource>(const pack::Pack&)> ForwardGate::SourceFactory() {
  return [this](const pack::Pack& p) -> std::unique_ptr<pack::ExpertSource> {
    auto inner = pack::OpenExpertSource(p, {}, nullptr);
    EXPECT_TRUE(inner.ok()) << inner.status();
    if (!inner.ok()) return nullptr;
    return std::make_unique<GatedSource>(*std::move(inner), this);
  };
}

// Opens the gate when the test leaves its scope, however it leaves, so that an engine destroyed after it
// is never left waiting for a pass the gate holds. Declare it after the engine.
struct OpenOnExit {
  ForwardGate* gate;
  ~OpenOnExit() { gate->Open(); }
};

class EngineTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_ = new TinyModel("qwen3moe");
    pack_ = new std::string(model_->Pack(kernels::Scheme::kS4));
  }
  static void TearDownTestSuite() {
    delete pack_;
    delete model_;
  }
  static TinyModel* model_;
  static std::string* pack_;
};
TinyModel* EngineTest::model_ = nullptr;
std::string* EngineTest::pack_ = nullptr;

TEST_F(EngineTest, BatchedDecodingGivesTheSameTokensAsOneAtATime) {
  const std::vector<std::vector<int32_t>> prompts = {{1, 2, 3}, {200, 100, 50, 25}, {7}, {90, 91, 92, 93, 94, 95}};
  std::vector<std::vector<int32_t>> alone;
  {
    auto engine = Engine::Create(Options(*pack_, 1));
    ASSERT_TRUE(engine.ok()) << engine.status();
    for (const auto& p : prompts) {
      auto done = GenerateWithin(**engine, Greedy(p, 10));
      ASSERT_TRUE(done.ok()) << done.status();
      alone.push_back(done->result.tokens);
    }
  }
  // Declared before the engine, which calls into them until it is gone.
  ForwardGate gate;
  std::vector<GenerationResult> results(prompts.size());
  std::vector<absl::Notification> done(prompts.size());
  EngineOptions o = Options(*pack_, 4);
  o.source_factory = gate.SourceFactory();
  auto engine = Engine::Create(o);
  ASSERT_TRUE(engine.ok());
  OpenOnExit open_on_exit{&gate};
  // The scheduler is held at its first pass until every request is queued, so they decode together
  // whatever the machine's speed (else a fast scheduler could finish one before the next arrives).
  gate.Pause();
  for (size_t i = 0; i < prompts.size(); ++i) {
    GenerateCallbacks cb;
    cb.on_done = [&, i](const GenerationResult& r) {
      results[i] = r;
      done[i].Notify();
    };
    ASSERT_TRUE((*engine)->Submit(Greedy(prompts[i], 10), cb).ok());
  }
  gate.Open();
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_TRUE(done[i].WaitForNotificationWithTimeout(kHangDeadline)) << "prompt " << i << " never finished";
  }
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(results[i].tokens, alone[i]) << "prompt " << i;
  // They did run together: 10 tokens each in at most two passes more than one request alone needs (one
  // pass may have held only the requests that had joined by then). One at a time would take 40 passes.
  EXPECT_GE((*engine)->stats().steps, 10u);
  EXPECT_LE((*engine)->stats().steps, 12u);
}

TEST_F(EngineTest, SameSeedSameTokensAndStopRules) {
  auto engine = Engine::Create(Options(*pack_));
  ASSERT_TRUE(engine.ok());
  GenerateRequest r = Greedy({3, 1, 4, 1, 5}, 20);
  r.sampling.temperature = 1.0f;
  r.sampling.seed = 42;
  auto a = GenerateWithin(**engine, r);
  auto b = GenerateWithin(**engine, r);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->result.tokens, b->result.tokens);
  EXPECT_EQ(a->result.tokens.size(), 20u);
  // A stop token id ends generation right after it.
  GenerateRequest s = r;
  s.sampling.stop_token_ids = {a->result.tokens[4]};
  auto c = GenerateWithin(**engine, s);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->result.reason, FinishReason::kStop);
  EXPECT_LE(c->result.tokens.size(), 5u);
  EXPECT_EQ(c->result.tokens.back(), a->result.tokens[4]);
}

// Without a seed each request draws its own, reports it, and the reported seed repeats the tokens.
TEST_F(EngineTest, WithoutASeedEachRequestDrawsOneAndReportsIt) {
  auto engine = Engine::Create(Options(*pack_));
  ASSERT_TRUE(engine.ok());
  GenerateRequest r = Greedy({3, 1, 4, 1, 5}, 20);
  r.sampling.temperature = 1.5f;  // spread enough that two seeds differ in 20 tokens
  ASSERT_FALSE(r.sampling.seed.has_value());
  auto a = GenerateWithin(**engine, r);
  auto b = GenerateWithin(**engine, r);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(a->result.usage.seed, b->result.usage.seed);
  EXPECT_NE(a->result.tokens, b->result.tokens);
  GenerateRequest again = r;
  again.sampling.seed = a->result.usage.seed;
  auto c = GenerateWithin(**engine, again);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->result.tokens, a->result.tokens);
  EXPECT_EQ(c->result.usage.seed, a->result.usage.seed);
}

// A prompt run in chunks reports its progress after each, the last (done == total) before the first token.
TEST_F(EngineTest, PrefillReportsPromptProgressChunkByChunkBeforeTheFirstToken) {
  EngineOptions o = Options(*pack_);
  o.prefill_chunk = 8;
  auto engine = Engine::Create(o);
  ASSERT_TRUE(engine.ok()) << engine.status();
  struct State {
    std::vector<std::pair<int64_t, int64_t>> progress;
    size_t progress_before_first_token = 0;
    bool saw_token = false;
    absl::Notification done;
  };
  auto state = std::make_shared<State>();
  GenerateCallbacks cb;
  cb.on_prompt_progress = [state](int64_t done, int64_t total) { state->progress.emplace_back(done, total); };
  cb.on_tokens = [state](const TokenEvent&) {
    if (!state->saw_token) state->progress_before_first_token = state->progress.size();
    state->saw_token = true;
  };
  cb.on_done = [state](const GenerationResult&) { state->done.Notify(); };
  std::vector<int32_t> prompt(20);
  for (int i = 0; i < 20; ++i) prompt[i] = 1 + i;
  auto handle = (*engine)->Submit(Greedy(prompt, 2), cb);
  ASSERT_TRUE(handle.ok()) << handle.status();
  ASSERT_TRUE(state->done.WaitForNotificationWithTimeout(kHangDeadline));
  EXPECT_EQ(state->progress, (std::vector<std::pair<int64_t, int64_t>>{{8, 20}, {16, 20}, {20, 20}}));
  EXPECT_EQ(state->progress_before_first_token, 3u);
}

TEST_F(EngineTest, BadOptionsAreRefusedNamingTheField) {
  EngineOptions o = Options(*pack_);
  o.threads = -4;
  EXPECT_THAT(Engine::Create(o).status(), StatusIsWith(absl::StatusCode::kInvalidArgument, "threads: -4"));
  o = Options(*pack_);
  o.max_ctx = -1;
  EXPECT_THAT(Engine::Create(o).status(), StatusIsWith(absl::StatusCode::kInvalidArgument, "max_ctx: -1"));
}

TEST_F(EngineTest, BadRequestsAreRefusedNamingTheField) {
  auto engine = Engine::Create(Options(*pack_));
  ASSERT_TRUE(engine.ok());
  GenerateRequest empty;
  EXPECT_THAT((*engine)->Submit(empty, {}).status(), StatusIsWith(absl::StatusCode::kInvalidArgument, "prompt"));
  EXPECT_THAT((*engine)->Submit(Greedy({1, 999999}, 4), {}).status(),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "prompt_tokens[1]"));
  EXPECT_THAT((*engine)->Submit(Greedy(std::vector<int32_t>(300, 1), 4), {}).status(),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "context"));
  GenerateRequest hot = Greedy({1}, 4);
  hot.sampling.temperature = -1;
  EXPECT_THAT((*engine)->Submit(hot, {}).status(), StatusIsWith(absl::StatusCode::kInvalidArgument, "temperature"));
}

// The tiny model's pack carries the built-in vocabulary's ChatML template: a conversation renders into
// its control tokens, which the prepared request parses as special tokens.
TEST_F(EngineTest, ChatRendersTheModelsTemplateAndParsesItsSpecialTokens) {
  auto engine = Engine::Create(Options(*pack_));
  ASSERT_TRUE(engine.ok()) << engine.status();
  ASSERT_NE((*engine)->chat_template(), nullptr);
  const std::vector<chat::ChatMessage> messages = {{"user", "hello there"}};
  absl::StatusOr<std::string> text = (*engine)->RenderChat(messages, {});
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text, "<|im_start|>user\nhello there<|im_end|>\n<|im_start|>assistant\n");

  ChatRequest chat;
  chat.system_prompt = "Be brief.";
  chat.messages = messages;
  chat.sampling.max_tokens = 3;
  absl::StatusOr<GenerateRequest> request = (*engine)->PrepareChat(chat);
  ASSERT_TRUE(request.ok()) << request.status();
  EXPECT_EQ(request->prompt,
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhello there<|im_end|>\n"
            "<|im_start|>assistant\n");
  EXPECT_TRUE(request->parse_special);
  EXPECT_EQ(request->sampling.max_tokens, 3);
  const std::vector<int32_t> ids = (*engine)->Tokenize(request->prompt, request->add_special, request->parse_special);
  const int32_t im_start = (*engine)->tokenizer().TokenId("<|im_start|>");
  ASSERT_GE(im_start, 0);
  EXPECT_EQ(ids.front(), im_start);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), im_start), 3);

  absl::StatusOr<Engine::Completion> done = (*engine)->Generate(*std::move(request));
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->result.usage.prompt_tokens, static_cast<int64_t>(ids.size()));
}

TEST_F(EngineTest, BadConversationsAreRefusedNamingTheMessage) {
  auto engine = Engine::Create(Options(*pack_));
  ASSERT_TRUE(engine.ok()) << engine.status();
  ChatRequest chat;
  EXPECT_THAT((*engine)->PrepareChat(chat).status(), StatusIsWith(absl::StatusCode::kInvalidArgument, "messages"));
  chat.messages = {{"user", "hi"}, {"robot", "beep"}};
  EXPECT_THAT((*engine)->PrepareChat(chat).status(),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "messages[1].role: 'robot'"));
  chat.messages = {{"system", "a"}, {"user", "hi"}};
  chat.system_prompt = "b";
  EXPECT_THAT((*engine)->PrepareChat(chat).status(),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "system_prompt"));
}

// A template override replaces the model's; one the interpreter cannot run fails the load, naming what.
TEST_F(EngineTest, AChatTemplateItCannotRenderIsRefusedAtLoad) {
  EngineOptions o = Options(*pack_);
  o.chat_template = "{% for m in messages %}[{{ m.role | wordwrap }}]{% endfor %}";
  EXPECT_THAT(Engine::Create(o).status(),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "unsupported filter 'wordwrap'"));
  o.chat_template = "{% include 'other.jinja' %}";
  EXPECT_THAT(Engine::Create(o).status(), StatusIsWith(absl::StatusCode::kInvalidArgument, "{% include %}"));
  o.chat_template = "{{ messages[0].content.zfill(3) }}";
  EXPECT_THAT(Engine::Create(o).status(), StatusIsWith(absl::StatusCode::kInvalidArgument, "zfill"));
  o.chat_template = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}";
  auto engine = Engine::Create(o);
  ASSERT_TRUE(engine.ok()) << engine.status();
  const std::vector<chat::ChatMessage> messages = {{"user", "x"}, {"assistant", "y"}};
  EXPECT_EQ(*(*engine)->RenderChat(messages, {}), "<user>x<assistant>y");
}

// A model whose GGUF has no tokenizer.chat_template loads (Generate works) but cannot chat.
TEST(EngineChatTest, AModelWithoutAChatTemplateRefusesChatAsAFailedPrecondition) {
  ScratchDir dir;
  absl::StatusOr<packtool::VocabMetadata> vocab = packtool::BuiltinVocab(0);
  ASSERT_TRUE(vocab.ok()) << vocab.status();
  gguf::GgufWriter writer(32);
  for (const auto& [key, value] : vocab->entries) {
    if (key != chat::kChatTemplateKey) writer.Set(key, value);
  }
  ASSERT_TRUE(writer.WriteFile(dir.Join("vocab.gguf")).ok());
  packtool::SynthOptions o;
  o.geometry = *packtool::PresetGeometry("qwen3moe", "tiny");
  o.vocab_path = dir.Join("vocab.gguf");
  o.output = dir.Join("pack");
  o.pack_scheme = kernels::Scheme::kS4;
  o.threads = 2;
  ASSERT_TRUE(packtool::SynthesizePack(o, nullptr, nullptr).ok());
  auto engine = Engine::Create(Options(dir.Join("pack")));
  ASSERT_TRUE(engine.ok()) << engine.status();
  EXPECT_FALSE((*engine)->info().has_chat_template);
  EXPECT_EQ((*engine)->chat_template(), nullptr);
  const std::vector<chat::ChatMessage> messages = {{"user", "hi"}};
  EXPECT_THAT((*engine)->RenderChat(messages, {}).status(),
              StatusIsWith(absl::StatusCode::kFailedPrecondition, "tokenizer.chat_template"));
  ChatRequest chat;
  chat.messages = messages;
  EXPECT_THAT((*engine)->PrepareChat(chat).status(), StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_TRUE((*engine)->Generate(Greedy({1, 2}, 2)).ok());
}

// Fails every read of one expert: the request must fail cleanly, with no token emitted.
class FailingSource : public pack::ExpertSource {
 public:
  explicit FailingSource(std::unique_ptr<pack::ExpertSource> inner) : inner_(std::move(inner)) {}
  absl::StatusOr<const uint8_t*> Blob(int64_t layer, int64_t expert) override {
    if (layer == 1) return absl::DataLossError("experts.bin: short read of blob (moe layer 1)");
    return inner_->Blob(layer, expert);
  }
  std::string_view kind() const override { return "failing"; }
  uint64_t blob_bytes() const override { return inner_->blob_bytes(); }

 private:
  std::unique_ptr<pack::ExpertSource> inner_;
};

TEST_F(EngineTest, AnExpertReadFailureFailsTheRequestWithoutTokens) {
  EngineOptions o = Options(*pack_);
  o.source_factory = [](const pack::Pack& p) -> std::unique_ptr<pack::ExpertSource> {
    return std::make_unique<FailingSource>(*pack::OpenExpertSource(p, {}, nullptr));
  };
  std::atomic<int> token_events{0};
  GenerationResult result;
  absl::Notification done;
  auto engine = Engine::Create(o);
  ASSERT_TRUE(engine.ok()) << engine.status();
  GenerateCallbacks cb;
  cb.on_tokens = [&](const TokenEvent&) { ++token_events; };
  cb.on_done = [&](const GenerationResult& r) {
    result = r;
    done.Notify();
  };
  ASSERT_TRUE((*engine)->Submit(Greedy({1, 2, 3}, 5), cb).ok());
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(kHangDeadline));
  EXPECT_EQ(result.reason, FinishReason::kError);
  EXPECT_THAT(result.status, StatusIsWith(absl::StatusCode::kDataLoss, "moe layer 1"));
  EXPECT_EQ(token_events.load(), 0);
  EXPECT_TRUE(result.tokens.empty());
  EXPECT_EQ((*engine)->stats().kv_bytes_in_use, 0u);
}

TEST_F(EngineTest, CancelFreesTheSequence) {
  // The gate holds the scheduler after two passes (the prompt's, giving the first token, and one decode
  // step), so the cancel lands mid-generation however fast or slow the machine is.
  ForwardGate gate;
  EngineOptions o = Options(*pack_, 1);
  o.source_factory = gate.SourceFactory();
  GenerationResult result;
  absl::Notification done;
  std::atomic<int> events{0};
  auto engine = Engine::Create(o);
  ASSERT_TRUE(engine.ok()) << engine.status();
  OpenOnExit open_on_exit{&gate};
  GenerateCallbacks cb;
  cb.on_tokens = [&](const TokenEvent&) { ++events; };
  cb.on_done = [&](const GenerationResult& r) {
    result = r;
    done.Notify();
  };
  gate.Pause();
  auto h = (*engine)->Submit(Greedy({1, 2, 3}, 200), cb);
  ASSERT_TRUE(h.ok());
  gate.Allow(2);
  ASSERT_TRUE(gate.WaitUntilHeld()) << "the scheduler never started a third pass";
  ASSERT_TRUE(WaitUntil([&] { return events.load() >= 2; })) << events.load() << " token events";
  (*h)->Cancel();
  gate.Open();
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(kHangDeadline));
  EXPECT_EQ(result.reason, FinishReason::kCancelled);
  // The pass that was held when the cancel came may still give its token; none comes after it.
  EXPECT_GE(result.tokens.size(), 2u);
  EXPECT_LE(result.tokens.size(), 3u);
  EXPECT_EQ((*engine)->stats().kv_bytes_in_use, 0u);
  // The engine still serves.
  auto next = GenerateWithin(**engine, Greedy({4, 5}, 3));
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(next->result.tokens.size(), 3u);
}

TEST_F(EngineTest, CallbacksOfARequestRunOneAtATimeInOrderAndAllBeforeTheEngineIsGone) {
  constexpr int kRequests = 4;
  ForwardGate gate;  // outlives the engine, whose expert source reports to it
  std::vector<std::atomic<int>> inside(2 * kRequests);  // per request
  std::atomic<int> overlaps{0};
  std::atomic<int> out_of_order{0};
  std::vector<std::atomic<int>> token_events(2 * kRequests);
  // Element i is touched only by request i's callbacks, which run one at a time.
  std::vector<std::vector<int32_t>> tokens_seen(2 * kRequests);
  std::vector<char> finished(2 * kRequests, false);
  std::vector<std::atomic<int>> done_calls(2 * kRequests);
  std::vector<GenerationResult> results(2 * kRequests);
  auto callbacks = [&](int i) {
    GenerateCallbacks cb;
    cb.on_tokens = [&, i](const TokenEvent& e) {
      if (inside[i].fetch_add(1) != 0) overlaps.fetch_add(1);
      if (finished[i]) out_of_order.fetch_add(1);
      tokens_seen[i].insert(tokens_seen[i].end(), e.tokens.begin(), e.tokens.end());
      token_events[i].fetch_add(1);
      std::this_thread::sleep_for(std::chrono::microseconds(50));  // widen any window for overlap
      inside[i].fetch_sub(1);
    };
    cb.on_done = [&, i](const GenerationResult& r) {
      if (inside[i].fetch_add(1) != 0) overlaps.fetch_add(1);
      finished[i] = true;
      results[i] = r;
      done_calls[i].fetch_add(1);
      inside[i].fetch_sub(1);
    };
    return cb;
  };
  {
    EngineOptions o = Options(*pack_, kRequests);
    o.threads = 3;  // workers exist, so callbacks run as posted work
    o.source_factory = gate.SourceFactory();
    auto engine = Engine::Create(o);
    ASSERT_TRUE(engine.ok());
    OpenOnExit open_on_exit{&gate};  // whatever fails below, the engine can still stop
    for (int i = 0; i < kRequests; ++i) {
      ASSERT_TRUE((*engine)->Submit(Greedy({static_cast<int32_t>(i + 1), 2, 3}, 12), callbacks(i)).ok());
    }
    auto all_done = [&] {
      for (int i = 0; i < kRequests; ++i) {
        if (done_calls[i].load() == 0) return false;
      }
      return true;
    };
    ASSERT_TRUE(WaitUntil(all_done));
    // A second batch is still running when the engine goes: each gets its on_done before the destructor
    // returns. The gate lets three passes run (every request of the batch has joined and has a token by
    // then) and holds the fourth, so none of them can reach its 200 tokens before the engine is destroyed.
    gate.Pause();
    for (int i = kRequests; i < 2 * kRequests; ++i) {
      ASSERT_TRUE((*engine)->Submit(Greedy({static_cast<int32_t>(i + 1), 5}, 200), callbacks(i)).ok());
    }
    gate.Allow(3);
    ASSERT_TRUE(gate.WaitUntilHeld()) << "the scheduler never started a fourth pass";
    ASSERT_TRUE(WaitUntil([&] {
      for (int i = kRequests; i < 2 * kRequests; ++i) {
        if (token_events[i].load() == 0) return false;
      }
      return true;
    })) << "a request of the second batch had no token after three passes";
    // Destroys the engine on another thread while the gate holds the scheduler, and releases the gate only
    // once the destructor has asked the scheduler to stop; the scheduler then finishes the held pass and
    // stops. Submit refuses with UNAVAILABLE from that moment: the destructor's body is running, blocked on
    // the scheduler, and every member Submit touches is alive until it returns.
    Engine* const raw = engine->get();
    std::thread destroyer([&] { engine->reset(); });
    const bool stopping = WaitUntil([&] {
      return raw->Submit(Greedy({1}, 1), {}).status().code() == absl::StatusCode::kUnavailable;
    });
    gate.Open();
    destroyer.join();
    ASSERT_TRUE(stopping) << "Submit was never refused while the engine was being destroyed";
  }
  EXPECT_EQ(overlaps.load(), 0);
  EXPECT_EQ(out_of_order.load(), 0);
  for (int i = 0; i < 2 * kRequests; ++i) {
    EXPECT_EQ(done_calls[i].load(), 1) << "request " << i;
    EXPECT_EQ(tokens_seen[i], results[i].tokens) << "request " << i;  // every token, in order
  }
  for (int i = 0; i < kRequests; ++i) EXPECT_EQ(results[i].reason, FinishReason::kLength);
  for (int i = kRequests; i < 2 * kRequests; ++i) {
    EXPECT_EQ(results[i].reason, FinishReason::kCancelled) << "request " << i;
    // Three passes and the held one: at most four tokens each.
    EXPECT_GE(results[i].tokens.size(), 1u) << "request " << i;
    EXPECT_LE(results[i].tokens.size(), 4u) << "request " << i;
  }
}

// SubmitAll queues its requests together: they join the first step as one batch, without a gate holding
// the scheduler; one bad request refuses them all, naming which.
TEST_F(EngineTest, SubmitAllQueuesTogetherOrNotAtAll) {
  const std::vector<std::vector<int32_t>> prompts = {{1, 2, 3}, {200, 100, 50, 25}, {7}, {90, 91, 92, 93, 94, 95}};
  auto engine = Engine::Create(Options(*pack_, 4));
  ASSERT_TRUE(engine.ok()) << engine.status();
  std::vector<Engine::Submission> bad;
  for (const auto& p : prompts) bad.push_back({Greedy(p, 10), {}});
  bad[2].request.prompt_tokens = {1, 999999};
  EXPECT_THAT((*engine)->SubmitAll(std::move(bad)).status(),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "request 2: prompt_tokens[1]"));
  EXPECT_EQ((*engine)->stats().queued, 0);
  EXPECT_EQ((*engine)->stats().steps, 0u);

  std::vector<GenerationResult> results(prompts.size());
  std::vector<absl::Notification> done(prompts.size());
  std::vector<Engine::Submission> good;
  for (size_t i = 0; i < prompts.size(); ++i) {
    GenerateCallbacks cb;
    cb.on_done = [&, i](const GenerationResult& r) {
      results[i] = r;
      done[i].Notify();
    };
    good.push_back({Greedy(prompts[i], 10), cb});
  }
  auto handles = (*engine)->SubmitAll(std::move(good));
  ASSERT_TRUE(handles.ok()) << handles.status();
  EXPECT_EQ(handles->size(), prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_TRUE(done[i].WaitForNotificationWithTimeout(kHangDeadline)) << "prompt " << i << " never finished";
    EXPECT_EQ(results[i].tokens.size(), 10u);
  }
  // One prefill step for all four, then 9 decode steps: never a step that held only some of them.
  EXPECT_EQ((*engine)->stats().steps, 10u);
}

TEST_F(EngineTest, FullQueueIsResourceExhausted) {
  ForwardGate gate;
  EngineOptions o = Options(*pack_, 1);
  o.max_queue = 1;
  o.source_factory = gate.SourceFactory();
  auto engine = Engine::Create(o);
  ASSERT_TRUE(engine.ok());
  OpenOnExit open_on_exit{&gate};
  gate.Pause();  // no request can finish and make room, however slowly the requests below are submitted
  std::vector<std::shared_ptr<RequestHandle>> handles;
  absl::Status last;
  for (int i = 0; i < 6 && last.ok(); ++i) {
    auto h = (*engine)->Submit(Greedy({1, 2}, 100), {});
    if (h.ok()) handles.push_back(*h);
    last = h.status();
  }
  EXPECT_THAT(last, StatusIs(absl::StatusCode::kResourceExhausted));
  for (auto& h : handles) h->Cancel();
}

}  // namespace
}  // namespace strata::runtime
