#ifndef STRATA_PACKTOOL_HF_CONFIG_H_
#define STRATA_PACKTOOL_HF_CONFIG_H_

// config.json of a Hugging Face checkpoint: which architecture it is (one table of architectures in
// hf_config.cc), the geometry synth's metadata writer takes, and the GGUF keys llama.cpp's converter writes for
// it. What the engine does not implement is refused naming the field. Pure functions, any thread.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/gguf/gguf_writer.h"
#include "nlohmann/json.hpp"
#include "packtool/synth.h"

namespace strata::packtool {

struct HfArch {
  std::string_view hf_name;        // config.json "architectures"
  std::string_view synth_name;     // synth's architecture, whose tensor list and metadata keys are the GGUF's
  std::string_view moe_block;      // model.layers.N.<moe_block>.<router> / .experts.E.<role>
  std::string_view router;         // "gate" (ffn_gate_inp) or gpt-oss's "router"
  std::string_view shared_expert;  // model.layers.N.<moe_block>.<shared_expert>.<role> (ffn_*_shexp)
  std::string_view roles[3];       // gate, up, down
  bool permute_qk;                 // normal (interleaved) RoPE in GGUF from Hugging Face's NeoX order
};

struct HfModelConfig {
  const HfArch* arch = nullptr;
  SynthGeometry geometry;
  nlohmann::json json;        // the whole file (token ids, tie_word_embeddings)
  bool fp8_blocks = false;    // quantization_config says FP8 with 128 x 128 blocks (packtool/hf_fp8.h)
  bool mxfp4_experts = false; // gpt-oss's quantization_config says MXFP4 (packtool/hf_gpt_oss.h)
  int64_t n_mtp_layers = 0;   // multi-token-prediction layers after the model's (DeepSeek-V3, GLM-4.5), left out
  bool tie_word_embeddings = false;  // the output projection is the token embedding when lm_head is absent
};

// Reads and checks `dir`/config.json.
absl::StatusOr<HfModelConfig> ReadHfConfig(const std::string& dir);

// The GGUF's hyper-parameter keys (SetSynthMetadata's), with llama.cpp's deepseek2 form (latent attention as
// one kv head whose key_length / value_length are the cached latent's and key_length_mla / value_length_mla
// the heads': attn_kv_b split into attn_k_b / attn_v_b), and the checkpoint's own values where synth writes
// fixed ones (glm4moe's routing, gpt-oss's YaRN).
void SetHfMetadata(const HfModelConfig& config, gguf::GgufWriter* writer);

}  // namespace strata::packtool

#endif  // STRATA_PACKTOOL_HF_CONFIG_H_
