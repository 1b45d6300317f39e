#ifndef STRATA_ENGINE_GPU_CUDA_DENSE_BACKEND_H_
#define STRATA_ENGINE_GPU_CUDA_DENSE_BACKEND_H_

// The dense blocks on a CUDA device: weights, activations and KV caches in VRAM, every block enqueued on
// one stream, one host sync a step (EndBatch). A decode step (every token wants logits, at most max_batch
// tokens) is captured as a CUDA graph the first time a batch of its shape arrives (token count rounded up
// to a power of two, positions bounded by a power of two) and replayed after; the tokens' ids, positions and
// caches reach the graph through a device table uploaded before each launch. Padding tokens run on a
// private one-position cache and their results are dropped. Used by one thread at a time (the scheduler).
// Beyond the base blocks it runs q/k/v biases, the q/k norm over the whole projection (OLMoE), partial RoPE,
// the router's other gatings (kernels::cuda::RouterGate, gpt-oss's softmax over the top k with its logit bias
// included), grouped routers (DeepSeek: at most 32 groups), shared experts gated or not (in Combine), dense
// leading blocks (DenseFfn), YaRN RoPE, multi-head latent attention (kernels/cuda/latent_attention.h, the
// absorbed form for every step: cuda_latent_attention.cc), and gpt-oss's attention sinks, sliding-window
// layers (each keeping a ring of its window plus a step's positions in the KV cache, as on the CPU:
// model::KvCache, kernels::cuda::KvPlace) and attention output bias: the blocks runtime/model_factory.cc's
// CheckDeviceBlocks lists for "CUDA".

#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/dense_backend.h"
#include "engine/model/model_config.h"
#include "engine/model/weights.h"
#include "kernels/cuda/dense_kernels.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/latent_attention.h"

namespace strata::gpu {

struct DeviceMatrix {
  kernels::DenseType type = kernels::DenseType::kF32;
  int64_t rows = 0;
  int64_t cols = 0;
  const uint8_t* data = nullptr;  // device
};

// A dense SwiGLU FFN (model::FfnWeights): a shared expert or a dense leading block's FFN.
struct DeviceFfn {
  DeviceMatrix gate, up, down;       // rows == 0: none
  const float* gate_inp = nullptr;   // n_embd; the shared expert's sigmoid gate, null without one
};

// Latent attention's projections (model::LatentAttentionWeights); rows == 0 unless the model has it.
struct DeviceLatent {
  DeviceMatrix q_a, q_b, kv_a, kv_b;  // q_a rows == 0 without q LoRA (DeviceLayer::wq then)
  const float* q_a_norm = nullptr;
  const float* kv_a_norm = nullptr;
};

struct DeviceLayer {
  const float* attn_norm = nullptr;
  DeviceMatrix wq, wk, wv, wo;
  const float* bq = nullptr;  // null without q/k/v biases
  const float* bk = nullptr;
  const float* bv = nullptr;
  // Per head (head_dim floats, qk_norm) or over the whole projection (q_dim / kv_dim, qk_norm_whole); null
  // when the architecture has no q/k norm.
  const float* q_norm = nullptr;
  const float* k_norm = nullptr;
  const float* ffn_norm = nullptr;
  const float* router = nullptr;       // n_expert x n_embd, F32; null in a dense leading block
  const float* router_bias = nullptr;  // n_expert, the choice's score-correction bias; null without one
  const float* router_logit_bias = nullptr;  // n_expert, added to the router logits (gpt-oss); null without one
  const float* bo = nullptr;          // n_embd, the attention output bias (gpt-oss); null without one
  const float* attn_sinks = nullptr;  // n_head sink logits (gpt-oss); null without them
  DeviceFfn shared;                    // the shared expert
  DeviceFfn dense_ffn;                 // a dense leading block's FFN
  DeviceLatent mla;                    // latent attention (DeepSeek-V2/V3) instead of wk / wv
};

// The latent attention kernels' sizes of `config` (kv_lora_rank > 0).
kernels::cuda::LatentShape LatentShapeOf(const model::ModelConfig& config);

// Device memory, by cudaMalloc, for KV caches.
class CudaKvMemory : public model::KvMemory {
 public:
  absl::StatusOr<void*> Allocate(size_t bytes) override;
  void Free(void* data) override;
  bool host_accessible() const override { return false; }
};

struct CudaDenseOptions {
  int max_batch = 64;    // decode tokens a step
  int max_prefill = 512;  // prompt tokens a step
  // Prompt steps' F16/BF16 dense products on TF32 tensor cores (kernels::cuda::MatmulContext's split products:
  // faster, further from the CPU's results); the split workspace is reserved only then.
  bool split_tf32_prompts = false;
  // Decode steps whose tokens are each their sequence's only one norm and rotate q and k inside the decode
  // attention (kernels::cuda::QkNormRopeAttention: one kernel less a layer, the same bits); false: two kernels.
  bool fuse_qk_rope = true;
};

class CudaDenseBackend : public model::DenseBackend {
 public:
  // Uploads the weights. `config` must outlive the backend.
  static absl::StatusOr<std::unique_ptr<CudaDenseBackend>> Create(const model::ModelConfig& config,
                                                                  const model::ModelWeights& weights,
                                                                  const CudaDenseOptions& options);
  ~CudaDenseBackend() override;

  // Bytes Create will take on the device (weights and step buffers), for the VRAM check.
  static uint64_t DeviceBytes(const model::ModelConfig& config, const model::ModelWeights& weights,
                              const CudaDenseOptions& options);

  void set_graphs(bool enabled) { graphs_enabled_ = enabled; }
  // The scheduler thread sleeps until a step's results are back instead of spinning (CUDA's default while
  // cores are free), leaving every core to host threads that compute experts during the step.
  absl::Status SleepWhileWaiting();
  cudaStream_t stream() const { return stream_; }
  void add_memory_used(uint64_t bytes) { memory_used_ += bytes; }

  model::BackendInfo info() const override;
  model::KvMemory* kv_memory() override { return &kv_memory_; }
  absl::Status BeginBatch(std::span<const model::ForwardToken> tokens) override;
  absl::Status Run(absl::FunctionRef<absl::Status()> blocks) override;
  absl::Status Embed() override;
  absl::Status Attention(int64_t layer) override;
  absl::Status Router(int64_t layer, model::MoeBatch* moe) override;
  // On guess_stream_, with buffers of its own (guess_h_, guess_ids_, ...); the next Combine waits for it.
  absl::Status GuessRouting(int64_t next_layer, model::RoutingGuess* guess) override;
  absl::Status Combine(int64_t layer, const model::MoeBatch& moe) override;
  absl::Status DenseFfn(int64_t layer) override;
  absl::Status Head() override;
  absl::Status EndBatch(float* logits) override;
  const int32_t* routing(int64_t layer) const override {
    return ids_host_.as<int32_t>() + layer * n_ * config_.n_expert_used;
  }

 private:
  explicit CudaDenseBackend(const model::ModelConfig& config) : config_(config) {}
  absl::Status Upload(const model::ModelWeights& weights);
  absl::Status AllocateBuffers();
  absl::Status EnsureAttentionWorkspace(int max_positions);
  // Attention for latent-attention models (cuda_latent_attention.cc).
  absl::Status AttendLatent(int64_t layer);
  kernels::cuda::RouterGate GateOf(const DeviceLayer& layer) const;
  // x += Ffn(h) of `ffn` (ff wide) for the batch's tokens, through ffn_gate_ and ffn_up_.
  absl::Status AddFfn(const DeviceFfn& ffn, int64_t ff);
  void DropGraphs();

  const model::ModelConfig& config_;
  std::vector<kernels::cuda::KvPlace> places_;  // per layer, where it sits in a cache
  int64_t first_windowed_ = -1;                  // a sliding-window layer (all keep rings of one length), or -1
  int max_tokens_ = 0;  // max(max_batch, max_prefill)
  int max_batch_ = 0;
  bool fuse_qk_rope_ = true;  // CudaDenseOptions::fuse_qk_rope
  cudaStream_t stream_ = nullptr;
  cudaEvent_t step_done_ = nullptr;  // with SleepWhileWaiting: a blocking-sync event the step end waits on
  std::unique_ptr<kernels::cuda::MatmulContext> matmul_;
  CudaKvMemory kv_memory_;
  uint64_t memory_used_ = 0;

  kernels::cuda::DeviceBuffer weights_buf_;
  std::vector<DeviceLayer> layers_;
  DeviceMatrix embedding_, output_;
  const float* output_norm_ = nullptr;
  kernels::cuda::DeviceBuffer freq_;  // rope_dim / 2 doubles (YaRN-scaled with rope_yarn)
  float rope_magnitude_ = 1.0f;       // YaRN's cos and sin factor (model::YarnMagnitude); 1 without YaRN

  // Step buffers, max_tokens_ rows each.
  kernels::cuda::DeviceBuffer x_, h_, q_, k_, v_, attn_, parts_, weights_, ids_, logits_, final_;
  // The dense FFNs' gate and up products (max(shared_expert_ff, dense_ff) a row); empty without such FFNs.
  kernels::cuda::DeviceBuffer ffn_gate_, ffn_up_;
  // Latent attention's: q LoRA rows (q_lora_rank a row), the queries carried into the latent space (n_head x
  // (rank + rope) a row) and the heads' latent sums (n_head x rank); empty without latent attention. Its
  // attn_kv_a_mqa rows (rank + rope) go in k_.
  kernels::cuda::DeviceBuffer q_lora_, q_latent_, latent_;
  kernels::cuda::DeviceBuffer slots_, router_ws_, attention_ws_;
  // Routing guesses (GuessRouting): a side stream forked from stream_ (fork_) and joined by the next Combine
  // (guessed_), its normed rows, ids, weights and router workspace.
  cudaStream_t guess_stream_ = nullptr;
  cudaEvent_t fork_ = nullptr, guessed_ = nullptr;
  bool guess_pending_ = false;
  kernels::cuda::DeviceBuffer guess_h_, guess_ids_, guess_weights_, guess_router_ws_;
  kernels::cuda::PinnedBuffer slots_host_, logits_host_, ids_host_;
  int attention_positions_ = 0;  // what attention_ws_ is sized for
  // A one-position cache for padding tokens.
  kernels::cuda::DeviceBuffer pad_cache_;

  // The current batch.
  int n_ = 0;            // tokens computed (padded in graph mode)
  int n_real_ = 0;       // tokens given
  int max_positions_ = 0;
  std::vector<int> wanted_;  // indices of tokens with want_logits
  bool graph_step_ = false;
  bool one_token_each_ = false;  // no two tokens of the step share a cache (QkNormRopeAttention's one_token_each)

  bool graphs_enabled_ = true;
  // (tokens, positions bound, one token a sequence) -> graph
  std::map<std::tuple<int, int, bool>, cudaGraphExec_t> graphs_;
};

}  // namespace strata::gpu

#endif  // STRATA_ENGINE_GPU_CUDA_DENSE_BACKEND_H_
