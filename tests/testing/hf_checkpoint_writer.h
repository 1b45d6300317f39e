#ifndef STRATA_TESTS_TESTING_HF_CHECKPOINT_WRITER_H_
#define STRATA_TESTS_TESTING_HF_CHECKPOINT_WRITER_H_

// Writes a GGUF model (as synth makes them: qwen3moe, "llama" with experts for Mixtral, deepseek2 for
// DeepSeek-V2 (softmax router) or V3 (sigmoid), gpt-oss) as the Hugging Face checkpoint it would have been
// converted from: config.json, tokenizer.json, tokenizer_config.json and *.safetensors shards with Hugging
// Face's tensor names, experts unstacked (gpt-oss's fused per layer, MXFP4 experts as gpt-oss ships them) and
// (for "llama") the q/k rows in Hugging Face's order. Written independently of
// packtool/hf_checkpoint.cc, so that the tests compare the two.

#include <string>

#include "absl/status/status.h"

namespace strata::testing {

struct HfWriteOptions {
  int shards = 2;               // tensors spread over model-0000i-of-0000n.safetensors
  bool tokenizer = true;        // write tokenizer.json and tokenizer_config.json
  bool array_merges = false;    // merges as ["a", "b"] (newer tokenizers) instead of "a b"
};

absl::Status WriteHfCheckpointFromGguf(const std::string& gguf_path, const std::string& dir,
                                       const HfWriteOptions& options = {});

// Rewrites the deepseek2 GGUF at `src` (attn_kv_b whole, as synth writes it) as llama.cpp's converter writes
// DeepSeek from a Hugging Face checkpoint: attn_kv_b split into attn_k_b ([nope, kv_lora, n_head]: each
// head's W_UK transposed) and attn_v_b ([kv_lora, v, n_head]: W_UV) in attn_kv_b's dtype, head_count_kv 1,
// key_length / value_length the latent's sizes and key_length_mla / value_length_mla the heads'.
absl::Status SplitDeepseekKvB(const std::string& src, const std::string& dst);

}  // namespace strata::testing

#endif  // STRATA_TESTS_TESTING_HF_CHECKPOINT_WRITER_H_
