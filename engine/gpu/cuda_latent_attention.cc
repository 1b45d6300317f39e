// Multi-head latent attention on the CUDA backend (DeepSeek-V2/V3; the CPU's is engine/model/
// cpu_latent_attention.cc): the same projections and cache, in the absorbed form for every step
// (kernels/cuda/latent_attention.h), where the CPU rebuilds keys and values for prompt steps.

#include "absl/strings/str_cat.h"
#include "engine/gpu/cuda_dense_backend.h"
#include "engine/status_macros.h"

namespace strata::gpu {

kernels::cuda::LatentShape LatentShapeOf(const model::ModelConfig& c) {
  kernels::cuda::LatentShape s;
  s.n_head = static_cast<int>(c.n_head);
  s.nope_dim = static_cast<int>(c.mla.nope_dim);
  s.rope_dim = static_cast<int>(c.rope_dim);
  s.v_dim = static_cast<int>(c.mla.v_dim);
  s.rank = static_cast<int>(c.mla.kv_lora_rank);
  return s;
}

absl::Status CudaDenseBackend::AttendLatent(int64_t l) {
  const model::ModelConfig& c = config_;
  const DeviceLayer& L = layers_[l];
  const DeviceLatent& M = L.mla;
  const kernels::cuda::LatentShape shape = LatentShapeOf(c);
  const int64_t E = c.n_embd, q_lora = c.mla.q_lora_rank, key_dim = shape.key_dim();
  float* q = q_.as<float>();
  float* kv = k_.as<float>();
  // h holds RmsNorm(x) * attn_norm (Embed, Combine and DenseFfn leave it so). q directly or through the LoRA;
  // the LoRA's first product and attn_kv_a_mqa share h in one launch where their types agree.
  if (q_lora > 0 && M.q_a.type == M.kv_a.type) {
    const kernels::cuda::MatmulOutput outputs[2] = {{M.q_a.data, M.q_a.rows, q_lora_.as<float>(), q_lora},
                                                    {M.kv_a.data, M.kv_a.rows, kv, key_dim}};
    RETURN_IF_ERROR(kernels::cuda::DenseMatmulGroup(*matmul_, M.q_a.type, E, outputs, h_.as<float>(), E, n_, stream_));
  } else {
    if (q_lora > 0) {
      RETURN_IF_ERROR(kernels::cuda::DenseMatmul(*matmul_, M.q_a.type, M.q_a.data, M.q_a.rows, E, h_.as<float>(), E,
                                                 n_, q_lora_.as<float>(), q_lora, /*accumulate=*/false, stream_));
    }
    RETURN_IF_ERROR(kernels::cuda::DenseMatmul(*matmul_, M.kv_a.type, M.kv_a.data, M.kv_a.rows, E, h_.as<float>(), E,
                                               n_, kv, key_dim, /*accumulate=*/false, stream_));
  }
  if (q_lora > 0) {
    RETURN_IF_ERROR(kernels::cuda::RmsNorm(q_lora_.as<float>(), q_lora, M.q_a_norm, q_lora, n_, c.rms_norm_eps,
                                           q_lora_.as<float>(), q_lora, stream_));
    RETURN_IF_ERROR(kernels::cuda::DenseMatmul(*matmul_, M.q_b.type, M.q_b.data, M.q_b.rows, q_lora,
                                               q_lora_.as<float>(), q_lora, n_, q, shape.q_dim(),
                                               /*accumulate=*/false, stream_));
  } else {
    RETURN_IF_ERROR(kernels::cuda::DenseMatmul(*matmul_, L.wq.type, L.wq.data, L.wq.rows, E, h_.as<float>(), E, n_,
                                               q, shape.q_dim(), /*accumulate=*/false, stream_));
  }
  RETURN_IF_ERROR(kernels::cuda::LatentRopeStore(q, kv, slots_.as<kernels::cuda::TokenSlot>(), n_, l, shape,
                                                 M.kv_a_norm, c.rms_norm_eps, freq_.as<double>(), rope_magnitude_,
                                                 c.rope_style == model::RopeStyle::kNeox ? 1 : 0, stream_));
  RETURN_IF_ERROR(
      kernels::cuda::LatentQueryAbsorb(M.kv_b.type, M.kv_b.data, q, n_, shape, q_latent_.as<float>(), stream_));
  RETURN_IF_ERROR(kernels::cuda::LatentAttention(q_latent_.as<float>(), slots_.as<kernels::cuda::TokenSlot>(), n_, l,
                                                 shape, c.attention_scale, max_positions_, latent_.as<float>(),
                                                 attention_ws_.data(), attention_ws_.bytes(), stream_));
  RETURN_IF_ERROR(kernels::cuda::LatentValueProject(M.kv_b.type, M.kv_b.data, latent_.as<float>(), n_, shape,
                                                    attn_.as<float>(), stream_));
  const int64_t heads_out = static_cast<int64_t>(shape.n_head) * shape.v_dim;
  return kernels::cuda::DenseMatmul(*matmul_, L.wo.type, L.wo.data, L.wo.rows, L.wo.cols, attn_.as<float>(), heads_out,
                                    n_, x_.as<float>(), E, /*accumulate=*/true, stream_);
}

}  // namespace strata::gpu
