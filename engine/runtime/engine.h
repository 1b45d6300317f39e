#ifndef STRATA_ENGINE_RUNTIME_ENGINE_H_
#define STRATA_ENGINE_RUNTIME_ENGINE_H_

// The engine: a loaded pack, its tokenizer and a scheduler that decodes many sequences together.
//
// Requests are queued by Submit (any thread) and run by one scheduler thread the engine owns. Between
// decode steps sequences join (after their KV cache is allocated) and leave (finished, cancelled or
// failed); each step runs the prompt chunks of joining sequences and one token of every decoding sequence
// through the model as one batch. Results arrive through the request's callbacks, which the scheduler posts
// to the compute pool so that a compute thread between parallel jobs runs them (see GenerateCallbacks).

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "engine/chat/chat_template.h"
#include "engine/model/model.h"
#include "engine/pack/expert_source.h"
#include "engine/pack/pack.h"
#include "engine/model/kv_cache.h"
#include "engine/runtime/model_factory.h"
#include "engine/runtime/request.h"
#include "engine/tokenizer/tokenizer.h"
#include "engine/exec/thread_pool.h"

namespace strata::runtime {

struct EngineOptions {
  std::string pack_dir;
  int threads = 0;                  // compute threads; 0 = one per core this process may use
  int max_seqs = 16;                // sequences decoded together
  int max_queue = 64;               // requests waiting beyond max_seqs; more are refused
  int64_t max_ctx = 0;              // positions per sequence; 0 = the model's training context
  uint64_t kv_budget_bytes = 0;     // all KV caches together; 0 = enough for max_seqs x max_ctx
  int prefill_chunk = 256;          // prompt tokens per step, over all joining sequences
  pack::ExpertSourceOptions experts;
  DeviceOptions device;
  // Jinja text replacing the model's tokenizer.chat_template; empty: the model's own (if it has one).
  std::string chat_template;
  // Replaces the pack's expert source (tests inject failures); null = open experts as `experts` says.
  std::function<std::unique_ptr<pack::ExpertSource>(const pack::Pack&)> source_factory;
};

struct EngineInfo {
  model::ModelConfig config;
  std::string scheme;
  uint64_t experts_bytes = 0;
  uint64_t dense_bytes_per_token = 0;
  uint64_t expert_bytes_per_token = 0;  // k experts x their weight bytes x MoE layers (batch of one)
  pack::ExpertSourceStats source;
  std::string source_kind;         // "arena", "mmap" or "vram" (every expert on the GPU)
  model::BackendInfo backend;      // device, kernels' ISA, device memory
  std::string device_note;         // why the model runs elsewhere than asked, when it does
  double load_seconds = 0;
  int threads = 0;
  int64_t max_ctx = 0;
  uint64_t kv_bytes_per_sequence = 0;  // one sequence's KV cache at max_ctx (windowed layers keep a ring)
  bool has_chat_template = false;  // RenderChat / PrepareChat work
};

struct EngineStats {
  int active = 0;
  int queued = 0;
  uint64_t steps = 0;
  uint64_t tokens_generated = 0;
  uint64_t prompt_tokens = 0;
  uint64_t expert_bytes = 0;
  uint64_t expert_hits = 0;      // routed pairs served from VRAM
  uint64_t expert_misses = 0;    // routed pairs computed from host memory
  model::CacheReport cache;      // the VRAM expert cache's slots, admissions, evictions, PCIe bytes
  uint64_t kv_bytes_in_use = 0;
  uint64_t kv_bytes_budget = 0;
  std::string device;            // "cpu" or "cuda"
  uint64_t requests_finished = 0;
  uint64_t callbacks_run = 0;    // on_tokens and on_done calls made
  double callback_seconds = 0;   // time spent in them, summed over the threads that ran them
};

// Lets a client stop its request; safe from any thread, at any time, any number of times.
class RequestHandle {
 public:
  void Cancel() { cancelled_.store(true); }
  bool cancelled() const { return cancelled_.load(); }

 private:
  std::atomic<bool> cancelled_{false};
};

class Engine {
 public:
  static absl::StatusOr<std::unique_ptr<Engine>> Create(const EngineOptions& options);
  ~Engine();  // cancels what is running and queued (their on_done is called) and joins the scheduler
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Checks and queues a request. INVALID_ARGUMENT naming the field for bad parameters (empty prompt,
  // unknown token id, prompt longer than the context, ...), RESOURCE_EXHAUSTED when the queue is full.
  // On success the callbacks will be called, on_done exactly once.
  absl::StatusOr<std::shared_ptr<RequestHandle>> Submit(GenerateRequest request, GenerateCallbacks callbacks);

  // Checks every request, then queues them all at once (so the scheduler admits them in one step when
  // there is room) or none: the first bad request's error, prefixed "request i: ", or RESOURCE_EXHAUSTED when
  // they do not all fit in the queue. Handles in order.
  struct Submission {
    GenerateRequest request;
    GenerateCallbacks callbacks;
  };
  absl::StatusOr<std::vector<std::shared_ptr<RequestHandle>>> SubmitAll(std::vector<Submission> submissions);

  // Submits and waits; collects all tokens and text.
  struct Completion {
    GenerationResult result;
    std::string text;
  };
  absl::StatusOr<Completion> Generate(GenerateRequest request);

  // The prompt text the model's chat template makes of `messages` (for the HTTP server's chat endpoint,
  // and PrepareChat). FAILED_PRECONDITION when the model has no chat template; INVALID_ARGUMENT naming the
  // message for a bad conversation or with the template's own message when it refuses it.
  absl::StatusOr<std::string> RenderChat(std::span<const chat::ChatMessage> messages,
                                         const chat::ChatOptions& options) const;
  // The GenerateRequest for a conversation: its rendered prompt with special tokens parsed, BOS added as the
  // vocabulary asks unless the template already wrote it, and the request's sampling. Errors as
  // RenderChat, plus INVALID_ARGUMENT for a system_prompt given with messages that start with a system
  // message.
  absl::StatusOr<GenerateRequest> PrepareChat(const ChatRequest& request) const;
  // Null when the model has no chat template.
  const chat::ChatTemplate* chat_template() const { return chat_template_.get(); }

  // The token ids of a text prompt as Submit would see them.
  std::vector<int32_t> Tokenize(const std::string& text, bool add_special, bool parse_special) const;

  const tokenizer::Tokenizer& tokenizer() const { return *tokenizer_; }
  const EngineInfo& info() const { return info_; }
  EngineStats stats() const;

 private:
  struct Sequence;
  Engine() = default;
  // A checked request as a sequence ready to queue (Submit's checks and errors).
  absl::StatusOr<std::unique_ptr<Sequence>> NewSequence(GenerateRequest request, GenerateCallbacks callbacks);
  void SchedulerLoop();
  // One step over the active sequences; false when there was nothing to do.
  bool Step();
  void Admit();
  void Finish(Sequence* seq, FinishReason reason, absl::Status status);
  void ProcessLogits(Sequence* seq, const float* logits);
  // Posts the request's on_tokens call to the pool, to run off the decode's critical path, ordered after
  // the request's earlier deliveries.
  void DeliverTokens(Sequence* seq, TokenEvent event);

  EngineOptions options_;
  EngineInfo info_;
  std::unique_ptr<pack::Pack> pack_;
  std::unique_ptr<exec::ThreadPool> pool_;
  std::unique_ptr<pack::ExpertSource> source_;  // null when every expert is in VRAM
  std::unique_ptr<model::Model> model_;         // reads source_ and pool_: declared after them
  std::unique_ptr<tokenizer::Tokenizer> tokenizer_;
  std::unique_ptr<chat::ChatTemplate> chat_template_;  // null: the model has none
  std::unique_ptr<model::KvCachePool> kv_pool_;

  std::atomic<uint64_t> next_request_id_{0};
  mutable absl::Mutex mu_;
  std::deque<std::unique_ptr<Sequence>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  int active_count_ ABSL_GUARDED_BY(mu_) = 0;
  EngineStats stats_ ABSL_GUARDED_BY(mu_);

  // Scheduler thread only.
  std::vector<std::unique_ptr<Sequence>> active_;
  std::vector<model::ForwardToken> batch_;
  std::vector<std::pair<Sequence*, int>> batch_owners_;  // per batch_ entry: its sequence, prompt index or -1
  std::vector<float> logits_;
  std::thread scheduler_;
};

}  // namespace strata::runtime

#endif  // STRATA_ENGINE_RUNTIME_ENGINE_H_
