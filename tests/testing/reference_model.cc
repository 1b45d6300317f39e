#include "tests/testing/reference_model.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <fstream>
#include <utility>

#include "absl/memory/memory.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/gguf/gguf_file.h"
#include "engine/pack/pack_format.h"
#include "engine/status_macros.h"
#include "kernels/cpu/quantize.h"
#include "tests/testing/reference_deepseek2.h"

namespace strata::testing {
namespace reference_internal {

std::vector<float> MatVec(const ReferenceModel::Matrix& m, std::span<const float> x) {
  std::vector<float> y(m.rows);
  for (int64_t r = 0; r < m.rows; ++r) {
    double acc = 0;
    for (int64_t c = 0; c < m.cols; ++c) acc += static_cast<double>(m.w[r * m.cols + c]) * x[c];
    y[r] = static_cast<float>(acc);
  }
  return y;
}

void RmsNorm(std::span<float> x, const std::vector<float>& weight, double eps) {
  double sum_sq = 0;
  for (float v : x) sum_sq += static_cast<double>(v) * v;
  const double scale = 1.0 / std::sqrt(sum_sq / static_cast<double>(x.size()) + eps);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(x[i] * scale) * weight[i];
}

}  // namespace reference_internal

namespace {

using reference_internal::MatVec;
using reference_internal::RmsNorm;

using Hparams = ReferenceModel::Hparams;
using Matrix = ReferenceModel::Matrix;

absl::Status Prefixed(const std::string& where, const absl::Status& s) {
  return absl::Status(s.code(), absl::StrCat(where, ": ", s.message()));
}

std::string Shape(std::span<const int64_t> ne) { return absl::StrCat("[", absl::StrJoin(ne, ", "), "]"); }

// Reads f32 copies of tensors from a GGUF, checking each one's shape.
class TensorLoader {
 public:
  TensorLoader(const gguf::GgufModel& model, std::string path) : model_(model), path_(std::move(path)) {}

  bool Has(const std::string& name) const { return model_.FindTensor(name) != nullptr; }

  absl::StatusOr<std::vector<float>> Load(const std::string& name, std::vector<int64_t> ne) const {
    const gguf::TensorInfo* t = model_.FindTensor(name);
    if (t == nullptr) return absl::NotFoundError(absl::StrCat(path_, ": missing tensor '", name, "'"));
    std::vector<int64_t> actual = t->ne;
    while (actual.size() > ne.size() && actual.back() == 1) actual.pop_back();
    if (actual != ne) {
      return absl::InvalidArgumentError(
          absl::StrCat(path_, ": tensor '", name, "' has shape ", Shape(t->ne), ", expected ", Shape(ne)));
    }
    auto data = gguf::DequantizeTensor(*t);
    if (!data.ok()) return Prefixed(path_, data.status());
    return std::move(*data);
  }

  // A ggml weight of ne = [cols, rows], whatever its storage type: row r is the gguf::RowBytes(type, cols)
  // bytes at r times that offset, decoded on its own with gguf::Dequantize (ggml's block formats). Dense
  // weights kept as f16, bf16 or q8_0 are read this way, independently of the engine's dense kernels.
  absl::StatusOr<Matrix> LoadMatrix(const std::string& name, int64_t cols, int64_t rows) const {
    const gguf::TensorInfo* t = model_.FindTensor(name);
    if (t == nullptr) return absl::NotFoundError(absl::StrCat(path_, ": missing tensor '", name, "'"));
    std::vector<int64_t> actual = t->ne;
    while (actual.size() > 2 && actual.back() == 1) actual.pop_back();
    if (actual != std::vector<int64_t>{cols, rows}) {
      return absl::InvalidArgumentError(absl::StrCat(path_, ": tensor '", name, "' has shape ", Shape(t->ne),
                                                     ", expected ", Shape(std::vector<int64_t>{cols, rows})));
    }
    if (absl::Status s = gguf::CheckDecodable(*t); !s.ok()) return Prefixed(path_, s);
    absl::StatusOr<uint64_t> row_bytes = gguf::RowBytes(t->type, cols);
    if (!row_bytes.ok()) return Prefixed(absl::StrCat(path_, ": tensor '", name, "'"), row_bytes.status());
    if (t->data == nullptr || t->bytes != *row_bytes * static_cast<uint64_t>(rows)) {
      return absl::InvalidArgumentError(absl::StrCat(path_, ": tensor '", name, "' holds ", t->bytes, " bytes, not ",
                                                     rows, " rows of ", *row_bytes));
    }
    Matrix m{rows, cols, std::vector<float>(static_cast<size_t>(rows * cols))};
    for (int64_t r = 0; r < rows; ++r) {
      absl::Status s = gguf::Dequantize(t->type, t->data + r * *row_bytes, m.w.data() + r * cols, cols);
      if (!s.ok()) return Prefixed(absl::StrCat(path_, ": tensor '", name, "' row ", r), s);
    }
    return m;
  }

 private:
  const gguf::GgufModel& model_;
  std::string path_;
};

absl::StatusOr<Hparams> ReadHparams(const gguf::Metadata& md, const std::string& path) {
  Hparams hp;
  auto fail = [&](const absl::Status& s) { return Prefixed(path, s); };
  auto uint_key = [&](const std::string& key) -> absl::StatusOr<int64_t> {
    auto v = md.GetUint(key);
    if (!v.ok()) return fail(v.status());
    if (*v == 0 || *v > (uint64_t{1} << 30)) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": ", key, " is ", *v, ", expected 1 .. 2^30"));
    }
    return static_cast<int64_t>(*v);
  };
  auto uint_or = [&](const std::string& key, int64_t fallback) -> absl::StatusOr<int64_t> {
    if (!md.Has(key)) return fallback;
    return uint_key(key);
  };

  auto arch = md.GetString("general.architecture");
  if (!arch.ok()) return fail(arch.status());
  hp.arch = *arch;
  if (hp.arch == "qwen3moe") {
    hp.rope_style = RopeStyle::kNeox;
    hp.qk_norm = true;
  } else if (hp.arch == "llama") {
    hp.rope_style = RopeStyle::kNormal;
  } else if (hp.arch == "qwen2moe") {
    hp.rope_style = RopeStyle::kNeox;
    hp.qkv_bias = true;
    hp.renormalize_top_k = false;
  } else if (hp.arch == "olmoe") {
    hp.rope_style = RopeStyle::kNeox;
    hp.qk_norm_whole = true;
    hp.renormalize_top_k = false;
  } else if (hp.arch == "deepseek2") {
    // reference_deepseek2.cc reads the rest.
  } else if (hp.arch == "glm4moe") {
    hp.rope_style = RopeStyle::kNeox;
    hp.qkv_bias = true;
    hp.sigmoid_router = true;
    auto norm = md.GetBoolOr("glm4moe.expert_weights_norm", false);
    if (!norm.ok()) return fail(norm.status());
    hp.renormalize_top_k = *norm;
    auto scale = md.GetFloatOr("glm4moe.expert_weights_scale", 0.0);
    if (!scale.ok()) return fail(scale.status());
    hp.routed_scale = *scale == 0.0 ? 1.0 : *scale;
  } else if (hp.arch == "gpt-oss") {
    hp.rope_style = RopeStyle::kNeox;
    hp.qkv_bias = true;
    hp.gpt_oss = true;
  } else {
    return absl::UnimplementedError(absl::StrCat(path, ": general.architecture is '", hp.arch,
                                                 "'; the reference model knows qwen3moe, llama, qwen2moe, olmoe, "
                                                 "glm4moe, gpt-oss and deepseek2"));
  }
  const std::string a = hp.arch + ".";
  ASSIGN_OR_RETURN(hp.n_layer, uint_key(a + "block_count"));
  // The last nextn_predict_layers blocks are multi-token-prediction blocks, which the model's forward pass
  // does not run.
  auto nextn = md.GetUintOr(a + "nextn_predict_layers", 0);
  if (!nextn.ok()) return fail(nextn.status());
  if (*nextn >= static_cast<uint64_t>(hp.n_layer)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", a, "nextn_predict_layers ", *nextn, " leaves no block"));
  }
  hp.n_layer -= static_cast<int64_t>(*nextn);
  ASSIGN_OR_RETURN(hp.n_embd, uint_key(a + "embedding_length"));
  ASSIGN_OR_RETURN(hp.n_head, uint_key(a + "attention.head_count"));
  ASSIGN_OR_RETURN(hp.n_head_kv, uint_or(a + "attention.head_count_kv", hp.n_head));
  ASSIGN_OR_RETURN(hp.head_dim, uint_or(a + "attention.key_length", hp.n_embd / hp.n_head));
  ASSIGN_OR_RETURN(const int64_t value_length, uint_or(a + "attention.value_length", hp.head_dim));
  ASSIGN_OR_RETURN(const int64_t n_rot, uint_or(a + "rope.dimension_count", hp.head_dim));
  ASSIGN_OR_RETURN(hp.n_expert, uint_or(a + "expert_count", 0));
  if (hp.n_expert == 0) {
    return absl::UnimplementedError(absl::StrCat(path, ": ", a, "expert_count is absent: not a MoE model"));
  }
  ASSIGN_OR_RETURN(hp.n_expert_used, uint_key(a + "expert_used_count"));
  auto base = md.GetFloatOr(a + "rope.freq_base", 10000.0);
  if (!base.ok()) return fail(base.status());
  hp.rope_freq_base = *base;
  auto eps = md.GetFloat(a + "attention.layer_norm_rms_epsilon");
  if (!eps.ok()) return fail(eps.status());
  hp.rms_eps = *eps;
  auto shared = md.GetUintOr(a + "expert_shared_count", 0);
  if (!shared.ok()) return fail(shared.status());
  if (hp.arch == "deepseek2") {
    RETURN_IF_ERROR(reference_internal::ReadDeepseek2Hparams(md, path, &hp));
    return hp;
  }
  if (hp.arch == "qwen2moe") {
    // llama.cpp: expert_shared_feed_forward_length, else feed_forward_length.
    const std::string key = md.Has(a + "expert_shared_feed_forward_length") ? a + "expert_shared_feed_forward_length"
                                                                              : a + "feed_forward_length";
    ASSIGN_OR_RETURN(hp.shared_ff, uint_key(key));
  }
  if (hp.arch == "glm4moe") {
    // llama.cpp: the shared expert is expert_shared_count experts of expert_feed_forward_length wide.
    ASSIGN_OR_RETURN(const int64_t expert_ff, uint_key(a + "expert_feed_forward_length"));
    hp.shared_ff = expert_ff * static_cast<int64_t>(*shared);
    auto lead = md.GetUintOr(a + "leading_dense_block_count", 0);
    if (!lead.ok()) return fail(lead.status());
    hp.n_dense_lead = static_cast<int64_t>(*lead);
    if (hp.n_dense_lead > 0) {
      ASSIGN_OR_RETURN(hp.dense_ff, uint_key(a + "feed_forward_length"));
    }
    if (hp.n_dense_lead >= hp.n_layer) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": ", a, "leading_dense_block_count ", hp.n_dense_lead,
                                                     " leaves no MoE block"));
    }
  }
  hp.rope_dim = n_rot;
  if (hp.gpt_oss) {
    ASSIGN_OR_RETURN(hp.sliding_window, uint_key(a + "attention.sliding_window"));
  }
  auto scaling = md.GetFloatOr(a + "rope.scaling.factor", 0.0);
  if (!scaling.ok()) return fail(scaling.status());
  auto scaling_type = md.Has(a + "rope.scaling.type") ? md.GetString(a + "rope.scaling.type") : std::string("none");
  if (!scaling_type.ok()) return fail(scaling_type.status());
  const bool yarn = *scaling_type == "yarn";
  if (yarn) {
    // llama.cpp's defaults: original context = context_length, beta_fast 32, beta_slow 1, attn_factor 1.
    hp.yarn.factor = *scaling;
    ASSIGN_OR_RETURN(const int64_t n_ctx, uint_key(a + "context_length"));
    ASSIGN_OR_RETURN(hp.yarn.original_context, uint_or(a + "rope.scaling.original_context_length", n_ctx));
    const std::pair<const char*, double*> floats[] = {{"rope.scaling.yarn_beta_fast", &hp.yarn.beta_fast},
                                                      {"rope.scaling.yarn_beta_slow", &hp.yarn.beta_slow},
                                                      {"rope.scaling.yarn_attn_factor", &hp.yarn.attn_factor}};
    for (const auto& [key, out] : floats) {
      auto v = md.GetFloatOr(a + key, *out);
      if (!v.ok()) return fail(v.status());
      *out = *v;
    }
    if (!(hp.yarn.factor > 1.0)) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": ", a, "rope.scaling.factor is ", hp.yarn.factor,
                                                     " with yarn; expected above 1"));
    }
  }

  const bool partial_rope = hp.arch == "glm4moe" && n_rot < hp.head_dim && n_rot % 2 == 0;
  if (hp.head_dim % 2 != 0 || value_length != hp.head_dim || (n_rot != hp.head_dim && !partial_rope)) {
    return absl::UnimplementedError(absl::StrCat(path, ": key_length ", hp.head_dim, ", value_length ",
                                                 value_length, ", rope.dimension_count ", n_rot,
                                                 "; expected all equal and even"));
  }
  if (hp.n_head % hp.n_head_kv != 0) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", a, "attention.head_count ", hp.n_head,
                                                   " is not a multiple of head_count_kv ", hp.n_head_kv));
  }
  if (hp.n_expert_used > hp.n_expert) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", a, "expert_used_count ", hp.n_expert_used,
                                                   " exceeds expert_count ", hp.n_expert));
  }
  if (*shared != 0 && hp.shared_ff == 0) {
    return absl::UnimplementedError(absl::StrCat(path, ": ", a, "expert_shared_count is ", *shared,
                                                 "; the reference model has no shared experts"));
  }
  if (!yarn && *scaling != 0.0 && *scaling != 1.0) {
    return absl::UnimplementedError(
        absl::StrCat(path, ": ", a, "rope.scaling.factor is ", *scaling, "; RoPE scaling is not implemented"));
  }
  if (!(hp.rms_eps > 0.0) || !(hp.rope_freq_base > 0.0)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": rms epsilon ", hp.rms_eps, " and rope.freq_base ",
                                                   hp.rope_freq_base, " must be positive"));
  }
  return hp;
}

// GQA attention tensors of block `p`.
absl::Status LoadAttention(const TensorLoader& loader, const std::string& p, const Hparams& hp,
                           ReferenceModel::Layer* layer) {
  const int64_t d = hp.n_embd, q_dim = hp.n_head * hp.head_dim, kv_dim = hp.n_head_kv * hp.head_dim;
  ASSIGN_OR_RETURN(layer->wq, loader.LoadMatrix(p + "attn_q.weight", d, q_dim));
  ASSIGN_OR_RETURN(layer->wk, loader.LoadMatrix(p + "attn_k.weight", d, kv_dim));
  ASSIGN_OR_RETURN(layer->wv, loader.LoadMatrix(p + "attn_v.weight", d, kv_dim));
  ASSIGN_OR_RETURN(layer->wo, loader.LoadMatrix(p + "attn_output.weight", q_dim, d));
  if (hp.qkv_bias) {
    ASSIGN_OR_RETURN(layer->bq, loader.Load(p + "attn_q.bias", {q_dim}));
    ASSIGN_OR_RETURN(layer->bk, loader.Load(p + "attn_k.bias", {kv_dim}));
    ASSIGN_OR_RETURN(layer->bv, loader.Load(p + "attn_v.bias", {kv_dim}));
  }
  if (hp.qk_norm) {
    ASSIGN_OR_RETURN(layer->q_norm, loader.Load(p + "attn_q_norm.weight", {hp.head_dim}));
    ASSIGN_OR_RETURN(layer->k_norm, loader.Load(p + "attn_k_norm.weight", {hp.head_dim}));
  }
  if (hp.qk_norm_whole) {
    ASSIGN_OR_RETURN(layer->q_norm, loader.Load(p + "attn_q_norm.weight", {q_dim}));
    ASSIGN_OR_RETURN(layer->k_norm, loader.Load(p + "attn_k_norm.weight", {kv_dim}));
  }
  return absl::OkStatus();
}

// deepseek2's latent attention tensors of block `p` (attn_q without q LoRA).
absl::Status LoadLatentAttention(const TensorLoader& loader, const std::string& p, const Hparams& hp,
                                 ReferenceModel::Layer* layer) {
  const int64_t d = hp.n_embd, q_dim = hp.n_head * hp.head_dim;
  if (hp.q_lora_rank > 0) {
    ASSIGN_OR_RETURN(layer->q_a, loader.LoadMatrix(p + "attn_q_a.weight", d, hp.q_lora_rank));
    ASSIGN_OR_RETURN(layer->q_a_norm, loader.Load(p + "attn_q_a_norm.weight", {hp.q_lora_rank}));
    ASSIGN_OR_RETURN(layer->q_b, loader.LoadMatrix(p + "attn_q_b.weight", hp.q_lora_rank, q_dim));
  } else {
    ASSIGN_OR_RETURN(layer->wq, loader.LoadMatrix(p + "attn_q.weight", d, q_dim));
  }
  ASSIGN_OR_RETURN(layer->kv_a, loader.LoadMatrix(p + "attn_kv_a_mqa.weight", d, hp.kv_lora_rank + hp.rope_dim));
  ASSIGN_OR_RETURN(layer->kv_a_norm, loader.Load(p + "attn_kv_a_norm.weight", {hp.kv_lora_rank}));
  const int64_t rank = hp.kv_lora_rank, nope = hp.nope_dim, vd = hp.v_dim, per_head = nope + vd;
  if (loader.Has(p + "attn_kv_b.weight") || !loader.Has(p + "attn_k_b.weight")) {
    ASSIGN_OR_RETURN(layer->kv_b, loader.LoadMatrix(p + "attn_kv_b.weight", rank, hp.n_head * per_head));
  } else {
    // Split as newer converters write it: attn_k_b holds each head's W_UK transposed, attn_v_b its W_UV.
    ASSIGN_OR_RETURN(const std::vector<float> k_b, loader.Load(p + "attn_k_b.weight", {nope, rank, hp.n_head}));
    ASSIGN_OR_RETURN(const std::vector<float> v_b, loader.Load(p + "attn_v_b.weight", {rank, vd, hp.n_head}));
    layer->kv_b = Matrix{hp.n_head * per_head, rank, std::vector<float>(hp.n_head * per_head * rank)};
    for (int64_t h = 0; h < hp.n_head; ++h) {
      for (int64_t r = 0; r < rank; ++r) {
        for (int64_t d = 0; d < nope; ++d) layer->kv_b.w[(h * per_head + d) * rank + r] = k_b[(h * rank + r) * nope + d];
        for (int64_t j = 0; j < vd; ++j) {
          layer->kv_b.w[(h * per_head + nope + j) * rank + r] = v_b[(h * vd + j) * rank + r];
        }
      }
    }
  }
  ASSIGN_OR_RETURN(layer->wo, loader.LoadMatrix(p + "attn_output.weight", hp.n_head * hp.v_dim, d));
  return absl::OkStatus();
}

// Everything but the experts. Sets hp->n_vocab from token_embd.weight.
absl::Status LoadDense(const gguf::GgufModel& model, const TensorLoader& loader, const std::string& path,
                       Hparams* hp, ReferenceModel::Weights* w) {
  const gguf::TensorInfo* embd = model.FindTensor("token_embd.weight");
  if (embd == nullptr) return absl::NotFoundError(absl::StrCat(path, ": missing tensor 'token_embd.weight'"));
  if (embd->ne.size() != 2 || embd->ne[0] != hp->n_embd) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": tensor 'token_embd.weight' has shape ", Shape(embd->ne),
                                                   ", expected [", hp->n_embd, ", n_vocab]"));
  }
  hp->n_vocab = embd->ne[1];
  // GLM-4.5 (not Air) normalizes each head of q and k: llama.cpp's glm4-moe.cpp applies attn_q_norm /
  // attn_k_norm (RMSNorm over n_embd_head) where the file has them, after the biases and before RoPE.
  if (hp->arch == "glm4moe" && loader.Has("blk.0.attn_q_norm.weight")) hp->qk_norm = true;
  const int64_t d = hp->n_embd;
  ASSIGN_OR_RETURN(w->token_embd, loader.LoadMatrix("token_embd.weight", d, hp->n_vocab));
  w->layers.resize(hp->n_layer);
  for (int64_t l = 0; l < hp->n_layer; ++l) {
    const std::string p = absl::StrCat("blk.", l, ".");
    ReferenceModel::Layer& layer = w->layers[l];
    ASSIGN_OR_RETURN(layer.attn_norm, loader.Load(p + "attn_norm.weight", {d}));
    if (hp->kv_lora_rank > 0) {
      RETURN_IF_ERROR(LoadLatentAttention(loader, p, *hp, &layer));
    } else {
      RETURN_IF_ERROR(LoadAttention(loader, p, *hp, &layer));
    }
    if (hp->gpt_oss) {
      ASSIGN_OR_RETURN(layer.bo, loader.Load(p + "attn_output.bias", {d}));
      ASSIGN_OR_RETURN(layer.sinks, loader.Load(p + "attn_sinks.weight", {hp->n_head}));
    }
    const bool post_norm = hp->arch == "glm4moe" || hp->gpt_oss;
    ASSIGN_OR_RETURN(layer.ffn_norm, loader.Load(p + (post_norm ? "post_attention_norm.weight" : "ffn_norm.weight"), {d}));
    if (l < hp->n_dense_lead) {
      const int64_t ff = hp->dense_ff;
      ASSIGN_OR_RETURN(layer.dense_ffn.gate, loader.LoadMatrix(p + "ffn_gate.weight", d, ff));
      ASSIGN_OR_RETURN(layer.dense_ffn.up, loader.LoadMatrix(p + "ffn_up.weight", d, ff));
      ASSIGN_OR_RETURN(layer.dense_ffn.down, loader.LoadMatrix(p + "ffn_down.weight", ff, d));
      continue;
    }
    ASSIGN_OR_RETURN(layer.router, loader.LoadMatrix(p + "ffn_gate_inp.weight", d, hp->n_expert));
    if (hp->sigmoid_router) {
      ASSIGN_OR_RETURN(layer.router_bias, loader.Load(p + "exp_probs_b.bias", {hp->n_expert}));
    }
    if (hp->gpt_oss) {
      ASSIGN_OR_RETURN(layer.router_logit_bias, loader.Load(p + "ffn_gate_inp.bias", {hp->n_expert}));
    }
    if (hp->shared_ff > 0) {
      const int64_t ff = hp->shared_ff;
      ASSIGN_OR_RETURN(layer.shared.gate, loader.LoadMatrix(p + "ffn_gate_shexp.weight", d, ff));
      ASSIGN_OR_RETURN(layer.shared.up, loader.LoadMatrix(p + "ffn_up_shexp.weight", d, ff));
      ASSIGN_OR_RETURN(layer.shared.down, loader.LoadMatrix(p + "ffn_down_shexp.weight", ff, d));
      if (hp->arch == "qwen2moe") {
        ASSIGN_OR_RETURN(layer.shared_gate, loader.Load(p + "ffn_gate_inp_shexp.weight", {d}));
      }
    }
  }
  ASSIGN_OR_RETURN(w->output_norm, loader.Load("output_norm.weight", {d}));
  if (loader.Has("output.weight")) {
    ASSIGN_OR_RETURN(w->output, loader.LoadMatrix("output.weight", d, hp->n_vocab));
  } else {
    w->output = w->token_embd;
  }
  return absl::OkStatus();
}

// Rows [e * rows, (e + 1) * rows) of a stack of per-expert matrices.
Matrix Slice(const std::vector<float>& all, int64_t e, int64_t rows, int64_t cols) {
  Matrix m{rows, cols, {}};
  const auto begin = all.begin() + e * rows * cols;
  m.w.assign(begin, begin + rows * cols);
  return m;
}

float Silu(float v) { return static_cast<float>(v / (1.0 + std::exp(-static_cast<double>(v)))); }

// gpt-oss's clamped SwiGLU (ggml_swiglu_oai with alpha 1.702, limit 7), in double.
float ClampedSwiGlu(double g, double u) {
  g = std::min(g, 7.0);
  u = std::clamp(u, -7.0, 7.0);
  return static_cast<float>(g / (1.0 + std::exp(-1.702 * g)) * (u + 1.0));
}

// down(silu(gate h) * up h); with biases (gpt-oss) down(ClampedSwiGlu(gate h + b, up h + b)) + b.
std::vector<float> ExpertForward(const ReferenceModel::Expert& expert, const std::vector<float>& h) {
  const std::vector<float> gate = MatVec(expert.gate, h);
  const std::vector<float> up = MatVec(expert.up, h);
  std::vector<float> act(gate.size());
  const bool biased = !expert.gate_bias.empty();
  for (size_t i = 0; i < act.size(); ++i) {
    act[i] = biased ? ClampedSwiGlu(static_cast<double>(gate[i]) + expert.gate_bias[i],
                                    static_cast<double>(up[i]) + expert.up_bias[i])
                    : Silu(gate[i]) * up[i];
  }
  std::vector<float> out = MatVec(expert.down, act);
  for (size_t i = 0; i < expert.down_bias.size(); ++i) out[i] += expert.down_bias[i];
  return out;
}

// gpt-oss: slices blk.N.ffn_{gate,up,down}_exps.bias ([width, n_expert]) into the loaded experts.
absl::Status LoadExpertBiases(const TensorLoader& loader, const Hparams& hp, ReferenceModel::Weights* w) {
  if (!hp.gpt_oss) return absl::OkStatus();
  for (int64_t l = hp.n_dense_lead; l < hp.n_layer; ++l) {
    const std::string p = absl::StrCat("blk.", l, ".");
    ASSIGN_OR_RETURN(const std::vector<float> gate, loader.Load(p + "ffn_gate_exps.bias", {hp.expert_ff, hp.n_expert}));
    ASSIGN_OR_RETURN(const std::vector<float> up, loader.Load(p + "ffn_up_exps.bias", {hp.expert_ff, hp.n_expert}));
    ASSIGN_OR_RETURN(const std::vector<float> down, loader.Load(p + "ffn_down_exps.bias", {hp.n_embd, hp.n_expert}));
    for (int64_t e = 0; e < hp.n_expert; ++e) {
      ReferenceModel::Expert& x = w->layers[l].experts[e];
      x.gate_bias.assign(gate.begin() + e * hp.expert_ff, gate.begin() + (e + 1) * hp.expert_ff);
      x.up_bias.assign(up.begin() + e * hp.expert_ff, up.begin() + (e + 1) * hp.expert_ff);
      x.down_bias.assign(down.begin() + e * hp.n_embd, down.begin() + (e + 1) * hp.n_embd);
    }
  }
  return absl::OkStatus();
}

}  // namespace

void ApplyRope(RopeStyle style, double freq_base, int64_t pos, std::span<float> head, const Yarn& yarn) {
  const size_t half = head.size() / 2;
  const double d = static_cast<double>(head.size());
  // YaRN's correction range of rotation indices and its magnitude (ggml_rope_yarn_corr_dims, rope_yarn).
  auto corr = [&](double beta) { return d * std::log(yarn.original_context / (beta * 2.0 * M_PI)) / (2.0 * std::log(freq_base)); };
  const bool scaled = yarn.factor != 1.0;
  const double low = scaled ? std::max(0.0, std::floor(corr(yarn.beta_fast))) : 0.0;
  const double high = scaled ? std::min(d - 1.0, std::ceil(corr(yarn.beta_slow))) : 0.0;
  const double magnitude = scaled ? yarn.attn_factor * (1.0 + 0.1 * std::log(yarn.factor)) : 1.0;
  for (size_t i = 0; i < half; ++i) {
    const double theta_extrap = static_cast<double>(pos) * std::pow(freq_base, -2.0 * i / d);
    double theta = theta_extrap;
    if (scaled) {
      const double ramp = 1.0 - std::clamp((static_cast<double>(i) - low) / std::max(0.001, high - low), 0.0, 1.0);
      theta = theta_extrap / yarn.factor * (1.0 - ramp) + theta_extrap * ramp;
    }
    const size_t a = style == RopeStyle::kNormal ? 2 * i : i;
    const size_t b = style == RopeStyle::kNormal ? 2 * i + 1 : i + half;
    const double x0 = head[a], x1 = head[b];
    const double cos = std::cos(theta) * magnitude, sin = std::sin(theta) * magnitude;
    head[a] = static_cast<float>(x0 * cos - x1 * sin);
    head[b] = static_cast<float>(x0 * sin + x1 * cos);
  }
}

absl::StatusOr<std::unique_ptr<ReferenceModel>> ReferenceModel::FromGguf(const std::string& path) {
  ASSIGN_OR_RETURN(std::unique_ptr<gguf::GgufModel> model, gguf::GgufModel::Open(path));
  auto ref = absl::WrapUnique(new ReferenceModel);
  Hparams& hp = ref->hparams_;
  ASSIGN_OR_RETURN(hp, ReadHparams(model->metadata(), path));
  TensorLoader loader(*model, path);
  RETURN_IF_ERROR(LoadDense(*model, loader, path, &hp, &ref->weights_));

  const std::string first_gate = absl::StrCat("blk.", hp.n_dense_lead, ".ffn_gate_exps.weight");
  const gguf::TensorInfo* gate0 = model->FindTensor(first_gate);
  if (gate0 == nullptr || gate0->ne.size() != 3 || gate0->ne[1] <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": expected a 3-D tensor '", first_gate, "' [n_embd, expert_ff, n_expert]"));
  }
  hp.expert_ff = gate0->ne[1];
  const int64_t d = hp.n_embd, ff = hp.expert_ff;
  for (int64_t l = hp.n_dense_lead; l < hp.n_layer; ++l) {
    const std::string p = absl::StrCat("blk.", l, ".");
    ASSIGN_OR_RETURN(const std::vector<float> gate, loader.Load(p + "ffn_gate_exps.weight", {d, ff, hp.n_expert}));
    ASSIGN_OR_RETURN(const std::vector<float> up, loader.Load(p + "ffn_up_exps.weight", {d, ff, hp.n_expert}));
    ASSIGN_OR_RETURN(const std::vector<float> down, loader.Load(p + "ffn_down_exps.weight", {ff, d, hp.n_expert}));
    std::vector<Expert>& experts = ref->weights_.layers[l].experts;
    for (int64_t e = 0; e < hp.n_expert; ++e) {
      experts.push_back({Slice(gate, e, ff, d), Slice(up, e, ff, d), Slice(down, e, d, ff)});
    }
  }
  RETURN_IF_ERROR(LoadExpertBiases(loader, hp, &ref->weights_));
  return ref;
}

absl::StatusOr<std::unique_ptr<ReferenceModel>> ReferenceModel::FromPack(const std::string& pack_dir) {
  ASSIGN_OR_RETURN(const pack::v1::Manifest manifest, pack::ReadManifest(pack_dir));
  const std::string manifest_path = absl::StrCat(pack_dir, "/", pack::kManifestFile);
  if (absl::Status s = pack::CheckManifest(manifest); !s.ok()) return Prefixed(manifest_path, s);
  auto layout = pack::LayoutFromManifest(manifest);
  if (!layout.ok()) return Prefixed(manifest_path, layout.status());

  const std::string dense_path = absl::StrCat(pack_dir, "/", pack::kDenseFile);
  ASSIGN_OR_RETURN(std::unique_ptr<gguf::GgufModel> model, gguf::GgufModel::Open(dense_path));
  auto ref = absl::WrapUnique(new ReferenceModel);
  Hparams& hp = ref->hparams_;
  ASSIGN_OR_RETURN(hp, ReadHparams(model->metadata(), dense_path));
  TensorLoader loader(*model, dense_path);
  RETURN_IF_ERROR(LoadDense(*model, loader, dense_path, &hp, &ref->weights_));

  // The manifest must describe the model dense.gguf describes, with every block a MoE block.
  const pack::v1::Geometry& g = manifest.geometry();
  const std::pair<const char*, std::pair<int64_t, int64_t>> checks[] = {
      {"n_layer", {g.n_layer(), hp.n_layer}},
      {"n_moe_layers", {g.n_moe_layers(), hp.n_layer - hp.n_dense_lead}},
      {"n_embd", {g.n_embd(), hp.n_embd}},
      {"n_expert", {g.n_expert(), hp.n_expert}},
      {"n_expert_used", {g.n_expert_used(), hp.n_expert_used}},
      {"n_shared_experts", {g.n_shared_experts(), hp.shared_ff > 0 ? g.n_shared_experts() : 0}}};
  for (const auto& [field, values] : checks) {
    if (values.first != values.second) {
      return absl::InvalidArgumentError(absl::StrCat(manifest_path, ": geometry.", field, " is ", values.first,
                                                     " but ", dense_path, " implies ", values.second));
    }
  }
  for (int64_t i = 0; i < g.n_moe_layers(); ++i) {
    if (g.moe_layers(i) != hp.n_dense_lead + i) {
      return absl::UnimplementedError(absl::StrCat(manifest_path, ": geometry.moe_layers[", i, "] is ", g.moe_layers(i),
                                                   "; the reference model needs every block MoE from block ",
                                                   hp.n_dense_lead, " on"));
    }
  }
  hp.expert_ff = layout->expert_ff;

  const std::string experts_path = absl::StrCat(pack_dir, "/", pack::kExpertsFile);
  std::ifstream in(experts_path, std::ios::binary | std::ios::ate);
  if (!in) return absl::NotFoundError(absl::StrCat(experts_path, ": cannot open"));
  const uint64_t size = static_cast<uint64_t>(in.tellg());
  if (size != manifest.experts_bytes()) {
    return absl::InvalidArgumentError(absl::StrCat(experts_path, ": size is ", size, " bytes, manifest says ",
                                                   manifest.experts_bytes()));
  }
  const int64_t d = hp.n_embd, ff = hp.expert_ff;
  const int64_t rows[3] = {ff, ff, d}, cols[3] = {d, d, ff};
  std::vector<uint8_t> blob(layout->blob_bytes);
  for (int64_t l = hp.n_dense_lead; l < hp.n_layer; ++l) {
    for (int64_t e = 0; e < hp.n_expert; ++e) {
      in.seekg(static_cast<std::streamoff>(pack::BlobIndex(manifest, l - hp.n_dense_lead, e) * layout->blob_bytes));
      if (!in.read(reinterpret_cast<char*>(blob.data()), static_cast<std::streamsize>(blob.size()))) {
        return absl::DataLossError(absl::StrCat(experts_path, ": cannot read blob of layer ", l, " expert ", e));
      }
      Matrix* roles[3];
      Expert& expert = ref->weights_.layers[l].experts.emplace_back();
      roles[0] = &expert.gate, roles[1] = &expert.up, roles[2] = &expert.down;
      for (int r = 0; r < 3; ++r) {
        *roles[r] = Matrix{rows[r], cols[r], std::vector<float>(rows[r] * cols[r])};
        kernels::DequantizeRole(layout->scheme, blob.data() + layout->role_offset[r], rows[r], cols[r],
                                roles[r]->w.data());
      }
    }
  }
  RETURN_IF_ERROR(LoadExpertBiases(loader, hp, &ref->weights_));
  return ref;
}

std::vector<float> ReferenceModel::MoeForward(const Layer& layer, const std::vector<float>& h, Route* route) const {
  std::vector<float> logits = MatVec(layer.router, h);
  for (size_t e = 0; e < layer.router_logit_bias.size(); ++e) logits[e] += layer.router_logit_bias[e];
  std::vector<double> probs(logits.size());
  if (hparams_.gpt_oss) {
    // Chosen by logit; weighed by a softmax over the chosen logits only.
    for (size_t e = 0; e < logits.size(); ++e) probs[e] = logits[e];
  } else if (hparams_.sigmoid_router) {
    for (size_t e = 0; e < logits.size(); ++e) probs[e] = 1.0 / (1.0 + std::exp(-static_cast<double>(logits[e])));
  } else {
    // Softmax over every expert, in double.
    double max_logit = logits[0];
    for (float v : logits) max_logit = std::max(max_logit, static_cast<double>(v));
    double total = 0;
    for (size_t e = 0; e < logits.size(); ++e) total += probs[e] = std::exp(logits[e] - max_logit);
    for (double& p : probs) p /= total;
  }
  // The experts are chosen by score plus the correction bias where there is one, weighed by score alone.
  std::vector<double> choice = probs;
  for (size_t e = 0; e < layer.router_bias.size(); ++e) choice[e] += layer.router_bias[e];
  reference_internal::KeepBestGroups(hparams_, &choice);
  // Top-k by repeated arg-max; a strict comparison keeps the lower index on ties.
  std::vector<bool> taken(probs.size(), false);
  route->experts.clear();
  double picked_sum = 0;
  for (int64_t k = 0; k < hparams_.n_expert_used; ++k) {
    int best = -1;
    for (size_t e = 0; e < probs.size(); ++e) {
      if (!taken[e] && (best < 0 || choice[e] > choice[best])) best = static_cast<int>(e);
    }
    taken[best] = true;
    route->experts.push_back(best);
    picked_sum += probs[best];
  }
  route->margin = std::numeric_limits<double>::infinity();
  for (size_t e = 0; e < probs.size(); ++e) {
    if (!taken[e]) route->margin = std::min(route->margin, choice[route->experts.back()] - choice[e]);
  }
  route->weights.clear();
  if (hparams_.gpt_oss) {
    const double top = probs[route->experts[0]];  // the largest chosen logit
    double total = 0;
    for (int e : route->experts) total += std::exp(probs[e] - top);
    for (int e : route->experts) route->weights.push_back(static_cast<float>(std::exp(probs[e] - top) / total));
  } else {
    const double divisor = hparams_.renormalize_top_k ? picked_sum : 1.0;
    for (int e : route->experts) {
      route->weights.push_back(static_cast<float>(probs[e] / divisor * hparams_.routed_scale));
    }
  }

  std::vector<float> out(hparams_.n_embd, 0.0f);
  for (size_t k = 0; k < route->experts.size(); ++k) {
    const std::vector<float> down = ExpertForward(layer.experts[route->experts[k]], h);
    for (int64_t i = 0; i < hparams_.n_embd; ++i) out[i] += route->weights[k] * down[i];
  }
  if (hparams_.shared_ff > 0) {
    double gate = 1.0;
    if (!layer.shared_gate.empty()) {
      double gate_logit = 0;
      for (int64_t i = 0; i < hparams_.n_embd; ++i) gate_logit += static_cast<double>(layer.shared_gate[i]) * h[i];
      gate = 1.0 / (1.0 + std::exp(-gate_logit));
    }
    const std::vector<float> shared = ExpertForward(layer.shared, h);
    for (int64_t i = 0; i < hparams_.n_embd; ++i) out[i] += static_cast<float>(gate * shared[i]);
  }
  return out;
}

std::vector<float> ReferenceModel::Logits(std::span<const int32_t> tokens,
                                          std::vector<std::vector<Route>>* routes) const {
  const Hparams& hp = hparams_;
  const int64_t n = static_cast<int64_t>(tokens.size()), d = hp.n_embd, hd = hp.head_dim;
  for (int32_t t : tokens) {
    if (t < 0 || t >= hp.n_vocab) return {};
  }
  if (routes != nullptr) routes->assign(hp.n_layer, std::vector<Route>(n));

  // The residual stream, one vector per position.
  std::vector<std::vector<float>> x(n);
  for (int64_t i = 0; i < n; ++i) {
    const auto row = weights_.token_embd.w.begin() + tokens[i] * d;
    x[i].assign(row, row + d);
  }
  const int64_t group = hp.n_head / hp.n_head_kv;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  for (int64_t l = 0; l < hp.n_layer; ++l) {
    const Layer& layer = weights_.layers[l];
    if (hp.kv_lora_rank > 0) {
      std::vector<std::vector<float>> h = x;
      for (std::vector<float>& hi : h) RmsNorm(hi, layer.attn_norm, hp.rms_eps);
      const std::vector<std::vector<float>> attn = reference_internal::LatentAttention(hp, layer, h);
      for (int64_t i = 0; i < n; ++i) {
        for (int64_t c = 0; c < d; ++c) x[i][c] += attn[i][c];
      }
    } else {
      std::vector<std::vector<float>> q(n), k(n), v(n);
      for (int64_t i = 0; i < n; ++i) {
        std::vector<float> h = x[i];
        RmsNorm(h, layer.attn_norm, hp.rms_eps);
        q[i] = MatVec(layer.wq, h);
        k[i] = MatVec(layer.wk, h);
        v[i] = MatVec(layer.wv, h);
        if (hp.qkv_bias) {
          for (size_t c = 0; c < q[i].size(); ++c) q[i][c] += layer.bq[c];
          for (size_t c = 0; c < k[i].size(); ++c) k[i][c] += layer.bk[c];
          for (size_t c = 0; c < v[i].size(); ++c) v[i][c] += layer.bv[c];
        }
        if (hp.qk_norm_whole) {
          RmsNorm(q[i], layer.q_norm, hp.rms_eps);
          RmsNorm(k[i], layer.k_norm, hp.rms_eps);
        }
        for (int64_t head = 0; head < hp.n_head; ++head) {
          std::span<float> qh(q[i].data() + head * hd, hd);
          if (hp.qk_norm) RmsNorm(qh, layer.q_norm, hp.rms_eps);
          ApplyRope(hp.rope_style, hp.rope_freq_base, i, qh.first(hp.rope_dim), hp.yarn);
        }
        for (int64_t head = 0; head < hp.n_head_kv; ++head) {
          std::span<float> kh(k[i].data() + head * hd, hd);
          if (hp.qk_norm) RmsNorm(kh, layer.k_norm, hp.rms_eps);
          ApplyRope(hp.rope_style, hp.rope_freq_base, i, kh.first(hp.rope_dim), hp.yarn);
        }
      }
      for (int64_t i = 0; i < n; ++i) {
        std::vector<float> attn(hp.n_head * hd, 0.0f);
        for (int64_t head = 0; head < hp.n_head; ++head) {
          const int64_t kv = head / group;
          const float* qh = q[i].data() + head * hd;
          // Causal: position i attends to positions 0..i; a windowed gpt-oss block (even l) to those j with
          // i - j < sliding_window.
          const int64_t first = hp.sliding_window > 0 && l % 2 == 0 ? std::max<int64_t>(0, i - hp.sliding_window + 1) : 0;
          std::vector<double> p(i + 1, 0.0);
          const bool sink = !layer.sinks.empty();
          double max_score = sink ? layer.sinks[head] : -INFINITY, total = 0;
          for (int64_t j = first; j <= i; ++j) {
            double dot = 0;
            for (int64_t c = 0; c < hd; ++c) dot += static_cast<double>(qh[c]) * k[j][kv * hd + c];
            p[j] = dot * scale;
            max_score = std::max(max_score, p[j]);
          }
          if (sink) total = std::exp(layer.sinks[head] - max_score);  // a logit with no value
          for (int64_t j = first; j <= i; ++j) total += p[j] = std::exp(p[j] - max_score);
          for (int64_t c = 0; c < hd; ++c) {
            double acc = 0;
            for (int64_t j = first; j <= i; ++j) acc += p[j] / total * v[j][kv * hd + c];
            attn[head * hd + c] = static_cast<float>(acc);
          }
        }
        const std::vector<float> out = MatVec(layer.wo, attn);
        for (int64_t c = 0; c < d; ++c) x[i][c] += out[c] + (layer.bo.empty() ? 0.0f : layer.bo[c]);
      }
    }
    for (int64_t i = 0; i < n; ++i) {
      std::vector<float> h = x[i];
      RmsNorm(h, layer.ffn_norm, hp.rms_eps);
      Route route;
      const std::vector<float> moe = l < hp.n_dense_lead ? ExpertForward(layer.dense_ffn, h) : MoeForward(layer, h, &route);
      for (int64_t c = 0; c < d; ++c) x[i][c] += moe[c];
      if (routes != nullptr) (*routes)[l][i] = std::move(route);
    }
  }

  std::vector<float> logits;
  logits.reserve(n * hp.n_vocab);
  for (int64_t i = 0; i < n; ++i) {
    RmsNorm(x[i], weights_.output_norm, hp.rms_eps);
    const std::vector<float> row = MatVec(weights_.output, x[i]);
    logits.insert(logits.end(), row.begin(), row.end());
  }
  return logits;
}

}  // namespace strata::testing
