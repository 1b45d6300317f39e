#ifndef STRATA_TESTS_TESTING_HF_CHECKPOINT_WRITER_H_
#define STRATA_TESTS_TESTING_HF_CHECKPOINT_WRITER_H_

// Writes a GGUF model (as synth makes them: qwen3moe, or "llama" with experts for Mixtral) as the Hugging Face
// checkpoint it would have been converted from: config.json, tokenizer.json, tokenizer_config.json and
// *.safetensors shards with Hugging Face's tensor names, experts unstacked and (for "llama") the q/k rows in
// Hugging Face's order. Written independently of packtool/hf_checkpoint.cc, so that the tests compare the two.

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

}  // namespace strata::testing

#endif  // STRATA_TESTS_TESTING_HF_CHECKPOINT_WRITER_H_
