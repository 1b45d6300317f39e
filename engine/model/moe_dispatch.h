#ifndef STRATA_ENGINE_MODEL_MOE_DISPATCH_H_
#define STRATA_ENGINE_MODEL_MOE_DISPATCH_H_

// The dispatch step of a MoE layer: given the layer's normed activations and the router's expert ids per
// token, it fills parts[t][j][n_embd] with expert ids[t][j]'s output for token t, at the router's index j.
// It does not apply the router weights (combine does, once). Each routed expert is computed once for all
// the tokens routed to it.
//
// Implementations: CpuMoeDispatch (every expert on the CPU from an ExpertSource) and, in CUDA builds,
// GpuMoeDispatch (every expert resident in VRAM, one grouped launch a layer). The offload tier adds one
// that splits a layer between VRAM hits, CPU misses and PCIe. Run is called by one thread at a time (the
// scheduler, inside Model::Forward).

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace strata::model {

struct DispatchStats {
  uint64_t expert_computations = 0;  // unique (layer, expert) pairs computed
  uint64_t routed = 0;               // (token, slot) pairs
  uint64_t expert_bytes = 0;         // weight bytes streamed
  uint64_t hits = 0;                 // routed pairs whose expert was resident in VRAM
  uint64_t misses = 0;               // routed pairs computed from host memory (CPU or over PCIe)
};

// One layer's work, with the views of whichever memory the dense backend keeps it in: host views for the
// CPU backend, device views (and the CUDA stream) for the CUDA backend; the views of the other side are null.
// x: n_tokens x n_embd; ids: n_tokens x k; parts: n_tokens x k x n_embd (overwritten). A pair whose id is
// -1 is computed elsewhere (the offload tier splits a layer between the GPU and the host): its parts row is
// left as it is.
struct MoeBatch {
  int64_t moe_layer = 0;
  int n_tokens = 0;
  int k = 0;
  const float* x = nullptr;
  const int32_t* ids = nullptr;
  float* parts = nullptr;
  const float* x_device = nullptr;
  const int32_t* ids_device = nullptr;
  float* parts_device = nullptr;
  void* stream = nullptr;  // cudaStream_t of the device views
};

// A guess at a MoE layer's routing made one layer early: that layer's router over the residual stream as the
// layer before it leaves its attention (DenseBackend::GuessRouting), for a dispatch that copies the likely
// misses ahead (Prefetch). ids: n_tokens x k in descending order of score, on the device, final once the
// work enqueued so far on `stream` (a side stream of the backend, not the step's) has run.
struct RoutingGuess {
  int64_t moe_layer = 0;  // the layer guessed
  int n_tokens = 0;
  int k = 0;
  const int32_t* ids_device = nullptr;
  void* stream = nullptr;  // cudaStream_t
};

// What a VRAM expert cache has done so far (all zero without one).
struct CacheReport {
  int64_t slots = 0;
  std::string policy;
  uint64_t admissions = 0;
  uint64_t evictions = 0;
  uint64_t pcie_bytes = 0;  // misses read in place or streamed, plus fills
  double host_share = 0;    // the share of a decode step's misses computed by host threads now
  uint64_t host_experts = 0;  // expert computations done by host threads so far
  uint64_t host_requests = 0;  // layers whose share the host computed
  double host_busy_seconds = 0;  // the host's time computing them
  // Guesses of a layer's routing made one layer early (RoutingGuess): the missed experts they named (at most
  // the prefetch limit a layer), how many of those the layer then routed, and of them the experts copied
  // into VRAM ahead (when the guesses were right often enough to pay) and the copies used.
  uint64_t guessed = 0;
  uint64_t guessed_right = 0;
  uint64_t prefetched = 0;
  uint64_t prefetch_used = 0;
  // Of host_requests, the layers in which the GPU had finished its own part (the hits and its share of the
  // misses) before the host answered and waited for it: evidence that the two ran at the same time.
  uint64_t gpu_waited_for_host = 0;
};

class MoeDispatch {
 public:
  virtual ~MoeDispatch() = default;

  // "cpu" or "cuda": which views Run reads (host or device).
  virtual std::string_view device() const = 0;
  // Whether Run only enqueues work on the batch's stream (no host sync, no host reads of device data), so
  // that a CUDA graph of the whole step may hold it.
  virtual bool capturable() const { return false; }

  // Fills the batch's parts. Host views: computed when Run returns. Device views: enqueued on the stream.
  // On error nothing in parts may be used.
  virtual absl::Status Run(const MoeBatch& batch) = 0;

  // Whether a step computing n_tokens tokens (MoeBatch::n_tokens, padding included) wants a RoutingGuess for
  // each MoE layer that follows a MoE layer. Fixed for a given n_tokens over the dispatch's life (a captured
  // step graph holds the guesses or not).
  virtual bool WantsRoutingGuess(int n_tokens) const { return false; }
  // Enqueues work on guess.stream that makes guess.moe_layer's Run faster if the guess was right; Run of that
  // layer follows in the same step (after Run of the layer before it). Results never depend on the guess.
  virtual absl::Status Prefetch(const RoutingGuess& guess) { return absl::OkStatus(); }

  // Adds what a layer's routing cost to `stats` (unique experts, routed pairs, bytes, hits and misses),
  // from the ids on the host once the step is done.
  virtual void Account(int64_t moe_layer, const int32_t* ids, int n_tokens, int k, DispatchStats* stats) const = 0;

  // Called before a step's blocks are run or enqueued (outside any graph capture), and after the step has
  // finished and been accounted for: a caching dispatch publishes finished fills and plans the next ones.
  virtual absl::Status BeforeStep() { return absl::OkStatus(); }
  // May be called from any thread.
  virtual CacheReport cache() const { return {}; }
  // Returns an error when the step's results must not be used (a share of a layer computed elsewhere
  // failed or never arrived).
  virtual absl::Status AfterStep(int64_t n_moe_layers, const int32_t* const* ids, int n_tokens, int k) {
    return absl::OkStatus();
  }
};

}  // namespace strata::model

#endif  // STRATA_ENGINE_MODEL_MOE_DISPATCH_H_
