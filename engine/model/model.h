#ifndef STRATA_ENGINE_MODEL_MODEL_H_
#define STRATA_ENGINE_MODEL_MODEL_H_

// A MoE transformer ready to run: configuration, dense weights, a dense backend and a MoE dispatch.
//
// Forward runs a batch of tokens, from any number of sequences, through every layer together: each dense
// matrix is read once for the batch and each routed expert is computed once for all tokens routed to it.
// One token's path reads top to bottom in Forward: embed, per layer {attention, router, MoE dispatch,
// combine}, head; each block is a call on the backend (CPU or CUDA) or the dispatch. Forward is called by
// one thread at a time (the scheduler).
//
// Built in two steps: Create reads the configuration and weights from a pack; the factory in
// engine/runtime/model_factory.h then attaches the backend and dispatch for the chosen device.

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/dense_backend.h"
#include "engine/model/model_config.h"
#include "engine/model/moe_dispatch.h"
#include "engine/model/weights.h"
#include "engine/pack/pack.h"

namespace strata::model {

struct ForwardStats {
  DispatchStats dispatch;
  uint64_t dense_bytes = 0;  // dense weight bytes read
};

class Model {
 public:
  // Reads the configuration and dense weights. `pack` must outlive the model. Geometry mismatches between
  // the pack's manifest and dense.gguf are refused with both numbers.
  static absl::StatusOr<std::unique_ptr<Model>> Create(const pack::Pack& pack);

  // Gives the model its backend and dispatch, built for this model's config and weights.
  void Attach(std::unique_ptr<DenseBackend> backend, std::unique_ptr<MoeDispatch> dispatch);

  const ModelConfig& config() const { return config_; }
  const ModelWeights& weights() const { return *weights_; }
  DenseBackend& backend() const { return *backend_; }
  const MoeDispatch& dispatch() const { return *dispatch_; }

  // Writes the logits of each token with want_logits, in order, to logits[i * n_vocab ...]. On error
  // nothing written to `logits` may be used; the caches of the batch's sequences hold garbage for the
  // positions of this batch.
  absl::Status Forward(std::span<const ForwardToken> tokens, float* logits, ForwardStats* stats);

  // Checks a batch without running it (token ids, positions, caches); Forward calls it too.
  absl::Status CheckBatch(std::span<const ForwardToken> tokens) const;

 private:
  Model() = default;
  absl::Status Blocks();

  ModelConfig config_;
  std::unique_ptr<ModelWeights> weights_;
  std::unique_ptr<DenseBackend> backend_;
  std::unique_ptr<MoeDispatch> dispatch_;
  static constexpr uint32_t kDenseBlock = ~uint32_t{0};
  std::vector<uint32_t> moe_index_;  // block -> moe layer index, kDenseBlock for a dense leading block
  std::vector<const int32_t*> routing_;  // per moe layer: the last step's ids on the host
};

}  // namespace strata::model

#endif  // STRATA_ENGINE_MODEL_MODEL_H_
