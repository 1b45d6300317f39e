#ifndef STRATA_ENGINE_MODEL_MODEL_CONFIG_H_
#define STRATA_ENGINE_MODEL_MODEL_CONFIG_H_

// Hyper-parameters of a MoE model, read from GGUF metadata only, and the table of architectures the
// engine runs. Each architecture lives in its own file (qwen3moe.cc, mixtral.cc, qwen2moe.cc, olmoe.cc,
// glm4moe.cc) and is listed once in ArchitectureTable(); it only switches on the shared blocks below.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/gguf/gguf_file.h"

namespace strata::model {

enum class RopeStyle : uint8_t {
  kNormal,  // rotates adjacent pairs (2i, 2i+1): llama, Mixtral
  kNeox,    // rotates (i, i + head_dim/2): Qwen2/3
};

enum class RouterGating : uint8_t {
  kSoftmax,  // softmax over the router logits
  kSigmoid,  // an independent sigmoid per expert (GLM-4.5, DeepSeek-V3)
};

struct ModelConfig {
  std::string arch;  // general.architecture
  int64_t n_layer = 0;
  int64_t n_embd = 0;
  int64_t n_head = 0;
  int64_t n_head_kv = 0;
  int64_t head_dim = 0;
  int64_t rope_dim = 0;  // leading values of each head that RoPE rotates (rope.dimension_count)
  int64_t n_vocab = 0;
  int64_t n_ctx_train = 0;
  int64_t n_expert = 0;
  int64_t n_expert_used = 0;
  int64_t expert_ff = 0;
  float rope_freq_base = 10000.0f;
  float rms_norm_eps = 1e-6f;
  RopeStyle rope_style = RopeStyle::kNormal;
  bool qk_norm = false;        // per-head RMSNorm of q and k before RoPE
  bool qk_norm_whole = false;  // RMSNorm over the whole q and the whole k projection before RoPE (OLMoE)
  bool qkv_bias = false;       // q, k and v projections add a bias (Qwen2)
  bool router_renorm = true;   // the top-k softmax weights are renormalised to sum 1
  int64_t shared_expert_ff = 0;     // width of the shared expert FFN run on every token; 0 = none
  bool shared_expert_gate = false;  // its output is scaled by sigmoid(ffn_gate_inp_shexp . h) (Qwen2-MoE)
  bool partial_rope = false;        // rope_dim may be less than head_dim
  RouterGating router_gating = RouterGating::kSoftmax;
  bool router_score_bias = false;   // exp_probs_b is added to the scores to choose the experts, not to weigh them
  float routed_scale = 1.0f;        // the routed experts' weights are multiplied by it (expert_weights_scale)
  int64_t n_dense_lead = 0;         // the first blocks have a dense SwiGLU FFN instead of experts
  int64_t dense_ff = 0;             // its width (feed_forward_length); 0 without dense blocks
  std::string ffn_norm_name = "ffn_norm";  // blk.N.<name>.weight, the FFN's pre-norm
};

// The blocks of the forward pass beyond the base every backend has (GQA attention with optional per-head
// q/k norm, NORMAL or NEOX RoPE, softmax router with renormalised top-k, SwiGLU experts).
enum class Block : uint8_t {
  kQkvBias,
  kWholeQkNorm,
  kRouterWithoutRenorm,
  kSharedExpert,
  kSharedExpertGate,
  kPartialRope,
  kSigmoidRouter,      // with the score-correction bias
  kRoutedScale,
  kDenseLeadingBlocks,
};
std::string_view BlockName(Block block);

// The blocks beyond the base that `config` needs, in enum order.
std::vector<Block> BlocksNeeded(const ModelConfig& config);

// OK when `backend` (a name for the message) implements every block `config` needs; otherwise
// UNIMPLEMENTED naming the architecture, the backend and the first missing block.
absl::Status CheckBackendBlocks(const ModelConfig& config, std::string_view backend,
                                const std::vector<Block>& supported);

// One supported architecture: how to read its hyper-parameters.
struct Architecture {
  std::string_view gguf_name;  // general.architecture
  std::string_view display_name;
  // Fills the architecture-specific parts of `config` (generic keys are already read).
  absl::Status (*configure)(const gguf::Metadata& metadata, ModelConfig* config);
};

const std::vector<Architecture>& ArchitectureTable();

// The table entry whose gguf_name is `gguf_arch`; UNIMPLEMENTED naming it and listing the supported
// architectures otherwise.
absl::StatusOr<const Architecture*> FindArchitecture(std::string_view gguf_arch);

// Reads the configuration; errors name the metadata key and what was expected. `n_vocab` is taken from
// the tokenizer's token list.
absl::StatusOr<ModelConfig> ReadModelConfig(const gguf::Metadata& metadata);

// A size hyper-parameter: an unsigned integer in 1 .. 2^31 (so that products of two stay in int64), or
// `fallback` when the key is absent and a fallback is given. The error names the key.
absl::StatusOr<int64_t> ReadDimension(const gguf::Metadata& metadata, const std::string& key,
                                      std::optional<int64_t> fallback = std::nullopt);

// Defined by each architecture's file.
absl::Status ConfigureQwen3Moe(const gguf::Metadata& metadata, ModelConfig* config);
absl::Status ConfigureMixtral(const gguf::Metadata& metadata, ModelConfig* config);
absl::Status ConfigureQwen2Moe(const gguf::Metadata& metadata, ModelConfig* config);
absl::Status ConfigureOlmoe(const gguf::Metadata& metadata, ModelConfig* config);
absl::Status ConfigureGlm4Moe(const gguf::Metadata& metadata, ModelConfig* config);

}  // namespace strata::model

#endif  // STRATA_ENGINE_MODEL_MODEL_CONFIG_H_
