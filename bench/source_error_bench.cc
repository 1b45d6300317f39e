// strata-source-error-bench: the error `convert` adds to each source expert type with each scheme, measured
// against the dequantized source (what convert reports in the manifest's quant_error), beside the error the
// source type itself has against the float weights it was made from. Prints a Markdown table.
//
//   strata-source-error-bench [--dir DIR] [--types f16,q8_0,...] [--embd 512] [--expert-ff 512] [--experts 8]
//                             [--layers 2] [--threads N] [--keep]
//
// Each type: a qwen3moe model synthesized with that expert type (the same seeded float weights for every
// type), converted with s8, s4 and s2 as convert does by default (s4 carries q4_0, q4_1 and q4_K codes
// over, packtool/source_transcode.h), and with s4 through the generic fit only; the columns give the
// relative RMS error over all expert roles. The "source" column converts an f32 model of the same weights
// to f16 against the source's own decoded weights, i.e. how far the source type already is from the floats.

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/bench_util.h"
#include "engine/gguf/gguf_file.h"
#include "packtool/convert.h"
#include "packtool/source_scheme.h"
#include "packtool/synth.h"
#include "packtool/synth_values.h"

namespace {

namespace fs = std::filesystem;
using strata::kernels::Scheme;
namespace packtool = strata::packtool;
namespace gguf = strata::gguf;

// Relative RMS error over every expert role of the converted pack, or NaN on failure (printed to stderr).
double ConvertError(const std::string& model, const std::string& out, Scheme scheme, bool transcode, int threads) {
  packtool::ConvertOptions c;
  c.input = model;
  c.output_dir = out;
  c.scheme = scheme;
  c.threads = threads;
  c.transcode = transcode;
  double rel_rms = std::nan("");
  auto manifest = packtool::ConvertGguf(
      c, [&](const packtool::ConvertProgress& p) { if (p.phase == "done") rel_rms = p.rel_rms_error; }, nullptr);
  if (!manifest.ok()) {
    std::fprintf(stderr, "convert %s: %s\n", model.c_str(), std::string(manifest.status().message()).c_str());
    return std::nan("");
  }
  fs::remove_all(out);
  return rel_rms;
}

// The source type's own relative RMS error against the float weights synth made it from, over every expert
// tensor (the values come from the same stream for every type).
double SourceError(const std::string& model, uint64_t seed) {
  auto file = gguf::GgufFile::Open(model);
  if (!file.ok()) return std::nan("");
  double err2 = 0, ref2 = 0;
  for (const gguf::TensorInfo& t : (*file)->tensors()) {
    if (t.name.find("_exps.weight") == std::string::npos) continue;
    int64_t n = 1;
    for (int64_t d : t.ne) n *= d;
    std::vector<float> decoded(n), reference(n);
    if (!gguf::Dequantize(t.type, t.data, decoded.data(), n).ok()) return std::nan("");
    // synth's expert scale: 1/sqrt(cols) of the role (ne[0]), offset 0.
    packtool::FillSynthValues(packtool::SynthStream(seed, t.name), 0, n, 1.0f / std::sqrt(static_cast<float>(t.ne[0])),
                              0.0f, reference.data());
    for (int64_t i = 0; i < n; ++i) {
      const double e = static_cast<double>(decoded[i]) - reference[i];
      err2 += e * e;
      ref2 += static_cast<double>(reference[i]) * reference[i];
    }
  }
  return std::sqrt(err2 / ref2);
}

std::string Cell(double v) {
  if (std::isnan(v)) return "failed";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2e", v);
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  strata::bench::Flags flags(argc, argv,
                             "usage: strata-source-error-bench [--dir DIR] [--types f16,q8_0,...] [--embd 512] "
                             "[--expert-ff 512] [--experts 8] [--layers 2] [--threads N] [--keep]");
  const std::string dir = flags.String("dir", "/tmp/strata-source-error-bench");
  const std::vector<std::string> types =
      flags.StringList("types", {"f16", "q8_0", "q6_K", "q5_K", "q4_K", "q4_1", "q4_0", "q3_K", "q2_K", "mxfp4"});
  const int64_t embd = flags.Int("embd", 512), expert_ff = flags.Int("expert-ff", 512);
  const int64_t experts = flags.Int("experts", 8), layers = flags.Int("layers", 2);
  const int threads = static_cast<int>(flags.Int("threads", 0));
  const bool keep = flags.Bool("keep", false);
  flags.CheckNoUnknown();

  fs::create_directories(dir);
  std::printf("%s\nexperts: %lld layers x %lld, n_embd %lld, expert ff %lld; load average %.2f\n\n",
              flags.command_line().c_str(), static_cast<long long>(layers), static_cast<long long>(experts),
              static_cast<long long>(embd), static_cast<long long>(expert_ff), strata::bench::LoadAverage());
  std::printf("| source | source vs floats | s8 | s4 (convert) | s4 (generic fit) | s2 | auto picks |\n");
  std::printf("| --- | --- | --- | --- | --- | --- | --- |\n");
  for (const std::string& name : types) {
    auto type = packtool::ParseSynthType(name);
    if (!type.ok()) {
      std::fprintf(stderr, "--types: %s\n", std::string(type.status().message()).c_str());
      return 2;
    }
    packtool::SynthOptions o;
    auto geometry = packtool::PresetGeometry("qwen3moe", "tiny");
    if (!geometry.ok()) return 1;
    o.geometry = *geometry;
    o.geometry.n_embd = embd;
    o.geometry.expert_ff = expert_ff;
    o.geometry.n_expert = experts;
    o.geometry.n_layer = layers;
    o.expert_type = *type;
    o.seed = 1;
    o.threads = threads;
    o.output = absl::StrCat(dir, "/", name, ".gguf");
    fs::remove(o.output);
    if (absl::Status s = packtool::SynthesizeGguf(o); !s.ok()) {
      std::fprintf(stderr, "synth %s: %s\n", name.c_str(), std::string(s.message()).c_str());
      return 1;
    }
    const std::string out = absl::StrCat(dir, "/", name, "-pack");
    fs::remove_all(out);
    const double s8 = ConvertError(o.output, out, Scheme::kS8, true, threads);
    const double s4 = ConvertError(o.output, out, Scheme::kS4, true, threads);
    const double s4_fit = ConvertError(o.output, out, Scheme::kS4, false, threads);
    const double s2 = ConvertError(o.output, out, Scheme::kS2, true, threads);
    auto picked = packtool::DefaultSchemeFor(*type);
    std::printf("| %s | %s | %s | %s | %s | %s | %s |\n", name.c_str(), Cell(SourceError(o.output, o.seed)).c_str(),
                Cell(s8).c_str(), Cell(s4).c_str(), Cell(s4_fit).c_str(), Cell(s2).c_str(),
                picked.ok() ? std::string(strata::kernels::SchemeName(*picked)).c_str() : "-");
    std::fflush(stdout);
    if (!keep) fs::remove(o.output);
  }
  return 0;
}
