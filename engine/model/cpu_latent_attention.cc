// Multi-head latent attention on the CPU (DeepSeek-V2 arXiv 2405.04434 section 2.1; llama.cpp
// src/models/deepseek2.cpp). Per token: q from attn_q (or attn_q_b(RmsNorm(attn_q_a h))), per head nope values
// then rope values; [c, k_pe] = attn_kv_a_mqa h with c normed by attn_kv_a_norm; RoPE on q's rope values and
// on k_pe (one for all heads). The cache keeps [c, k_pe] per position. Per head h, with W_UK[h] and W_UV[h]
// the nope and v rows of attn_kv_b:
//   naive:    k_nope[p] = W_UK[h] c[p], v[p] = W_UV[h] c[p]; score[p] = q_nope . k_nope[p] + q_pe . k_pe[p]
//   absorbed: score[p] = (W_UK[h]^T q_nope) . c[p] + q_pe . k_pe[p]; out = W_UV[h] sum_p w[p] c[p]
// which are equal; the softmax scale is ModelConfig::attention_scale.

#include <algorithm>
#include <cmath>
#include <vector>

#include "engine/model/cpu_dense_backend.h"
#include "engine/model/ops.h"
#include "kernels/cpu/dense_gemv.h"

namespace strata::model {
void CpuDenseBackend::RebuildLatentKeys(int64_t layer) {
  const ModelConfig& c = config_;
  const int64_t rank = c.mla.kv_lora_rank;
  const DenseMatrix& kv_b = weights_.layers[layer].mla.kv_b;
  // Per cache of the batch: its tokens and the positions up to its last one. The naive form serves a cache with
  // several tokens here (kAuto) and is rebuilt once for all of them.
  struct CacheUse {
    KvCache* cache;
    int tokens;
    int64_t positions;
  };
  std::vector<CacheUse> uses;
  std::vector<int> use_of(static_cast<size_t>(n_));
  for (int t = 0; t < n_; ++t) {
    size_t i = 0;
    while (i < uses.size() && uses[i].cache != tokens_[t].cache) ++i;
    if (i == uses.size()) uses.push_back({tokens_[t].cache, 0, 0});
    ++uses[i].tokens;
    uses[i].positions = std::max(uses[i].positions, tokens_[t].pos + 1);
    use_of[t] = static_cast<int>(i);
  }
  std::vector<std::pair<KvCache*, int64_t>> caches;  // those rebuilt, with their positions
  std::vector<int> rebuilt_of_use(uses.size(), -1);
  for (size_t i = 0; i < uses.size(); ++i) {
    const bool naive = latent_form_ == LatentForm::kNaive || (latent_form_ == LatentForm::kAuto && uses[i].tokens > 1);
    if (!naive) continue;
    rebuilt_of_use[i] = static_cast<int>(caches.size());
    caches.emplace_back(uses[i].cache, uses[i].positions);
  }
  rebuilt_index_.resize(static_cast<size_t>(n_));
  for (int t = 0; t < n_; ++t) rebuilt_index_[t] = rebuilt_of_use[use_of[t]];
  if (rebuilt_.size() < caches.size()) rebuilt_.resize(caches.size());
  std::vector<float> latents;
  for (size_t i = 0; i < caches.size(); ++i) {
    const auto [cache, positions] = caches[i];
    latents.resize(static_cast<size_t>(positions * rank));
    for (int64_t p = 0; p < positions; ++p) std::copy_n(cache->key(layer, p), rank, latents.data() + p * rank);
    rebuilt_[i].resize(static_cast<size_t>(positions * kv_b.rows));
    Project(kv_b, latents.data(), static_cast<int>(positions), rebuilt_[i].data());
  }
}

absl::Status CpuDenseBackend::AttendLatent(int64_t l) {
  const ModelConfig& c = config_;
  const LatentAttention& a = c.mla;
  const LayerWeights& L = weights_.layers[l];
  const LatentAttentionWeights& W = L.mla;
  const int64_t E = c.n_embd, q_dim = c.n_head * c.head_dim, rank = a.kv_lora_rank;
  const int64_t kv_width = rank + c.rope_dim, per_head = a.nope_dim + a.v_dim, half = c.rope_dim / 2;
  const int n = n_;
  for (int t = 0; t < n; ++t) RmsNorm(x_.data() + t * E, L.attn_norm.data(), E, c.rms_norm_eps, h_.data() + t * E);
  if (a.q_lora_rank > 0) {
    Project(W.q_a, h_.data(), n, q_lora_.data());
    for (int t = 0; t < n; ++t) {
      float* qa = q_lora_.data() + t * a.q_lora_rank;
      RmsNorm(qa, W.q_a_norm.data(), a.q_lora_rank, c.rms_norm_eps, qa);
    }
    Project(W.q_b, q_lora_.data(), n, q_.data());
  } else {
    Project(L.wq, h_.data(), n, q_.data());
  }
  Project(W.kv_a, h_.data(), n, k_.data());
  for (int t = 0; t < n; ++t) {
    float* kv = k_.data() + t * kv_width;
    RmsNorm(kv, W.kv_a_norm.data(), rank, c.rms_norm_eps, kv);
    const float* cos = rope_cos_.data() + t * half;
    const float* sin = rope_sin_.data() + t * half;
    Rope(kv + rank, c.rope_dim, cos, sin, c.rope_style);
    for (int64_t hd = 0; hd < c.n_head; ++hd) {
      Rope(q_.data() + t * q_dim + hd * c.head_dim + a.nope_dim, c.rope_dim, cos, sin, c.rope_style);
    }
    std::copy_n(kv, kv_width, tokens_[t].cache->key(l, tokens_[t].pos));
  }
  RebuildLatentKeys(l);

  const float scale = c.attention_scale;
  auto task = [&](int64_t i) {
    const int64_t t = i / c.n_head, head = i % c.n_head;
    const ForwardToken& tok = tokens_[t];
    const float* q_nope = q_.data() + t * q_dim + head * c.head_dim;
    const float* q_pe = q_nope + a.nope_dim;
    float* out = attn_.data() + (t * c.n_head + head) * a.v_dim;
    const int64_t positions = tok.pos + 1;
    thread_local std::vector<float> scores, q_absorbed, latent_sum, heads_out;
    scores.resize(static_cast<size_t>(positions));
    const int rebuilt = rebuilt_index_[t];
    if (rebuilt >= 0) {
      const float* keys = rebuilt_[rebuilt].data() + head * per_head;
      const int64_t row = c.n_head * per_head;
      for (int64_t p = 0; p < positions; ++p) {
        const float* k_pe = tok.cache->key(l, p) + rank;
        scores[p] = (Dot(q_nope, keys + p * row, a.nope_dim) + Dot(q_pe, k_pe, c.rope_dim)) * scale;
      }
      Softmax(scores.data(), positions);
      std::fill(out, out + a.v_dim, 0.0f);
      for (int64_t p = 0; p < positions; ++p) {
        const float* value = keys + p * row + a.nope_dim;
        for (int64_t d = 0; d < a.v_dim; ++d) out[d] += scores[p] * value[d];
      }
      return;
    }
    q_absorbed.resize(static_cast<size_t>(rank));
    const float* uk_t = W.uk_t.data() + head * rank * a.nope_dim;
    for (int64_t r = 0; r < rank; ++r) q_absorbed[r] = Dot(uk_t + r * a.nope_dim, q_nope, a.nope_dim);
    for (int64_t p = 0; p < positions; ++p) {
      const float* key = tok.cache->key(l, p);
      scores[p] = (Dot(q_absorbed.data(), key, rank) + Dot(q_pe, key + rank, c.rope_dim)) * scale;
    }
    Softmax(scores.data(), positions);
    latent_sum.assign(static_cast<size_t>(rank), 0.0f);
    for (int64_t p = 0; p < positions; ++p) {
      const float* key = tok.cache->key(l, p);
      for (int64_t r = 0; r < rank; ++r) latent_sum[r] += scores[p] * key[r];
    }
    // W_UV[h] is rows [head * per_head + nope, + v) of attn_kv_b; the kernel writes y[row].
    const int64_t r0 = head * per_head + a.nope_dim;
    heads_out.resize(static_cast<size_t>(r0 + a.v_dim));
    kernels::DenseGemv(W.kv_b.type, W.kv_b.data, W.kv_b.cols, r0, r0 + a.v_dim, latent_sum.data(), rank, 1,
                       heads_out.data(), 0);
    std::copy_n(heads_out.data() + r0, a.v_dim, out);
  };
  exec::ParallelFor(pool_, static_cast<int64_t>(n) * c.n_head, task);
  Project(L.wo, attn_.data(), n, o_.data());
  for (int64_t i = 0; i < n * E; ++i) x_[i] += o_[i];
  return absl::OkStatus();
}

}  // namespace strata::model
