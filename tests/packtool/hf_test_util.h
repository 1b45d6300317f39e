#ifndef STRATA_TESTS_PACKTOOL_HF_TEST_UTIL_H_
#define STRATA_TESTS_PACKTOOL_HF_TEST_UTIL_H_

// Hugging Face checkpoints for the packtool tests: written from synth GGUFs (tests/testing/hf_checkpoint_writer.h),
// edited, and their conversions compared with GGUFs.

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "engine/gguf/gguf_file.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "packtool/safetensors.h"
#include "packtool/synth.h"
#include "tests/packtool/packtool_test_util.h"
#include "tests/testing/hf_checkpoint_writer.h"
#include "tests/testing/safetensors_writer.h"
#include "tests/testing/test_util.h"

namespace strata::packtool::testing {

inline bool SameValue(const gguf::Value& a, const gguf::Value& b) {
  if (a.type != b.type || a.data.index() != b.data.index()) return false;
  if (const auto* x = std::get_if<gguf::Array>(&a.data)) {
    const auto& y = std::get<gguf::Array>(b.data);
    if (x->element_type != y.element_type || x->elements.size() != y.elements.size()) return false;
    for (size_t i = 0; i < x->elements.size(); ++i) {
      if (!SameValue(x->elements[i], y.elements[i])) return false;
    }
    return true;
  }
  return std::visit(
      [&](const auto& x) {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, gguf::Array>) {
          return false;  // handled above
        } else {
          return x == std::get<T>(b.data);
        }
      },
      a.data);
}

// Every tensor (name, type, shape, bytes) and every metadata key of `a` in `b` and the other way round;
// `ignore` keys may differ.
inline void ExpectSameGguf(const std::string& a_path, const std::string& b_path, const std::vector<std::string>& ignore) {
  auto a = gguf::GgufFile::Open(a_path);
  auto b = gguf::GgufFile::Open(b_path);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_EQ((*a)->tensors().size(), (*b)->tensors().size());
  for (const gguf::TensorInfo& t : (*a)->tensors()) {
    const gguf::TensorInfo* u = (*b)->FindTensor(t.name);
    ASSERT_NE(u, nullptr) << t.name;
    EXPECT_EQ(t.type, u->type) << t.name;
    EXPECT_EQ(t.ne, u->ne) << t.name;
    ASSERT_EQ(t.bytes, u->bytes) << t.name;
    EXPECT_EQ(std::memcmp(t.data, u->data, t.bytes), 0) << t.name << " differs";
  }
  auto keys = [&](const gguf::GgufFile& f) {
    std::map<std::string, const gguf::Value*> m;
    for (const auto& [k, v] : f.metadata().entries()) {
      if (std::find(ignore.begin(), ignore.end(), k) == ignore.end()) m[k] = &v;
    }
    return m;
  };
  const auto ka = keys(**a), kb = keys(**b);
  ASSERT_EQ(ka.size(), kb.size());
  for (const auto& [k, v] : ka) {
    ASSERT_TRUE(kb.contains(k)) << k;
    EXPECT_TRUE(SameValue(*v, *kb.at(k))) << k << " differs";
  }
}

// `arch`'s tiny preset with two layers and `expert_type` experts, written to `path`.
inline SynthOptions HfTinyOptions(const std::string& arch, const std::string& path, gguf::GgmlType expert_type) {
  SynthOptions o = TinyOptions(path, expert_type);
  o.geometry = *PresetGeometry(arch, "tiny");
  o.geometry.n_layer = 2;
  return o;
}

// Synthesizes `options` into `dir`/synth.gguf and writes it as a checkpoint in `dir`/hf, returned.
inline std::string WriteSynthCheckpoint(const ::strata::testing::ScratchDir& dir, SynthOptions options,
                                        const ::strata::testing::HfWriteOptions& w = {}) {
  const std::string hf_dir = dir.Join("hf");
  options.output = dir.Join("synth.gguf");
  const absl::Status synthesized = SynthesizeGguf(options);
  EXPECT_TRUE(synthesized.ok()) << synthesized;
  std::filesystem::create_directory(hf_dir);
  const absl::Status written = ::strata::testing::WriteHfCheckpointFromGguf(options.output, hf_dir, w);
  EXPECT_TRUE(written.ok()) << written;
  return hf_dir;
}

// DeepSeek-V2 as the tiny preset makes it (softmax router over groups, no q LoRA, YaRN) or V3 ("v3": sigmoid
// router with the score-correction bias, q LoRA, weights renormalised and scaled), BF16 as DeepSeek ships them.
inline SynthOptions DeepseekOptions(const std::string& version, const std::string& path) {
  SynthOptions o = TinyOptions(path, gguf::GgmlType::kBF16);
  o.dense_type = gguf::GgmlType::kBF16;
  o.geometry = *PresetGeometry("deepseek2", "tiny");
  if (version == "v3") {
    SynthGeometry& g = o.geometry;
    g.expert_gating = 2, g.q_lora_rank = 32, g.expert_weights_norm = true, g.expert_weights_scale = 2.5f;
    g.yarn_log_multiplier = 0.1f;
  }
  return o;
}

inline void EditConfig(const std::string& hf_dir, const std::function<void(nlohmann::json&)>& edit) {
  std::ifstream in(hf_dir + "/config.json");
  nlohmann::json config = nlohmann::json::parse(in);
  edit(config);
  std::ofstream(hf_dir + "/config.json") << config.dump();
}

// Rewrites every *.safetensors shard of `hf_dir` with `edit` applied to its tensors.
inline void EditShards(const std::string& hf_dir,
                       const std::function<void(std::vector<::strata::testing::SafetensorsEntry>&)>& edit) {
  for (const auto& f : std::filesystem::directory_iterator(hf_dir)) {
    if (f.path().extension() != ".safetensors") continue;
    std::vector<::strata::testing::SafetensorsEntry> entries;
    {
      auto file = SafetensorsFile::Open(f.path().string());
      ASSERT_TRUE(file.ok()) << file.status();
      for (const SafetensorsTensor& t : (*file)->tensors()) {
        entries.push_back({t.name, t.dtype, t.shape, std::vector<uint8_t>(t.data.begin(), t.data.end())});
      }
    }
    edit(entries);
    ASSERT_TRUE(::strata::testing::WriteSafetensors(f.path().string(), entries).ok());
  }
}

}  // namespace strata::packtool::testing

#endif  // STRATA_TESTS_PACKTOOL_HF_TEST_UTIL_H_
