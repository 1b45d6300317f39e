// LoadWeights (engine/model/weights.cc): a q/k norm tensor the configuration does not switch on is refused,
// naming it, never ignored.

#include "engine/model/weights.h"

#include <memory>
#include <string>
#include <vector>

#include "engine/gguf/gguf_file.h"
#include "engine/gguf/gguf_writer.h"
#include "engine/model/model_config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "packtool/synth.h"
#include "tests/testing/test_util.h"

namespace strata::model {
namespace {

using ::strata::testing::ScratchDir;
using ::testing::HasSubstr;

// A tiny model of `arch` written again with one more f32 tensor of `n` ones.
std::string WithExtraTensor(const ScratchDir& dir, const std::string& arch, const std::string& name, int64_t n) {
  packtool::SynthOptions o;
  o.geometry = *packtool::PresetGeometry(arch, "tiny");
  o.dense_type = gguf::GgmlType::kF32;
  o.expert_type = gguf::GgmlType::kF32;
  o.threads = 2;
  o.output = dir.Join(arch + ".gguf");
  const absl::Status synth = packtool::SynthesizeGguf(o);
  EXPECT_TRUE(synth.ok()) << synth;
  auto file = gguf::GgufFile::Open(o.output);
  EXPECT_TRUE(file.ok()) << file.status();
  if (!file.ok()) return "";
  gguf::GgufWriter writer;
  for (const auto& [key, value] : (*file)->metadata().entries()) writer.Set(key, value);
  for (const gguf::TensorInfo& t : (*file)->tensors()) {
    EXPECT_TRUE(writer.AddTensorData(t.name, t.type, t.ne, {t.data, t.bytes}).ok());
  }
  const std::vector<float> ones(static_cast<size_t>(n), 1.0f);
  EXPECT_TRUE(writer
                  .AddTensorData(name, gguf::GgmlType::kF32, {n},
                                 {reinterpret_cast<const uint8_t*>(ones.data()), ones.size() * sizeof(float)})
                  .ok());
  const std::string out = dir.Join(arch + "-extra.gguf");
  EXPECT_TRUE(writer.WriteFile(out).ok());
  return out;
}

absl::Status Load(const std::string& path) {
  auto file = gguf::GgufFile::Open(path);
  if (!file.ok()) return file.status();
  absl::StatusOr<ModelConfig> config = ReadModelConfig((*file)->metadata());
  if (!config.ok()) return config.status();
  if (absl::Status s = ConfigureFromTensors(**file, &*config); !s.ok()) return s;
  return LoadWeights(**file, *config).status();
}

TEST(WeightsTest, AQkNormTheConfigurationDoesNotUseIsRefusedNamingIt) {
  ScratchDir dir;
  // qwen2moe has no q/k norm: a k norm alone (no q norm beside it) in its second block.
  const absl::Status k_only = Load(WithExtraTensor(dir, "qwen2moe", "blk.1.attn_k_norm.weight", 32));
  EXPECT_EQ(k_only.code(), absl::StatusCode::kUnimplemented) << k_only;
  EXPECT_THAT(std::string(k_only.message()), HasSubstr("'blk.1.attn_k_norm.weight' is a q/k norm"));
  // glm4moe takes its q/k norm from block 0's tensors: one in a later block only is not silently dropped.
  const absl::Status later = Load(WithExtraTensor(dir, "glm4moe", "blk.1.attn_q_norm.weight", 32));
  EXPECT_EQ(later.code(), absl::StatusCode::kUnimplemented) << later;
  EXPECT_THAT(std::string(later.message()), HasSubstr("'blk.1.attn_q_norm.weight' is a q/k norm"));
}

}  // namespace
}  // namespace strata::model
