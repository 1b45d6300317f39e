#ifndef STRATA_TESTS_PACKTOOL_PACKTOOL_TEST_UTIL_H_
#define STRATA_TESTS_PACKTOOL_PACKTOOL_TEST_UTIL_H_

// Small synthetic models and packs for the packtool tests.

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "engine/gguf/gguf_file.h"
#include "engine/gguf/gguf_writer.h"
#include "engine/runtime/engine.h"
#include "gtest/gtest.h"
#include "packtool/convert.h"
#include "packtool/synth.h"
#include "tests/testing/test_util.h"

namespace strata::packtool::testing {

// Options for a tiny qwen3moe model written to `path` (F32 experts unless told otherwise).
inline SynthOptions TinyOptions(const std::string& path, gguf::GgmlType expert_type = gguf::GgmlType::kF32) {
  SynthOptions o;
  o.geometry = *PresetGeometry("qwen3moe", "tiny");
  o.dense_type = gguf::GgmlType::kF16;
  o.expert_type = expert_type;
  o.seed = 7;
  o.output = path;
  o.threads = 2;
  return o;
}

// Synthesizes a tiny GGUF at `gguf_path` and converts it into `pack_dir` with `scheme`.
inline pack::v1::Manifest MakeTinyPack(const std::string& gguf_path, const std::string& pack_dir,
                                       kernels::Scheme scheme = kernels::Scheme::kS8) {
  const absl::Status s = SynthesizeGguf(TinyOptions(gguf_path));
  EXPECT_TRUE(s.ok()) << s;
  ConvertOptions c;
  c.input = gguf_path;
  c.output_dir = pack_dir;
  c.scheme = scheme;
  c.threads = 2;
  auto manifest = ConvertGguf(c, nullptr, nullptr);
  EXPECT_TRUE(manifest.ok()) << manifest.status();
  return manifest.ok() ? *manifest : pack::v1::Manifest();
}

// `arch`'s tiny preset as a GGUF converted to s8 (dir/converted) and written directly as a pack
// (SynthesizePack, dir/direct): expects the same geometry and the same experts.bin. Returns the converted
// manifest (empty on failure) for checks of the architecture's own.
inline pack::v1::Manifest ExpectPackOnlyEqualsConvert(const std::string& arch, const std::string& dir) {
  SynthOptions o = TinyOptions(dir + "/m.gguf");
  o.geometry = *PresetGeometry(arch, "tiny");
  const absl::Status synthesized = SynthesizeGguf(o);
  EXPECT_TRUE(synthesized.ok()) << synthesized;
  ConvertOptions c;
  c.input = o.output;
  c.output_dir = dir + "/converted";
  c.scheme = kernels::Scheme::kS8;
  c.threads = 2;
  auto converted = ConvertGguf(c, nullptr, nullptr);
  EXPECT_TRUE(converted.ok()) << converted.status();
  o.output = dir + "/direct";
  o.pack_scheme = kernels::Scheme::kS8;
  auto direct = SynthesizePack(o, nullptr, nullptr);
  EXPECT_TRUE(direct.ok()) << direct.status();
  if (!converted.ok() || !direct.ok()) return pack::v1::Manifest();
  EXPECT_EQ(direct->geometry().SerializeAsString(), converted->geometry().SerializeAsString()) << arch;
  EXPECT_EQ(::strata::testing::ReadFileBytes(dir + "/direct/experts.bin"),
            ::strata::testing::ReadFileBytes(dir + "/converted/experts.bin"))
      << arch;
  return *converted;
}

// Logits of every position of `tokens` from the CPU engine on `pack`.
inline std::vector<float> EngineLogits(const std::string& pack, const std::vector<int32_t>& tokens) {
  runtime::EngineOptions o;
  o.pack_dir = pack;
  o.threads = 1;
  o.max_seqs = 1;
  o.max_ctx = 64;
  o.device.device = "cpu";
  auto engine = runtime::Engine::Create(o);
  EXPECT_TRUE(engine.ok()) << engine.status();
  if (!engine.ok()) return {};
  runtime::GenerateRequest request;
  request.prompt_tokens = tokens;
  request.prompt_logits = true;
  request.sampling.temperature = 0;
  request.sampling.max_tokens = 1;
  auto done = (*engine)->Generate(request);
  EXPECT_TRUE(done.ok()) << done.status();
  if (!done.ok()) return {};
  EXPECT_TRUE(done->result.status.ok()) << done->result.status;
  return done->result.prompt_logits;
}

// Copies the GGUF at `src` to `dst` as another architecture: general.architecture becomes `arch` and every
// "<old arch>." key is renamed "<arch>.", tensors unchanged (a model llama.cpp would load as `arch`).
inline void RewriteArchitecture(const std::string& src, const std::string& dst, const std::string& arch) {
  auto file = gguf::GgufFile::Open(src);
  ASSERT_TRUE(file.ok()) << file.status();
  auto old_arch = (*file)->metadata().GetString("general.architecture");
  ASSERT_TRUE(old_arch.ok()) << old_arch.status();
  gguf::GgufWriter w((*file)->alignment());
  for (const auto& [key, value] : (*file)->metadata().entries()) {
    if (key == "general.alignment") continue;
    if (key == "general.architecture") {
      w.SetString(key, arch);
    } else if (absl::StartsWith(key, *old_arch + ".")) {
      w.Set(absl::StrCat(arch, key.substr(old_arch->size())), value);
    } else {
      w.Set(key, value);
    }
  }
  for (const gguf::TensorInfo& t : (*file)->tensors()) {
    ASSERT_TRUE(w.AddTensorData(t.name, t.type, t.ne, {t.data, t.bytes}).ok()) << t.name;
  }
  const absl::Status written = w.WriteFile(dst);
  ASSERT_TRUE(written.ok()) << written;
}

}  // namespace strata::packtool::testing

#endif  // STRATA_TESTS_PACKTOOL_PACKTOOL_TEST_UTIL_H_
