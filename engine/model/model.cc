#include "engine/model/model.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "engine/gguf/ggml_types.h"
#include "engine/model/ops.h"
#include "engine/status_macros.h"

namespace strata::model {
namespace {

absl::Status Mismatch(const char* what, int64_t pack_value, int64_t model_value) {
  return absl::InvalidArgumentError(absl::StrCat("pack geometry ", what, " is ", pack_value,
                                                 " but dense.gguf says ", model_value));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Model>> Model::Create(const pack::Pack& pack, std::unique_ptr<MoeDispatch> dispatch,
                                                     kernels::ThreadPool* pool) {
  std::unique_ptr<Model> m(new Model());
  ASSIGN_OR_RETURN(m->config_, ReadModelConfig(pack.dense().metadata()));
  const ModelConfig& c = m->config_;
  const pack::v1::Geometry& g = pack.manifest().geometry();
  if (g.n_layer() != c.n_layer) return Mismatch("n_layer", g.n_layer(), c.n_layer);
  if (g.n_embd() != c.n_embd) return Mismatch("n_embd", g.n_embd(), c.n_embd);
  if (g.n_expert() != c.n_expert) return Mismatch("n_expert", g.n_expert(), c.n_expert);
  if (g.n_expert_used() != c.n_expert_used) return Mismatch("n_expert_used", g.n_expert_used(), c.n_expert_used);
  if (g.expert_ff() != c.expert_ff) return Mismatch("expert_ff", g.expert_ff(), c.expert_ff);
  if (g.n_shared_experts() != 0) {
    return absl::UnimplementedError(absl::StrCat("the pack has ", g.n_shared_experts(),
                                                 " shared experts; ", c.arch, " models in Strata have none"));
  }
  if (g.n_moe_layers() != c.n_layer) {
    return absl::UnimplementedError(absl::StrCat("the pack has ", g.n_moe_layers(), " MoE layers of ", c.n_layer,
                                                 "; Strata runs models whose every layer is MoE"));
  }
  m->rope_frequencies_ = RopeFrequencies(c.head_dim, c.rope_freq_base);
  m->moe_index_.assign(static_cast<size_t>(c.n_layer), 0);
  for (int i = 0; i < g.moe_layers_size(); ++i) m->moe_index_[g.moe_layers(i)] = static_cast<uint32_t>(i);
  ASSIGN_OR_RETURN(m->weights_, LoadWeights(pack.dense(), c));
  m->dispatch_ = std::move(dispatch);
  m->pool_ = pool;
  return m;
}

void Model::EnsureCapacity(int n) {
  if (n <= capacity_) return;
  const ModelConfig& c = config_;
  const size_t q_dim = static_cast<size_t>(c.n_head * c.head_dim), kv_dim = static_cast<size_t>(c.n_head_kv * c.head_dim);
  const size_t e = static_cast<size_t>(c.n_embd), k = static_cast<size_t>(c.n_expert_used);
  x_.resize(n * e);
  h_.resize(n * e);
  q_.resize(n * q_dim);
  k_.resize(n * kv_dim);
  v_.resize(n * kv_dim);
  attn_.resize(n * q_dim);
  o_.resize(n * e);
  router_.resize(n * static_cast<size_t>(c.n_expert));
  weights_buf_.resize(n * k);
  ids_.resize(n * k);
  parts_.resize(n * k * e);
  final_.resize(n * e);
  rope_cos_.resize(n * static_cast<size_t>(c.head_dim / 2));
  rope_sin_.resize(n * static_cast<size_t>(c.head_dim / 2));
  capacity_ = n;
}

absl::Status Model::CheckBatch(std::span<const ForwardToken> tokens) const {
  for (size_t i = 0; i < tokens.size(); ++i) {
    const ForwardToken& t = tokens[i];
    if (t.token < 0 || t.token >= config_.n_vocab) {
      return absl::InvalidArgumentError(
          absl::StrCat("token id ", t.token, " is not in the vocabulary (", config_.n_vocab, " tokens)"));
    }
    if (t.cache == nullptr || t.pos < 0 || t.pos >= t.cache->capacity()) {
      return absl::OutOfRangeError(absl::StrCat("position ", t.pos, " is outside the sequence's KV cache (",
                                                t.cache == nullptr ? 0 : t.cache->capacity(), " positions)"));
    }
  }
  return absl::OkStatus();
}

void Model::Project(const DenseMatrix& m, const float* x, int n, float* y, ForwardStats* stats) {
  const int threads = pool_ == nullptr ? 1 : pool_->num_threads();
  const int64_t chunk = std::max<int64_t>(16, (m.rows + threads * 4 - 1) / (threads * 4));
  const int64_t n_chunks = (m.rows + chunk - 1) / chunk;
  auto task = [&](int64_t i) {
    const int64_t r0 = i * chunk, r1 = std::min(m.rows, r0 + chunk);
    kernels::DenseGemv(m.type, m.data, m.cols, r0, r1, x, m.cols, n, y, m.rows);
  };
  kernels::ParallelFor(pool_, n_chunks, task);
  if (stats != nullptr) stats->dense_bytes += m.bytes();
}

void Model::Attention(int64_t layer, std::span<const ForwardToken> tokens) {
  const ModelConfig& c = config_;
  const int64_t q_dim = c.n_head * c.head_dim;
  const int64_t group = c.n_head / c.n_head_kv;
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  auto task = [&](int64_t i) {
    const int64_t t = i / c.n_head, head = i % c.n_head;
    const ForwardToken& tok = tokens[t];
    const float* q = q_.data() + t * q_dim + head * c.head_dim;
    const int64_t kv_off = (head / group) * c.head_dim;
    thread_local std::vector<float> scores;
    scores.resize(static_cast<size_t>(tok.pos + 1));
    float max = -INFINITY;
    for (int64_t p = 0; p <= tok.pos; ++p) {
      const float* key = tok.cache->key(layer, p) + kv_off;
      float s = 0;
      for (int64_t d = 0; d < c.head_dim; ++d) s += q[d] * key[d];
      scores[p] = s * scale;
      max = std::max(max, scores[p]);
    }
    double sum = 0;
    for (int64_t p = 0; p <= tok.pos; ++p) {
      scores[p] = std::exp(scores[p] - max);
      sum += scores[p];
    }
    float* out = attn_.data() + t * q_dim + head * c.head_dim;
    std::fill(out, out + c.head_dim, 0.0f);
    const float inv = static_cast<float>(1.0 / sum);
    for (int64_t p = 0; p <= tok.pos; ++p) {
      const float w = scores[p] * inv;
      const float* value = tok.cache->value(layer, p) + kv_off;
      for (int64_t d = 0; d < c.head_dim; ++d) out[d] += w * value[d];
    }
  };
  const int64_t n_tasks = static_cast<int64_t>(tokens.size()) * c.n_head;
  kernels::ParallelFor(pool_, n_tasks, task);
}

absl::Status Model::Forward(std::span<const ForwardToken> tokens, float* logits, ForwardStats* stats) {
  RETURN_IF_ERROR(CheckBatch(tokens));
  const ModelConfig& c = config_;
  const int n = static_cast<int>(tokens.size());
  if (n == 0) return absl::OkStatus();
  EnsureCapacity(n);
  const int64_t E = c.n_embd, q_dim = c.n_head * c.head_dim, kv_dim = c.n_head_kv * c.head_dim;
  const int k = static_cast<int>(c.n_expert_used);
  const ModelWeights& w = *weights_;
  const uint64_t embd_row = gguf::RowBytes(w.token_embd->type, E).value();
  for (int t = 0; t < n; ++t) {
    RETURN_IF_ERROR(gguf::Dequantize(w.token_embd->type, w.token_embd->data + embd_row * tokens[t].token,
                                     x_.data() + t * E, E));
  }
  const int64_t half = c.head_dim / 2;
  for (int t = 0; t < n; ++t) {
    RopeAngles(rope_frequencies_, tokens[t].pos, rope_cos_.data() + t * half, rope_sin_.data() + t * half);
  }
  for (int64_t l = 0; l < c.n_layer; ++l) {
    const LayerWeights& L = w.layers[l];
    for (int t = 0; t < n; ++t) RmsNorm(x_.data() + t * E, L.attn_norm.data(), E, c.rms_norm_eps, h_.data() + t * E);
    Project(L.wq, h_.data(), n, q_.data(), stats);
    Project(L.wk, h_.data(), n, k_.data(), stats);
    Project(L.wv, h_.data(), n, v_.data(), stats);
    for (int t = 0; t < n; ++t) {
      const float* cos = rope_cos_.data() + t * half;
      const float* sin = rope_sin_.data() + t * half;
      for (int64_t hd = 0; hd < c.n_head; ++hd) {
        float* qh = q_.data() + t * q_dim + hd * c.head_dim;
        if (c.qk_norm) RmsNorm(qh, L.q_norm.data(), c.head_dim, c.rms_norm_eps, qh);
        Rope(qh, c.head_dim, cos, sin, c.rope_style);
      }
      for (int64_t hd = 0; hd < c.n_head_kv; ++hd) {
        float* kh = k_.data() + t * kv_dim + hd * c.head_dim;
        if (c.qk_norm) RmsNorm(kh, L.k_norm.data(), c.head_dim, c.rms_norm_eps, kh);
        Rope(kh, c.head_dim, cos, sin, c.rope_style);
      }
      std::copy_n(k_.data() + t * kv_dim, kv_dim, tokens[t].cache->key(l, tokens[t].pos));
      std::copy_n(v_.data() + t * kv_dim, kv_dim, tokens[t].cache->value(l, tokens[t].pos));
    }
    Attention(l, tokens);
    Project(L.wo, attn_.data(), n, o_.data(), stats);
    for (int64_t i = 0; i < n * E; ++i) x_[i] += o_[i];

    for (int t = 0; t < n; ++t) RmsNorm(x_.data() + t * E, L.ffn_norm.data(), E, c.rms_norm_eps, h_.data() + t * E);
    Project(L.router, h_.data(), n, router_.data(), stats);
    for (int t = 0; t < n; ++t) {
      float* probs = router_.data() + t * c.n_expert;
      Softmax(probs, c.n_expert);
      int32_t* ids = ids_.data() + t * k;
      TopK(probs, c.n_expert, k, ids);
      double sum = 0;
      for (int j = 0; j < k; ++j) sum += probs[ids[j]];
      for (int j = 0; j < k; ++j) weights_buf_[t * k + j] = static_cast<float>(probs[ids[j]] / sum);
    }
    RETURN_IF_ERROR(dispatch_->Run(moe_index_[l], h_.data(), n, ids_.data(), k, parts_.data(),
                                   stats == nullptr ? nullptr : &stats->dispatch));
    // Combine: the router weight is applied here and only here.
    for (int t = 0; t < n; ++t) {
      float* xt = x_.data() + t * E;
      for (int j = 0; j < k; ++j) {
        const float wj = weights_buf_[t * k + j];
        const float* part = parts_.data() + (static_cast<int64_t>(t) * k + j) * E;
        for (int64_t i = 0; i < E; ++i) xt[i] += wj * part[i];
      }
    }
  }
  int n_out = 0;
  for (int t = 0; t < n; ++t) {
    if (!tokens[t].want_logits) continue;
    RmsNorm(x_.data() + t * E, w.output_norm.data(), E, c.rms_norm_eps, final_.data() + n_out * E);
    ++n_out;
  }
  if (n_out > 0) Project(w.output, final_.data(), n_out, logits, stats);
  return absl::OkStatus();
}

}  // namespace strata::model
