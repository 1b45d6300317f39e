#include "engine/model/cpu_dense_backend.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "engine/gguf/ggml_types.h"
#include "engine/model/ops.h"
#include "engine/status_macros.h"
#include "kernels/cpu/dense_gemv.h"
#include "kernels/cpu/role_gemv.h"

namespace strata::model {

CpuDenseBackend::CpuDenseBackend(const ModelConfig& config, const ModelWeights& weights, exec::ThreadPool* pool,
                                 LatentForm latent_form)
    : config_(config),
      weights_(weights),
      pool_(pool),
      latent_form_(latent_form),
      rope_frequencies_(config.rope_yarn ? YarnFrequencies(config.rope_dim, config.rope_freq_base, config.yarn)
                                         : RopeFrequencies(config.rope_dim, config.rope_freq_base)),
      rope_magnitude_(config.rope_yarn ? YarnMagnitude(config.yarn) : 1.0f) {}

BackendInfo CpuDenseBackend::info() const {
  BackendInfo b;
  b.device = "cpu";
  b.isa = std::string(kernels::CpuPathName(kernels::BestCpuPath()));
  b.name = absl::StrCat(pool_ == nullptr ? 1 : pool_->num_threads(), " threads");
  return b;
}

void CpuDenseBackend::EnsureCapacity(int n) {
  const ModelConfig& c = config_;
  const size_t k = static_cast<size_t>(c.n_expert_used);
  ids_.resize(static_cast<size_t>(c.n_layer) * n * k);
  if (n <= capacity_) return;
  const size_t q_dim = static_cast<size_t>(c.n_head * c.head_dim);
  // Latent attention keeps each token's latent and RoPE'd key part in k_ and writes n_head values of v_dim.
  const size_t kv_dim = static_cast<size_t>(std::max(c.n_head_kv * c.head_dim, c.mla.kv_lora_rank + c.rope_dim));
  const size_t attn_dim = static_cast<size_t>(c.n_head * std::max(c.head_dim, c.mla.v_dim));
  const size_t e = static_cast<size_t>(c.n_embd);
  x_.resize(n * e);
  h_.resize(n * e);
  q_.resize(n * q_dim);
  k_.resize(n * kv_dim);
  v_.resize(n * kv_dim);
  attn_.resize(n * attn_dim);
  q_lora_.resize(n * static_cast<size_t>(c.mla.q_lora_rank));
  o_.resize(n * e);
  router_.resize(n * static_cast<size_t>(c.n_expert));
  weights_buf_.resize(n * k);
  parts_.resize(n * k * e);
  final_.resize(n * e);
  logits_.resize(n * static_cast<size_t>(c.n_vocab));
  rope_cos_.resize(n * static_cast<size_t>(c.rope_dim / 2));
  rope_sin_.resize(n * static_cast<size_t>(c.rope_dim / 2));
  const size_t ff = static_cast<size_t>(std::max(c.shared_expert_ff, c.dense_ff));
  ffn_gate_.resize(n * ff);
  ffn_up_.resize(n * ff);
  selection_.resize(static_cast<size_t>(c.n_expert));
  capacity_ = n;
}

absl::Status CpuDenseBackend::BeginBatch(std::span<const ForwardToken> tokens) {
  tokens_ = tokens;
  n_ = static_cast<int>(tokens.size());
  EnsureCapacity(n_);
  const int64_t half = config_.rope_dim / 2;
  for (int t = 0; t < n_; ++t) {
    RopeAngles(rope_frequencies_, tokens[t].pos, rope_cos_.data() + t * half, rope_sin_.data() + t * half,
               rope_magnitude_);
  }
  return absl::OkStatus();
}

void CpuDenseBackend::Project(const DenseMatrix& m, const float* x, int n, float* y) {
  const int threads = pool_ == nullptr ? 1 : pool_->num_threads();
  const int64_t chunk = std::max<int64_t>(16, (m.rows + threads * 4 - 1) / (threads * 4));
  const int64_t n_chunks = (m.rows + chunk - 1) / chunk;
  exec::ParallelFor(pool_, n_chunks, [&](int64_t i) {
    const int64_t r0 = i * chunk, r1 = std::min(m.rows, r0 + chunk);
    kernels::DenseGemv(m.type, m.data, m.cols, r0, r1, x, m.cols, n, y, m.rows);
  });
}

absl::Status CpuDenseBackend::Embed() {
  const int64_t E = config_.n_embd;
  const gguf::TensorInfo* table = weights_.token_embd;
  const uint64_t row = gguf::RowBytes(table->type, E).value();
  for (int t = 0; t < n_; ++t) {
    RETURN_IF_ERROR(gguf::Dequantize(table->type, table->data + row * tokens_[t].token, x_.data() + t * E, E));
  }
  return absl::OkStatus();
}

void CpuDenseBackend::AttendAll(int64_t layer) {
  const ModelConfig& c = config_;
  const int64_t q_dim = c.n_head * c.head_dim;
  const int64_t group = c.n_head / c.n_head_kv;
  const float scale = c.attention_scale;
  const int64_t window = AttentionWindow(c, layer);
  const std::vector<float>& sinks = weights_.layers[layer].attn_sinks;
  auto task = [&](int64_t i) {
    const int64_t t = i / c.n_head, head = i % c.n_head;
    const ForwardToken& tok = tokens_[t];
    const float* q = q_.data() + t * q_dim + head * c.head_dim;
    const int64_t kv_off = (head / group) * c.head_dim;
    // A windowed block sees its last `window` positions, itself included.
    const int64_t first = window > 0 ? std::max<int64_t>(0, tok.pos - window + 1) : 0;
    thread_local std::vector<float> scores;
    scores.resize(static_cast<size_t>(tok.pos + 1 - first));
    // A sink is one more logit in the softmax, unscaled and with no value (ggml_soft_max_ext's sinks).
    const float sink = sinks.empty() ? -INFINITY : sinks[head];
    float max = sink;
    for (int64_t p = first; p <= tok.pos; ++p) {
      const float* key = tok.cache->key(layer, p) + kv_off;
      float s = 0;
      for (int64_t d = 0; d < c.head_dim; ++d) s += q[d] * key[d];
      scores[p - first] = s * scale;
      max = std::max(max, scores[p - first]);
    }
    double sum = sinks.empty() ? 0.0 : std::exp(sink - max);
    for (float& s : scores) {
      s = std::exp(s - max);
      sum += s;
    }
    float* out = attn_.data() + t * q_dim + head * c.head_dim;
    std::fill(out, out + c.head_dim, 0.0f);
    const float inv = static_cast<float>(1.0 / sum);
    for (int64_t p = first; p <= tok.pos; ++p) {
      const float w = scores[p - first] * inv;
      const float* value = tok.cache->value(layer, p) + kv_off;
      for (int64_t d = 0; d < c.head_dim; ++d) out[d] += w * value[d];
    }
  };
  exec::ParallelFor(pool_, static_cast<int64_t>(n_) * c.n_head, task);
}

absl::Status CpuDenseBackend::Attention(int64_t l) {
  if (config_.mla.kv_lora_rank > 0) return AttendLatent(l);
  const ModelConfig& c = config_;
  const LayerWeights& L = weights_.layers[l];
  const int64_t E = c.n_embd, q_dim = c.n_head * c.head_dim, kv_dim = c.n_head_kv * c.head_dim;
  const int64_t half = c.rope_dim / 2;
  const int n = n_;
  for (int t = 0; t < n; ++t) RmsNorm(x_.data() + t * E, L.attn_norm.data(), E, c.rms_norm_eps, h_.data() + t * E);
  Project(L.wq, h_.data(), n, q_.data());
  Project(L.wk, h_.data(), n, k_.data());
  Project(L.wv, h_.data(), n, v_.data());
  for (int t = 0; t < n; ++t) {
    float* qt = q_.data() + t * q_dim;
    float* kt = k_.data() + t * kv_dim;
    if (c.qkv_bias) {
      AddBias(qt, L.bq.data(), q_dim);
      AddBias(kt, L.bk.data(), kv_dim);
      AddBias(v_.data() + t * kv_dim, L.bv.data(), kv_dim);
    }
    if (c.qk_norm_whole) {
      RmsNorm(qt, L.q_norm.data(), q_dim, c.rms_norm_eps, qt);
      RmsNorm(kt, L.k_norm.data(), kv_dim, c.rms_norm_eps, kt);
    }
    const float* cos = rope_cos_.data() + t * half;
    const float* sin = rope_sin_.data() + t * half;
    for (int64_t hd = 0; hd < c.n_head; ++hd) {
      float* qh = q_.data() + t * q_dim + hd * c.head_dim;
      if (c.qk_norm) RmsNorm(qh, L.q_norm.data(), c.head_dim, c.rms_norm_eps, qh);
      Rope(qh, c.rope_dim, cos, sin, c.rope_style);
    }
    for (int64_t hd = 0; hd < c.n_head_kv; ++hd) {
      float* kh = k_.data() + t * kv_dim + hd * c.head_dim;
      if (c.qk_norm) RmsNorm(kh, L.k_norm.data(), c.head_dim, c.rms_norm_eps, kh);
      Rope(kh, c.rope_dim, cos, sin, c.rope_style);
    }
    std::copy_n(k_.data() + t * kv_dim, kv_dim, tokens_[t].cache->key(l, tokens_[t].pos));
    std::copy_n(v_.data() + t * kv_dim, kv_dim, tokens_[t].cache->value(l, tokens_[t].pos));
  }
  AttendAll(l);
  Project(L.wo, attn_.data(), n, o_.data());
  for (int64_t i = 0; i < n * E; ++i) x_[i] += o_[i];
  if (c.attn_output_bias) {
    for (int t = 0; t < n; ++t) AddBias(x_.data() + t * E, L.bo.data(), E);
  }
  return absl::OkStatus();
}

absl::Status CpuDenseBackend::Router(int64_t l, MoeBatch* moe) {
  const ModelConfig& c = config_;
  const LayerWeights& L = weights_.layers[l];
  const int64_t E = c.n_embd;
  const int k = static_cast<int>(c.n_expert_used);
  for (int t = 0; t < n_; ++t) RmsNorm(x_.data() + t * E, L.ffn_norm.data(), E, c.rms_norm_eps, h_.data() + t * E);
  Project(L.router, h_.data(), n_, router_.data());
  int32_t* layer_ids = ids_.data() + l * n_ * k;
  for (int t = 0; t < n_; ++t) {
    float* probs = router_.data() + t * c.n_expert;
    int32_t* ids = layer_ids + t * k;
    if (c.router_logit_bias) AddBias(probs, L.router_logit_bias.data(), c.n_expert);
    if (c.router_gating == RouterGating::kSoftmaxTopK) {
      // The k largest logits, then a softmax over those k alone.
      TopK(probs, c.n_expert, k, ids);
      float* w = weights_buf_.data() + t * k;
      for (int j = 0; j < k; ++j) w[j] = probs[ids[j]];
      Softmax(w, k);
      for (int j = 0; j < k; ++j) w[j] *= c.routed_scale;
      continue;
    }
    if (c.router_gating == RouterGating::kSigmoid) {
      for (int64_t e = 0; e < c.n_expert; ++e) probs[e] = Sigmoid(probs[e]);
    } else {
      Softmax(probs, c.n_expert);
    }
    // The score-correction bias moves the choice only; the weights are the unbiased scores.
    const float* choice = probs;
    if (c.router_score_bias || c.n_expert_group > 1) {
      for (int64_t e = 0; e < c.n_expert; ++e) {
        selection_[e] = probs[e] + (c.router_score_bias ? L.router_bias[e] : 0.0f);
      }
      MaskAllButBestGroups(selection_.data(), c.n_expert, c.n_expert_group, c.n_group_used, c.group_score);
      choice = selection_.data();
    }
    TopK(choice, c.n_expert, k, ids);
    double sum = 1.0;
    if (c.router_renorm) {
      sum = 0;
      for (int j = 0; j < k; ++j) sum += probs[ids[j]];
    }
    for (int j = 0; j < k; ++j) weights_buf_[t * k + j] = static_cast<float>(probs[ids[j]] / sum * c.routed_scale);
  }
  moe->n_tokens = n_;
  moe->k = k;
  moe->x = h_.data();
  moe->ids = layer_ids;
  moe->parts = parts_.data();
  return absl::OkStatus();
}

void CpuDenseBackend::AddFfn(const FfnWeights& f, int64_t ff) {
  const int64_t E = config_.n_embd;
  Project(f.gate, h_.data(), n_, ffn_gate_.data());
  Project(f.up, h_.data(), n_, ffn_up_.data());
  SwiGlu(ffn_gate_.data(), ffn_up_.data(), n_ * ff, ffn_gate_.data());
  Project(f.down, ffn_gate_.data(), n_, o_.data());
  for (int t = 0; t < n_; ++t) {
    float scale = 1.0f;
    if (!f.gate_inp.empty()) scale = Sigmoid(Dot(f.gate_inp.data(), h_.data() + t * E, E));
    float* xt = x_.data() + t * E;
    const float* ot = o_.data() + t * E;
    for (int64_t i = 0; i < E; ++i) xt[i] += scale * ot[i];
  }
}

absl::Status CpuDenseBackend::Combine(int64_t l, const MoeBatch& moe) {
  // The router weight is applied here and only here. h_ still holds the MoE input (the dispatch reads it).
  const int64_t E = config_.n_embd;
  const int k = moe.k;
  if (config_.shared_expert_ff > 0) AddFfn(weights_.layers[l].shared, config_.shared_expert_ff);
  for (int t = 0; t < n_; ++t) {
    float* xt = x_.data() + t * E;
    for (int j = 0; j < k; ++j) {
      const float wj = weights_buf_[t * k + j];
      const float* part = parts_.data() + (static_cast<int64_t>(t) * k + j) * E;
      for (int64_t i = 0; i < E; ++i) xt[i] += wj * part[i];
    }
  }
  return absl::OkStatus();
}

absl::Status CpuDenseBackend::DenseFfn(int64_t l) {
  const ModelConfig& c = config_;
  const LayerWeights& L = weights_.layers[l];
  const int64_t E = c.n_embd;
  for (int t = 0; t < n_; ++t) RmsNorm(x_.data() + t * E, L.ffn_norm.data(), E, c.rms_norm_eps, h_.data() + t * E);
  AddFfn(L.dense_ffn, c.dense_ff);
  return absl::OkStatus();
}

absl::Status CpuDenseBackend::Head() {
  const ModelConfig& c = config_;
  const int64_t E = c.n_embd;
  n_out_ = 0;
  for (int t = 0; t < n_; ++t) {
    if (!tokens_[t].want_logits) continue;
    RmsNorm(x_.data() + t * E, weights_.output_norm.data(), E, c.rms_norm_eps, final_.data() + n_out_ * E);
    ++n_out_;
  }
  if (n_out_ > 0) Project(weights_.output, final_.data(), n_out_, logits_.data());
  return absl::OkStatus();
}

absl::Status CpuDenseBackend::EndBatch(float* logits) {
  if (n_out_ > 0) std::memcpy(logits, logits_.data(), static_cast<size_t>(n_out_) * config_.n_vocab * sizeof(float));
  return absl::OkStatus();
}

}  // namespace strata::model
