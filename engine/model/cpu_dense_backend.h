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

// How latent attention (ModelConfig::mla) attends; both forms compute the same values. kNaive rebuilds each
// head's keys and values from the cached latents (once per sequence and batch: cheap per token of a long
// prompt); kAbsorbed folds W_UK into the query and W_UV after the weighted sum, reading the latents as they
// are (cheap for one token). kAuto: naive for a sequence with several tokens in the batch, absorbed otherwise.
enum class LatentForm : uint8_t { kAuto, kNaive, kAbsorbed };

class CpuDenseBackend : public DenseBackend {
 public:
  // `config`, `weights` and `pool` must outlive the backend; `pool` may be null.
  CpuDenseBackend(const ModelConfig& config, const ModelWeights& weights, exec::ThreadPool* pool,
                  LatentForm latent_form = LatentForm::kAuto);

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
  // Attention(layer) for latent attention (cpu_latent_attention.cc).
  absl::Status AttendLatent(int64_t layer);
  // The naive form's keys and values of the caches that use it: rebuilt_[i] = [pos][n_head][nope + v].
  void RebuildLatentKeys(int64_t layer);
  // x += the FFN `f` (ff wide) of h, scaled by its sigmoid gate when it has one.
  void AddFfn(const FfnWeights& f, int64_t ff);
  void EnsureCapacity(int n);

  const ModelConfig& config_;
  const ModelWeights& weights_;
  exec::ThreadPool* pool_;
  LatentForm latent_form_;
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
  std::vector<float> q_lora_;             // n x q_lora_rank (latent attention's q LoRA)
  std::vector<int> rebuilt_index_;        // per batch token: its rebuilt_ entry, -1 for the absorbed form
  std::vector<std::vector<float>> rebuilt_;
};

}  // namespace strata::model

#endif  // STRATA_ENGINE_MODEL_CPU_DENSE_BACKEND_H_
