#include "engine/model/model_config.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/status_macros.h"

namespace strata::model {

const std::vector<Architecture>& ArchitectureTable() {
  static const std::vector<Architecture> table = {
      {"qwen3moe", "Qwen3-MoE", &ConfigureQwen3Moe},
      {"llama", "Mixtral (llama with experts)", &ConfigureMixtral},
      {"qwen2moe", "Qwen2-MoE (Qwen1.5-MoE, Qwen2-57B-A14B)", &ConfigureQwen2Moe},
      {"olmoe", "OLMoE", &ConfigureOlmoe},
      {"glm4moe", "GLM-4.5 / GLM-4.6", &ConfigureGlm4Moe, &ConfigureGlm4MoeTensors},
      {"gpt-oss", "gpt-oss", &ConfigureGptOss},
      {"deepseek2", "DeepSeek-V2 / V3, Kimi-K2", &ConfigureDeepseek2},
  };
  return table;
}

absl::StatusOr<const Architecture*> FindArchitecture(std::string_view gguf_arch) {
  std::vector<std::string> known;
  for (const Architecture& a : ArchitectureTable()) {
    if (a.gguf_name == gguf_arch) return &a;
    known.emplace_back(a.gguf_name);
  }
  return absl::UnimplementedError(absl::StrCat("general.architecture '", std::string(gguf_arch),
                                               "' is not supported (supported: ", absl::StrJoin(known, ", "), ")"));
}

absl::Status ConfigureFromTensors(const gguf::GgufFile& file, ModelConfig* config) {
  ASSIGN_OR_RETURN(const Architecture* arch, FindArchitecture(config->arch));
  if (arch->configure_from_tensors == nullptr) return absl::OkStatus();
  return arch->configure_from_tensors(file, config);
}

std::string_view BlockName(Block block) {
  switch (block) {
    case Block::kQkvBias:
      return "q/k/v projection biases";
    case Block::kWholeQkNorm:
      return "q/k RMSNorm over the whole projection";
    case Block::kRouterWithoutRenorm:
      return "softmax router without top-k renormalisation";
    case Block::kSharedExpert:
      return "shared expert";
    case Block::kSharedExpertGate:
      return "sigmoid-gated shared expert";
    case Block::kPartialRope:
      return "partial RoPE";
    case Block::kSigmoidRouter:
      return "sigmoid router with score-correction bias";
    case Block::kRoutedScale:
      return "routed expert scaling";
    case Block::kDenseLeadingBlocks:
      return "dense leading blocks";
    case Block::kSinkWindowAttention:
      return "attention with sinks and sliding-window blocks";
    case Block::kYarnRope:
      return "YaRN RoPE scaling";
    case Block::kSoftmaxTopKRouter:
      return "biased router with a softmax over the top k";
    case Block::kBiasedClampedExperts:
      return "experts with biases and the clamped SwiGLU";
    case Block::kGroupedRouter:
      return "grouped expert choice";
    case Block::kLatentAttention:
      return "multi-head latent attention";
    case Block::kHeadQkNormPartialRope:
      return "per-head q/k RMSNorm with partial RoPE";
  }
  return "unknown block";
}

std::vector<Block> BlocksNeeded(const ModelConfig& c) {
  std::vector<Block> blocks;
  if (c.qkv_bias) blocks.push_back(Block::kQkvBias);
  if (c.qk_norm_whole) blocks.push_back(Block::kWholeQkNorm);
  if (!c.router_renorm) blocks.push_back(Block::kRouterWithoutRenorm);
  if (c.shared_expert_ff > 0) blocks.push_back(Block::kSharedExpert);
  if (c.shared_expert_gate) blocks.push_back(Block::kSharedExpertGate);
  if (c.rope_dim != c.head_dim && c.mla.kv_lora_rank == 0) blocks.push_back(Block::kPartialRope);
  if (c.router_gating == RouterGating::kSigmoid || c.router_score_bias) blocks.push_back(Block::kSigmoidRouter);
  if (c.routed_scale != 1.0f) blocks.push_back(Block::kRoutedScale);
  if (c.n_dense_lead > 0) blocks.push_back(Block::kDenseLeadingBlocks);
  if (c.attn_sinks || c.attn_output_bias || c.sliding_window > 0) blocks.push_back(Block::kSinkWindowAttention);
  if (c.rope_yarn) blocks.push_back(Block::kYarnRope);
  if (c.router_gating == RouterGating::kSoftmaxTopK || c.router_logit_bias) blocks.push_back(Block::kSoftmaxTopKRouter);
  if (c.expert_biases || c.clamped_swiglu) blocks.push_back(Block::kBiasedClampedExperts);
  if (c.n_expert_group > 1) blocks.push_back(Block::kGroupedRouter);
  if (c.mla.kv_lora_rank > 0) blocks.push_back(Block::kLatentAttention);
  if (c.qk_norm && c.rope_dim != c.head_dim && c.mla.kv_lora_rank == 0) blocks.push_back(Block::kHeadQkNormPartialRope);
  return blocks;
}

KvLayout CacheLayout(const ModelConfig& c) {
  if (c.mla.kv_lora_rank > 0) return {c.mla.kv_lora_rank + c.rope_dim, 0};
  return {c.n_head_kv * c.head_dim, c.n_head_kv * c.head_dim};
}

absl::Status CheckBackendBlocks(const ModelConfig& c, std::string_view backend, const std::vector<Block>& supported) {
  for (Block b : BlocksNeeded(c)) {
    if (std::find(supported.begin(), supported.end(), b) == supported.end()) {
      return absl::UnimplementedError(absl::StrCat("architecture '", c.arch, "' needs the ", std::string(BlockName(b)),
                                                   " block, which the ", std::string(backend), " backend does not implement"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> ReadDimension(const gguf::Metadata& m, const std::string& key,
                                      std::optional<int64_t> fallback) {
  uint64_t v = 0;
  if (fallback.has_value()) {
    ASSIGN_OR_RETURN(v, m.GetUintOr(key, static_cast<uint64_t>(*fallback)));
  } else {
    ASSIGN_OR_RETURN(v, m.GetUint(key));
  }
  if (v == 0 || v > (uint64_t{1} << 31)) return absl::InvalidArgumentError(absl::StrCat(key, " is ", v, ", expected 1 .. 2^31"));
  return static_cast<int64_t>(v);
}

int64_t TensorBlock(const std::string& name) {
  if (!absl::StartsWith(name, "blk.")) return -1;
  const size_t dot = name.find('.', 4);
  int64_t block = -1;
  if (dot == std::string::npos || !absl::SimpleAtoi(name.substr(4, dot - 4), &block)) return -1;
  return block;
}

absl::StatusOr<BlockCount> ReadBlockCount(const gguf::Metadata& m, const std::string& arch) {
  BlockCount count;
  const std::string total_key = arch + ".block_count", mtp_key = arch + ".nextn_predict_layers";
  ASSIGN_OR_RETURN(count.total, ReadDimension(m, total_key));
  ASSIGN_OR_RETURN(const uint64_t mtp, m.GetUintOr(mtp_key, 0));
  if (mtp >= static_cast<uint64_t>(count.total)) {
    return absl::InvalidArgumentError(absl::StrCat(mtp_key, " is ", mtp, ", expected fewer than ", total_key, " (",
                                                   count.total, "): the multi-token-prediction blocks are the last ",
                                                   "of the file's blocks"));
  }
  count.mtp = static_cast<int64_t>(mtp);
  return count;
}

absl::Status CheckLeadingDenseBlocks(const ModelConfig& c, uint64_t n_dense) {
  if (n_dense < static_cast<uint64_t>(c.n_layer)) return absl::OkStatus();
  const std::string p = c.arch + ".";
  if (c.n_mtp_blocks == 0) {
    return absl::InvalidArgumentError(absl::StrCat(p, "leading_dense_block_count is ", n_dense,
                                                   ", expected fewer than block_count (", c.n_layer, ")"));
  }
  return absl::InvalidArgumentError(absl::StrCat(
      p, "leading_dense_block_count is ", n_dense, " and ", p, "nextn_predict_layers is ", c.n_mtp_blocks,
      ", expected their sum below ", p, "block_count (", c.n_layer + c.n_mtp_blocks,
      "): the multi-token-prediction blocks follow at least one MoE block"));
}

absl::StatusOr<ModelConfig> ReadModelConfig(const gguf::Metadata& m) {
  ModelConfig c;
  ASSIGN_OR_RETURN(c.arch, m.GetString("general.architecture"));
  ASSIGN_OR_RETURN(const Architecture* arch, FindArchitecture(c.arch));
  const std::string p = c.arch + ".";
  ASSIGN_OR_RETURN(const BlockCount blocks, ReadBlockCount(m, c.arch));
  c.n_layer = blocks.run();
  c.n_mtp_blocks = blocks.mtp;
  ASSIGN_OR_RETURN(c.n_embd, ReadDimension(m, p + "embedding_length"));
  ASSIGN_OR_RETURN(c.n_head, ReadDimension(m, p + "attention.head_count"));
  ASSIGN_OR_RETURN(c.n_ctx_train, ReadDimension(m, p + "context_length"));
  ASSIGN_OR_RETURN(c.n_expert, ReadDimension(m, p + "expert_count"));
  ASSIGN_OR_RETURN(c.n_expert_used, ReadDimension(m, p + "expert_used_count"));
  ASSIGN_OR_RETURN(c.n_head_kv, ReadDimension(m, p + "attention.head_count_kv", c.n_head));
  ASSIGN_OR_RETURN(c.head_dim, ReadDimension(m, p + "attention.key_length", std::max<int64_t>(1, c.n_embd / c.n_head)));
  ASSIGN_OR_RETURN(const double base, m.GetFloatOr(p + "rope.freq_base", 10000.0));
  if (!std::isfinite(base) || base <= 1.0 || base > 1e12) {
    return absl::InvalidArgumentError(absl::StrCat(p, "rope.freq_base is ", base, ", expected a finite value above 1"));
  }
  c.rope_freq_base = static_cast<float>(base);
  ASSIGN_OR_RETURN(const double eps, m.GetFloatOr(p + "attention.layer_norm_rms_epsilon", 1e-6));
  if (!std::isfinite(eps) || eps <= 0.0 || eps >= 1.0) {
    return absl::InvalidArgumentError(
        absl::StrCat(p, "attention.layer_norm_rms_epsilon is ", eps, ", expected a finite value in (0, 1)"));
  }
  c.rms_norm_eps = static_cast<float>(eps);
  ASSIGN_OR_RETURN(const std::vector<std::string> tokens, m.GetStringArray("tokenizer.ggml.tokens"));
  c.n_vocab = static_cast<int64_t>(tokens.size());
  ASSIGN_OR_RETURN(c.rope_dim, ReadDimension(m, p + "rope.dimension_count", c.head_dim));
  RETURN_IF_ERROR(arch->configure(m, &c));

  if (c.n_head % c.n_head_kv != 0) {  // both >= 1 (ReadDimension)
    return absl::InvalidArgumentError(absl::StrCat(p, "attention.head_count (", c.n_head,
                                                   ") is not a multiple of attention.head_count_kv (", c.n_head_kv, ")"));
  }
  if (c.head_dim % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(p, "attention.key_length is ", c.head_dim, ", expected an even number"));
  }
  ASSIGN_OR_RETURN(const uint64_t value_dim, m.GetUintOr(p + "attention.value_length", c.head_dim));
  if (c.mla.kv_lora_rank == 0 && static_cast<int64_t>(value_dim) != c.head_dim) {
    return absl::UnimplementedError(absl::StrCat(p, "attention.value_length ", value_dim, " differs from key_length ",
                                                 c.head_dim, "; Strata needs them equal"));
  }
  // Hyper-parameters the forward pass does not implement are refused, never ignored (an architecture that
  // reads the scaling keys itself, deepseek2, has done so).
  if (!c.rope_yarn) RETURN_IF_ERROR(ReadRopeScaling(m, &c));
  // Router keys some converters write: each must say what the architecture's file configured.
  ASSIGN_OR_RETURN(const uint64_t gating, m.GetUintOr(p + "expert_gating_func", 0));
  // 0: unset (the architecture's own), 1: softmax, 2: sigmoid, 3: softmax over the top k
  // (llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_*).
  const uint64_t expected_gating = c.router_gating == RouterGating::kSoftmax   ? 1
                                   : c.router_gating == RouterGating::kSigmoid ? 2
                                                                               : 3;
  if (gating != 0 && gating != expected_gating) {
    static constexpr const char* kGatingNames[] = {"", "softmax", "sigmoid", "top-k softmax"};
    return absl::UnimplementedError(absl::StrCat(p, "expert_gating_func is ", gating, "; ", c.arch, " in Strata has a ",
                                                 kGatingNames[expected_gating], " router (expected ", expected_gating,
                                                 ")"));
  }
  ASSIGN_OR_RETURN(const uint64_t groups, m.GetUintOr(p + "expert_group_count", 1));
  if (groups > 1 && static_cast<int64_t>(groups) != c.n_expert_group) {
    return absl::UnimplementedError(absl::StrCat(p, "expert_group_count is ", groups, "; Strata implements grouped ",
                                                 "expert choice for deepseek2 only (expected 1 for ", c.arch, ")"));
  }
  ASSIGN_OR_RETURN(const bool renorm, m.GetBoolOr(p + "expert_weights_norm", c.router_renorm));
  if (renorm != c.router_renorm) {
    return absl::UnimplementedError(absl::StrCat(p, "expert_weights_norm is ", renorm ? "true" : "false", "; ",
                                                 c.arch, " in Strata ", c.router_renorm ? "renormalises" : "does not renormalise",
                                                 " the top-k router weights"));
  }
  ASSIGN_OR_RETURN(const double weights_scale, m.GetFloatOr(p + "expert_weights_scale", 1.0));
  if (weights_scale != 1.0 && weights_scale != 0.0 && static_cast<float>(weights_scale) != c.routed_scale) {
    return absl::UnimplementedError(absl::StrCat(p, "expert_weights_scale is ", weights_scale, "; ", c.arch,
                                                 " in Strata does not scale the routed experts (expected 1)"));
  }
  if (c.rope_dim != c.head_dim && !c.partial_rope) {
    return absl::UnimplementedError(absl::StrCat(p, "rope.dimension_count ", c.rope_dim, " differs from the head size ",
                                                 c.head_dim, "; Strata rotates whole heads of ", c.arch));
  }
  if (c.rope_dim > c.head_dim || c.rope_dim % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(p, "rope.dimension_count is ", c.rope_dim,
                                                   ", expected an even number up to the head size ", c.head_dim));
  }
  if (c.n_expert_used > c.n_expert) {
    return absl::InvalidArgumentError(absl::StrCat(p, "expert_used_count ", c.n_expert_used, " exceeds expert_count ",
                                                   c.n_expert));
  }
  if (c.n_vocab == 0) return absl::InvalidArgumentError("tokenizer.ggml.tokens is empty");
  if (c.attention_scale == 0.0f) c.attention_scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  return c;
}

}  // namespace strata::model
