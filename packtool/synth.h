#ifndef STRATA_PACKTOOL_SYNTH_H_
#define STRATA_PACKTOOL_SYNTH_H_

// Synthetic MoE models with random weights, in the exact GGUF layout llama.cpp loads.
//
// Deterministic: every weight is a pure function of (seed, tensor name, element index), so the same options
// give the same bytes, in any thread order, and SynthesizePack with exact_quantize writes the same experts a
// GGUF written by SynthesizeGguf (with F32 experts) converts to. Without exact_quantize, SynthesizePack
// writes random codes and scales straight into each blob (packtool/synth_codes.h): a pure function of
// (seed, tensor name, expert), with the spread the f32 weights would have, and many times faster.

#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/gguf/ggml_types.h"
#include "kernels/format/scheme.h"
#include "packtool/convert.h"
#include "strata/pack/v1/manifest.pb.h"

namespace strata::packtool {

// Hyper-parameters of a synthetic model.
struct SynthGeometry {
  std::string arch = "qwen3moe";  // a name of SynthArchitectures()
  int64_t n_layer = 2;
  // glm4moe, deepseek2: multi-token-prediction blocks after the n_layer (a MoE block each, plus llama.cpp's
  // blk.N.nextn.* tensors), counted in block_count and said by nextn_predict_layers, as GLM-4.5's GGUFs have;
  // GGUF only (a pack holds the blocks that run).
  int64_t n_mtp_layers = 0;
  // glm4moe: a per-head q/k RMSNorm (attn_q_norm / attn_k_norm of head_dim), as GLM-4.5 has and Air has not.
  bool head_qk_norm = false;
  int64_t n_expert = 8;
  int64_t n_expert_used = 2;
  int64_t n_embd = 128;
  int64_t expert_ff = 128;
  int64_t shared_ff = 256;  // the shared expert's width, for architectures with one (qwen2moe, glm4moe, deepseek2)
  int64_t n_dense_lead = 0;  // leading blocks with a dense FFN instead of experts (glm4moe, deepseek2)
  int64_t dense_ff = 512;    // their width
  int64_t rope_dim = 0;      // values of a head RoPE rotates; 0: all (glm4moe rotates half)
  int64_t sliding_window = 128;  // positions the windowed (even) blocks of gpt-oss attend to
  int64_t n_head = 4;
  int64_t n_head_kv = 2;
  int64_t head_dim = 32;
  int64_t n_vocab = 0;  // 0: the vocabulary's own size
  int64_t n_ctx = 4096;
  float rope_freq_base = 1000000.0f;
  float rms_norm_eps = 1e-6f;
  // deepseek2 only (latent attention): head_dim is the q/k head (nope + rope_dim values), v_dim the value
  // head; q_lora_rank 0 projects q directly.
  int64_t q_lora_rank = 0;
  int64_t kv_lora_rank = 0;
  int64_t v_dim = 0;
  int64_t n_expert_group = 1;  // the router picks from the n_group_used best groups
  int64_t n_group_used = 1;
  int expert_gating = 2;       // 1: softmax (DeepSeek-V2), 2: sigmoid with exp_probs_b (V3)
  bool expert_weights_norm = true;
  float expert_weights_scale = 2.5f;
  float yarn_factor = 0.0f;    // rope.scaling.type yarn with this factor; 0: none
  int64_t yarn_original_context = 0;
  float yarn_log_multiplier = 0.1f;
};

// Architectures synth can write.
std::vector<std::string> SynthArchitectures();
// Presets: "tiny" (well under a second per token on one core), "small" (~1 GB of f16 GGUF) and "seed"
// (48 layers, 512 experts, top-10, n_embd 2560, expert FF 640; for gpt-oss, gpt-oss-120b's geometry: 36 layers,
// 128 experts, top-4, n_embd and expert FF 2880, 64 q heads and 8 kv heads of 64, sliding window 128; for
// deepseek2, DeepSeek-V3's).
std::vector<std::string> SynthPresets();
absl::StatusOr<SynthGeometry> PresetGeometry(std::string_view arch, std::string_view preset);
// Checks that the geometry is one the engine and every scheme can hold; errors name the field.
absl::Status CheckSynthGeometry(const SynthGeometry& geometry);

struct SynthOptions {
  SynthGeometry geometry;
  gguf::GgmlType dense_type = gguf::GgmlType::kF16;   // 2-D non-expert weights (norms are always F32)
  gguf::GgmlType expert_type = gguf::GgmlType::kF16;  // expert tensors in the GGUF
  uint64_t seed = 1;
  std::string vocab_path;  // copy tokenizer metadata from this GGUF; empty: built-in byte-level vocabulary
  std::string output;      // the .gguf file, or the pack directory for SynthesizePack
  kernels::Scheme pack_scheme = kernels::Scheme::kS4;  // SynthesizePack only
  // SynthesizePack only. true: make f32 weights and quantize them (minutes for large geometries; the
  // manifest reports the quantization error). false: write random codes and scales directly (the manifest's
  // created_by is kSynthRandomCodesCreatedBy and its quant_error is empty: not measured).
  bool exact_quantize = true;
  // --router-skew: the Zipf exponent of expert popularity (packtool/synth_router_skew.h); 0 leaves the
  // router's random weights as they are (the same bytes as before the option existed).
  double router_skew = 0;
  int threads = 0;         // 0 = one per core this process may use
};

// created_by of a pack whose experts SynthesizePack wrote as random codes (exact_quantize false); packs of
// quantized f32 weights say "synth" (or "convert").
inline constexpr char kSynthRandomCodesCreatedBy[] = "synth-random-codes";

// Writes a GGUF model.
absl::Status SynthesizeGguf(const SynthOptions& options);

// Writes a pack directly (dense.gguf + experts.bin), streaming with bounded memory; for geometries whose
// GGUF would be too large to write first. Same partial-directory and cancellation rules as ConvertGguf.
absl::StatusOr<pack::v1::Manifest> SynthesizePack(const SynthOptions& options, const ConvertProgressFn& progress,
                                                  const std::atomic<bool>* cancel);

// Parses "f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q6_K", "q5_K", "q4_K", "q3_K", "q2_K", "mxfp4" (the
// types synth can write). A K type (blocks of 256) needs rows that are multiples of 256: for experts, --embd and
// --expert-ff; SynthesizeGguf refuses other shapes naming the flag and the tensor.
absl::StatusOr<gguf::GgmlType> ParseSynthType(std::string_view name);

}  // namespace strata::packtool

#endif  // STRATA_PACKTOOL_SYNTH_H_
