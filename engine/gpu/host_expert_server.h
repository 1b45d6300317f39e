#ifndef STRATA_ENGINE_GPU_HOST_EXPERT_SERVER_H_
#define STRATA_ENGINE_GPU_HOST_EXPERT_SERVER_H_

// The host side of the offload tier's CPU miss path: a thread that answers the GPU's requests in a mailbox of
// mapped page-locked memory (kernels/cuda/offload_kernels.h). A decode step's graph posts, per layer, the
// pairs the host computes and their activations; this thread computes those experts from the arena with
// the CPU expert kernels (model::CpuMoeDispatch over a thread pool of its own), writes their rows into the
// mailbox and answers. No CUDA call is made on this path: the GPU polls the answer.
//
// Between Arm and Disarm (a step) the thread spins on the mailbox, polling every 50 us once 5 ms pass
// without a request; otherwise it sleeps. Owns the mailbox, the thread and the pool; the arena must outlive
// it. Arm, Disarm, TakeError and stats may be called from the scheduler thread (one at a time); the device
// views are read by the GPU.

#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "engine/exec/thread_pool.h"
#include "engine/model/cpu_moe_dispatch.h"
#include "engine/pack/expert_source.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/offload_kernels.h"
#include "kernels/format/expert_layout.h"

namespace strata::gpu {

class HostExpertServer {
 public:
  // Requests of up to max_tokens tokens of k experts each. threads: the pool's (the serving thread is one of
  // them), >= 1. `extras`: the model's expert biases and activation (model::ExpertExtrasOf; its biases must
  // outlive the server), so that the host computes its misses as the GPU computes its hits.
  static absl::StatusOr<std::unique_ptr<HostExpertServer>> Create(pack::ExpertSource* arena,
                                                                  const kernels::ExpertLayout& layout,
                                                                  int64_t n_expert, int max_tokens, int k,
                                                                  int threads, model::ExpertExtras extras);
  ~HostExpertServer();  // stops and joins the thread
  HostExpertServer(const HostExpertServer&) = delete;
  HostExpertServer& operator=(const HostExpertServer&) = delete;

  int max_tokens() const { return max_tokens_; }
  int threads() const { return threads_; }

  // The mailbox as the kernels see it (mapped: host addresses are device addresses).
  kernels::cuda::HostMailbox* mailbox() const { return mailbox_; }
  int32_t* ids() const { return ids_; }
  float* x() const { return x_; }
  float* parts() const { return parts_; }

  void Arm();
  void Disarm();

  // The first failure since the last call (a blob read, or the GPU having given up waiting), then OK.
  absl::Status TakeError();

  struct Stats {
    uint64_t requests = 0;     // layers answered
    uint64_t experts = 0;      // expert computations on the host
    uint64_t bytes = 0;        // expert weight bytes the host read
    double busy_seconds = 0;   // time spent computing
  };
  Stats stats() const;

 private:
  HostExpertServer() = default;
  void Loop();
  void Serve(int64_t request);

  pack::ExpertSource* arena_ = nullptr;
  kernels::ExpertLayout layout_;
  int64_t n_expert_ = 0;
  int max_tokens_ = 0;
  int k_ = 0;
  int threads_ = 1;
  kernels::cuda::PinnedBuffer memory_;
  kernels::cuda::HostMailbox* mailbox_ = nullptr;
  int32_t* ids_ = nullptr;
  float* x_ = nullptr;
  float* parts_ = nullptr;
  std::unique_ptr<exec::ThreadPool> pool_;
  std::unique_ptr<model::CpuMoeDispatch> dispatch_;  // used by the serving thread only
  model::RoutingCounter counter_{1};                 // serving thread only
  int64_t served_ = 0;                               // serving thread only

  mutable absl::Mutex mu_;
  bool armed_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  Stats stats_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> armed_flag_{false};  // what the spinning thread reads
  std::thread thread_;
};

}  // namespace strata::gpu

#endif  // STRATA_ENGINE_GPU_HOST_EXPERT_SERVER_H_
