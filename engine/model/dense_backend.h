#ifndef STRATA_ENGINE_MODEL_DENSE_BACKEND_H_
#define STRATA_ENGINE_MODEL_DENSE_BACKEND_H_

// The dense (non-expert) blocks of a forward pass on one device: embedding, attention, router, combine and
// the head, over activations the backend keeps in its own memory. Model::Forward calls them in order:
//
//   BeginBatch(tokens)
//   Run([] { Embed(); for each layer { Attention(l); Router(l, &moe); [GuessRouting(l + 1, &guess);
//            dispatch.Prefetch(guess);] dispatch.Run(moe); Combine(l, moe); } Head(); })
//   (a dense leading block: Attention(l); DenseFfn(l); the guess only when the dispatch wants it and block
//   l + 1 is a MoE block)
//   EndBatch(logits)
//
// CpuDenseBackend (today's CPU code) computes each block when called. CudaDenseBackend (engine/gpu)
// enqueues them on its stream and may capture the function given to Run as a CUDA graph, once per batch
// shape, and replay it for later batches of that shape, so the blocks must not make host decisions that
// depend on token values or positions. A backend is used by one thread at a time (the scheduler).

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/model/kv_cache.h"
#include "engine/model/moe_dispatch.h"

namespace strata::model {

struct ForwardToken {
  int32_t token = 0;
  int64_t pos = 0;            // position in its sequence
  KvCache* cache = nullptr;   // its sequence's cache (in the backend's KV memory); capacity > pos
  bool want_logits = false;
};

// What the device reports about itself, for logs and GetModelInfo.
struct BackendInfo {
  std::string device;       // "cpu" or "cuda"
  std::string name;         // CPU kernel path or GPU model
  std::string isa;          // the kernels' instruction set: "avx512", "sm_90", ...
  uint64_t memory_used = 0;   // device memory held (weights, experts, workspace; KV caches counted apart)
  uint64_t memory_total = 0;  // device memory (0 for the CPU)
};

class DenseBackend {
 public:
  virtual ~DenseBackend() = default;

  virtual BackendInfo info() const = 0;
  // Where the KV caches of sequences must live.
  virtual KvMemory* kv_memory() = 0;

  // Starts a batch. The tokens (checked by Model) and their caches stay valid until EndBatch.
  virtual absl::Status BeginBatch(std::span<const ForwardToken> tokens) = 0;
  // Runs `blocks` (the blocks of the batch in order). The CUDA backend may instead replay what an earlier
  // call captured for a batch of the same shape.
  virtual absl::Status Run(absl::FunctionRef<absl::Status()> blocks) = 0;
  // x = the tokens' embeddings.
  virtual absl::Status Embed() = 0;
  // x += attention(RmsNorm(x)) of `layer`, storing the batch's keys and values in the caches.
  virtual absl::Status Attention(int64_t layer) = 0;
  // h = RmsNorm(x) for the MoE input, the router's top-k ids and weights; fills `moe` with views of h, the
  // ids and the parts buffer on this backend's side.
  virtual absl::Status Router(int64_t layer, MoeBatch* moe) = 0;
  // A guess at the routing of MoE block next_layer, called after Router of the block before it
  // (RoutingGuess): that block's FFN norm and router over x as it is now (after this block's attention),
  // enqueued on a side stream whose work the step's blocks do not wait for, except that the next Combine
  // waits for its reads of x. Fills `guess` but for moe_layer. Backends without a side stream refuse (Model asks only for dispatches that want it).
  virtual absl::Status GuessRouting(int64_t next_layer, RoutingGuess* guess) {
    return absl::UnimplementedError(absl::StrCat("the ", info().device, " backend does not guess routing"));
  }
  // x += sum_j weight[t][j] * parts[t][j], plus the layer's shared expert of h where the model has one.
  virtual absl::Status Combine(int64_t layer, const MoeBatch& moe) = 0;
  // x += Ffn(RmsNorm(x)) of a dense leading block (no router, no experts); Model calls it instead of
  // Router/dispatch/Combine for blocks below ModelConfig::n_dense_lead. Backends without the block refuse.
  virtual absl::Status DenseFfn(int64_t layer) {
    return absl::UnimplementedError(absl::StrCat("the ", info().device, " backend has no dense FFN block"));
  }
  // The final norm and output matrix for the tokens with want_logits.
  virtual absl::Status Head() = 0;
  // Copies the logits of the tokens with want_logits, in order, to logits[i * n_vocab ...], and waits for the
  // batch to finish. routing(layer) then gives each layer's ids (n_tokens x k) on the host.
  virtual absl::Status EndBatch(float* logits) = 0;
  virtual const int32_t* routing(int64_t layer) const = 0;
};

}  // namespace strata::model

#endif  // STRATA_ENGINE_MODEL_DENSE_BACKEND_H_
