#include "services/pack_cli.h"

#include <algorithm>
#include <filesystem>
#include <memory>
#include <system_error>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "kernels/format/scheme.h"
#include "engine/pack/routing_profile.h"
#include "packtool/pack_writer.h"
#include "packtool/routing_profiler.h"
#include "packtool/source_scheme.h"
#include "packtool/synth.h"
#include "packtool/synth_router_skew.h"
#include "services/packtool_backend.h"
#include "services/packtool_protos.h"
#include "services/progress_printer.h"
#include "strata/v1/packtool.pb.h"

namespace strata::services {
namespace {

constexpr char kUsage[] =
    R"(usage: strata-pack <command> [arguments] [flags]

commands:
  synth --out FILE.gguf [--arch qwen3moe|mixtral|qwen2moe|olmoe|glm4moe|gpt-oss|deepseek2] [--preset tiny|small|seed] [geometry flags]
        [--type T] [--expert-type T] [--seed N] [--vocab FILE.gguf] [--router-skew S] [--mtp-layers N] [--qk-norm]
        [--pack-only --scheme S [--exact-quantize]] [--threads N]
      Writes a synthetic MoE model with random weights (a pack directory with --pack-only). With
      --pack-only the experts are random codes and scales written directly, with the spread the weights
      would have (no quantization error is measured); --exact-quantize makes f32 weights and quantizes
      them instead (slow; the experts then equal those of synth's GGUF converted by convert).
      Geometry flags override the preset: --layers --experts --experts-used --embd --expert-ff --shared-ff
      --heads --kv-heads --head-dim --vocab-size --ctx. Types: f32 f16 bf16 q8_0 q4_0 q4_1 q6_K q5_K q4_K
      q3_K q2_K mxfp4 (K types: rows of whole 256-weight blocks, e.g. --embd and --expert-ff multiples of
      256).
      --router-skew S (qwen3moe, mixtral, qwen2moe, olmoe, glm4moe; default 0: uniform) scales each router
      row so that expert popularity follows a Zipf law with exponent S over a seeded order of each layer's
      experts (an expert is picked at most 0.45 of the tokens; glm4moe's score bias becomes zeros). Hottest expert over the mean at top-10 of 512
      experts (the seed preset): S 0.18 -> about 2.5x, 0.32 -> 5x, 0.42 -> 8x; fewer experts reach less
      (top-4 of 32: at most 3.6x).
      --qk-norm (glm4moe) adds GLM-4.5's per-head q/k RMSNorm (attn_q_norm, attn_k_norm; GLM-4.5-Air has none).
      --mtp-layers N (glm4moe, deepseek2; not with --pack-only) adds N multi-token-prediction blocks after
      the layers, as GLM-4.5's GGUFs carry them (block_count counts them, nextn_predict_layers says N, the
      blk.L.nextn.* tensors); Strata does not run them and convert leaves them out.
      Local only.
  convert IN.gguf|FIRST-SHARD|HF_DIR OUT_DIR [--scheme auto|f16|s8|s4|s2|mxfp4] [--dense-type keep|f16|bf16|q8_0]
        [--threads N] [--tokenizer-gguf FILE.gguf]
      Converts a GGUF model, or a Hugging Face checkpoint (HF_DIR: config.json, *.safetensors and a
      byte-level BPE tokenizer.json, or --tokenizer-gguf naming a GGUF whose tokenizer to take instead;
      Qwen3Moe, Mixtral, DeepseekV2, DeepseekV3, GptOss, Qwen2Moe, Olmoe or Glm4Moe ...ForCausalLM; F16, BF16,
      F32, DeepSeek's FP8 block-scaled and gpt-oss's MXFP4 weights), into a pack directory.
      --scheme auto (the default) picks the scheme that adds the least error to the source's experts: s4
      for f32, f16, bf16, and for q4_0, q4_1 and q4_K (their codes carried over as they are), mxfp4 for
      mxfp4 (carried over byte for byte), s8 for q8_0, q6_K, q5_K, q5_0, q5_1, q3_K and q2_K (the most
      precise one any expert tensor needs). --dense-type
      stores the dense weight matrices (attention, embeddings, output) as f16, bf16 or q8_0 instead of the
      source's type (keep, the default); norms and the router are copied as they are.
  validate DIR [--quick] [--threads N]
      Checks a pack; --quick skips the per-expert checksums. Exit status 1 when it finds problems.
  inspect DIR|FILE.gguf
      Describes a pack or a GGUF file.
  profile DIR --prompts FILE [--tokens N] [--chat] [--threads N]
      Runs each prompt of FILE (one a line; blank lines skipped) through the pack's model on the CPU, then
      --tokens N tokens generated greedily (default 32), counts how often the router picks each expert of
      each layer, and stores the counts in the pack (DIR/routing_profile.bin, replacing any earlier
      profile, atomically), for a VRAM expert cache to start with the experts it found hottest. --chat
      sends each prompt as a user message through the model's chat template, as a chat client would.
      Local only.

--server ADDR runs convert, validate and inspect on a strata-packd; paths are then relative to its data root.
)";

int Fail(const CliIo& io, int code, absl::string_view message) {
  *io.err << "strata-pack: error: " << message << '\n' << std::flush;
  return code;
}

int UsageError(const CliIo& io, absl::string_view message) {
  return Fail(io, kExitUsage, absl::StrCat(message, " (see strata-pack --help)"));
}

// Checks the positional arguments of `command` (args[0]): exactly `expected` after it.
bool CheckArity(const std::vector<std::string>& args, size_t expected, absl::string_view what, const CliIo& io,
                int* exit_code) {
  if (args.size() - 1 == expected) return true;
  if (args.size() - 1 < expected) {
    *exit_code = UsageError(io, absl::StrCat(args[0], ": missing ", what));
  } else {
    *exit_code = UsageError(io, absl::StrCat(args[0], ": unexpected argument '", args[expected + 1], "'"));
  }
  return false;
}

std::unique_ptr<PackToolBackend> MakeBackend(const PackCliOptions& options) {
  if (options.server.empty()) return NewLocalBackend();
  return NewRemoteBackend(NewPackToolChannel(options.server), options.server);
}

// Summary of a finished pack and the per-role quantization error table.
void PrintPackSummary(const pack::v1::Manifest& m, absl::string_view dir, absl::Duration took, std::ostream& out) {
  const pack::v1::Geometry& g = m.geometry();
  out << absl::StrFormat("wrote %s in %.1f s: %s, %u MoE layers x %u experts (%u used), n_embd %u, expert ff %u\n", dir,
                         absl::ToDoubleSeconds(took), m.architecture(), g.n_moe_layers(), g.n_expert(),
                         g.n_expert_used(), g.n_embd(), g.expert_ff());
  out << absl::StrFormat("  scheme %s: %s per expert, experts.bin %s, dense.gguf %s\n", m.scheme(),
                         FormatBytes(static_cast<double>(m.blob_bytes())),
                         FormatBytes(static_cast<double>(m.experts_bytes())),
                         FormatBytes(static_cast<double>(m.dense_bytes())));
  if (m.quant_error_size() == 0) return;
  out << "quantization error by role:\n";
  out << absl::StrFormat("  %-6s %12s %12s\n", "role", "rel_rms", "max_abs");
  for (const pack::v1::RoleError& error : m.quant_error()) {
    out << absl::StrFormat("  %-6s %12.4e %12.4e\n", error.role(), error.rel_rms(), error.max_abs());
  }
}

int RunSynth(const std::vector<std::string>& args, const PackCliOptions& options, const CliIo& io) {
  int exit_code = kExitOk;
  if (!CheckArity(args, 0, "", io, &exit_code)) return exit_code;
  if (!options.server.empty()) {
    return UsageError(io, "synth runs in this process only; drop --server and copy the file to the server");
  }
  if (options.out.empty()) return UsageError(io, "synth: missing --out");
  if (absl::Status s = packtool::CheckThreads(options.threads, "--threads"); !s.ok()) return UsageError(io, std::string(s.message()));

  absl::StatusOr<packtool::SynthGeometry> preset = packtool::PresetGeometry(options.arch, options.preset);
  if (!preset.ok()) return UsageError(io, absl::StrCat("--arch/--preset: ", preset.status().message()));
  packtool::SynthOptions synth;
  synth.geometry = *preset;
  packtool::SynthGeometry& g = synth.geometry;
  const std::pair<const std::optional<int64_t>*, int64_t*> overrides[] = {
      {&options.layers, &g.n_layer},     {&options.experts, &g.n_expert},    {&options.experts_used, &g.n_expert_used},
      {&options.embd, &g.n_embd},        {&options.expert_ff, &g.expert_ff}, {&options.shared_ff, &g.shared_ff},
      {&options.heads, &g.n_head},
      {&options.kv_heads, &g.n_head_kv}, {&options.head_dim, &g.head_dim},   {&options.vocab_size, &g.n_vocab},
      {&options.ctx, &g.n_ctx},          {&options.mtp_layers, &g.n_mtp_layers}};
  for (const auto& [value, field] : overrides) {
    if (value->has_value()) *field = **value;
  }
  g.head_qk_norm = options.qk_norm;
  if (absl::Status status = packtool::CheckSynthGeometry(g); !status.ok()) {
    return UsageError(io, absl::StrCat("synth geometry: ", status.message()));
  }
  if (absl::Status status = packtool::CheckRouterSkew(g.arch, g.n_expert, g.n_expert_used, options.router_skew);
      !status.ok()) {
    return UsageError(io, std::string(status.message()));
  }
  absl::StatusOr<gguf::GgmlType> dense_type = packtool::ParseSynthType(options.type);
  if (!dense_type.ok()) return UsageError(io, absl::StrCat("--type: ", dense_type.status().message()));
  absl::StatusOr<gguf::GgmlType> expert_type = packtool::ParseSynthType(options.expert_type);
  if (!expert_type.ok()) return UsageError(io, absl::StrCat("--expert-type: ", expert_type.status().message()));
  // auto: s4, what convert picks for the float weights synth makes.
  absl::StatusOr<kernels::Scheme> scheme =
      kernels::ParseScheme(options.scheme == "auto" ? std::string("s4") : options.scheme);
  if (!scheme.ok()) {
    return UsageError(io, absl::StrCat("--scheme: unknown '", options.scheme, "'; expected auto, f16, s8, s4, s2 or mxfp4"));
  }
  synth.dense_type = *dense_type;
  synth.expert_type = *expert_type;
  synth.seed = options.seed;
  synth.vocab_path = options.vocab;
  synth.output = options.out;
  synth.pack_scheme = *scheme;
  synth.threads = options.threads;
  synth.exact_quantize = options.exact_quantize;
  synth.router_skew = options.router_skew;
  if (synth.exact_quantize && !options.pack_only) return UsageError(io, "--exact-quantize needs --pack-only");
  if (g.n_mtp_layers > 0 && options.pack_only) {
    return UsageError(io, absl::StrCat("--mtp-layers: ", g.n_mtp_layers, " with --pack-only; a pack holds only the ",
                                       "blocks Strata runs (write a GGUF instead, which convert turns into that pack)"));
  }

  // Said after the summary, when the model was written.
  const std::string skew_line =
      synth.router_skew > 0
          ? absl::StrFormat("router skew %g: the hottest expert of each layer aimed at %.2fx the mean (a Zipf law "
                            "over a seeded order of the experts, for router inputs of random direction)\n",
                            synth.router_skew,
                            packtool::RouterSkewHottestOverMean(g.n_expert, g.n_expert_used, synth.router_skew))
          : std::string();
  const absl::Time start = absl::Now();
  if (options.pack_only) {
    ProgressPrinter printer(io.err, io.err_is_terminal);
    absl::StatusOr<pack::v1::Manifest> manifest = packtool::SynthesizePack(
        synth, [&](const packtool::ConvertProgress& p) { printer.Update(p); }, io.cancel);
    printer.Finish();
    if (!manifest.ok()) return Fail(io, kExitFailure, manifest.status().message());
    PrintPackSummary(*manifest, options.out, absl::Now() - start, *io.out);
    *io.out << skew_line;
    if (!synth.exact_quantize) {
      *io.out << "quantization error: not measured (experts are random codes; --exact-quantize measures it)\n";
    }
    return kExitOk;
  }
  if (absl::Status status = packtool::SynthesizeGguf(synth); !status.ok()) {
    return Fail(io, kExitFailure, status.message());
  }
  std::error_code ec;
  const uintmax_t size = std::filesystem::file_size(options.out, ec);
  *io.out << absl::StrFormat("wrote %s in %.1f s: %s, %d layers x %d experts (%d used), n_embd %d, expert ff %d, %s\n",
                             options.out, absl::ToDoubleSeconds(absl::Now() - start), g.arch, g.n_layer, g.n_expert,
                             g.n_expert_used, g.n_embd, g.expert_ff,
                             ec ? std::string("size unknown") : FormatBytes(static_cast<double>(size)));
  *io.out << skew_line;
  return kExitOk;
}

int RunConvert(const std::vector<std::string>& args, const PackCliOptions& options, const CliIo& io) {
  int exit_code = kExitOk;
  if (!CheckArity(args, 2, args.size() < 2 ? "the input GGUF (or Hugging Face directory) and the output directory" : "the output directory", io,
                  &exit_code)) {
    return exit_code;
  }
  if (absl::Status s = packtool::ParseSchemeChoice(options.scheme, "--scheme").status(); !s.ok()) {
    return UsageError(io, std::string(s.message()));
  }
  if (absl::Status s = packtool::CheckThreads(options.threads, "--threads"); !s.ok()) return UsageError(io, std::string(s.message()));
  if (absl::Status s = packtool::ParseDenseTarget(options.dense_type, "--dense-type").status(); !s.ok()) {
    return UsageError(io, std::string(s.message()));
  }
  v1::ConvertRequest request;
  request.set_input(args[1]);
  request.set_output_dir(args[2]);
  request.set_scheme(options.scheme);
  request.set_threads(static_cast<uint32_t>(options.threads));
  request.set_dense_type(options.dense_type);
  request.set_tokenizer_gguf(options.tokenizer_gguf);

  std::unique_ptr<PackToolBackend> backend = MakeBackend(options);
  ProgressPrinter printer(io.err, io.err_is_terminal);
  const absl::Time start = absl::Now();
  absl::StatusOr<v1::ConvertProgress> result = backend->Convert(
      request, [&](const v1::ConvertProgress& p) { printer.Update(ProgressFromProto(p)); }, io.cancel);
  printer.Finish();
  if (!result.ok()) return Fail(io, kExitFailure, result.status().message());
  PrintPackSummary(result->manifest(), args[2], absl::Now() - start, *io.out);
  return kExitOk;
}

int RunValidate(const std::vector<std::string>& args, const PackCliOptions& options, const CliIo& io) {
  int exit_code = kExitOk;
  if (!CheckArity(args, 1, "the pack directory", io, &exit_code)) return exit_code;
  if (absl::Status s = packtool::CheckThreads(options.threads, "--threads"); !s.ok()) return UsageError(io, std::string(s.message()));
  v1::ValidateRequest request;
  request.set_pack_dir(args[1]);
  request.set_quick(options.quick);
  request.set_threads(static_cast<uint32_t>(options.threads));
  absl::StatusOr<v1::ValidateReport> report = MakeBackend(options)->Validate(request, io.cancel);
  if (!report.ok()) return Fail(io, kExitFailure, report.status().message());
  for (const v1::Problem& problem : report->problems()) {
    *io.out << problem.file() << ": " << problem.message() << '\n';
  }
  if (report->blobs_checked() > 0) {
    *io.out << absl::StrFormat("checked %u expert checksums, %s in %.2f s (%.2f GB/s)\n", report->blobs_checked(),
                               FormatBytes(static_cast<double>(report->bytes_checked())), report->seconds(),
                               report->gb_per_second());
  } else {
    *io.out << absl::StrFormat("expert checksums skipped%s (%.2f s)\n", options.quick ? " (--quick)" : "",
                               report->seconds());
  }
  if (report->problems_size() > 0 || !report->ok()) {
    return Fail(io, kExitFailure,
                absl::StrCat(args[1], ": invalid pack, ", report->problems_size(),
                             report->problems_size() == 1 ? " problem" : " problems"));
  }
  *io.out << args[1] << ": valid pack\n";
  return kExitOk;
}

int RunInspect(const std::vector<std::string>& args, const PackCliOptions& options, const CliIo& io) {
  int exit_code = kExitOk;
  if (!CheckArity(args, 1, "the pack directory or GGUF file", io, &exit_code)) return exit_code;
  v1::InspectRequest request;
  request.set_path(args[1]);
  absl::StatusOr<v1::InspectReport> report = MakeBackend(options)->Inspect(request, io.cancel);
  if (!report.ok()) return Fail(io, kExitFailure, report.status().message());
  *io.out << report->text();
  if (!report->text().empty() && report->text().back() != '\n') *io.out << '\n';
  return kExitOk;
}

int RunProfile(const std::vector<std::string>& args, const PackCliOptions& options, const CliIo& io) {
  int exit_code = kExitOk;
  if (!CheckArity(args, 1, "the pack directory", io, &exit_code)) return exit_code;
  if (!options.server.empty()) return UsageError(io, "profile runs in this process only; drop --server");
  if (options.prompts.empty()) return UsageError(io, "profile: missing --prompts FILE (one prompt a line)");
  if (options.tokens < 0 || options.tokens > packtool::kMaxDecodeTokens) {
    return UsageError(io, absl::StrCat("--tokens: ", options.tokens, " is not in 0 .. ", packtool::kMaxDecodeTokens));
  }
  if (absl::Status s = packtool::CheckThreads(options.threads, "--threads"); !s.ok()) return UsageError(io, std::string(s.message()));
  packtool::ProfileOptions profile;
  profile.pack_dir = args[1];
  profile.prompts_path = options.prompts;
  profile.decode_tokens = options.tokens;
  profile.chat = options.chat;
  profile.threads = options.threads;
  profile.cancel = io.cancel;
  // A progress line at most every 2 s; none for a run shorter than that.
  absl::Time last_line = absl::Now();
  absl::StatusOr<packtool::ProfileResult> result =
      packtool::ProfilePack(profile, [&](const packtool::ProfileProgress& p) {
        if (absl::Now() - last_line < absl::Seconds(2)) return;
        last_line = absl::Now();
        *io.err << absl::StrFormat("profile: prompt %u of %u, %u tokens, %.1f tokens/s\n",
                                   std::min(p.prompts_done + 1, p.prompts), p.prompts, p.tokens,
                                   p.seconds > 0 ? static_cast<double>(p.tokens) / p.seconds : 0.0)
                << std::flush;
      });
  if (!result.ok()) return Fail(io, kExitFailure, result.status().message());
  const pack::RoutingProfile& counts = result->profile;
  const packtool::ProfileSkew skew = packtool::MeasureSkew(counts);
  *io.out << absl::StrFormat(
      "profiled %u tokens of %u prompts in %.2f s (%.1f tokens/s; model loaded in %.2f s)\n", counts.tokens,
      counts.prompts, result->seconds, result->seconds > 0 ? static_cast<double>(counts.tokens) / result->seconds : 0.0,
      result->load_seconds);
  *io.out << absl::StrFormat("  hottest expert %.2fx its layer's mean (moe layer %u, expert %u); %u of %u never picked\n",
                             skew.hottest_over_mean, skew.hottest_layer, skew.hottest_expert, skew.never_picked,
                             counts.counts.size());
  *io.out << "wrote " << args[1] << "/" << pack::kRoutingProfileFile << '\n';
  return kExitOk;
}

}  // namespace

std::string PackCliUsage() { return HelpText(kUsage, {kPackCliFlagFile}); }

int RunPackCli(const std::vector<std::string>& args, const PackCliOptions& options, const CliIo& io) {
  if (args.empty()) return UsageError(io, "missing command: synth, convert, validate, inspect or profile");
  const std::string& command = args[0];
  int code = kExitOk;
  if (command == "synth") {
    code = RunSynth(args, options, io);
  } else if (command == "convert") {
    code = RunConvert(args, options, io);
  } else if (command == "validate") {
    code = RunValidate(args, options, io);
  } else if (command == "inspect") {
    code = RunInspect(args, options, io);
  } else if (command == "profile") {
    code = RunProfile(args, options, io);
  } else if (command == "help") {
    *io.out << PackCliUsage();
  } else {
    code =
        UsageError(io, absl::StrCat("unknown command '", command, "'; expected synth, convert, validate, inspect or profile"));
  }
  io.out->flush();
  return code;
}

}  // namespace strata::services
