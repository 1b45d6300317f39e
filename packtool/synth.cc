#include "packtool/synth.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <filesystem>
#include <span>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/pack/pack_format.h"
#include "engine/status_macros.h"
#include "packtool/builtin_vocab.h"
#include "packtool/pack_writer.h"
#include "packtool/synth_arch.h"
#include "packtool/synth_codes.h"
#include "packtool/synth_router_skew.h"
#include "packtool/synth_values.h"

namespace strata::packtool {
namespace {

// Splits [0, n) into `threads` contiguous ranges and runs fn(begin, end) on each, in parallel.
void ParallelRanges(int64_t n, int threads, const std::function<void(int64_t, int64_t)>& fn) {
  threads = static_cast<int>(std::clamp<int64_t>(n / 4096, 1, threads));
  if (threads <= 1) {
    fn(0, n);
    return;
  }
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    const int64_t b = n * t / threads, e = n * (t + 1) / threads;
    pool.emplace_back(fn, b, e);
  }
  for (std::thread& th : pool) th.join();
}

// Multiplies `values` so that their Euclidean norm is `norm`.
void ScaleToNorm(double norm, std::span<float> values) {
  double sum = 0;
  for (float v : values) sum += static_cast<double>(v) * v;
  if (sum <= 0) return;
  const double factor = norm / std::sqrt(sum);
  for (float& v : values) v = static_cast<float>(v * factor);
}

absl::StatusOr<VocabMetadata> LoadVocab(const SynthOptions& options) {
  if (options.vocab_path.empty()) return BuiltinVocab(options.geometry.n_vocab);
  ASSIGN_OR_RETURN(VocabMetadata v, VocabFromGguf(options.vocab_path));
  if (options.geometry.n_vocab != 0 && options.geometry.n_vocab != v.n_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("--vocab-size ", options.geometry.n_vocab, " differs from the ",
                                                   v.n_tokens, " tokens of --vocab ", options.vocab_path));
  }
  return v;
}

gguf::GgmlType TensorType(const SynthTensor& t, const SynthOptions& options) {
  switch (t.kind) {
    case SynthTensorKind::kNorm:
    case SynthTensorKind::kBias:
    case SynthTensorKind::kRouter:
      return gguf::GgmlType::kF32;  // llama.cpp keeps norms, biases and the router in f32
    case SynthTensorKind::kExpert:
      return options.expert_type;
    default:
      return options.dense_type;
  }
}

// Declares every tensor (optionally without the experts) and the metadata in `writer`.
absl::Status BuildModel(const SynthOptions& options, const SynthGeometry& g, const VocabMetadata& vocab,
                        bool include_experts, gguf::GgufWriter* writer) {
  ASSIGN_OR_RETURN(const SynthArch* arch, FindSynthArch(g.arch));
  SetSynthMetadata(*arch, g, writer);
  if (options.router_skew > 0) writer->SetFloat32(kRouterSkewKey, static_cast<float>(options.router_skew));
  writer->SetUint32("general.quantization_version", 2);
  for (const auto& [key, value] : vocab.entries) writer->Set(key, value);
  const int threads = ResolveThreads(options.threads);
  for (const SynthTensor& t : SynthTensors(*arch, g)) {
    if (t.kind == SynthTensorKind::kExpert && !include_experts) continue;
    const gguf::GgmlType type = TensorType(t, options);
    const uint64_t stream = SynthStream(options.seed, t.name);
    const int64_t row = t.ne[0];
    int64_t n_rows = 1;
    for (size_t i = 1; i < t.ne.size(); ++i) n_rows *= t.ne[i];
    absl::StatusOr<uint64_t> row_bytes_or = gguf::RowBytes(type, row);
    if (!row_bytes_or.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          t.kind == SynthTensorKind::kExpert ? "--expert-type " : "--type ", gguf::TypeName(static_cast<uint32_t>(type)),
          ": tensor '", t.name, "' has rows of ", row, " weights: ", row_bytes_or.status().message()));
    }
    const uint64_t row_bytes = *row_bytes_or;
    const float scale = t.scale, offset = t.offset;
    const std::string name = t.name;
    // The router of a MoE layer ([n_embd, n_expert]: a row per expert) under --router-skew: the norm each row
    // is set to, RouterSkewRowNorms' factor times the norm a random row has on average, scale * sqrt(n_embd).
    std::vector<double> row_norms;
    if (options.router_skew > 0 && t.kind == SynthTensorKind::kRouter && t.ne.size() == 2) {
      row_norms = RouterSkewRowNorms(stream, g.n_expert, g.n_expert_used, options.router_skew);
      for (double& n : row_norms) n *= scale * std::sqrt(static_cast<double>(row));
    }
    // A bias the router adds to its scores before it picks would move the picks off the law: zeros instead.
    const bool zero = options.router_skew > 0 && IsRouterPickBias(t.name);
    RETURN_IF_ERROR(writer->AddTensor(
        t.name, type, t.ne, [=](std::span<uint8_t> dst) -> absl::Status {
          std::atomic<bool> bad{false};
          ParallelRanges(n_rows, threads, [&](int64_t r0, int64_t r1) {
            std::vector<float> values(row);
            for (int64_t r = r0; r < r1; ++r) {
              FillSynthValues(stream, static_cast<uint64_t>(r * row), row, scale, offset, values.data());
              if (!row_norms.empty()) ScaleToNorm(row_norms[static_cast<size_t>(r)], values);
              if (zero) std::fill(values.begin(), values.end(), 0.0f);
              if (!gguf::Quantize(type, values.data(), dst.data() + r * row_bytes, row).ok()) bad = true;
            }
          });
          if (bad) return absl::InternalError(absl::StrCat("synth: cannot encode tensor ", name));
          return absl::OkStatus();
        }));
  }
  return absl::OkStatus();
}

// Refuses, before writing anything, a pack the output's file system cannot hold (a real-size geometry is
// hundreds of GB): dense.gguf's tensors plus `expert_bytes`, against the space available there.
absl::Status CheckOutputSpace(const SynthOptions& options, const SynthGeometry& g, const SynthArch& arch,
                              uint64_t expert_bytes) {
  uint64_t need = expert_bytes;
  for (const SynthTensor& t : SynthTensors(arch, g)) {
    if (t.kind == SynthTensorKind::kExpert) continue;
    int64_t rows = 1;
    for (size_t i = 1; i < t.ne.size(); ++i) rows *= t.ne[i];
    need += gguf::RowBytes(TensorType(t, options), t.ne[0]).value_or(0) * static_cast<uint64_t>(rows);
  }
  std::filesystem::path dir = std::filesystem::absolute(options.output).parent_path();
  std::error_code ec;
  const std::filesystem::space_info space = std::filesystem::space(dir, ec);
  if (ec) return absl::OkStatus();  // unknown: the writes themselves report a full disk
  if (need > space.available) {
    return absl::ResourceExhaustedError(absl::StrCat("synth --pack-only: the pack needs ", need >> 20, " MiB but ",
                                                     dir.string(), " has ", space.available >> 20,
                                                     " MiB available; write it where there is room"));
  }
  return absl::OkStatus();
}

// Where the random codes of one role come from: the tensor's value stream and the spread of its weights.
struct RandomRoleSource {
  uint64_t stream = 0;
  float stddev = 0;
};

// Fills a blob with random codes for the expert tensors in `tensors`; null when one of them has a nonzero
// mean (random codes of the symmetric schemes are centred on 0).
BlobFiller MakeRandomBlobFiller(const std::vector<SynthTensor>& tensors, int64_t n_layer, int64_t n_dense_lead,
                                const pack::BlobLayout& layout, uint64_t seed) {
  std::vector<std::array<RandomRoleSource, 3>> sources(static_cast<size_t>(n_layer));
  for (const SynthTensor& t : tensors) {
    if (t.kind != SynthTensorKind::kExpert) continue;
    if (t.offset != 0.0f) return nullptr;
    sources[static_cast<size_t>(t.layer)][static_cast<size_t>(t.role)] = {SynthStream(seed, t.name), t.scale};
  }
  const uint64_t role_elems = static_cast<uint64_t>(layout.n_embd) * static_cast<uint64_t>(layout.expert_ff);
  // The blocks of a synthetic model are MoE from n_dense_lead on: block = n_dense_lead + MoE layer index.
  return [sources = std::move(sources), layout, role_elems, n_dense_lead](int64_t moe_layer, int64_t expert,
                                                                          std::span<uint8_t> blob) -> absl::Status {
    for (int r = 0; r < 3; ++r) {
      const RandomRoleSource& source = sources[static_cast<size_t>(n_dense_lead + moe_layer)][static_cast<size_t>(r)];
      // The role's first element in the tensor's stream, as for the f32 weights: expert * rows * cols.
      RETURN_IF_ERROR(FillRandomRole(layout.scheme, layout.rows(r), layout.cols(r), source.stddev, source.stream,
                                     static_cast<uint64_t>(expert) * role_elems, blob.data() + layout.role_offset[r]));
    }
    return absl::OkStatus();
  };
}

}  // namespace

std::vector<std::string> SynthArchitectures() {
  std::vector<std::string> names;
  for (const SynthArch& a : SynthArchTable()) names.emplace_back(a.name);
  return names;
}

std::vector<std::string> SynthPresets() { return {"tiny", "small", "seed"}; }

namespace {

// DeepSeek's shapes: tiny is V2-Lite's kind (q without LoRA, softmax router, 2 shared experts), small V3's (q
// LoRA, sigmoid router with exp_probs_b, 1 shared expert), both with a dense block, expert groups and YaRN;
// seed is DeepSeek-V3 (config.json of deepseek-ai/DeepSeek-V3).
void SetDeepseek2Preset(std::string_view preset, SynthGeometry* g) {
  g->rope_freq_base = 10000.0f;
  if (preset == "tiny") {
    g->n_layer = 3, g->n_dense_lead = 1, g->dense_ff = 256, g->n_expert = 8, g->n_expert_used = 3;
    g->n_expert_group = 4, g->n_group_used = 2, g->n_embd = 128, g->expert_ff = 128, g->shared_ff = 256;
    g->n_head = 4, g->head_dim = 48, g->rope_dim = 16, g->v_dim = 32, g->kv_lora_rank = 64, g->q_lora_rank = 0;
    g->expert_gating = 1, g->expert_weights_norm = false, g->expert_weights_scale = 1.0f;
    g->yarn_factor = 4.0f, g->yarn_original_context = 512, g->yarn_log_multiplier = 0.0707f;
  } else if (preset == "small") {
    g->n_layer = 4, g->n_dense_lead = 1, g->dense_ff = 1024, g->n_expert = 32, g->n_expert_used = 4;
    g->n_expert_group = 8, g->n_group_used = 4, g->n_embd = 512, g->expert_ff = 256, g->shared_ff = 256;
    g->n_head = 8, g->head_dim = 96, g->rope_dim = 32, g->v_dim = 64, g->kv_lora_rank = 128, g->q_lora_rank = 192;
    g->expert_gating = 2, g->expert_weights_norm = true, g->expert_weights_scale = 2.5f;
    g->yarn_factor = 40.0f, g->yarn_original_context = 4096, g->yarn_log_multiplier = 0.1f;
    g->n_ctx = 16384;
  } else {
    g->n_layer = 61, g->n_dense_lead = 3, g->dense_ff = 18432, g->n_expert = 256, g->n_expert_used = 8;
    g->n_expert_group = 8, g->n_group_used = 4, g->n_embd = 7168, g->expert_ff = 2048, g->shared_ff = 2048;
    g->n_head = 128, g->head_dim = 192, g->rope_dim = 64, g->v_dim = 128, g->kv_lora_rank = 512;
    g->q_lora_rank = 1536, g->expert_gating = 2, g->expert_weights_norm = true, g->expert_weights_scale = 2.5f;
    g->yarn_factor = 40.0f, g->yarn_original_context = 4096, g->yarn_log_multiplier = 0.1f;
    g->n_ctx = 163840;
  }
  g->n_head_kv = g->n_head;  // as DeepSeek's GGUFs say; latent attention has no kv heads
}

}  // namespace

absl::StatusOr<SynthGeometry> PresetGeometry(std::string_view arch, std::string_view preset) {
  RETURN_IF_ERROR(FindSynthArch(arch).status());
  SynthGeometry g;
  g.arch = std::string(arch);
  if (preset == "tiny") {
    g.n_layer = 2, g.n_expert = 8, g.n_expert_used = 2, g.n_embd = 128, g.expert_ff = 128;
    g.n_head = 4, g.n_head_kv = 2, g.head_dim = 32, g.n_ctx = 2048;
  } else if (preset == "small") {
    g.n_layer = 8, g.n_expert = 32, g.n_expert_used = 4, g.n_embd = 1024, g.expert_ff = 512;
    g.n_head = 16, g.n_head_kv = 4, g.head_dim = 64, g.n_ctx = 4096;
  } else if (preset == "seed") {
    g.n_layer = 48, g.n_expert = 512, g.n_expert_used = 10, g.n_embd = 2560, g.expert_ff = 640;
    g.n_head = 32, g.n_head_kv = 4, g.head_dim = 128, g.n_ctx = 32768;
  } else {
    return absl::InvalidArgumentError(absl::StrCat("--preset: unknown preset '", std::string(preset),
                                                   "' (expected one of: ", absl::StrJoin(SynthPresets(), ", "), ")"));
  }
  if (arch == "mixtral") g.rope_freq_base = 1000000.0f, g.rms_norm_eps = 1e-5f;
  // Qwen1.5-MoE's shared expert is 4 experts wide.
  g.shared_ff = 4 * g.expert_ff;
  if (arch == "glm4moe") {
    // GLM-4.5-Air's shape: one dense block first, one shared expert as wide as a routed one, half of each
    // head rotated.
    g.n_dense_lead = 1;
    g.dense_ff = 4 * g.expert_ff;
    g.shared_ff = g.expert_ff;
    g.rope_dim = g.head_dim / 2;
  }
  if (arch == "gpt-oss") {
    // gpt-oss's rope base and epsilon; a window short enough that the tests' prompts pass it.
    g.rope_freq_base = 150000.0f, g.rms_norm_eps = 1e-5f;
    g.sliding_window = 8;
    if (preset == "seed") {  // gpt-oss-120b (its config.json)
      g.n_layer = 36, g.n_expert = 128, g.n_expert_used = 4, g.n_embd = 2880, g.expert_ff = 2880;
      g.n_head = 64, g.n_head_kv = 8, g.head_dim = 64, g.n_ctx = 131072, g.sliding_window = 128;
    }
  }
  if (arch == "deepseek2") SetDeepseek2Preset(preset, &g);
  if (arch == "olmoe") {
    // llama.cpp loads OLMoE's k norm with n_embd weights: as many kv heads as heads.
    g.n_head_kv = g.n_head;
    g.rope_freq_base = 10000.0f, g.rms_norm_eps = 1e-5f;
  }
  return g;
}

absl::Status CheckSynthGeometry(const SynthGeometry& g) {
  RETURN_IF_ERROR(FindSynthArch(g.arch).status());
  if (g.head_qk_norm && g.arch != "glm4moe") {
    return absl::InvalidArgumentError(absl::StrCat("--qk-norm: only glm4moe has an optional per-head q/k norm (GLM-4.5); ",
                                                   g.arch, " has its own or none"));
  }
  const std::pair<const char*, int64_t> positive[] = {
      {"--layers", g.n_layer}, {"--experts", g.n_expert}, {"--experts-used", g.n_expert_used},
      {"--embd", g.n_embd},    {"--expert-ff", g.expert_ff}, {"--shared-ff", g.shared_ff}, {"--heads", g.n_head},
      {"--kv-heads", g.n_head_kv}, {"--head-dim", g.head_dim}, {"--ctx", g.n_ctx}};
  for (const auto& [flag, v] : positive) {
    if (v <= 0 || v > (int64_t{1} << 30)) {
      return absl::InvalidArgumentError(absl::StrCat(flag, ": ", v, " is out of range (expected 1 .. 2^30)"));
    }
  }
  if (g.n_expert_used > g.n_expert) {
    return absl::InvalidArgumentError(
        absl::StrCat("--experts-used: ", g.n_expert_used, " exceeds --experts ", g.n_expert));
  }
  if (g.n_head % g.n_head_kv != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--heads: ", g.n_head, " is not a multiple of --kv-heads ", g.n_head_kv));
  }
  if (g.head_dim % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("--head-dim: ", g.head_dim, " must be even for RoPE"));
  }
  // Every scheme and every synth tensor type must be able to hold the experts: multiples of 64 (s2's group).
  if (g.n_embd % 64 != 0 || g.expert_ff % 64 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("--embd (", g.n_embd, ") and --expert-ff (", g.expert_ff,
                                                   ") must be multiples of 64"));
  }
  if (g.n_vocab < 0) return absl::InvalidArgumentError(absl::StrCat("--vocab-size: ", g.n_vocab, " is negative"));
  if (g.n_mtp_layers < 0 || g.n_mtp_layers > 16) {
    return absl::InvalidArgumentError(absl::StrCat("--mtp-layers: ", g.n_mtp_layers, " is out of range (expected 0 .. 16)"));
  }
  if (g.n_mtp_layers > 0 && g.arch != "glm4moe" && g.arch != "deepseek2") {
    return absl::InvalidArgumentError(absl::StrCat("--mtp-layers: architecture ", g.arch,
                                                   " has no multi-token-prediction blocks (expected glm4moe or deepseek2)"));
  }
  // Set by the presets only (no flags): checked for what the writers assume.
  if (g.n_dense_lead < 0 || g.n_dense_lead >= g.n_layer || g.dense_ff <= 0 || g.rope_dim < 0 || g.rope_dim > g.head_dim ||
      g.rope_dim % 2 != 0 || ((g.arch == "glm4moe" || g.arch == "deepseek2") && g.shared_ff % g.expert_ff != 0) ||
      g.sliding_window <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("synth geometry: dense blocks ", g.n_dense_lead, " of --layers ",
                                                   g.n_layer, ", dense width ", g.dense_ff, ", rope dimensions ",
                                                   g.rope_dim, " of --head-dim ", g.head_dim, ", --shared-ff ",
                                                   g.shared_ff, " of --expert-ff ", g.expert_ff, ", sliding window ",
                                                   g.sliding_window, " do not fit"));
  }
  if (g.arch == "deepseek2") {
    const int64_t groups = g.n_expert_group;
    if (g.kv_lora_rank <= 0 || g.v_dim <= 0 || g.q_lora_rank < 0 || g.rope_dim <= 0 || g.rope_dim >= g.head_dim ||
        groups <= 0 || g.n_expert % groups != 0 || g.n_group_used <= 0 || g.n_group_used > groups ||
        g.n_group_used * (g.n_expert / groups) < g.n_expert_used || (g.expert_gating != 1 && g.expert_gating != 2)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "synth geometry: deepseek2 with --experts ", g.n_expert, " in ", groups, " groups (", g.n_group_used,
          " used) for --experts-used ", g.n_expert_used, ", --head-dim ", g.head_dim, " (rope ", g.rope_dim,
          "), value ", g.v_dim, ", kv LoRA ", g.kv_lora_rank, ", gating ", g.expert_gating, " does not fit"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<gguf::GgmlType> ParseSynthType(std::string_view name) {
  const std::pair<std::string_view, gguf::GgmlType> types[] = {
      {"f32", gguf::GgmlType::kF32},   {"f16", gguf::GgmlType::kF16},   {"bf16", gguf::GgmlType::kBF16},
      {"q8_0", gguf::GgmlType::kQ8_0}, {"q4_0", gguf::GgmlType::kQ4_0}, {"q4_1", gguf::GgmlType::kQ4_1},
      {"q6_K", gguf::GgmlType::kQ6_K}, {"q5_K", gguf::GgmlType::kQ5_K}, {"q4_K", gguf::GgmlType::kQ4_K},
      {"q3_K", gguf::GgmlType::kQ3_K}, {"q2_K", gguf::GgmlType::kQ2_K}, {"mxfp4", gguf::GgmlType::kMXFP4}};
  for (const auto& [n, t] : types) {
    if (n == name) return t;
  }
  return absl::InvalidArgumentError(absl::StrCat("tensor type '", std::string(name),
                                                 "' is not one synth writes (expected f32, f16, bf16, q8_0, q4_0, "
                                                 "q4_1, q6_K, q5_K, q4_K, q3_K, q2_K, mxfp4)"));
}

absl::Status SynthesizeGguf(const SynthOptions& options) {
  RETURN_IF_ERROR(CheckSynthGeometry(options.geometry));
  RETURN_IF_ERROR(CheckRouterSkew(options.geometry.arch, options.geometry.n_expert, options.geometry.n_expert_used,
                                  options.router_skew));
  ASSIGN_OR_RETURN(VocabMetadata vocab, LoadVocab(options));
  SynthGeometry g = options.geometry;
  g.n_vocab = vocab.n_tokens;
  // Never truncate an existing file: write beside it and rename once complete.
  RETURN_IF_ERROR(CheckOutputFree(options.output));
  gguf::GgufWriter writer;
  RETURN_IF_ERROR(BuildModel(options, g, vocab, /*include_experts=*/true, &writer));
  const std::string partial = options.output + ".partial";
  RETURN_IF_ERROR(writer.WriteFile(partial));
  std::error_code ec;
  std::filesystem::rename(partial, options.output, ec);
  if (ec) {
    std::filesystem::remove(partial, ec);
    return absl::InternalError(absl::StrCat(options.output, ": rename from ", partial, " failed: ", ec.message()));
  }
  return absl::OkStatus();
}

absl::StatusOr<pack::v1::Manifest> SynthesizePack(const SynthOptions& options, const ConvertProgressFn& progress,
                                                  const std::atomic<bool>* cancel) {
  RETURN_IF_ERROR(CheckSynthGeometry(options.geometry));
  if (options.geometry.n_mtp_layers > 0) {
    return absl::InvalidArgumentError(absl::StrCat("--mtp-layers: ", options.geometry.n_mtp_layers,
                                                   " with --pack-only; a pack holds only the blocks Strata runs ",
                                                   "(write a GGUF instead, which convert turns into that pack)"));
  }
  RETURN_IF_ERROR(CheckRouterSkew(options.geometry.arch, options.geometry.n_expert, options.geometry.n_expert_used,
                                  options.router_skew));
  ASSIGN_OR_RETURN(VocabMetadata vocab, LoadVocab(options));
  ASSIGN_OR_RETURN(const SynthArch* arch, FindSynthArch(options.geometry.arch));
  SynthGeometry g = options.geometry;
  g.n_vocab = vocab.n_tokens;
  ASSIGN_OR_RETURN(pack::BlobLayout layout, pack::ComputeBlobLayout(options.pack_scheme, g.n_embd, g.expert_ff));

  PackWriteJob job;
  job.output_dir = options.output;
  job.layout = layout;
  job.threads = options.threads;
  job.manifest.set_architecture(std::string(arch->gguf_arch));
  job.manifest.set_created_by(options.exact_quantize ? "synth" : kSynthRandomCodesCreatedBy);
  pack::v1::Geometry* geo = job.manifest.mutable_geometry();
  geo->set_n_layer(static_cast<uint32_t>(g.n_layer));
  const int64_t n_moe = g.n_layer - g.n_dense_lead;
  geo->set_n_moe_layers(static_cast<uint32_t>(n_moe));
  for (int64_t l = g.n_dense_lead; l < g.n_layer; ++l) geo->add_moe_layers(static_cast<uint32_t>(l));
  geo->set_n_expert(static_cast<uint32_t>(g.n_expert));
  // As convert reads it from expert_shared_count, which only glm4moe's and deepseek2's metadata have.
  if (arch->sigmoid_router || arch->latent_attention) {
    geo->set_n_shared_experts(static_cast<uint32_t>(g.shared_ff / g.expert_ff));
  }
  geo->set_n_expert_used(static_cast<uint32_t>(g.n_expert_used));
  geo->set_n_embd(static_cast<uint32_t>(g.n_embd));
  geo->set_expert_ff(static_cast<uint32_t>(g.expert_ff));
  job.source_expert_bytes = static_cast<uint64_t>(n_moe) * g.n_expert * 3 * g.n_embd * g.expert_ff * sizeof(float);
  job.write_dense = [&](const std::string& path, std::vector<pack::v1::RoleError>*) -> absl::Status {
    gguf::GgufWriter writer;
    RETURN_IF_ERROR(BuildModel(options, g, vocab, /*include_experts=*/false, &writer));
    return writer.WriteFile(path);
  };
  RETURN_IF_ERROR(CheckOutputSpace(options, g, *arch, static_cast<uint64_t>(n_moe) * g.n_expert * layout.blob_bytes));
  const uint64_t seed = options.seed;
  const uint64_t role_elems = static_cast<uint64_t>(g.n_embd) * g.expert_ff;
  std::vector<SynthTensor> tensors = SynthTensors(*arch, g);
  if (!options.exact_quantize) {
    // No source to read: the progress rate is the rate at which blobs are written.
    job.source_expert_bytes = static_cast<uint64_t>(n_moe) * g.n_expert * layout.blob_bytes;
    job.fill_blob = MakeRandomBlobFiller(tensors, g.n_layer, g.n_dense_lead, layout, seed);
    if (!job.fill_blob) return absl::InternalError("synth: an expert tensor is not centred on 0");
    return WritePack(job, progress, cancel);
  }
  job.fill_expert = [&, seed, role_elems](int64_t moe_layer, int64_t expert, float* gate, float* up,
                                          float* down) -> absl::Status {
    float* out[3] = {gate, up, down};
    for (const SynthTensor& t : tensors) {
      if (t.kind != SynthTensorKind::kExpert || t.layer != g.n_dense_lead + moe_layer) continue;
      // Element (expert, row, col) of a [cols, rows, n_expert] tensor is number expert*rows*cols + row*cols
      // + col: the same stream index SynthesizeGguf uses.
      FillSynthValues(SynthStream(seed, t.name), static_cast<uint64_t>(expert) * role_elems,
                      static_cast<int64_t>(role_elems), t.scale, t.offset, out[t.role]);
    }
    return absl::OkStatus();
  };
  return WritePack(job, progress, cancel);
}

}  // namespace strata::packtool
