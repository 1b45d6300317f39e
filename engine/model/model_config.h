#ifndef STRATA_ENGINE_MODEL_MODEL_CONFIG_H_
#define STRATA_ENGINE_MODEL_MODEL_CONFIG_H_

// Hyper-parameters of a MoE model, read from GGUF metadata only, and the table of architectures the
// engine runs. Each architecture lives in its own file (qwen3moe.cc, mixtral.cc, qwen2moe.cc, olmoe.cc,
// glm4moe.cc, gpt_oss.cc, deepseek2.cc) and is listed once in ArchitectureTable(); it only switches on the
// shared blocks below.

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
  kSoftmaxTopK,  // top-k of the logits, then a softmax over those k only (gpt-oss: llama.cpp's SOFTMAX_WEIGHT)
};

// YaRN RoPE scaling as llama.cpp computes it (ggml rope_yarn / ggml_rope_yarn_corr_dims, ext_factor 1): each
// frequency mixes its interpolated (/ factor) and original value by a ramp over the rotation index between
// the correction dimensions of beta_fast and beta_slow, and cos and sin are scaled by
// attn_factor * (1 + 0.1 ln(factor)).
struct RopeYarn {
  float factor = 1.0f;             // rope.scaling.factor (> 1)
  int64_t original_context = 0;    // rope.scaling.original_context_length
  float beta_fast = 32.0f;         // rope.scaling.yarn_beta_fast
  float beta_slow = 1.0f;          // rope.scaling.yarn_beta_slow
  float attn_factor = 1.0f;        // rope.scaling.yarn_attn_factor
  float log_multiplier = 0.0f;     // rope.scaling.yarn_log_multiplier (DeepSeek's mscale; deepseek2 only)
  // Whether cos and sin carry YaRN's magnitude (YarnMagnitude); deepseek2 leaves it out of the rotation and
  // scales the attention instead (ModelConfig::attention_scale), as llama.cpp's deepseek2 graph does.
  bool rotation_magnitude = true;
};

// How the expert groups are ranked when the router picks experts from the best groups only.
enum class GroupScore : uint8_t {
  kMax,        // the best score in the group (DeepSeek-V2's group_limited_greedy)
  kTopTwoSum,  // the sum of the group's two best scores (DeepSeek-V3's noaux_tc)
};

// Multi-head latent attention (DeepSeek-V2/V3): keys and values are rebuilt per head from one compressed
// latent per token, which is all the KV cache holds (with the token's RoPE'd shared key part).
struct LatentAttention {
  int64_t q_lora_rank = 0;   // 0: q is projected directly (attn_q), else through attn_q_a / attn_q_b
  int64_t kv_lora_rank = 0;  // the latent's size; 0: not latent attention
  int64_t nope_dim = 0;      // per head, the part of q and k without RoPE (key_length - rope.dimension_count)
  int64_t v_dim = 0;         // per head, the value size (value_length)
};

struct ModelConfig {
  std::string arch;  // general.architecture
  int64_t n_layer = 0;  // the blocks run: block_count less n_mtp_blocks
  // The GGUF's last blocks that are multi-token-prediction blocks (<arch>.nextn_predict_layers, for
  // speculative decoding): counted in block_count, never run (as in llama.cpp's main pass).
  int64_t n_mtp_blocks = 0;
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
  bool rope_yarn = false;           // RoPE frequencies and magnitude scaled by `yarn`
  RopeYarn yarn;
  // gpt-oss: attention with a learned per-head sink logit (attn_sinks) in each softmax denominator, an output
  // bias (attn_output.bias), and every even block attending to its last sliding_window positions only.
  bool attn_sinks = false;
  bool attn_output_bias = false;
  int64_t sliding_window = 0;       // 0: every block attends to every earlier position
  // With a sliding window, block l is windowed when l % swa_pattern < swa_pattern - 1 (llama.cpp's
  // hparams.set_swa_pattern; gpt-oss sets 2: the even blocks).
  int64_t swa_pattern = 0;
  bool router_logit_bias = false;   // ffn_gate_inp.bias is added to the router logits
  bool expert_biases = false;       // ffn_{gate,up,down}_exps.bias per expert, in dense.gguf
  bool clamped_swiglu = false;      // experts use gpt-oss's clamped SwiGLU (kernels::ExpertActivation)
  int64_t n_expert_group = 1;       // the router picks experts from the n_group_used best of these groups
  int64_t n_group_used = 1;
  GroupScore group_score = GroupScore::kMax;
  LatentAttention mla;              // kv_lora_rank > 0: latent attention instead of GQA
  float attention_scale = 0.0f;     // softmax scale of q.k: 1 / sqrt(head_dim) unless the architecture sets it
};

// The number of latest positions block `layer` attends to, itself included; 0: all of them (llama.cpp:
// swa_layers[il] = il % swa_pattern < swa_pattern - 1; a key at p0 is masked for a query at p1 when
// p1 - p0 >= n_swa, llama_hparams::is_masked_swa).
inline int64_t AttentionWindow(const ModelConfig& config, int64_t layer) {
  const bool windowed = config.sliding_window > 0 && config.swa_pattern > 0 &&
                        layer % config.swa_pattern < config.swa_pattern - 1;
  return windowed ? config.sliding_window : 0;
}

// What a sequence's KV cache holds per layer and position: key_dim floats of keys and value_dim of values
// (GQA: n_head_kv * head_dim each; latent attention: the latent and the RoPE'd key part, no values).
struct KvLayout {
  int64_t key_dim = 0;
  int64_t value_dim = 0;
};
KvLayout CacheLayout(const ModelConfig& config);

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
  kSinkWindowAttention,  // attention sinks, sliding-window blocks, output bias (gpt-oss)
  kYarnRope,
  kSoftmaxTopKRouter,    // router logit bias, softmax over the top k (gpt-oss)
  kBiasedClampedExperts, // expert biases and the clamped SwiGLU (gpt-oss)
  kGroupedRouter,      // top-k within the best expert groups
  kLatentAttention,
  kHeadQkNormPartialRope,  // per-head q/k RMSNorm before a partial RoPE (GLM-4.5)
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
  // What llama.cpp decides from the tensors a file has rather than its keys (null: nothing). Called by
  // ConfigureFromTensors after ReadModelConfig.
  absl::Status (*configure_from_tensors)(const gguf::GgufFile& file, ModelConfig* config) = nullptr;
};

const std::vector<Architecture>& ArchitectureTable();

// Applies the architecture's configure_from_tensors to a config ReadModelConfig read from `file`'s metadata.
absl::Status ConfigureFromTensors(const gguf::GgufFile& file, ModelConfig* config);

// The table entry whose gguf_name is `gguf_arch`; UNIMPLEMENTED naming it and listing the supported
// architectures otherwise.
absl::StatusOr<const Architecture*> FindArchitecture(std::string_view gguf_arch);

// Reads the configuration; errors name the metadata key and what was expected. `n_vocab` is taken from
// the tokenizer's token list.
absl::StatusOr<ModelConfig> ReadModelConfig(const gguf::Metadata& metadata);

// <arch>.block_count and how many of those blocks, the last ones, are multi-token-prediction blocks
// (<arch>.nextn_predict_layers, 0 when absent): GLM-4.5's and DeepSeek-V3's converters count them in
// block_count. Strata runs blocks [0, run()) only.
struct BlockCount {
  int64_t total = 0;
  int64_t mtp = 0;
  int64_t run() const { return total - mtp; }
};

// The block of a "blk.N.<name>" tensor, N; -1 for the others (token_embd, output, ...).
int64_t TensorBlock(const std::string& tensor_name);

// INVALID_ARGUMENT naming the key unless block_count is a dimension (ReadDimension) and nextn_predict_layers
// leaves at least one block to run.
absl::StatusOr<BlockCount> ReadBlockCount(const gguf::Metadata& metadata, const std::string& arch);

// For the architectures with leading dense blocks: OK when `n_dense` (<arch>.leading_dense_block_count) leaves
// at least one MoE block before the multi-token-prediction ones; INVALID_ARGUMENT naming the keys otherwise.
absl::Status CheckLeadingDenseBlocks(const ModelConfig& config, uint64_t n_dense);

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
absl::Status ConfigureGlm4MoeTensors(const gguf::GgufFile& file, ModelConfig* config);
absl::Status ConfigureDeepseek2(const gguf::Metadata& metadata, ModelConfig* config);
absl::Status ConfigureGptOss(const gguf::Metadata& metadata, ModelConfig* config);

// Reads <arch>.rope.scaling.* into `config` (rope_yarn, yarn): none, linear with factor 1, or yarn; any other
// kind or factor is refused naming the key, and so is yarn_log_multiplier unless the architecture uses it
// (engine/model/rope_scaling.cc).
absl::Status ReadRopeScaling(const gguf::Metadata& metadata, ModelConfig* config,
                             bool log_multiplier_used = false);

}  // namespace strata::model

#endif  // STRATA_ENGINE_MODEL_MODEL_CONFIG_H_
