#include "engine/gpu/host_expert_server.h"

#include <atomic>
#include <chrono>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/status_macros.h"

namespace strata::gpu {
namespace {

// Pool workers keep spinning this long after a layer's work, so the next layer's (about 100 us later in a
// decode step) finds them awake.
constexpr int kPoolSpinMicros = 2000;
// Armed, the serving thread spins this long after its last request, then polls every kIdlePoll.
constexpr std::chrono::milliseconds kSpinBeforeSleeping{5};
constexpr std::chrono::microseconds kIdlePoll{50};

}  // namespace

absl::StatusOr<std::unique_ptr<HostExpertServer>> HostExpertServer::Create(pack::ExpertSource* arena,
                                                                           const kernels::ExpertLayout& layout,
                                                                           int64_t n_expert, int max_tokens, int k,
                                                                           int threads, model::ExpertExtras extras) {
  if (arena == nullptr || max_tokens < 1 || k < 1 || threads < 1) {
    return absl::InvalidArgumentError(absl::StrCat("HostExpertServer: needs an arena, max_tokens ", max_tokens,
                                                   " >= 1, k ", k, " >= 1 and threads ", threads, " >= 1"));
  }
  std::unique_ptr<HostExpertServer> s(new HostExpertServer());
  s->arena_ = arena;
  s->layout_ = layout;
  s->n_expert_ = n_expert;
  s->max_tokens_ = max_tokens;
  s->k_ = k;
  s->threads_ = threads;
  const size_t pairs = static_cast<size_t>(max_tokens) * k;
  const size_t n_embd = static_cast<size_t>(layout.n_embd);
  const size_t header = 256;  // keeps the arrays 16-byte aligned
  const size_t ids_bytes = (pairs * sizeof(int32_t) + 255) / 256 * 256;
  const size_t x_bytes = static_cast<size_t>(max_tokens) * n_embd * sizeof(float);
  ASSIGN_OR_RETURN(s->memory_,
                   kernels::cuda::PinnedBuffer::Allocate(header + ids_bytes + x_bytes + pairs * n_embd * sizeof(float)));
  uint8_t* base = s->memory_.as<uint8_t>();
  std::fill(base, base + header, uint8_t{0});
  s->mailbox_ = reinterpret_cast<kernels::cuda::HostMailbox*>(base);
  s->ids_ = reinterpret_cast<int32_t*>(base + header);
  s->x_ = reinterpret_cast<float*>(base + header + ids_bytes);
  s->parts_ = reinterpret_cast<float*>(base + header + ids_bytes + x_bytes);
  ASSIGN_OR_RETURN(s->pool_, exec::ThreadPool::Create(threads, kPoolSpinMicros));
  s->dispatch_ =
      std::make_unique<model::CpuMoeDispatch>(arena, layout, n_expert, s->pool_.get(), std::move(extras));
  s->counter_ = model::RoutingCounter(n_expert);
  s->thread_ = std::thread([p = s.get()] { p->Loop(); });
  return s;
}

HostExpertServer::~HostExpertServer() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    armed_ = false;
  }
  armed_flag_.store(false);
  if (thread_.joinable()) thread_.join();
}

void HostExpertServer::Arm() {
  absl::MutexLock lock(&mu_);
  armed_ = true;
  armed_flag_.store(true, std::memory_order_release);
}

void HostExpertServer::Disarm() {
  absl::MutexLock lock(&mu_);
  armed_ = false;
  armed_flag_.store(false, std::memory_order_release);
}

absl::Status HostExpertServer::TakeError() {
  absl::MutexLock lock(&mu_);
  if (mailbox_->timed_out != 0 && error_.ok()) {
    error_ = absl::DeadlineExceededError(
        "the GPU gave up waiting for the host's share of a layer's experts (the host threads did not answer)");
  }
  absl::Status e = error_;
  error_ = absl::OkStatus();
  // A late answer has come in by now or never will; the next step may wait again.
  if (mailbox_->done >= mailbox_->request) mailbox_->timed_out = 0;
  return e;
}

HostExpertServer::Stats HostExpertServer::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

void HostExpertServer::Loop() {
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](HostExpertServer* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu_) { return s->armed_ || s->stopping_; }, this));
      if (stopping_) return;
    }
    auto last_work = std::chrono::steady_clock::now();
    while (armed_flag_.load(std::memory_order_acquire)) {
      const int64_t request = mailbox_->request;
      if (request > served_) {
        std::atomic_thread_fence(std::memory_order_acquire);  // the request's fields after its number
        Serve(request);
        last_work = std::chrono::steady_clock::now();
      } else if (std::chrono::steady_clock::now() - last_work < kSpinBeforeSleeping) {
        exec::CpuRelax();
      } else {
        // A step with no share for the host (a long prompt's, or one that failed before Disarm): poll gently.
        std::this_thread::sleep_for(kIdlePoll);
      }
    }
  }
}

void HostExpertServer::Serve(int64_t request) {
  const int n_tokens = mailbox_->n_tokens, k = mailbox_->k;
  const int64_t moe_layer = mailbox_->moe_layer;
  absl::Status status;
  uint64_t experts = 0;
  const auto start = std::chrono::steady_clock::now();
  if (n_tokens < 1 || n_tokens > max_tokens_ || k != k_) {
    status = absl::InternalError(absl::StrCat("the GPU posted ", n_tokens, " tokens of ", k, " experts; the mailbox holds ",
                                              max_tokens_, " of ", k_));
  } else {
    model::MoeBatch batch;
    batch.moe_layer = moe_layer;
    batch.n_tokens = n_tokens;
    batch.k = k;
    batch.x = x_;
    batch.ids = ids_;
    batch.parts = parts_;
    status = dispatch_->Run(batch);
    experts = counter_.Distinct(ids_, n_tokens * k);
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // The rows before the answer; answered even on failure, so the GPU never waits for a request in vain.
  std::atomic_thread_fence(std::memory_order_release);
  mailbox_->done = request;
  served_ = request;
  absl::MutexLock lock(&mu_);
  if (!status.ok() && error_.ok()) {
    error_ = absl::Status(status.code(),
                          absl::StrCat("the host's share of moe layer ", moe_layer, ": ", status.message()));
  }
  stats_.requests += 1;
  stats_.experts += experts;
  stats_.bytes += experts * layout_.weight_bytes();
  stats_.busy_seconds += seconds;
}

}  // namespace strata::gpu
