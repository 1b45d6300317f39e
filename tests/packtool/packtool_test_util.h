#ifndef STRATA_TESTS_PACKTOOL_PACKTOOL_TEST_UTIL_H_
#define STRATA_TESTS_PACKTOOL_PACKTOOL_TEST_UTIL_H_

// Small synthetic models and packs for the packtool tests.

#include <string>

#include "gtest/gtest.h"
#include "packtool/convert.h"
#include "packtool/synth.h"

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

}  // namespace strata::packtool::testing

#endif  // STRATA_TESTS_PACKTOOL_PACKTOOL_TEST_UTIL_H_
