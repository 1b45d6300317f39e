#ifndef STRATA_ENGINE_MODEL_MODEL_H_
#define STRATA_ENGINE_MODEL_MODEL_H_

// A MoE transformer ready to run: configuration, dense weights and the MoE dispatch.
//
// Forward runs a batch of tokens, from any number of sequences, through every layer together: each dense
// matrix is read once for the batch and each routed expert is computed once for all tokens routed to it.
// Forward is called by one thread at a time (the scheduler); it uses the thread pool it was given.

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/model_config.h"
#include "engine/model/moe_dispatch.h"
#include "engine/model/weights.h"
#include "engine/pack/pack.h"
#include "engine/runtime/kv_cache.h"
#include "kernels/cpu/thread_pool.h"

namespace strata::model {

struct ForwardToken {
  int32_t token = 0;
  int64_t pos = 0;                       // position in its sequence
  runtime::KvCache* cache = nullptr;     // its sequence's cache; capacity > pos
  bool want_logits = false;
};

struct ForwardStats {
  DispatchStats dispatch;
  uint64_t dense_bytes = 0;  // dense weight bytes read
};

class Model {
 public:
  // `pack` and `pool` must outlive the model. Geometry mismatches between the pack's manifest and
  // dense.gguf are refused with both numbers.
  static absl::StatusOr<std::unique_ptr<Model>> Create(const pack::Pack& pack, std::unique_ptr<MoeDispatch> dispatch,
                                                       kernels::ThreadPool* pool);

  const ModelConfig& config() const { return config_; }
  const ModelWeights& weights() const { return *weights_; }

  // Writes the logits of each token with want_logits, in order, to logits[i * n_vocab ...]. On error
  // nothing written to `logits` may be used; the caches of the batch's sequences hold garbage for the
  // positions of this batch.
  absl::Status Forward(std::span<const ForwardToken> tokens, float* logits, ForwardStats* stats);

  // Checks a batch without running it (token ids, positions, caches); Forward calls it too.
  absl::Status CheckBatch(std::span<const ForwardToken> tokens) const;

 private:
  Model() = default;
  // y[t] = m * x[t] for t < n, rows split across the pool.
  void Project(const DenseMatrix& m, const float* x, int n, float* y, ForwardStats* stats);
  void Attention(int64_t layer, std::span<const ForwardToken> tokens);
  void EnsureCapacity(int n);

  ModelConfig config_;
  std::unique_ptr<ModelWeights> weights_;
  std::unique_ptr<MoeDispatch> dispatch_;
  kernels::ThreadPool* pool_ = nullptr;
  std::vector<uint32_t> moe_index_;  // block -> moe layer index
  std::vector<double> rope_frequencies_;  // RopeFrequencies of the config

  // Scratch, sized for the largest batch seen.
  int capacity_ = 0;
  std::vector<float> x_, h_, q_, k_, v_, attn_, o_, router_, weights_buf_, parts_, final_;
  std::vector<float> rope_cos_, rope_sin_;  // per batch token: its position's rotation, head_dim / 2 each
  std::vector<int32_t> ids_;
};

}  // namespace strata::model

#endif  // STRATA_ENGINE_MODEL_MODEL_H_
