#ifndef STRATA_ENGINE_MODEL_CPU_DENSE_BACKEND_H_
#define STRATA_ENGINE_MODEL_CPU_DENSE_BACKEND_H_

// The dense blocks on the CPU: weights read in place from dense.gguf, activations and KV caches in host
// memory, rows of each matrix split across the thread pool. Each block computes when called.

#include <cstdint>
#include <span>
#include <vector>

#include "engine/exec/thread_pool.h"
#include "engine/model/dense_backend.h"
#include "engine/model/model_config.h"
#include "engine/model/weights.h"

namespace strata::model {

class CpuDenseBackend : public DenseBackend {
 public:
  // `config`, `weights` and `pool` must outlive the backend; `pool` may be null.
  CpuDenseBackend(const ModelConfig& config, const ModelWeights& weights, exec::ThreadPool* pool);

  BackendInfo info() const override;
  KvMemory* kv_memory() override { return HostKvMemory(); }
  absl::Status BeginBatch(std::span<const ForwardToken> tokens) override;
  absl::Status Run(absl::FunctionRef<absl::Status()> blocks) override { return blocks(); }
  absl::Status Embed() override;
  absl::Status Attention(int64_t layer) override;
  absl::Status Router(int64_t layer, MoeBatch* moe) override;
  absl::Status Combine(int64_t layer, const MoeBatch& moe) override;
  absl::Status DenseFfn(int64_t layer) override;
  absl::Status Head() override;
  absl::Status EndBatch(float* logits) override;
  const int32_t* routing(int64_t layer) const override { return ids_.data() + layer * n_ * config_.n_expert_used; }

 private:
  // y[t] = m * x[t] for t < n, rows split across the pool.
  void Project(const DenseMatrix& m, const float* x, int n, float* y);
  void AttendAll(int64_t layer);
  // x += the FFN `f` (ff wide) of h, scaled by its sigmoid gate when it has one.
  void AddFfn(const FfnWeights& f, int64_t ff);
  void EnsureCapacity(int n);

  const ModelConfig& config_;
  const ModelWeights& weights_;
  exec::ThreadPool* pool_;
  std::vector<double> rope_frequencies_;
  float rope_magnitude_;  // YaRN's scale of cos and sin; 1 without YaRN

  std::span<const ForwardToken> tokens_;
  int n_ = 0;
  int n_out_ = 0;
  // Scratch, sized for the largest batch seen.
  int capacity_ = 0;
  std::vector<float> x_, h_, q_, k_, v_, attn_, o_, router_, weights_buf_, parts_, final_, logits_;
  std::vector<float> rope_cos_, rope_sin_;  // per batch token: its position's rotation, head_dim / 2 each
  std::vector<int32_t> ids_;                // [layer][token][k]
  std::vector<float> ffn_gate_, ffn_up_;  // n x the widest of the shared expert and the dense FFN
  std::vector<float> selection_;          // n_expert: the router scores plus the score-correction bias
};

}  // namespace strata::model

#endif  // STRATA_ENGINE_MODEL_CPU_DENSE_BACKEND_H_
