#include "engine/runtime/engine.h"

#include <pthread.h>

#include <algorithm>
#include <chrono>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "engine/log.h"
#include "engine/runtime/stop_matcher.h"
#include "engine/status_macros.h"
#include "engine/tokenizer/streaming_decoder.h"

namespace strata::runtime {
namespace {

// A seed for a request that gave none: different on every call, from the system's entropy.
uint64_t RandomSeed() {
  thread_local std::random_device device;  // one per submitting thread: no lock
  return (static_cast<uint64_t>(device()) << 32) ^ device();
}

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

}  // namespace

struct Engine::Sequence {
  uint64_t id = 0;  // orders the deliveries of this request on the pool
  GenerateRequest request;
  // Shared with the deliveries posted to the pool, which may run after the sequence is gone.
  std::shared_ptr<const GenerateCallbacks> callbacks;
  std::shared_ptr<RequestHandle> handle;
  std::vector<int32_t> prompt;
  int64_t positions = 0;  // KV positions this sequence needs
  std::unique_ptr<model::KvCache> cache;
  std::unique_ptr<Sampler> sampler;
  std::unique_ptr<StopMatcher> stop;
  std::unique_ptr<tokenizer::StreamingDecoder> decoder;
  int64_t n_past = 0;       // positions already in the cache
  int32_t next_token = -1;  // sampled and not yet run through the model
  bool finished = false;
  GenerationResult result;
  double expert_bytes = 0, dense_bytes = 0;
  double expert_hits = 0, expert_routed = 0;  // its share of each step's routed pairs
  Clock::time_point submitted, started, first_token, last_token;
};

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(const EngineOptions& options) {
  if (options.threads < 0 || options.threads > exec::ThreadPool::kMaxThreads) {
    return absl::InvalidArgumentError(
        absl::StrCat("threads: ", options.threads, " is not in 0 (all cores) .. ", exec::ThreadPool::kMaxThreads));
  }
  if (options.max_seqs < 1) return absl::InvalidArgumentError("max_seqs: must be at least 1");
  if (options.max_queue < 0) return absl::InvalidArgumentError("max_queue: must not be negative");
  RETURN_IF_ERROR(CheckDeviceOptions(options.device));
  if (options.max_ctx < 0) {
    return absl::InvalidArgumentError(absl::StrCat("max_ctx: ", options.max_ctx, " must not be negative"));
  }
  std::unique_ptr<Engine> e(new Engine());
  e->options_ = options;
  const auto start = Clock::now();
  ASSIGN_OR_RETURN(e->pack_, pack::Pack::Open(options.pack_dir));
  const int threads = exec::ResolveThreads(options.threads);
  ASSIGN_OR_RETURN(e->pool_, exec::ThreadPool::Create(threads));
  pack::ExpertSourceOptions so = options.experts;
  if (so.threads == 0) so.threads = options.threads;
  // A step holds one token of each decoding sequence and up to prefill_chunk prompt tokens.
  DeviceOptions device = options.device;
  device.max_batch = std::max(1, options.max_seqs);
  device.max_prefill = std::max(1, options.prefill_chunk) + device.max_batch;
  ASSIGN_OR_RETURN(LoadedModel loaded, LoadModel(*e->pack_, device, so, options.source_factory,
                                                 e->pool_.get(), &e->info_.source));
  e->source_ = std::move(loaded.source);
  e->model_ = std::move(loaded.model);
  e->info_.device_note = loaded.note;
  if (!loaded.note.empty()) spdlog::warn("{}", loaded.note);
  ASSIGN_OR_RETURN(e->tokenizer_, tokenizer::Tokenizer::FromMetadata(e->pack_->dense().metadata()));
  const model::ModelConfig& c = e->model_->config();
  if (e->tokenizer_->n_vocab() != c.n_vocab) {
    return absl::InvalidArgumentError(absl::StrCat("tokenizer has ", e->tokenizer_->n_vocab(),
                                                   " tokens but the model's vocabulary is ", c.n_vocab));
  }
  ASSIGN_OR_RETURN(e->chat_template_,
                   chat::LoadChatTemplate(e->pack_->dense().metadata(), *e->tokenizer_, options.chat_template));
  const int64_t max_ctx = options.max_ctx > 0 ? options.max_ctx : std::min<int64_t>(c.n_ctx_train, 8192);
  // A step writes at most prefill_chunk prompt positions of one sequence (or one decoded position): the
  // windowed layers' rings hold that many more than the window.
  model::KvShape kv_shape = model::CacheShape(c, std::max(1, options.prefill_chunk));
  const uint64_t kv_bytes_per_sequence = model::KvCachePool::BytesFor(kv_shape, max_ctx);
  uint64_t budget = options.kv_budget_bytes;
  if (budget == 0) budget = std::min<uint64_t>(kv_bytes_per_sequence * options.max_seqs, uint64_t{8} << 30);
  e->kv_pool_ = std::make_unique<model::KvCachePool>(std::move(kv_shape), budget, e->model_->backend().kv_memory());

  EngineInfo& info = e->info_;
  info.config = c;
  info.scheme = e->pack_->manifest().scheme();
  info.experts_bytes = e->pack_->manifest().experts_bytes();
  info.dense_bytes_per_token = e->model_->weights().dense_bytes_per_token;
  info.expert_bytes_per_token = static_cast<uint64_t>(c.n_layer) * c.n_expert_used * e->pack_->layout().weight_bytes();
  info.source_kind = e->source_ != nullptr ? std::string(e->source_->kind()) : std::string("vram");
  info.backend = e->model_->backend().info();
  info.threads = threads;
  info.max_ctx = max_ctx;
  info.kv_bytes_per_sequence = kv_bytes_per_sequence;
  info.has_chat_template = e->chat_template_ != nullptr;
  info.load_seconds = Since(start, Clock::now());
  e->scheduler_ = std::thread([engine = e.get()] { engine->SchedulerLoop(); });
  return e;
}

Engine::~Engine() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (scheduler_.joinable()) scheduler_.join();
}

absl::StatusOr<std::string> Engine::RenderChat(std::span<const chat::ChatMessage> messages,
                                               const chat::ChatOptions& options) const {
  if (chat_template_ == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the model has no chat template (", chat::kChatTemplateKey,
        " is absent from its GGUF): use Generate with a raw prompt, or give the server a chat template"));
  }
  return chat_template_->Render(messages, options);
}

absl::StatusOr<GenerateRequest> Engine::PrepareChat(const ChatRequest& request) const {
  std::vector<chat::ChatMessage> messages;
  if (!request.system_prompt.empty()) {
    if (!request.messages.empty() && request.messages[0].role == "system") {
      return absl::InvalidArgumentError(
          "system_prompt: messages[0] is already a system message; give the system prompt once");
    }
    messages.push_back({"system", request.system_prompt});
  }
  messages.insert(messages.end(), request.messages.begin(), request.messages.end());
  ASSIGN_OR_RETURN(std::string prompt, RenderChat(messages, request.options));
  GenerateRequest out;
  out.add_special = chat::AddSpecialToRendered(prompt, *tokenizer_);
  out.parse_special = true;
  out.prompt = std::move(prompt);
  out.sampling = request.sampling;
  return out;
}

std::vector<int32_t> Engine::Tokenize(const std::string& text, bool add_special, bool parse_special) const {
  return tokenizer_->Encode(text, {.add_special = add_special, .parse_special = parse_special});
}

EngineStats Engine::stats() const {
  absl::MutexLock lock(&mu_);
  EngineStats s = stats_;
  s.queued = static_cast<int>(queue_.size());
  s.active = active_count_;
  s.kv_bytes_in_use = kv_pool_->in_use();
  s.kv_bytes_budget = kv_pool_->budget();
  s.cache = model_->dispatch().cache();
  s.device = info_.backend.device;
  const exec::ThreadPool::PostedStats posted = pool_->posted_stats();  // only callbacks are posted
  s.callbacks_run = posted.items;
  s.callback_seconds = posted.seconds;
  return s;
}

absl::StatusOr<std::shared_ptr<RequestHandle>> Engine::Submit(GenerateRequest request, GenerateCallbacks callbacks) {
  std::vector<Submission> one;
  one.push_back({std::move(request), std::move(callbacks)});
  ASSIGN_OR_RETURN(std::vector<std::shared_ptr<RequestHandle>> handles, SubmitAll(std::move(one)));
  return handles[0];
}

absl::StatusOr<std::vector<std::shared_ptr<RequestHandle>>> Engine::SubmitAll(std::vector<Submission> submissions) {
  std::vector<std::unique_ptr<Sequence>> seqs;
  std::vector<std::shared_ptr<RequestHandle>> handles;
  for (size_t i = 0; i < submissions.size(); ++i) {
    absl::StatusOr<std::unique_ptr<Sequence>> seq =
        NewSequence(std::move(submissions[i].request), std::move(submissions[i].callbacks));
    if (!seq.ok()) {
      if (submissions.size() == 1) return seq.status();
      return absl::Status(seq.status().code(), absl::StrCat("request ", i, ": ", seq.status().message()));
    }
    handles.push_back((*seq)->handle);
    seqs.push_back(*std::move(seq));
  }
  absl::MutexLock lock(&mu_);
  if (stopping_) return absl::UnavailableError("the engine is shutting down");
  const int waiting_room = options_.max_queue + std::max(0, options_.max_seqs - active_count_);
  if (static_cast<int>(queue_.size() + seqs.size()) > waiting_room) {
    return absl::ResourceExhaustedError(absl::StrCat("the request queue is full (", queue_.size(), " waiting, ",
                                                     active_count_, " running)"));
  }
  for (auto& seq : seqs) queue_.push_back(std::move(seq));
  return handles;
}

absl::StatusOr<std::unique_ptr<Engine::Sequence>> Engine::NewSequence(GenerateRequest request, GenerateCallbacks callbacks) {
  auto seq = std::make_unique<Sequence>();
  seq->id = next_request_id_.fetch_add(1, std::memory_order_relaxed);
  const int64_t n_vocab = model_->config().n_vocab;
  if (!request.prompt_tokens.empty()) {
    for (size_t i = 0; i < request.prompt_tokens.size(); ++i) {
      const int32_t id = request.prompt_tokens[i];
      if (id < 0 || id >= n_vocab) {
        return absl::InvalidArgumentError(
            absl::StrCat("prompt_tokens[", i, "]: ", id, " is not a token id (the vocabulary has ", n_vocab, ")"));
      }
    }
    seq->prompt = request.prompt_tokens;
  } else {
    if (request.prompt.empty()) return absl::InvalidArgumentError("prompt: empty (give text or token ids)");
    seq->prompt = Tokenize(request.prompt, request.add_special, request.parse_special);
    if (seq->prompt.empty()) return absl::InvalidArgumentError("prompt: no tokens after tokenization");
  }
  RETURN_IF_ERROR(ValidateSamplingParams(request.sampling, static_cast<int>(n_vocab)));
  const int64_t n_prompt = static_cast<int64_t>(seq->prompt.size());
  if (n_prompt + 1 > info_.max_ctx) {
    return absl::InvalidArgumentError(absl::StrCat("prompt: ", n_prompt, " tokens leave no room to generate in the ",
                                                   info_.max_ctx, "-token context"));
  }
  seq->positions = std::min<int64_t>(n_prompt + request.sampling.max_tokens, info_.max_ctx);
  if (kv_pool_->BytesFor(seq->positions) > kv_pool_->budget()) {
    return absl::ResourceExhaustedError(absl::StrCat("the KV cache for ", seq->positions,
                                                     " positions exceeds the engine's whole KV budget of ",
                                                     kv_pool_->budget(), " bytes"));
  }
  if (!request.sampling.seed.has_value()) request.sampling.seed = RandomSeed();
  seq->sampler = std::make_unique<Sampler>(request.sampling, static_cast<int>(n_vocab));
  for (int32_t t : seq->prompt) seq->sampler->Accept(t);
  seq->stop = std::make_unique<StopMatcher>(request.sampling.stop);
  seq->decoder = std::make_unique<tokenizer::StreamingDecoder>(tokenizer_.get());
  seq->request = std::move(request);
  seq->callbacks = std::make_shared<const GenerateCallbacks>(std::move(callbacks));
  seq->handle = std::make_shared<RequestHandle>();
  seq->submitted = Clock::now();
  seq->result.usage.prompt_tokens = n_prompt;
  seq->result.usage.seed = *seq->request.sampling.seed;
  return seq;
}

absl::StatusOr<Engine::Completion> Engine::Generate(GenerateRequest request) {
  auto completion = std::make_shared<Completion>();
  auto done = std::make_shared<absl::Notification>();
  GenerateCallbacks callbacks;
  callbacks.on_tokens = [completion](const TokenEvent& e) { completion->text += e.text; };
  callbacks.on_done = [completion, done](const GenerationResult& r) {
    completion->result = r;
    done->Notify();
  };
  RETURN_IF_ERROR(Submit(std::move(request), std::move(callbacks)).status());
  done->WaitForNotification();
  return *completion;
}

void Engine::Finish(Sequence* seq, FinishReason reason, absl::Status status) {
  if (seq->finished) return;
  seq->finished = true;
  if (reason != FinishReason::kError && reason != FinishReason::kCancelled) {
    // Release what the decoder and the stop matcher hold back.
    TokenEvent tail;
    if (!seq->stop->stopped()) {
      tail.text = seq->stop->Push(seq->decoder->Flush()).emit;
      if (!seq->stop->stopped()) tail.text += seq->stop->Flush();
    }
    if (!tail.text.empty()) DeliverTokens(seq, std::move(tail));
  }
  GenerationResult& r = seq->result;
  r.reason = reason;
  r.status = std::move(status);
  Usage& u = r.usage;
  u.completion_tokens = static_cast<int64_t>(r.tokens.size());
  if (!r.tokens.empty()) {
    u.time_to_first_token = Since(seq->submitted, seq->first_token);
    const double prefill = Since(seq->started, seq->first_token);
    u.prefill_tokens_per_second = prefill > 0 ? static_cast<double>(u.prompt_tokens) / prefill : 0;
    const double decode = Since(seq->first_token, seq->last_token);
    u.decode_tokens_per_second = decode > 0 ? static_cast<double>(u.completion_tokens - 1) / decode : 0;
  }
  u.expert_bytes = static_cast<uint64_t>(seq->expert_bytes);
  u.dense_bytes = static_cast<uint64_t>(seq->dense_bytes);
  u.expert_hit_rate = seq->expert_routed > 0 ? seq->expert_hits / seq->expert_routed : 0;
  seq->cache.reset();
  {
    // Counted before on_done, so a client that reads the stats after its result sees itself finished.
    absl::MutexLock lock(&mu_);
    ++stats_.requests_finished;
  }
  if (seq->callbacks->on_done) {
    pool_->Post(seq->id, [callbacks = seq->callbacks, result = std::move(r)] { callbacks->on_done(result); });
  }
}

void Engine::DeliverTokens(Sequence* seq, TokenEvent event) {
  if (!seq->callbacks->on_tokens) return;
  pool_->Post(seq->id, [callbacks = seq->callbacks, event = std::move(event)] { callbacks->on_tokens(event); });
}

void Engine::ProcessLogits(Sequence* seq, const float* logits) {
  const int64_t n_vocab = model_->config().n_vocab;
  absl::StatusOr<SampleResult> sampled = seq->sampler->Sample({logits, static_cast<size_t>(n_vocab)});
  if (!sampled.ok()) {
    Finish(seq, FinishReason::kError, sampled.status());
    return;
  }
  const int32_t token = sampled->token;
  seq->sampler->Accept(token);
  const auto now = Clock::now();
  if (seq->result.tokens.empty()) seq->first_token = now;
  seq->last_token = now;
  seq->result.tokens.push_back(token);
  const SamplingParams& p = seq->request.sampling;
  TokenEvent event;
  event.tokens.push_back(token);
  if (p.logprobs) event.logprobs.push_back(*std::move(sampled));
  const bool eos = !p.ignore_eos && tokenizer_->IsEog(token);
  const bool stop_id = std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), token) != p.stop_token_ids.end();
  bool stopped = false;
  if (!eos && !stop_id) {
    StopResult sr = seq->stop->Push(seq->decoder->Add(token));
    event.text = std::move(sr.emit);
    stopped = sr.stopped;
  }
  DeliverTokens(seq, std::move(event));
  if (eos) return Finish(seq, FinishReason::kEos, absl::OkStatus());
  if (stop_id || stopped) return Finish(seq, FinishReason::kStop, absl::OkStatus());
  if (static_cast<int64_t>(seq->result.tokens.size()) >= p.max_tokens || seq->n_past >= seq->cache->capacity() ||
      seq->n_past >= info_.max_ctx) {
    return Finish(seq, FinishReason::kLength, absl::OkStatus());
  }
  seq->next_token = token;
}

void Engine::Admit() {
  for (;;) {
    std::unique_ptr<Sequence> seq;
    {
      absl::MutexLock lock(&mu_);
      if (queue_.empty() || static_cast<int>(active_.size()) >= options_.max_seqs) return;
      seq = std::move(queue_.front());
      queue_.pop_front();
    }
    if (seq->handle->cancelled()) {
      Finish(seq.get(), FinishReason::kCancelled, absl::OkStatus());
      continue;
    }
    absl::StatusOr<std::unique_ptr<model::KvCache>> cache = kv_pool_->Allocate(seq->positions);
    if (!cache.ok()) {
      if (!active_.empty()) {
        // Wait for running sequences to free their caches.
        absl::MutexLock lock(&mu_);
        queue_.push_front(std::move(seq));
        return;
      }
      Finish(seq.get(), FinishReason::kError, cache.status());
      continue;
    }
    seq->cache = *std::move(cache);
    seq->started = Clock::now();
    seq->result.usage.queue_seconds = Since(seq->submitted, seq->started);
    active_.push_back(std::move(seq));
  }
}

bool Engine::Step() {
  // Free the slots of finished and cancelled sequences first, so that waiting requests take them now.
  for (auto& seq : active_) {
    if (seq->handle->cancelled()) Finish(seq.get(), FinishReason::kCancelled, absl::OkStatus());
  }
  std::erase_if(active_, [](const std::unique_ptr<Sequence>& s) { return s->finished; });
  Admit();
  {
    absl::MutexLock lock(&mu_);
    active_count_ = static_cast<int>(active_.size());
  }
  if (active_.empty()) return false;

  // Build the batch: one token of each decoding sequence, then prompt chunks within the prefill budget.
  batch_.clear();
  std::vector<std::pair<Sequence*, int>>& owners = batch_owners_;
  owners.clear();
  int64_t prefill_budget = std::max(1, options_.prefill_chunk);
  std::vector<std::pair<Sequence*, int64_t>> prefilled;  // sequence, prompt tokens done after this step
  for (auto& seq : active_) {
    const int64_t n_prompt = static_cast<int64_t>(seq->prompt.size());
    if (seq->n_past >= n_prompt) {
      batch_.push_back({seq->next_token, seq->n_past, seq->cache.get(), true});
      owners.emplace_back(seq.get(), -1);
    }
  }
  for (auto& seq : active_) {
    const int64_t n_prompt = static_cast<int64_t>(seq->prompt.size());
    if (seq->n_past >= n_prompt || prefill_budget == 0) continue;
    const int64_t n = std::min(n_prompt - seq->n_past, prefill_budget);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t pos = seq->n_past + i;
      batch_.push_back({seq->prompt[pos], pos, seq->cache.get(), seq->request.prompt_logits || pos == n_prompt - 1});
      owners.emplace_back(seq.get(), static_cast<int>(pos));
    }
    prefill_budget -= n;
    prefilled.emplace_back(seq.get(), seq->n_past + n);
  }
  const int64_t n_vocab = model_->config().n_vocab;
  int64_t n_logits = 0;
  for (const auto& t : batch_) n_logits += t.want_logits ? 1 : 0;
  logits_.resize(static_cast<size_t>(n_logits * n_vocab));
  model::ForwardStats fstats;
  const absl::Status status = model_->Forward(batch_, logits_.data(), &fstats);
  const double share = 1.0 / static_cast<double>(batch_.size());
  for (const auto& [seq, index] : owners) {
    seq->expert_bytes += static_cast<double>(fstats.dispatch.expert_bytes) * share;
    seq->dense_bytes += static_cast<double>(fstats.dense_bytes) * share;
    seq->expert_hits += static_cast<double>(fstats.dispatch.hits) * share;
    seq->expert_routed += static_cast<double>(fstats.dispatch.routed) * share;
  }
  if (!status.ok()) {
    spdlog::warn("decode step failed: {}", std::string(status.message()));
    for (const auto& [seq, index] : owners) Finish(seq, FinishReason::kError, status);
  } else {
    for (const auto& [seq, done] : prefilled) {
      if (!seq->callbacks->on_prompt_progress) continue;
      pool_->Post(seq->id, [callbacks = seq->callbacks, done = done, total = static_cast<int64_t>(seq->prompt.size())] {
        callbacks->on_prompt_progress(done, total);
      });
    }
    int64_t row = 0;
    for (size_t i = 0; i < batch_.size(); ++i) {
      Sequence* seq = owners[i].first;
      const int prompt_index = owners[i].second;
      seq->n_past = batch_[i].pos + 1;
      if (!batch_[i].want_logits) continue;
      const float* logits = logits_.data() + row * n_vocab;
      ++row;
      if (seq->finished) continue;
      if (prompt_index >= 0 && seq->request.prompt_logits) {
        seq->result.prompt_logits.insert(seq->result.prompt_logits.end(), logits, logits + n_vocab);
      }
      if (prompt_index < 0 || prompt_index == static_cast<int>(seq->prompt.size()) - 1) ProcessLogits(seq, logits);
    }
  }
  uint64_t generated = 0, prompt = 0;
  for (const auto& [seq, index] : owners) (index < 0 ? generated : prompt) += 1;
  absl::MutexLock lock(&mu_);
  ++stats_.steps;
  stats_.tokens_generated += generated;
  stats_.prompt_tokens += prompt;
  stats_.expert_bytes += fstats.dispatch.expert_bytes;
  stats_.expert_hits += fstats.dispatch.hits;
  stats_.expert_misses += fstats.dispatch.misses;
  return true;
}

void Engine::SchedulerLoop() {
  pthread_setname_np(pthread_self(), "strata-sched");
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || !queue_.empty() || !active_.empty(); };
      mu_.Await(absl::Condition(&ready));
      if (stopping_) break;
    }
    Step();
  }
  for (auto& seq : active_) Finish(seq.get(), FinishReason::kCancelled, absl::OkStatus());
  active_.clear();
  std::deque<std::unique_ptr<Sequence>> rest;
  {
    absl::MutexLock lock(&mu_);
    rest.swap(queue_);
  }
  for (auto& seq : rest) Finish(seq.get(), FinishReason::kCancelled, absl::OkStatus());
  pool_->RunPosted();  // every on_done has run before the destructor returns
}

}  // namespace strata::runtime
