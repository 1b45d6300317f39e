#include "engine/gpu/cuda_dense_backend.h"

#include <algorithm>
#include <bit>
#include <cstring>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "engine/gguf/ggml_types.h"
#include "engine/model/ops.h"
#include "engine/status_macros.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/latent_attention.h"

namespace strata::gpu {
namespace {

using kernels::cuda::CudaStatus;
using kernels::cuda::DeviceBuffer;
using kernels::cuda::PinnedBuffer;
using kernels::cuda::TokenSlot;

constexpr uint64_t kAlign = 256;
// Batches of at most this many tokens (one router token block) get the FFN norm fused with the router.
constexpr int kFusedNormTokens = 8;
uint64_t AlignUp(uint64_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

// Positions a graph's attention grid covers: the next power of two, at least 256.
int PositionsBound(int64_t max_pos_plus_one) {
  return static_cast<int>(std::max<uint64_t>(256, std::bit_ceil(static_cast<uint64_t>(max_pos_plus_one))));
}

// Rows of a routing guess: a decode step's tokens, which a graph pads to a power of two (within the buffers).
int GuessRows(int max_batch, int max_tokens) {
  return std::min(max_tokens, static_cast<int>(std::bit_ceil(static_cast<unsigned>(std::max(1, max_batch)))));
}

// The widening workspace's weights: the largest dense matrix, up to 64 Mi weights (larger ones go in row
// blocks).
int64_t WideningElements(const model::ModelWeights& weights) {
  int64_t largest = weights.output.rows * weights.output.cols;
  for (const model::LayerWeights& L : weights.layers) {
    for (const model::DenseMatrix* m : {&L.wq, &L.wk, &L.wv, &L.wo, &L.shared.gate, &L.shared.up, &L.shared.down,
                                        &L.dense_ffn.gate, &L.dense_ffn.up, &L.dense_ffn.down, &L.mla.q_a, &L.mla.q_b,
                                        &L.mla.kv_a}) {
      largest = std::max(largest, m->rows * m->cols);
    }
  }
  return std::min<int64_t>(largest, 64 << 20);
}

// Activation elements of the widest dense product of a prompt step of `max_tokens` (the matmul context's split
// workspace); 0 without split TF32 prompts or when no step is larger than the GEMV's.
int64_t SplitElements(const model::ModelConfig& c, int max_tokens, bool split_tf32_prompts) {
  if (!split_tf32_prompts || max_tokens <= kernels::cuda::kMaxGemvTokens) return 0;
  const int64_t widest = std::max({c.n_embd, c.n_head * c.head_dim, c.shared_expert_ff, c.dense_ff});
  return int64_t{max_tokens} * widest;
}

// Floats a token of a step takes in the attention's buffers.
struct AttentionRows {
  uint64_t q = 0, k = 0, v = 0, attn = 0;  // q_, k_, v_, attn_
  uint64_t q_lora = 0, q_latent = 0, latent = 0;  // latent attention's buffers
  uint64_t total() const { return q + k + v + attn + q_lora + q_latent + latent; }
};

AttentionRows AttentionRowsOf(const model::ModelConfig& c) {
  const model::KvLayout kv = model::CacheLayout(c);
  AttentionRows r;
  r.q = c.n_head * c.head_dim;
  r.k = kv.key_dim;  // latent attention: attn_kv_a_mqa's rows, rank + rope
  r.v = kv.value_dim;
  r.attn = std::max<uint64_t>(r.q, c.n_head * c.mla.v_dim);
  if (c.mla.kv_lora_rank > 0) {
    r.q_lora = c.mla.q_lora_rank;
    r.q_latent = c.n_head * kv.key_dim;
    r.latent = c.n_head * c.mla.kv_lora_rank;
  }
  return r;
}

// The attention kernels' workspace for steps of up to n_tokens tokens and `positions` positions.
size_t AttentionWorkspace(const model::ModelConfig& c, int n_tokens, int positions) {
  if (c.mla.kv_lora_rank > 0) {
    return kernels::cuda::LatentAttentionWorkspaceBytes(n_tokens, LatentShapeOf(c), positions);
  }
  return kernels::cuda::AttentionWorkspaceBytes(n_tokens, static_cast<int>(c.n_head), static_cast<int>(c.n_head_kv),
                                                static_cast<int>(c.head_dim), positions);
}

// The host bytes of the weights in upload order; each entry is copied to an aligned offset.
struct UploadItem {
  const void* host;
  uint64_t bytes;
  const void** device_out;
};

}  // namespace

absl::StatusOr<void*> CudaKvMemory::Allocate(size_t bytes) {
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, bytes);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return CudaStatus(e, absl::StrCat("KV cache: cudaMalloc of ", bytes, " bytes"));
  }
  return p;
}

void CudaKvMemory::Free(void* data) { cudaFree(data); }

uint64_t CudaDenseBackend::DeviceBytes(const model::ModelConfig& c, const model::ModelWeights& w,
                                       const CudaDenseOptions& options) {
  const int max_batch = options.max_batch, max_prefill = options.max_prefill;
  uint64_t bytes = 0;
  auto floats = [](const std::vector<float>& v) { return AlignUp(v.size() * sizeof(float)); };
  auto ffn = [&](const model::FfnWeights& f) {
    return AlignUp(f.gate.bytes()) + AlignUp(f.up.bytes()) + AlignUp(f.down.bytes()) + floats(f.gate_inp);
  };
  auto latent = [&](const model::LatentAttentionWeights& m) {
    return AlignUp(m.q_a.bytes()) + AlignUp(m.q_b.bytes()) + AlignUp(m.kv_a.bytes()) + AlignUp(m.kv_b.bytes()) +
           floats(m.q_a_norm) + floats(m.kv_a_norm);
  };
  for (const model::LayerWeights& L : w.layers) {
    bytes += AlignUp(L.wq.bytes()) + AlignUp(L.wk.bytes()) + AlignUp(L.wv.bytes()) + AlignUp(L.wo.bytes()) +
             AlignUp(L.router.bytes()) + 4 * AlignUp(c.n_embd * 4) + floats(L.q_norm) + floats(L.k_norm) +
             floats(L.bq) + floats(L.bk) + floats(L.bv) + floats(L.router_bias) + floats(L.router_logit_bias) +
             floats(L.bo) + floats(L.attn_sinks) + ffn(L.shared) + ffn(L.dense_ffn) + latent(L.mla);
  }
  bytes += AlignUp(w.output.bytes()) + AlignUp(c.n_embd * 4);
  bytes += static_cast<uint64_t>(c.n_vocab) * c.n_embd * 4;  // the embedding, at most widened to F32
  const uint64_t n = static_cast<uint64_t>(std::max(max_batch, max_prefill));
  bytes += n * 4 * (4 * c.n_embd + AttentionRowsOf(c).total() + c.n_expert_used * (c.n_embd + 2) + c.n_vocab);
  bytes += n * 4 * c.n_layer * c.n_expert_used;
  bytes += n * 4 * 2 * static_cast<uint64_t>(std::max(c.shared_expert_ff, c.dense_ff));  // ffn_gate_, ffn_up_
  // The routing guesses' buffers (decode steps), and both routers' workspaces.
  const int guess_rows = GuessRows(std::max(1, max_batch), static_cast<int>(n));
  bytes += static_cast<uint64_t>(guess_rows) * 4 * (c.n_embd + 2 * c.n_expert_used);
  bytes += kernels::cuda::RouterWorkspaceBytes(static_cast<int>(n), static_cast<int>(c.n_expert)) +
           kernels::cuda::RouterWorkspaceBytes(guess_rows, static_cast<int>(c.n_expert));
  // The matmul context's workspaces and the attention workspace as first sized (it grows with the context).
  bytes += kernels::cuda::MatmulContext::DeviceBytes(
      WideningElements(w), SplitElements(c, static_cast<int>(n), options.split_tf32_prompts));
  bytes += AttentionWorkspace(c, static_cast<int>(n), PositionsBound(1));
  return bytes;
}

absl::StatusOr<std::unique_ptr<CudaDenseBackend>> CudaDenseBackend::Create(const model::ModelConfig& config,
                                                                           const model::ModelWeights& weights,
                                                                           const CudaDenseOptions& options) {
  if (config.mla.kv_lora_rank > 0) {
    for (const model::LayerWeights& layer : weights.layers) {
      if (absl::Status s = kernels::cuda::CheckLatentShape(LatentShapeOf(config), layer.mla.kv_b.type); !s.ok()) {
        return absl::UnimplementedError(absl::StrCat(
            "the CUDA latent attention kernels do not take this model's sizes (", s.message(), "): use --device cpu"));
      }
    }
  } else if (config.head_dim != 32 && config.head_dim != 64 && config.head_dim != 128) {
    return absl::UnimplementedError(absl::StrCat(
        "the CUDA attention kernels take head_dim 32, 64 or 128; this model's is ", config.head_dim,
        ": use --device cpu"));
  }
  if (config.n_expert_group > 32 && config.n_group_used < config.n_expert_group) {
    return absl::UnimplementedError(absl::StrCat("the CUDA router ranks at most 32 expert groups; this model has ",
                                                 config.n_expert_group, ": use --device cpu"));
  }
  std::unique_ptr<CudaDenseBackend> b(new CudaDenseBackend(config));
  // Where each layer sits in a cache: windowed layers (gpt-oss's) keep rings (model::KvCache), counted apart,
  // all of one length (TokenSlot::ring_slots), which takes one window for all of them.
  int64_t full = 0, rings = 0;
  for (int64_t l = 0; l < config.n_layer; ++l) {
    const int64_t window = model::AttentionWindow(config, l);
    if (window > 0 && b->first_windowed_ >= 0 && window != model::AttentionWindow(config, b->first_windowed_)) {
      return absl::UnimplementedError(absl::StrCat(
          "the CUDA backend's KV rings take one window for every sliding-window layer; this model has ",
          model::AttentionWindow(config, b->first_windowed_), " and ", window, ": use --device cpu"));
    }
    if (window > 0 && b->first_windowed_ < 0) b->first_windowed_ = l;
    b->places_.emplace_back(full, rings, window > 0);
    (window > 0 ? rings : full) += 1;
  }
  b->max_batch_ = std::max(1, options.max_batch);
  b->fuse_qk_rope_ = options.fuse_qk_rope;
  b->max_tokens_ = std::max(b->max_batch_, std::max(1, options.max_prefill));
  CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&b->stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&b->guess_stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&b->fork_, cudaEventDisableTiming), "cudaEventCreate");
  CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&b->guessed_, cudaEventDisableTiming), "cudaEventCreate");
  ASSIGN_OR_RETURN(b->matmul_, kernels::cuda::MatmulContext::Create(b->stream_, WideningElements(weights),
                                                                     SplitElements(config, b->max_tokens_,
                                                                                   options.split_tf32_prompts)));
  RETURN_IF_ERROR(b->Upload(weights));
  RETURN_IF_ERROR(b->AllocateBuffers());
  return b;
}

absl::Status CudaDenseBackend::SleepWhileWaiting() {
  if (step_done_ != nullptr) return absl::OkStatus();
  CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&step_done_, cudaEventBlockingSync | cudaEventDisableTiming),
                       "cudaEventCreate");
  return absl::OkStatus();
}

CudaDenseBackend::~CudaDenseBackend() {
  if (step_done_ != nullptr) cudaEventDestroy(step_done_);
  DropGraphs();
  if (guess_stream_ != nullptr) {
    cudaStreamSynchronize(guess_stream_);
    cudaStreamDestroy(guess_stream_);
  }
  if (fork_ != nullptr) cudaEventDestroy(fork_);
  if (guessed_ != nullptr) cudaEventDestroy(guessed_);
  if (stream_ != nullptr) {
    cudaStreamSynchronize(stream_);
    matmul_.reset();
    cudaStreamDestroy(stream_);
  }
}

void CudaDenseBackend::DropGraphs() {
  for (auto& [key, exec] : graphs_) cudaGraphExecDestroy(exec);
  graphs_.clear();
}

absl::Status CudaDenseBackend::Upload(const model::ModelWeights& w) {
  const model::ModelConfig& c = config_;
  // The embedding: read in place when the kernels can, else widened to F32 here.
  std::vector<uint8_t> widened;
  const gguf::TensorInfo* table = w.token_embd;
  const void* embd_host = table->data;
  kernels::DenseType embd_type = kernels::DenseType::kF32;
  switch (table->type) {
    case gguf::GgmlType::kF32: embd_type = kernels::DenseType::kF32; break;
    case gguf::GgmlType::kF16: embd_type = kernels::DenseType::kF16; break;
    case gguf::GgmlType::kBF16: embd_type = kernels::DenseType::kBF16; break;
    case gguf::GgmlType::kQ8_0: embd_type = kernels::DenseType::kQ8_0; break;
    default: {
      widened.resize(static_cast<size_t>(c.n_vocab * c.n_embd) * sizeof(float));
      RETURN_IF_ERROR(gguf::Dequantize(table->type, table->data, reinterpret_cast<float*>(widened.data()),
                                       c.n_vocab * c.n_embd));
      embd_host = widened.data();
    }
  }
  const uint64_t embd_bytes = kernels::DenseRowBytes(embd_type, c.n_embd) * c.n_vocab;
  embedding_ = {embd_type, c.n_vocab, c.n_embd, nullptr};

  layers_.assign(static_cast<size_t>(c.n_layer), DeviceLayer{});
  std::vector<UploadItem> items;
  auto matrix = [&](const model::DenseMatrix& m, DeviceMatrix* d) {
    *d = {m.type, m.rows, m.cols, nullptr};
    items.push_back({m.data, m.bytes(), reinterpret_cast<const void**>(&d->data)});
  };
  // Absent weights (empty, rows == 0) stay null on the device.
  auto vec = [&](const std::vector<float>& v, const float** d) {
    if (v.empty()) return;
    items.push_back({v.data(), v.size() * sizeof(float), reinterpret_cast<const void**>(d)});
  };
  auto ffn = [&](const model::FfnWeights& f, DeviceFfn* d) {
    if (f.gate.rows == 0) return;
    matrix(f.gate, &d->gate);
    matrix(f.up, &d->up);
    matrix(f.down, &d->down);
    vec(f.gate_inp, &d->gate_inp);
  };
  for (int64_t l = 0; l < c.n_layer; ++l) {
    const model::LayerWeights& L = w.layers[l];
    DeviceLayer& D = layers_[l];
    vec(L.attn_norm, &D.attn_norm);
    matrix(L.wq, &D.wq);
    matrix(L.wk, &D.wk);
    matrix(L.wv, &D.wv);
    matrix(L.wo, &D.wo);
    if (c.qkv_bias) {
      vec(L.bq, &D.bq);
      vec(L.bk, &D.bk);
      vec(L.bv, &D.bv);
    }
    if (c.qk_norm || c.qk_norm_whole) {
      vec(L.q_norm, &D.q_norm);
      vec(L.k_norm, &D.k_norm);
    }
    vec(L.ffn_norm, &D.ffn_norm);
    if (L.router.rows > 0) {
      items.push_back({L.router.data, L.router.bytes(), reinterpret_cast<const void**>(&D.router)});
    }
    if (c.router_score_bias) vec(L.router_bias, &D.router_bias);
    if (c.router_logit_bias) vec(L.router_logit_bias, &D.router_logit_bias);
    if (c.attn_output_bias) vec(L.bo, &D.bo);
    if (c.attn_sinks) vec(L.attn_sinks, &D.attn_sinks);
    ffn(L.shared, &D.shared);
    ffn(L.dense_ffn, &D.dense_ffn);
    if (c.mla.kv_lora_rank > 0) {
      if (L.mla.q_a.rows > 0) {
        matrix(L.mla.q_a, &D.mla.q_a);
        vec(L.mla.q_a_norm, &D.mla.q_a_norm);
        matrix(L.mla.q_b, &D.mla.q_b);
      }
      matrix(L.mla.kv_a, &D.mla.kv_a);
      vec(L.mla.kv_a_norm, &D.mla.kv_a_norm);
      matrix(L.mla.kv_b, &D.mla.kv_b);
    }
  }
  vec(w.output_norm, &output_norm_);
  matrix(w.output, &output_);
  items.push_back({embd_host, embd_bytes, reinterpret_cast<const void**>(&embedding_.data)});

  uint64_t total = 0;
  for (const UploadItem& it : items) total += AlignUp(it.bytes);
  ASSIGN_OR_RETURN(weights_buf_, DeviceBuffer::Allocate(total));
  uint64_t offset = 0;
  for (const UploadItem& it : items) {
    uint8_t* dst = weights_buf_.as<uint8_t>() + offset;
    CUDA_RETURN_IF_ERROR(cudaMemcpy(dst, it.host, it.bytes, cudaMemcpyHostToDevice), "uploading dense weights");
    *it.device_out = dst;
    offset += AlignUp(it.bytes);
  }
  memory_used_ += total;

  const std::vector<double> freq = c.rope_yarn ? model::YarnFrequencies(c.rope_dim, c.rope_freq_base, c.yarn)
                                               : model::RopeFrequencies(c.rope_dim, c.rope_freq_base);
  rope_magnitude_ = c.rope_yarn ? model::YarnMagnitude(c.yarn) : 1.0f;
  ASSIGN_OR_RETURN(freq_, DeviceBuffer::Allocate(freq.size() * sizeof(double)));
  CUDA_RETURN_IF_ERROR(cudaMemcpy(freq_.data(), freq.data(), freq.size() * sizeof(double), cudaMemcpyHostToDevice),
                       "uploading RoPE frequencies");
  return absl::OkStatus();
}

absl::Status CudaDenseBackend::AllocateBuffers() {
  const model::ModelConfig& c = config_;
  const uint64_t n = static_cast<uint64_t>(max_tokens_);
  const uint64_t k = c.n_expert_used;
  const AttentionRows rows = AttentionRowsOf(c);
  struct Need {
    DeviceBuffer* buf;
    uint64_t bytes;
  };
  const Need needs[] = {
      {&x_, n * c.n_embd * 4},          {&h_, n * c.n_embd * 4},           {&q_, n * rows.q * 4},
      {&k_, n * rows.k * 4},            {&v_, n * rows.v * 4},             {&attn_, n * rows.attn * 4},
      {&q_lora_, n * rows.q_lora * 4},  {&q_latent_, n * rows.q_latent * 4}, {&latent_, n * rows.latent * 4},
      {&parts_, n * k * c.n_embd * 4},  {&weights_, n * k * 4},           {&ids_, c.n_layer * n * k * 4},
      {&logits_, n * c.n_vocab * 4},    {&final_, n * c.n_embd * 4},      {&slots_, n * sizeof(TokenSlot)},
  };
  for (const Need& need : needs) {
    ASSIGN_OR_RETURN(*need.buf, DeviceBuffer::Allocate(need.bytes));
    memory_used_ += need.bytes;
  }
  if (const int64_t ff = std::max(c.shared_expert_ff, c.dense_ff); ff > 0) {
    for (DeviceBuffer* buf : {&ffn_gate_, &ffn_up_}) {
      ASSIGN_OR_RETURN(*buf, DeviceBuffer::Allocate(n * ff * 4));
      memory_used_ += n * ff * 4;
    }
  }
  ASSIGN_OR_RETURN(router_ws_, DeviceBuffer::Allocate(kernels::cuda::RouterWorkspaceBytes(max_tokens_, c.n_expert)));
  // On the compute stream: it does not wait for the legacy stream's work, cudaMemset's included.
  CUDA_RETURN_IF_ERROR(cudaMemsetAsync(router_ws_.data(), 0, router_ws_.bytes(), stream_),
                       "clearing the router workspace");
  // Guesses are made for decode steps only: max_batch_ tokens, padded to a power of two in a graph.
  const uint64_t guess_rows = static_cast<uint64_t>(GuessRows(max_batch_, max_tokens_));
  const Need guess_needs[] = {{&guess_h_, guess_rows * c.n_embd * 4},
                              {&guess_ids_, guess_rows * k * 4},
                              {&guess_weights_, guess_rows * k * 4},
                              {&guess_router_ws_,
                               kernels::cuda::RouterWorkspaceBytes(static_cast<int>(guess_rows), c.n_expert)}};
  for (const Need& need : guess_needs) {
    ASSIGN_OR_RETURN(*need.buf, DeviceBuffer::Allocate(need.bytes));
    memory_used_ += need.bytes;
  }
  CUDA_RETURN_IF_ERROR(cudaMemsetAsync(guess_router_ws_.data(), 0, guess_router_ws_.bytes(), stream_),
                       "clearing the guess router's workspace");
  const model::KvLayout layout = model::CacheLayout(c);
  ASSIGN_OR_RETURN(pad_cache_,
                   DeviceBuffer::Allocate(c.n_layer * (layout.key_dim + layout.value_dim) * sizeof(float)));
  ASSIGN_OR_RETURN(slots_host_, PinnedBuffer::Allocate(n * sizeof(TokenSlot)));
  ASSIGN_OR_RETURN(logits_host_, PinnedBuffer::Allocate(n * c.n_vocab * 4));
  ASSIGN_OR_RETURN(ids_host_, PinnedBuffer::Allocate(c.n_layer * n * k * 4));
  RETURN_IF_ERROR(EnsureAttentionWorkspace(PositionsBound(1)));
  // Uploads from pageable memory may return before their DMA lands; the compute stream does not wait for it.
  CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize(), "uploading the dense weights");
  return absl::OkStatus();
}

absl::Status CudaDenseBackend::EnsureAttentionWorkspace(int max_positions) {
  if (max_positions <= attention_positions_) return absl::OkStatus();
  const int positions = PositionsBound(max_positions);
  const size_t bytes = AttentionWorkspace(config_, max_tokens_, positions);
  // Graphs hold the old workspace's address.
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_), "waiting for the stream");
  DropGraphs();
  memory_used_ -= attention_ws_.bytes();
  attention_ws_ = DeviceBuffer();
  ASSIGN_OR_RETURN(attention_ws_, DeviceBuffer::Allocate(bytes));
  if (bytes > 0) {
    CUDA_RETURN_IF_ERROR(cudaMemsetAsync(attention_ws_.data(), 0, bytes, stream_), "clearing the attention workspace");
  }
  memory_used_ += bytes;
  attention_positions_ = positions;
  return absl::OkStatus();
}

model::BackendInfo CudaDenseBackend::info() const {
  model::BackendInfo b;
  b.device = "cuda";
  cudaDeviceProp prop{};
  int device = 0;
  if (cudaGetDevice(&device) == cudaSuccess && cudaGetDeviceProperties(&prop, device) == cudaSuccess) {
    b.name = prop.name;
    b.isa = absl::StrCat("sm_", prop.major, prop.minor);
    b.memory_total = prop.totalGlobalMem;
  }
  b.memory_used = memory_used_;
  return b;
}

absl::Status CudaDenseBackend::BeginBatch(std::span<const model::ForwardToken> tokens) {
  const int n = static_cast<int>(tokens.size());
  if (n > max_tokens_) {
    return absl::InvalidArgumentError(
        absl::StrCat("a batch of ", n, " tokens exceeds the ", max_tokens_, " the device buffers hold"));
  }
  n_real_ = n;
  guess_pending_ = false;  // a step that failed after a guess leaves nothing for this one to wait on
  wanted_.clear();
  int64_t max_pos = 0;
  for (int t = 0; t < n; ++t) {
    if (tokens[t].want_logits) wanted_.push_back(t);
    max_pos = std::max(max_pos, tokens[t].pos);
  }
  graph_step_ = graphs_enabled_ && n <= max_batch_ && static_cast<int>(wanted_.size()) == n;
  n_ = graph_step_ ? static_cast<int>(std::bit_ceil(static_cast<unsigned>(n))) : n;
  if (n_ > max_tokens_) n_ = n;  // a bucket may not exceed the buffers
  max_positions_ = PositionsBound(max_pos + 1);
  RETURN_IF_ERROR(EnsureAttentionWorkspace(max_positions_));

  // The step writes each sequence's positions from its lowest in the batch on (TokenSlot::first_new).
  absl::flat_hash_map<const model::KvCache*, int64_t> first_new;
  for (int t = 0; t < n; ++t) {
    const auto [it, inserted] = first_new.try_emplace(tokens[t].cache, tokens[t].pos);
    if (!inserted) it->second = std::min(it->second, tokens[t].pos);
  }
  one_token_each_ = first_new.size() == static_cast<size_t>(n);
  TokenSlot* host = slots_host_.as<TokenSlot>();
  for (int t = 0; t < n; ++t) {
    const model::ForwardToken& tok = tokens[t];
    // A cache without rings keeps capacity slots in every layer, windowed ones included; one with rings has them
    // for the model's windows (Model::CheckBatch), so the first windowed layer's is every ring's length.
    const int64_t ring_slots = tok.cache->windowed() ? tok.cache->slots(first_windowed_) : tok.cache->capacity();
    host[t] = TokenSlot{tok.cache->keys(), tok.cache->values(), tok.cache->capacity(), static_cast<int32_t>(tok.pos),
                        tok.token, ring_slots};
    host[t].first_new = static_cast<int32_t>(first_new.at(tok.cache));
  }
  float* pad = pad_cache_.as<float>();
  const int64_t pad_keys = config_.n_layer * model::CacheLayout(config_).key_dim;
  for (int t = n; t < n_; ++t) host[t] = TokenSlot{pad, pad + pad_keys, 1, 0, 0, 1};
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(slots_.data(), host, n_ * sizeof(TokenSlot), cudaMemcpyHostToDevice, stream_),
                       "uploading the batch");
  return absl::OkStatus();
}

absl::Status CudaDenseBackend::Run(absl::FunctionRef<absl::Status()> blocks) {
  if (!graph_step_) return blocks();
  const std::tuple<int, int, bool> key{n_, max_positions_, one_token_each_};
  auto it = graphs_.find(key);
  if (it == graphs_.end()) {
    CUDA_RETURN_IF_ERROR(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), "starting a graph capture");
    const absl::Status captured = blocks();
    cudaGraph_t graph = nullptr;
    const cudaError_t end = cudaStreamEndCapture(stream_, &graph);
    if (!captured.ok()) {
      if (graph != nullptr) cudaGraphDestroy(graph);
      cudaGetLastError();
      return captured;
    }
    CUDA_RETURN_IF_ERROR(end, "ending a graph capture");
    cudaGraphExec_t exec = nullptr;
    const cudaError_t inst = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    CUDA_RETURN_IF_ERROR(inst, "instantiating the decode graph");
    it = graphs_.emplace(key, exec).first;
  }
  CUDA_RETURN_IF_ERROR(cudaGraphLaunch(it->second, stream_), "launching the decode graph");
  return absl::OkStatus();
}

absl::Status CudaDenseBackend::Embed() {
  const model::ModelConfig& c = config_;
  RETURN_IF_ERROR(kernels::cuda::EmbedRows(embedding_.type, embedding_.data, c.n_embd, slots_.as<TokenSlot>(), n_,
                                           x_.as<float>(), stream_));
  return kernels::cuda::RmsNorm(x_.as<float>(), c.n_embd, layers_[0].attn_norm, c.n_embd, n_, c.rms_norm_eps,
                                h_.as<float>(), c.n_embd, stream_);
}

absl::Status CudaDenseBackend::Attention(int64_t l) {
  const model::ModelConfig& c = config_;
  if (c.mla.kv_lora_rank > 0) return AttendLatent(l);
  const DeviceLayer& L = layers_[l];
  const int64_t q_dim = c.n_head * c.head_dim, kv_dim = c.n_head_kv * c.head_dim;
  const kernels::cuda::MatmulOutput qkv[3] = {{L.wq.data, L.wq.rows, q_.as<float>(), q_dim},
                                              {L.wk.data, L.wk.rows, k_.as<float>(), kv_dim},
                                              {L.wv.data, L.wv.rows, v_.as<float>(), kv_dim}};
  RETURN_IF_ERROR(kernels::cuda::DenseMatmulGroup(*matmul_, L.wq.type, c.n_embd, qkv, h_.as<float>(), c.n_embd, n_,
                                                  stream_));
  if (c.qkv_bias || c.qk_norm_whole) {
    RETURN_IF_ERROR(kernels::cuda::QkvBiasAndNorm(q_.as<float>(), k_.as<float>(), v_.as<float>(), n_, q_dim, kv_dim,
                                                  L.bq, L.bk, L.bv, c.qk_norm_whole ? L.q_norm : nullptr,
                                                  c.qk_norm_whole ? L.k_norm : nullptr, c.rms_norm_eps, stream_));
  }
  kernels::cuda::QkRopeInputs rope;
  rope.q = q_.as<float>();
  rope.k = k_.as<float>();
  rope.v = v_.as<float>();
  rope.rope_dim = static_cast<int>(c.rope_dim);
  rope.q_norm = c.qk_norm ? L.q_norm : nullptr;
  rope.k_norm = c.qk_norm ? L.k_norm : nullptr;
  rope.eps = c.rms_norm_eps;
  rope.freq = freq_.as<double>();
  rope.rope_magnitude = rope_magnitude_;
  rope.rope_style = c.rope_style == model::RopeStyle::kNeox ? 1 : 0;
  const kernels::cuda::AttentionSinkWindow sink_window{L.attn_sinks, static_cast<int>(model::AttentionWindow(c, l))};
  // Padding tokens share one cache (BeginBatch) at position 0, which fused blocks store and read in no
  // particular order, as the two kernels do: their rows are never read back.
  RETURN_IF_ERROR(kernels::cuda::QkNormRopeAttention(
      rope, fuse_qk_rope_ && one_token_each_, slots_.as<TokenSlot>(), n_, places_[l], static_cast<int>(c.n_head),
      static_cast<int>(c.n_head_kv), static_cast<int>(c.head_dim), c.attention_scale, sink_window, max_positions_,
      attn_.as<float>(), attention_ws_.data(), attention_ws_.bytes(), stream_));
  RETURN_IF_ERROR(kernels::cuda::DenseMatmul(*matmul_, L.wo.type, L.wo.data, L.wo.rows, L.wo.cols, attn_.as<float>(),
                                             q_dim, n_, x_.as<float>(), c.n_embd, /*accumulate=*/true, stream_));
  // As the CPU: x += o, then x += bo.
  if (L.bo == nullptr) return absl::OkStatus();
  return kernels::cuda::AddRowBias(x_.as<float>(), L.bo, c.n_embd, n_, stream_);
}

absl::Status CudaDenseBackend::Router(int64_t l, model::MoeBatch* moe) {
  const model::ModelConfig& c = config_;
  const DeviceLayer& L = layers_[l];
  const int k = static_cast<int>(c.n_expert_used);
  int32_t* ids = ids_.as<int32_t>() + l * n_ * k;
  // The FFN norm of x into h: fused with the router for a decode step (one launch less); a prefill chunk
  // normalizes first, since every router block would recompute the norms of its tokens.
  kernels::cuda::RouterNorm norm{L.ffn_norm, c.rms_norm_eps, h_.as<float>()};
  const float* router_in = x_.as<float>();
  if (n_ > kFusedNormTokens) {
    RETURN_IF_ERROR(kernels::cuda::RmsNorm(x_.as<float>(), c.n_embd, L.ffn_norm, c.n_embd, n_, c.rms_norm_eps,
                                           h_.as<float>(), c.n_embd, stream_));
    norm = {};
    router_in = h_.as<float>();
  }
  RETURN_IF_ERROR(kernels::cuda::RouterTopK(L.router, static_cast<int>(c.n_expert), c.n_embd, router_in, norm,
                                            GateOf(L), n_, k, ids, weights_.as<float>(), router_ws_.data(),
                                            router_ws_.bytes(), stream_));
  moe->n_tokens = n_;
  moe->k = k;
  moe->x_device = h_.as<float>();
  moe->ids_device = ids;
  moe->parts_device = parts_.as<float>();
  moe->stream = stream_;
  return absl::OkStatus();
}

kernels::cuda::RouterGate CudaDenseBackend::GateOf(const DeviceLayer& L) const {
  const model::ModelConfig& c = config_;
  kernels::cuda::RouterGate gate;
  gate.sigmoid = c.router_gating == model::RouterGating::kSigmoid;
  gate.choice_bias = c.router_score_bias ? L.router_bias : nullptr;
  gate.renorm = c.router_renorm;
  gate.scale = c.routed_scale;
  gate.logit_bias = L.router_logit_bias;
  gate.softmax_top_k = c.router_gating == model::RouterGating::kSoftmaxTopK;
  gate.n_group = static_cast<int>(c.n_expert_group);
  gate.n_group_used = static_cast<int>(c.n_group_used);
  gate.group_top_two = c.group_score == model::GroupScore::kTopTwoSum;
  return gate;
}

absl::Status CudaDenseBackend::GuessRouting(int64_t next_layer, model::RoutingGuess* guess) {
  const model::ModelConfig& c = config_;
  const int guess_rows = GuessRows(max_batch_, max_tokens_);
  if (next_layer < 0 || next_layer >= c.n_layer || layers_[next_layer].router == nullptr || n_ > guess_rows) {
    return absl::InvalidArgumentError(absl::StrCat("GuessRouting: block ", next_layer, " is not a MoE block of ",
                                                   c.n_layer, ", or the step's ", n_, " tokens exceed the ",
                                                   guess_rows, " of a (padded) decode step"));
  }
  const DeviceLayer& L = layers_[next_layer];
  const int k = static_cast<int>(c.n_expert_used);
  CUDA_RETURN_IF_ERROR(cudaEventRecord(fork_, stream_), "forking the guess stream");
  CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(guess_stream_, fork_, 0), "forking the guess stream");
  const kernels::cuda::RouterNorm norm{L.ffn_norm, c.rms_norm_eps, guess_h_.as<float>()};
  RETURN_IF_ERROR(kernels::cuda::RouterTopK(L.router, static_cast<int>(c.n_expert), c.n_embd, x_.as<float>(), norm,
                                            GateOf(L), n_, k, guess_ids_.as<int32_t>(), guess_weights_.as<float>(),
                                            guess_router_ws_.data(), guess_router_ws_.bytes(), guess_stream_));
  CUDA_RETURN_IF_ERROR(cudaEventRecord(guessed_, guess_stream_), "cudaEventRecord");
  guess_pending_ = true;
  guess->n_tokens = n_;
  guess->k = k;
  guess->ids_device = guess_ids_.as<int32_t>();
  guess->stream = guess_stream_;
  return absl::OkStatus();
}

absl::Status CudaDenseBackend::AddFfn(const DeviceFfn& f, int64_t ff) {
  const int64_t E = config_.n_embd;
  float* gate = ffn_gate_.as<float>();
  float* up = ffn_up_.as<float>();
  if (f.gate.type == f.up.type) {
    const kernels::cuda::MatmulOutput outputs[2] = {{f.gate.data, f.gate.rows, gate, ff},
                                                    {f.up.data, f.up.rows, up, ff}};
    RETURN_IF_ERROR(kernels::cuda::DenseMatmulGroup(*matmul_, f.gate.type, E, outputs, h_.as<float>(), E, n_, stream_));
  } else {
    RETURN_IF_ERROR(kernels::cuda::DenseMatmul(*matmul_, f.gate.type, f.gate.data, f.gate.rows, E, h_.as<float>(), E,
                                               n_, gate, ff, /*accumulate=*/false, stream_));
    RETURN_IF_ERROR(kernels::cuda::DenseMatmul(*matmul_, f.up.type, f.up.data, f.up.rows, E, h_.as<float>(), E, n_,
                                               up, ff, /*accumulate=*/false, stream_));
  }
  // The activation (times the shared expert's gate, if any) in place of the gate product.
  RETURN_IF_ERROR(kernels::cuda::SwiGlu(gate, up, ff, n_, f.gate_inp, h_.as<float>(), E, gate, stream_));
  return kernels::cuda::DenseMatmul(*matmul_, f.down.type, f.down.data, f.down.rows, ff, gate, ff, n_,
                                    x_.as<float>(), E, /*accumulate=*/true, stream_);
}

absl::Status CudaDenseBackend::DenseFfn(int64_t l) {
  const model::ModelConfig& c = config_;
  const DeviceLayer& L = layers_[l];
  RETURN_IF_ERROR(kernels::cuda::RmsNorm(x_.as<float>(), c.n_embd, L.ffn_norm, c.n_embd, n_, c.rms_norm_eps,
                                         h_.as<float>(), c.n_embd, stream_));
  RETURN_IF_ERROR(AddFfn(L.dense_ffn, c.dense_ff));
  // The next norm into h, as Combine leaves it.
  const float* next_norm = l + 1 < c.n_layer ? layers_[l + 1].attn_norm : output_norm_;
  return kernels::cuda::RmsNorm(x_.as<float>(), c.n_embd, next_norm, c.n_embd, n_, c.rms_norm_eps, h_.as<float>(),
                                c.n_embd, stream_);
}

absl::Status CudaDenseBackend::Combine(int64_t l, const model::MoeBatch& moe) {
  const model::ModelConfig& c = config_;
  if (guess_pending_) {  // the guess reads x, which CombineAndNorm writes
    CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream_, guessed_, 0), "joining the guess stream");
    guess_pending_ = false;
  }
  // The shared expert first (of h, the MoE input), as the CPU adds it before the routed experts' parts.
  if (c.shared_expert_ff > 0) RETURN_IF_ERROR(AddFfn(layers_[l].shared, c.shared_expert_ff));
  // Fused with the next norm: the next layer's attention norm, or the output norm after the last layer.
  const float* next_norm = l + 1 < c.n_layer ? layers_[l + 1].attn_norm : output_norm_;
  return kernels::cuda::CombineAndNorm(parts_.as<float>(), weights_.as<float>(), n_, moe.k, c.n_embd,
                                       x_.as<float>(), next_norm, c.rms_norm_eps, h_.as<float>(), stream_);
}

absl::Status CudaDenseBackend::Head() {
  const model::ModelConfig& c = config_;
  const int m = static_cast<int>(wanted_.size());
  if (m == 0) return absl::OkStatus();
  // h holds every token's output-normed state; gather the wanted rows unless they are the first m.
  const float* rows = h_.as<float>();
  bool contiguous = true;
  for (int i = 0; i < m; ++i) contiguous &= wanted_[i] == i;
  if (!contiguous) {
    for (int i = 0; i < m; ++i) {
      CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(final_.as<float>() + i * c.n_embd, h_.as<float>() + wanted_[i] * c.n_embd,
                                           c.n_embd * sizeof(float), cudaMemcpyDeviceToDevice, stream_),
                           "gathering the rows that want logits");
    }
    rows = final_.as<float>();
  }
  // In graph mode every token (padding too) wants logits: the head runs over the padded count.
  const int count = graph_step_ ? n_ : m;
  return kernels::cuda::DenseMatmul(*matmul_, output_.type, output_.data, output_.rows, output_.cols, rows,
                                    c.n_embd, count, logits_.as<float>(), c.n_vocab, /*accumulate=*/false, stream_);
}

absl::Status CudaDenseBackend::EndBatch(float* logits) {
  const model::ModelConfig& c = config_;
  const size_t m = wanted_.size();
  const size_t logit_bytes = m * c.n_vocab * sizeof(float);
  const size_t ids_bytes = static_cast<size_t>(c.n_layer) * n_ * c.n_expert_used * sizeof(int32_t);
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(logits_host_.data(), logits_.data(), logit_bytes, cudaMemcpyDeviceToHost,
                                       stream_), "copying the logits back");
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(ids_host_.data(), ids_.data(), ids_bytes, cudaMemcpyDeviceToHost, stream_),
                       "copying the routing back");
  if (step_done_ != nullptr) {
    CUDA_RETURN_IF_ERROR(cudaEventRecord(step_done_, stream_), "cudaEventRecord");
    CUDA_RETURN_IF_ERROR(cudaEventSynchronize(step_done_), "the decode step");
  } else {
    CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_), "the decode step");
  }
  std::memcpy(logits, logits_host_.data(), logit_bytes);
  return absl::OkStatus();
}

}  // namespace strata::gpu
