#ifndef STRATA_PACKTOOL_HF_CHECKPOINT_H_
#define STRATA_PACKTOOL_HF_CHECKPOINT_H_

// Hugging Face checkpoints (a directory of config.json, *.safetensors and tokenizer.json) as the GGUF that
// llama.cpp's converter would write for them, so that ConvertGguf packs them like any GGUF.
//
// Supported (one table, packtool/hf_config.h): Qwen3MoeForCausalLM (GGUF "qwen3moe"), MixtralForCausalLM
// (GGUF "llama" with experts), DeepseekV2ForCausalLM / DeepseekV3ForCausalLM ("deepseek2") and
// GptOssForCausalLM ("gpt-oss"), each as llama.cpp's convert_hf_to_gguf.py writes it.
// config.json gives the hyper-parameters (written with the same keys as synth writes, SetSynthMetadata),
// the tensors are renamed to GGUF's (blk.N.*), the experts of each layer and role stacked into one
// blk.N.ffn_{gate,up,down}_exps tensor, norms, biases and the router widened to F32, other weights kept in
// their F16/BF16/F32 dtype. Mixtral's q/k projections are permuted for the engine's normal (interleaved) RoPE,
// as llama.cpp does: Hugging Face rotates (i, i + head_dim/2), GGUF "llama" rotates (2i, 2i + 1). DeepSeek's
// kv_b_proj is split into attn_k_b / attn_v_b; its FP8 block-scaled weights become BF16 (packtool/hf_fp8.h).
// gpt-oss's fused experts are split per role, their MXFP4 blocks repacked as GGUF's (packtool/hf_gpt_oss.h).

#include <atomic>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "packtool/synth.h"

namespace strata::packtool {

// True when `path` is a directory holding config.json.
bool IsHfCheckpointDir(const std::string& path);

struct HfToGgufOptions {
  std::string dir;            // the checkpoint
  std::string output;         // the GGUF written
  std::string tokenizer_gguf; // non-empty: take the tokenizer.* keys from this GGUF instead of tokenizer.json
  const std::atomic<bool>* cancel = nullptr;  // checked before each tensor: CANCELLED once true
};

// Writes the checkpoint as one GGUF file. Every tensor of the checkpoint must be used (a stray one is
// refused by name, so nothing is silently dropped) and every one the model needs present with its shape.
absl::Status HfCheckpointToGguf(const HfToGgufOptions& options);

// The row order llama.cpp gives Hugging Face q/k projections for normal RoPE: within each head of
// `head_dim` rows (of `row_bytes` bytes), row 2i + j comes from row i + j * head_dim / 2. `src` and `dst`
// hold n_head * head_dim rows and must not overlap.
void PermuteRowsForNormalRope(std::span<const uint8_t> src, std::span<uint8_t> dst, int64_t n_head, int64_t head_dim,
                              uint64_t row_bytes);
// The inverse: GGUF's order back to Hugging Face's.
void UnpermuteRowsForNormalRope(std::span<const uint8_t> src, std::span<uint8_t> dst, int64_t n_head,
                                int64_t head_dim, uint64_t row_bytes);

}  // namespace strata::packtool

#endif  // STRATA_PACKTOOL_HF_CHECKPOINT_H_
