#include "engine/model/weights.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/gguf/ggml_types.h"
#include "engine/status_macros.h"

namespace strata::model {
namespace {

absl::StatusOr<const gguf::TensorInfo*> Find(const gguf::GgufFile& file, const std::string& name,
                                             const std::vector<int64_t>& ne) {
  const gguf::TensorInfo* t = file.FindTensor(name);
  if (t == nullptr) return absl::NotFoundError(absl::StrCat(file.path(), ": tensor '", name, "' is missing"));
  std::vector<int64_t> actual = t->ne;  // trailing dimensions of 1 are ggml padding ([n_embd, 1] is [n_embd])
  while (actual.size() > ne.size() && actual.back() == 1) actual.pop_back();
  if (actual != ne) {
    return absl::InvalidArgumentError(absl::StrCat(file.path(), ": tensor '", name, "' has shape [",
                                                   absl::StrJoin(t->ne, ", "), "], expected [", absl::StrJoin(ne, ", "),
                                                   "]"));
  }
  auto info = gguf::GetTypeInfo(static_cast<uint32_t>(t->type));
  if (!info.ok() || !info->can_dequantize) {
    return absl::UnimplementedError(absl::StrCat(file.path(), ": tensor '", name, "' has type ",
                                                 gguf::TypeName(static_cast<uint32_t>(t->type)),
                                                 ", which Strata cannot decode"));
  }
  return t;
}

// A tensor of shape `ne` (a vector, or [width, n] for n vectors), widened to f32.
absl::StatusOr<std::vector<float>> LoadFloats(const gguf::GgufFile& file, const std::string& name,
                                              const std::vector<int64_t>& ne) {
  ASSIGN_OR_RETURN(const gguf::TensorInfo* t, Find(file, name, ne));
  int64_t n = 1;
  for (int64_t e : ne) n *= e;
  std::vector<float> v(static_cast<size_t>(n));
  RETURN_IF_ERROR(gguf::Dequantize(t->type, t->data, v.data(), n));
  return v;
}

absl::StatusOr<std::vector<float>> LoadVector(const gguf::GgufFile& file, const std::string& name, int64_t n) {
  return LoadFloats(file, name, {n});
}

// `force_f32`: widen whatever the type (the router is small and read in f32).
absl::StatusOr<DenseMatrix> LoadMatrix(const gguf::GgufFile& file, const std::string& name, int64_t cols,
                                       int64_t rows, bool force_f32 = false) {
  ASSIGN_OR_RETURN(const gguf::TensorInfo* t, Find(file, name, {cols, rows}));
  DenseMatrix m;
  m.name = name;
  m.rows = rows;
  m.cols = cols;
  if (!force_f32) {
    switch (t->type) {
      case gguf::GgmlType::kF32:
        m.type = kernels::DenseType::kF32;
        m.data = t->data;
        return m;
      case gguf::GgmlType::kF16:
        m.type = kernels::DenseType::kF16;
        m.data = t->data;
        return m;
      case gguf::GgmlType::kBF16:
        m.type = kernels::DenseType::kBF16;
        m.data = t->data;
        return m;
      case gguf::GgmlType::kQ8_0:
        m.type = kernels::DenseType::kQ8_0;
        m.data = t->data;
        return m;
      default:
        break;
    }
  }
  m.type = kernels::DenseType::kF32;
  m.owned.resize(static_cast<size_t>(rows * cols) * sizeof(float));
  RETURN_IF_ERROR(gguf::Dequantize(t->type, t->data, reinterpret_cast<float*>(m.owned.data()), rows * cols));
  m.data = m.owned.data();
  return m;
}

// blk.N.ffn_{gate,up,down}<suffix>.weight of width ff.
absl::StatusOr<FfnWeights> LoadFfn(const gguf::GgufFile& file, const std::string& prefix, const char* suffix,
                                   int64_t n_embd, int64_t ff) {
  FfnWeights f;
  ASSIGN_OR_RETURN(f.gate, LoadMatrix(file, absl::StrCat(prefix, "ffn_gate", suffix, ".weight"), n_embd, ff));
  ASSIGN_OR_RETURN(f.up, LoadMatrix(file, absl::StrCat(prefix, "ffn_up", suffix, ".weight"), n_embd, ff));
  ASSIGN_OR_RETURN(f.down, LoadMatrix(file, absl::StrCat(prefix, "ffn_down", suffix, ".weight"), ff, n_embd));
  return f;
}

// The GQA attention tensors of block `prefix`; adds the bytes a token reads.
absl::Status LoadGqaAttention(const gguf::GgufFile& dense, const std::string& p, const ModelConfig& c,
                              LayerWeights* layer, uint64_t* per_token) {
  LayerWeights& L = *layer;
  const int64_t q_dim = c.n_head * c.head_dim, kv_dim = c.n_head_kv * c.head_dim;
  ASSIGN_OR_RETURN(L.wq, LoadMatrix(dense, p + "attn_q.weight", c.n_embd, q_dim));
  ASSIGN_OR_RETURN(L.wk, LoadMatrix(dense, p + "attn_k.weight", c.n_embd, kv_dim));
  ASSIGN_OR_RETURN(L.wv, LoadMatrix(dense, p + "attn_v.weight", c.n_embd, kv_dim));
  ASSIGN_OR_RETURN(L.wo, LoadMatrix(dense, p + "attn_output.weight", q_dim, c.n_embd));
  if (c.qkv_bias) {
    ASSIGN_OR_RETURN(L.bq, LoadVector(dense, p + "attn_q.bias", q_dim));
    ASSIGN_OR_RETURN(L.bk, LoadVector(dense, p + "attn_k.bias", kv_dim));
    ASSIGN_OR_RETURN(L.bv, LoadVector(dense, p + "attn_v.bias", kv_dim));
  }
  if (c.attn_output_bias) {
    ASSIGN_OR_RETURN(L.bo, LoadVector(dense, p + "attn_output.bias", c.n_embd));
  }
  if (c.attn_sinks) {
    ASSIGN_OR_RETURN(L.attn_sinks, LoadVector(dense, p + "attn_sinks.weight", c.n_head));
  }
  if (c.qk_norm || c.qk_norm_whole) {
    ASSIGN_OR_RETURN(L.q_norm, LoadVector(dense, p + "attn_q_norm.weight", c.qk_norm ? c.head_dim : q_dim));
    ASSIGN_OR_RETURN(L.k_norm, LoadVector(dense, p + "attn_k_norm.weight", c.qk_norm ? c.head_dim : kv_dim));
  } else {
    // A q/k norm the configuration does not switch on is never ignored (glm4moe's comes from block 0's tensors).
    for (const char* norm : {"attn_q_norm.weight", "attn_k_norm.weight"}) {
      if (dense.FindTensor(p + norm) == nullptr) continue;
      return absl::UnimplementedError(absl::StrCat(dense.path(), ": tensor '", p, norm, "' is a q/k norm, which ",
                                                   "Strata does not implement for ", c.arch, " here"));
    }
  }
  *per_token += L.wq.bytes() + L.wk.bytes() + L.wv.bytes() + L.wo.bytes();
  return absl::OkStatus();
}

// attn_kv_b as one f32 matrix and W_UK^T per head, from whichever form the file has: attn_kv_b whole, or split
// into attn_k_b ([nope, kv_lora, n_head]: W_UK^T per head) and attn_v_b ([kv_lora, v, n_head]: W_UV per head).
absl::Status LoadLatentUpProjections(const gguf::GgufFile& file, const std::string& prefix, const ModelConfig& c,
                                     LatentAttentionWeights* m) {
  const LatentAttention& a = c.mla;
  const int64_t rank = a.kv_lora_rank, per_head = a.nope_dim + a.v_dim;
  m->uk_t.resize(static_cast<size_t>(c.n_head * rank * a.nope_dim));
  if (file.FindTensor(prefix + "attn_kv_b.weight") != nullptr) {
    ASSIGN_OR_RETURN(m->kv_b, LoadMatrix(file, prefix + "attn_kv_b.weight", rank, c.n_head * per_head));
    const gguf::TensorInfo* kv_b = file.FindTensor(prefix + "attn_kv_b.weight");
    std::vector<float> wide(static_cast<size_t>(c.n_head * per_head * rank));
    RETURN_IF_ERROR(gguf::Dequantize(kv_b->type, kv_b->data, wide.data(), static_cast<int64_t>(wide.size())));
    // uk_t[h][r][d] = kv_b[h * per_head + d][r].
    for (int64_t h = 0; h < c.n_head; ++h) {
      for (int64_t d = 0; d < a.nope_dim; ++d) {
        const float* row = wide.data() + (h * per_head + d) * rank;
        for (int64_t r = 0; r < rank; ++r) m->uk_t[(h * rank + r) * a.nope_dim + d] = row[r];
      }
    }
    return absl::OkStatus();
  }
  if (file.FindTensor(prefix + "attn_k_b.weight") == nullptr) {
    return absl::NotFoundError(absl::StrCat(file.path(), ": tensor '", prefix, "attn_kv_b.weight' is missing (nor ",
                                            "is it split into attn_k_b / attn_v_b)"));
  }
  ASSIGN_OR_RETURN(const gguf::TensorInfo* k_b, Find(file, prefix + "attn_k_b.weight", {a.nope_dim, rank, c.n_head}));
  ASSIGN_OR_RETURN(const gguf::TensorInfo* v_b, Find(file, prefix + "attn_v_b.weight", {rank, a.v_dim, c.n_head}));
  RETURN_IF_ERROR(gguf::Dequantize(k_b->type, k_b->data, m->uk_t.data(), static_cast<int64_t>(m->uk_t.size())));
  std::vector<float> uv(static_cast<size_t>(c.n_head * a.v_dim * rank));
  RETURN_IF_ERROR(gguf::Dequantize(v_b->type, v_b->data, uv.data(), static_cast<int64_t>(uv.size())));
  // kv_b rebuilt in f32: per head W_UK's rows (uk_t transposed back), then W_UV's.
  DenseMatrix& kv_b = m->kv_b;
  kv_b.name = prefix + "attn_k_b.weight + attn_v_b.weight";
  kv_b.type = kernels::DenseType::kF32;
  kv_b.rows = c.n_head * per_head;
  kv_b.cols = rank;
  kv_b.owned.resize(static_cast<size_t>(kv_b.rows * rank) * sizeof(float));
  float* out = reinterpret_cast<float*>(kv_b.owned.data());
  for (int64_t h = 0; h < c.n_head; ++h) {
    for (int64_t d = 0; d < a.nope_dim; ++d) {
      for (int64_t r = 0; r < rank; ++r) out[(h * per_head + d) * rank + r] = m->uk_t[(h * rank + r) * a.nope_dim + d];
    }
    std::copy_n(uv.data() + h * a.v_dim * rank, a.v_dim * rank, out + (h * per_head + a.nope_dim) * rank);
  }
  kv_b.data = kv_b.owned.data();
  return absl::OkStatus();
}

// The latent attention tensors of block `prefix` (and wq without q LoRA); adds the bytes a token reads.
absl::Status LoadLatentAttention(const gguf::GgufFile& file, const std::string& prefix, const ModelConfig& c,
                                 LayerWeights* L, uint64_t* per_token) {
  const LatentAttention& a = c.mla;
  LatentAttentionWeights& m = L->mla;
  const int64_t q_dim = c.n_head * c.head_dim;
  if (a.q_lora_rank > 0) {
    ASSIGN_OR_RETURN(m.q_a, LoadMatrix(file, prefix + "attn_q_a.weight", c.n_embd, a.q_lora_rank));
    ASSIGN_OR_RETURN(m.q_a_norm, LoadVector(file, prefix + "attn_q_a_norm.weight", a.q_lora_rank));
    ASSIGN_OR_RETURN(m.q_b, LoadMatrix(file, prefix + "attn_q_b.weight", a.q_lora_rank, q_dim));
    *per_token += m.q_a.bytes() + m.q_b.bytes();
  } else {
    ASSIGN_OR_RETURN(L->wq, LoadMatrix(file, prefix + "attn_q.weight", c.n_embd, q_dim));
    *per_token += L->wq.bytes();
  }
  ASSIGN_OR_RETURN(m.kv_a, LoadMatrix(file, prefix + "attn_kv_a_mqa.weight", c.n_embd, a.kv_lora_rank + c.rope_dim));
  ASSIGN_OR_RETURN(m.kv_a_norm, LoadVector(file, prefix + "attn_kv_a_norm.weight", a.kv_lora_rank));
  RETURN_IF_ERROR(LoadLatentUpProjections(file, prefix, c, &m));
  ASSIGN_OR_RETURN(L->wo, LoadMatrix(file, prefix + "attn_output.weight", c.n_head * a.v_dim, c.n_embd));
  *per_token += m.kv_a.bytes() + m.kv_b.bytes() + L->wo.bytes();
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<ModelWeights>> LoadWeights(const gguf::GgufFile& dense, const ModelConfig& c) {
  auto w = std::make_unique<ModelWeights>();
  ASSIGN_OR_RETURN(w->token_embd, Find(dense, "token_embd.weight", {c.n_embd, c.n_vocab}));
  uint64_t per_token = 0;
  for (int64_t l = 0; l < c.n_layer; ++l) {
    const std::string p = absl::StrCat("blk.", l, ".");
    LayerWeights L;
    ASSIGN_OR_RETURN(L.attn_norm, LoadVector(dense, p + "attn_norm.weight", c.n_embd));
    if (c.mla.kv_lora_rank > 0) {
      RETURN_IF_ERROR(LoadLatentAttention(dense, p, c, &L, &per_token));
    } else {
      RETURN_IF_ERROR(LoadGqaAttention(dense, p, c, &L, &per_token));
    }
    ASSIGN_OR_RETURN(L.ffn_norm, LoadVector(dense, absl::StrCat(p, c.ffn_norm_name, ".weight"), c.n_embd));
    if (l < c.n_dense_lead) {
      ASSIGN_OR_RETURN(L.dense_ffn, LoadFfn(dense, p, "", c.n_embd, c.dense_ff));
      per_token += L.dense_ffn.gate.bytes() + L.dense_ffn.up.bytes() + L.dense_ffn.down.bytes();
      w->layers.push_back(std::move(L));
      continue;
    }
    ASSIGN_OR_RETURN(L.router, LoadMatrix(dense, p + "ffn_gate_inp.weight", c.n_embd, c.n_expert, /*force_f32=*/true));
    if (c.router_score_bias) {
      ASSIGN_OR_RETURN(L.router_bias, LoadVector(dense, p + "exp_probs_b.bias", c.n_expert));
    } else if (dense.FindTensor(p + "exp_probs_b.bias") != nullptr) {
      return absl::UnimplementedError(absl::StrCat(dense.path(), ": tensor '", p, "exp_probs_b.bias' is a score-",
                                                   "correction bias, which Strata uses with sigmoid routers only"));
    }
    if (c.router_logit_bias) {
      ASSIGN_OR_RETURN(L.router_logit_bias, LoadVector(dense, p + "ffn_gate_inp.bias", c.n_expert));
    }
    if (c.expert_biases) {
      ExpertBiases& b = L.expert_biases;
      ASSIGN_OR_RETURN(b.gate, LoadFloats(dense, p + "ffn_gate_exps.bias", {c.expert_ff, c.n_expert}));
      ASSIGN_OR_RETURN(b.up, LoadFloats(dense, p + "ffn_up_exps.bias", {c.expert_ff, c.n_expert}));
      ASSIGN_OR_RETURN(b.down, LoadFloats(dense, p + "ffn_down_exps.bias", {c.n_embd, c.n_expert}));
    }
    per_token += L.router.bytes();
    if (c.shared_expert_ff > 0) {
      ASSIGN_OR_RETURN(L.shared, LoadFfn(dense, p, "_shexp", c.n_embd, c.shared_expert_ff));
      if (c.shared_expert_gate) {
        ASSIGN_OR_RETURN(L.shared.gate_inp, LoadVector(dense, p + "ffn_gate_inp_shexp.weight", c.n_embd));
      }
      per_token += L.shared.gate.bytes() + L.shared.up.bytes() + L.shared.down.bytes();
    }
    w->layers.push_back(std::move(L));
  }
  ASSIGN_OR_RETURN(w->output_norm, LoadVector(dense, "output_norm.weight", c.n_embd));
  if (dense.FindTensor("output.weight") != nullptr) {
    ASSIGN_OR_RETURN(w->output, LoadMatrix(dense, "output.weight", c.n_embd, c.n_vocab));
  } else {
    ASSIGN_OR_RETURN(w->output, LoadMatrix(dense, "token_embd.weight", c.n_embd, c.n_vocab));
  }
  per_token += w->output.bytes();
  w->dense_bytes_per_token = per_token;
  return w;
}

}  // namespace strata::model
