#include "packtool/inspect.h"

#include <filesystem>
#include <memory>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "engine/gguf/gguf_file.h"
#include "engine/model/model_config.h"
#include "engine/pack/pack_format.h"
#include "engine/pack/routing_profile.h"
#include "engine/status_macros.h"
#include "packtool/routing_profiler.h"

namespace strata::packtool {
namespace {

namespace fs = std::filesystem;

// Architecture, tokenizer and tensor list common to a GGUF model and a pack's dense.gguf.
void DescribeGguf(const gguf::Metadata& meta, const std::vector<gguf::TensorInfo>& tensors, Inspection* out) {
  out->architecture = meta.GetString("general.architecture").value_or("");
  out->tokenizer_model = meta.GetString("tokenizer.ggml.model").value_or("");
  if (auto tokens = meta.GetStringArray("tokenizer.ggml.tokens"); tokens.ok()) out->vocab_size = tokens->size();
  for (const gguf::TensorInfo& t : tensors) {
    out->tensors.push_back({t.name, gguf::TypeName(static_cast<uint32_t>(t.type)), t.ne, t.bytes});
  }
}

std::string HumanBytes(uint64_t b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(b);
  int u = 0;
  while (v >= 1024 && u < 4) v /= 1024, ++u;
  return u == 0 ? absl::StrCat(b, " B") : absl::StrFormat("%.2f %s", v, units[u]);
}

// A malformed profile is described, not an error: inspect shows what is there.
std::string DescribeRoutingProfile(const std::string& pack_dir, const pack::v1::Manifest& m) {
  absl::StatusOr<std::optional<pack::RoutingProfile>> profile = pack::ReadRoutingProfile(pack_dir, m);
  // The file is named relative to the pack: a strata-packd does not show its own paths.
  if (!profile.ok()) return absl::StrCat("invalid: ", absl::StripPrefix(profile.status().message(), pack_dir + "/"));
  if (!profile->has_value()) return "none (strata-pack profile makes one)";
  const pack::RoutingProfile& p = **profile;
  const ProfileSkew skew = MeasureSkew(p);
  return absl::StrFormat("%u tokens of %u prompts; hottest expert %.2fx its layer's mean, %u of %u never picked",
                         p.tokens, p.prompts, skew.hottest_over_mean, skew.never_picked, p.counts.size());
}

}  // namespace

absl::StatusOr<Inspection> Inspect(const std::string& path) {
  Inspection out;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    out.kind = "pack";
    ASSIGN_OR_RETURN(pack::v1::Manifest m, pack::ReadManifest(path));
    RETURN_IF_ERROR(pack::CheckManifest(m));
    out.geometry = m.geometry();
    out.scheme = m.scheme();
    ASSIGN_OR_RETURN(std::unique_ptr<gguf::GgufFile> dense,
                     gguf::GgufFile::Open(absl::StrCat(path, "/", pack::kDenseFile)));
    DescribeGguf(dense->metadata(), dense->tensors(), &out);
    out.architecture = m.architecture();
    out.total_bytes = m.experts_bytes() + dense->file_size();
    out.routing_profile = DescribeRoutingProfile(path, m);
    return out;
  }
  out.kind = "gguf";
  ASSIGN_OR_RETURN(std::unique_ptr<gguf::GgufModel> model, gguf::GgufModel::Open(path));
  DescribeGguf(model->metadata(), model->tensors(), &out);
  out.total_bytes = model->total_bytes();
  const gguf::Metadata& meta = model->metadata();
  const std::string a = out.architecture;
  pack::v1::Geometry& g = out.geometry;
  // What inspect can say of a file the engine may refuse: the raw block_count when the keys do not fit.
  int64_t n_run = static_cast<int64_t>(meta.GetUint(a + ".block_count").value_or(0));
  if (auto blocks = model::ReadBlockCount(meta, a); blocks.ok()) {
    n_run = blocks->run();
    out.mtp_blocks = blocks->mtp;
  }
  g.set_n_layer(static_cast<uint32_t>(n_run));
  g.set_n_expert(static_cast<uint32_t>(meta.GetUint(a + ".expert_count").value_or(0)));
  g.set_n_expert_used(static_cast<uint32_t>(meta.GetUint(a + ".expert_used_count").value_or(0)));
  g.set_n_embd(static_cast<uint32_t>(meta.GetUint(a + ".embedding_length").value_or(0)));
  g.set_n_shared_experts(static_cast<uint32_t>(meta.GetUint(a + ".expert_shared_count").value_or(0)));
  for (const gguf::TensorInfo& t : model->tensors()) {
    if (out.mtp_blocks > 0 && model::TensorBlock(t.name) >= n_run) continue;  // a multi-token-prediction block
    if (t.name.size() > 4 && t.name.find(".ffn_gate_exps.weight") != std::string::npos) {
      g.set_n_moe_layers(g.n_moe_layers() + 1);
      if (t.ne.size() >= 2) g.set_expert_ff(static_cast<uint32_t>(t.ne[1]));
    }
  }
  return out;
}

std::string FormatInspection(const Inspection& in) {
  const pack::v1::Geometry& g = in.geometry;
  std::string s = absl::StrCat(in.kind == "pack" ? "pack" : "GGUF model", "\n");
  absl::StrAppend(&s, "  architecture   ", in.architecture, "\n");
  absl::StrAppend(&s, "  layers         ", g.n_layer(), " (", g.n_moe_layers(), " with routed experts)\n");
  if (in.mtp_blocks > 0) {
    absl::StrAppend(&s, "  MTP blocks     ", in.mtp_blocks, " more in the file (multi-token prediction): Strata does ",
                    "not run them; convert leaves them out\n");
  }
  absl::StrAppend(&s, "  experts        ", g.n_expert(), " per layer, ", g.n_expert_used(), " used per token");
  if (g.n_shared_experts() > 0) absl::StrAppend(&s, ", ", g.n_shared_experts(), " shared");
  absl::StrAppend(&s, "\n  n_embd         ", g.n_embd(), "\n  expert FF      ", g.expert_ff(), "\n");
  if (!in.scheme.empty()) absl::StrAppend(&s, "  scheme         ", in.scheme, "\n");
  absl::StrAppend(&s, "  size           ", HumanBytes(in.total_bytes), " (", in.total_bytes, " bytes)\n");
  absl::StrAppend(&s, "  tokenizer      ", in.tokenizer_model.empty() ? "(none)" : in.tokenizer_model, ", ",
                  in.vocab_size, " tokens\n");
  if (in.kind == "pack") absl::StrAppend(&s, "  profile        ", in.routing_profile, "\n");
  absl::StrAppend(&s, "  tensors        ", in.tensors.size(), in.kind == "pack" ? " in dense.gguf" : "", "\n");
  for (const TensorSummary& t : in.tensors) {
    absl::StrAppend(&s, absl::StrFormat("    %-36s %-6s [%s] %s\n", t.name, t.type, absl::StrJoin(t.shape, ", "),
                                        HumanBytes(t.bytes)));
  }
  return s;
}

}  // namespace strata::packtool
