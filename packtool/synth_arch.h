#ifndef STRATA_PACKTOOL_SYNTH_ARCH_H_
#define STRATA_PACKTOOL_SYNTH_ARCH_H_

// What a synthetic model of each architecture contains: its GGUF metadata and tensors, named and shaped
// exactly as llama.cpp's loader expects. One table entry per architecture.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/gguf/gguf_writer.h"
#include "packtool/synth.h"

namespace strata::packtool {

enum class SynthTensorKind { kNorm, kBias, kEmbedding, kWeight, kRouter, kExpert };

struct SynthTensor {
  std::string name;
  std::vector<int64_t> ne;  // ggml order
  SynthTensorKind kind;
  float scale;              // standard deviation of the values
  float offset;             // mean (1 for norm weights)
  int64_t layer = -1;       // block index, -1 for global tensors
  int role = -1;            // experts: 0 gate, 1 up, 2 down
};

struct SynthArch {
  std::string_view name;       // what --arch takes
  std::string_view gguf_arch;  // general.architecture written to the file
  bool qk_norm;                // per-head q/k RMSNorm (qwen3moe)
  bool qk_norm_whole = false;  // q/k RMSNorm over the whole projection (olmoe)
  bool qkv_bias = false;       // attn_{q,k,v}.bias (qwen2moe)
  bool shared_expert = false;  // blk.N.ffn_{gate,up,down}_shexp.weight of width SynthGeometry::shared_ff
  bool shared_gate = false;    // blk.N.ffn_gate_inp_shexp.weight (qwen2moe)
  bool sigmoid_router = false; // blk.N.exp_probs_b.bias, sigmoid gating keys, FFN pre-norm post_attention_norm,
                               // SynthGeometry::n_dense_lead dense blocks and partial RoPE (glm4moe)
  bool gpt_oss = false;        // q/k/v/output biases, attn_sinks, post_attention_norm, the router's bias,
                               // per-expert biases, sliding window and YaRN keys (gpt-oss)
  bool latent_attention = false;  // deepseek2: MLA tensors and keys, dense blocks, shared experts, expert
                                  // groups, the gating SynthGeometry::expert_gating says, YaRN
};

absl::StatusOr<const SynthArch*> FindSynthArch(std::string_view name);
const std::vector<SynthArch>& SynthArchTable();

// Every tensor of the model, in file order.
std::vector<SynthTensor> SynthTensors(const SynthArch& arch, const SynthGeometry& g);

// Writes the architecture's hyper-parameter keys (general.*, <arch>.*) into `writer`.
void SetSynthMetadata(const SynthArch& arch, const SynthGeometry& g, gguf::GgufWriter* writer);

}  // namespace strata::packtool

#endif  // STRATA_PACKTOOL_SYNTH_ARCH_H_
