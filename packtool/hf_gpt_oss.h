#ifndef STRATA_PACKTOOL_HF_GPT_OSS_H_
#define STRATA_PACKTOOL_HF_GPT_OSS_H_

// gpt-oss's experts as its Hugging Face checkpoints hold them, rearranged into GGUF's per-role tensors as
// llama.cpp's converter (GptOssModel) does. Per layer, all experts in one tensor per projection:
//   mlp.experts.gate_up_proj_*  gate and up interleaved row by row: gate row i is row 2i, up row i row 2i + 1
//   mlp.experts.down_proj_*
// each as MXFP4 (as released): `_blocks` U8 [E, rows, K / 32, 16], value 2j of a block in byte j's low
// nibble and 2j + 1 in its high, and `_scales` U8 [E, rows, K / 32] (E8M0, the same exponent GGUF's block
// stores); or, in dequantized checkpoints, a float `<name>` [E, K, rows] (transposed); and `_bias` [E, rows].
// Pure functions, any thread.

#include <cstdint>
#include <span>

#include "absl/status/status.h"
#include "packtool/hf_config.h"
#include "packtool/hf_tensors.h"
#include "packtool/synth_arch.h"

namespace strata::packtool {

// GGUF MXFP4 blocks (the E8M0 byte, then qs[16] with value j in qs[j]'s low nibble and j + 16 in its high)
// of rows first, first + step, ... of each expert's `src_rows` rows of `n_blocks` blocks; `dst` holds
// n_expert * (src_rows / step) * n_blocks blocks of 17 bytes.
void RepackMxfp4Rows(std::span<const uint8_t> blocks, std::span<const uint8_t> scales, int64_t n_expert,
                     int64_t src_rows, int64_t n_blocks, int64_t step, int64_t first, std::span<uint8_t> dst);

// Rows first, first + step, ... of each expert's `src_rows` rows of `row_bytes` bytes.
void SelectExpertRows(std::span<const uint8_t> src, int64_t n_expert, int64_t src_rows, uint64_t row_bytes,
                      int64_t step, int64_t first, std::span<uint8_t> dst);

// Each expert's [k, src_rows] matrix of `element`-byte values transposed to [src_rows / step, k], keeping
// columns first, first + step, ... as rows.
void TransposeExpertRows(std::span<const uint8_t> src, int64_t n_expert, int64_t k, int64_t src_rows,
                         uint64_t element, int64_t step, int64_t first, std::span<uint8_t> dst);

// Adds GGUF tensor `st` (blk.N.ffn_{gate,up,down}_exps.{weight,bias}) from layer N's fused tensors: MXFP4
// blocks repacked where config.json says mxfp4, float experts transposed otherwise, biases widened to f32.
absl::Status AddGptOssExpertTensor(const SynthTensor& st, const HfModelConfig& config, HfCheckpointTensors& tensors,
                                   const HfTensorAdder& add);

}  // namespace strata::packtool

#endif  // STRATA_PACKTOOL_HF_GPT_OSS_H_
