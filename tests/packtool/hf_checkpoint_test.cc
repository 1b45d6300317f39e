#include "packtool/hf_checkpoint.h"

#include <filesystem>
#include <fstream>
#include <random>

#include "engine/gguf/gguf_file.h"
#include "engine/model/ops.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "packtool/convert.h"
#include "packtool/safetensors.h"
#include "packtool/source_scheme.h"
#include "packtool/synth.h"
#include "tests/packtool/packtool_test_util.h"
#include "tests/testing/hf_checkpoint_writer.h"
#include "tests/testing/safetensors_writer.h"
#include "tests/testing/test_util.h"

namespace strata::packtool {
namespace {

using ::strata::testing::HfWriteOptions;
using ::strata::testing::ReadFileBytes;
using ::strata::testing::ScratchDir;
using ::strata::testing::WriteHfCheckpointFromGguf;
using ::testing::HasSubstr;

bool SameValue(const gguf::Value& a, const gguf::Value& b) {
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
void ExpectSameGguf(const std::string& a_path, const std::string& b_path, const std::vector<std::string>& ignore) {
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

SynthOptions Options(const std::string& arch, const std::string& path, gguf::GgmlType expert_type) {
  SynthOptions o = testing::TinyOptions(path, expert_type);
  o.geometry = *PresetGeometry(arch, "tiny");
  o.geometry.n_layer = 2;
  return o;
}

class HfCheckpointArchTest : public ::testing::TestWithParam<std::string> {};

// The checkpoint written from a synthetic GGUF converts back to that GGUF exactly (bar general.name), and
// to the same pack.
TEST_P(HfCheckpointArchTest, ConvertsToTheSameGgufAndPack) {
  ScratchDir dir;
  const std::string gguf_path = dir.Join("synth.gguf"), hf_dir = dir.Join("hf");
  // BF16 experts for Mixtral, F16 for Qwen3: both dtypes travel unchanged.
  const gguf::GgmlType expert_type = GetParam() == "mixtral" ? gguf::GgmlType::kBF16 : gguf::GgmlType::kF16;
  ASSERT_TRUE(SynthesizeGguf(Options(GetParam(), gguf_path, expert_type)).ok());
  std::filesystem::create_directory(hf_dir);
  HfWriteOptions w;
  w.shards = 3;
  w.array_merges = GetParam() == "mixtral";
  ASSERT_TRUE(WriteHfCheckpointFromGguf(gguf_path, hf_dir, w).ok());
  ASSERT_TRUE(IsHfCheckpointDir(hf_dir));
  EXPECT_FALSE(IsHfCheckpointDir(gguf_path));

  ASSERT_TRUE(HfCheckpointToGguf({hf_dir, dir.Join("from_hf.gguf"), ""}).ok());
  ExpectSameGguf(gguf_path, dir.Join("from_hf.gguf"), {"general.name"});

  auto scheme = DefaultSchemeForModel(hf_dir);
  auto gguf_scheme = DefaultSchemeForModel(gguf_path);
  ASSERT_TRUE(scheme.ok()) << scheme.status();
  EXPECT_EQ(*scheme, *gguf_scheme);

  ConvertOptions c;
  c.scheme = kernels::Scheme::kS8;
  c.threads = 2;
  c.input = gguf_path;
  c.output_dir = dir.Join("pack_gguf");
  auto from_gguf = ConvertGguf(c, nullptr, nullptr);
  ASSERT_TRUE(from_gguf.ok()) << from_gguf.status();
  c.input = hf_dir;
  c.output_dir = dir.Join("pack_hf");
  std::vector<std::string> phases;
  auto from_hf = ConvertGguf(c, [&](const ConvertProgress& p) { phases.push_back(p.phase); }, nullptr);
  ASSERT_TRUE(from_hf.ok()) << from_hf.status();
  ASSERT_FALSE(phases.empty());
  EXPECT_EQ(phases.front(), "hf-to-gguf");
  EXPECT_FALSE(std::filesystem::exists(dir.Join("pack_hf.hf.gguf"))) << "the temporary GGUF is removed";
  EXPECT_EQ(ReadFileBytes(dir.Join("pack_gguf/experts.bin")), ReadFileBytes(dir.Join("pack_hf/experts.bin")));
  ExpectSameGguf(dir.Join("pack_gguf/dense.gguf"), dir.Join("pack_hf/dense.gguf"), {"general.name"});
  EXPECT_EQ(from_hf->architecture(), from_gguf->architecture());
  EXPECT_EQ(from_hf->geometry().SerializeAsString(), from_gguf->geometry().SerializeAsString());
}

INSTANTIATE_TEST_SUITE_P(Archs, HfCheckpointArchTest, ::testing::Values("qwen3moe", "mixtral"));

// Hugging Face rotates (i, i + d/2) (NeoX style); the engine runs Mixtral ("llama") with normal RoPE,
// rotating (2i, 2i + 1). With the q/k rows permuted as the converter does, the engine's rotation of the
// permuted projection is the permutation of Hugging Face's rotation.
TEST(HfCheckpointTest, PermutedRowsMakeNormalRopeMatchHuggingFaces) {
  const int64_t n_head = 3, head_dim = 8;
  std::mt19937 rng(5);
  std::normal_distribution<float> normal;
  std::vector<float> hf(n_head * head_dim);
  for (float& v : hf) v = normal(rng);
  std::vector<float> permuted(hf.size());
  auto as_bytes = [](std::vector<float>& v) { return std::span<uint8_t>(reinterpret_cast<uint8_t*>(v.data()), v.size() * 4); };
  PermuteRowsForNormalRope(as_bytes(hf), as_bytes(permuted), n_head, head_dim, sizeof(float));
  std::vector<float> back(hf.size());
  UnpermuteRowsForNormalRope(as_bytes(permuted), as_bytes(back), n_head, head_dim, sizeof(float));
  EXPECT_EQ(back, hf);

  const std::vector<double> freq = model::RopeFrequencies(head_dim, 10000.0f);
  std::vector<float> cos(head_dim / 2), sin(head_dim / 2);
  model::RopeAngles(freq, 7, cos.data(), sin.data());
  std::vector<float> hf_roped = hf, engine_roped = permuted, unpermuted_roped = hf;
  for (int64_t h = 0; h < n_head; ++h) {
    model::Rope(hf_roped.data() + h * head_dim, head_dim, cos.data(), sin.data(), model::RopeStyle::kNeox);
    model::Rope(engine_roped.data() + h * head_dim, head_dim, cos.data(), sin.data(), model::RopeStyle::kNormal);
    model::Rope(unpermuted_roped.data() + h * head_dim, head_dim, cos.data(), sin.data(), model::RopeStyle::kNormal);
  }
  std::vector<float> expected(hf.size());
  PermuteRowsForNormalRope(as_bytes(hf_roped), as_bytes(expected), n_head, head_dim, sizeof(float));
  for (size_t i = 0; i < expected.size(); ++i) EXPECT_NEAR(engine_roped[i], expected[i], 1e-5) << i;
  // Without the permutation the rotations disagree: the permutation is what makes them equal.
  float max_diff = 0;
  for (size_t i = 0; i < hf.size(); ++i) max_diff = std::max(max_diff, std::abs(unpermuted_roped[i] - hf_roped[i]));
  EXPECT_GT(max_diff, 1e-2f);
}

// A tiny qwen3moe checkpoint in `dir`/hf from a synthetic GGUF at `dir`/synth.gguf.
std::string WriteTinyCheckpoint(const ScratchDir& dir, const HfWriteOptions& w = {}) {
  const std::string hf_dir = dir.Join("hf");
  EXPECT_TRUE(SynthesizeGguf(Options("qwen3moe", dir.Join("synth.gguf"), gguf::GgmlType::kF16)).ok());
  std::filesystem::create_directory(hf_dir);
  EXPECT_TRUE(WriteHfCheckpointFromGguf(dir.Join("synth.gguf"), hf_dir, w).ok());
  return hf_dir;
}

void EditConfig(const std::string& hf_dir, const std::function<void(nlohmann::json&)>& edit) {
  std::ifstream in(hf_dir + "/config.json");
  nlohmann::json config = nlohmann::json::parse(in);
  edit(config);
  std::ofstream(hf_dir + "/config.json") << config.dump();
}

absl::Status ToGguf(const ScratchDir& dir, const std::string& hf_dir, const std::string& tokenizer_gguf = "") {
  return HfCheckpointToGguf({hf_dir, dir.Join("out.gguf"), tokenizer_gguf});
}

TEST(HfCheckpointTest, RefusesAnUnknownArchitectureNamingTheField) {
  ScratchDir dir;
  const std::string hf = WriteTinyCheckpoint(dir);
  EditConfig(hf, [](nlohmann::json& c) { c["architectures"] = {"LlamaForCausalLM"}; });
  absl::Status s = ToGguf(dir, hf);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(std::string(s.message()), HasSubstr("config.json: architectures: 'LlamaForCausalLM' is not supported"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("Qwen3MoeForCausalLM, MixtralForCausalLM"));
  EditConfig(hf, [](nlohmann::json& c) { c.erase("architectures"); });
  EXPECT_THAT(std::string(ToGguf(dir, hf).message()), HasSubstr("architectures: missing"));
}

TEST(HfCheckpointTest, RefusesBadConfigFields) {
  ScratchDir dir;
  const std::string hf = WriteTinyCheckpoint(dir);
  EditConfig(hf, [](nlohmann::json& c) { c["rope_scaling"] = {{"type", "yarn"}, {"factor", 4.0}}; });
  EXPECT_THAT(std::string(ToGguf(dir, hf).message()), HasSubstr("config.json: rope_scaling"));
  EditConfig(hf, [](nlohmann::json& c) { c["rope_scaling"] = nullptr; c["hidden_size"] = -3; });
  EXPECT_THAT(std::string(ToGguf(dir, hf).message()), HasSubstr("config.json: hidden_size: expected an integer"));
  EditConfig(hf, [](nlohmann::json& c) { c["hidden_size"] = 128; c.erase("num_experts"); });
  EXPECT_THAT(std::string(ToGguf(dir, hf).message()), HasSubstr("config.json: num_experts: missing"));
  EditConfig(hf, [](nlohmann::json& c) { c["num_experts"] = 8; c["mlp_only_layers"] = {0}; });
  EXPECT_THAT(std::string(ToGguf(dir, hf).message()), HasSubstr("mlp_only_layers"));
  // More tokens than vocab_size: refused; fewer: padded up to vocab_size, which then the embedding lacks.
  EditConfig(hf, [](nlohmann::json& c) { c["mlp_only_layers"] = nlohmann::json::array(); c["vocab_size"] = 100; });
  EXPECT_THAT(std::string(ToGguf(dir, hf).message()), HasSubstr("tokens, config.json's vocab_size is 100"));
  EditConfig(hf, [](nlohmann::json& c) { c["vocab_size"] = 100000; });
  EXPECT_THAT(std::string(ToGguf(dir, hf).message()),
              HasSubstr("tensor 'model.embed_tokens.weight' has shape [638, 128], expected [100000, 128]"));
}

TEST(HfCheckpointTest, RefusesMissingStrayAndMisshapenTensors) {
  ScratchDir dir;
  const std::string hf = WriteTinyCheckpoint(dir, {.shards = 1});
  const std::string shard = hf + "/model-00001-of-00001.safetensors";
  auto file = SafetensorsFile::Open(shard);
  ASSERT_TRUE(file.ok());
  std::vector<::strata::testing::SafetensorsEntry> entries;
  for (const SafetensorsTensor& t : (*file)->tensors()) {
    entries.push_back({t.name, t.dtype, t.shape, std::vector<uint8_t>(t.data.begin(), t.data.end())});
  }
  file->reset();
  auto rewrite = [&](std::vector<::strata::testing::SafetensorsEntry> e) {
    ASSERT_TRUE(::strata::testing::WriteSafetensors(shard, e).ok());
  };
  // Missing: one expert of one layer.
  auto without = entries;
  std::erase_if(without, [](const auto& e) { return e.name == "model.layers.1.mlp.experts.3.up_proj.weight"; });
  rewrite(without);
  EXPECT_THAT(std::string(ToGguf(dir, hf).message()),
              HasSubstr("tensor 'model.layers.1.mlp.experts.3.up_proj.weight' is missing"));
  // Stray: a tensor the model has no place for.
  auto stray = entries;
  stray.push_back({"model.layers.0.mlp.shared_expert.up_proj.weight", "F16", {2, 2}, std::vector<uint8_t>(8)});
  rewrite(stray);
  absl::Status s = ToGguf(dir, hf);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(std::string(s.message()), HasSubstr("'model.layers.0.mlp.shared_expert.up_proj.weight' has no place"));
  // Misshapen: q_proj with its elements in other rows and columns.
  auto shaped = entries;
  for (auto& e : shaped) {
    if (e.name == "model.layers.0.self_attn.q_proj.weight") e.shape = {e.shape[0] / 2, e.shape[1] * 2};
  }
  rewrite(shaped);
  EXPECT_THAT(std::string(ToGguf(dir, hf).message()),
              HasSubstr("tensor 'model.layers.0.self_attn.q_proj.weight' has shape"));
  // Experts of one role in two dtypes.
  auto mixed = entries;
  for (auto& e : mixed) {
    if (e.name == "model.layers.0.mlp.experts.1.gate_proj.weight") e.dtype = "BF16";
  }
  rewrite(mixed);
  EXPECT_THAT(std::string(ToGguf(dir, hf).message()), HasSubstr("must share one dtype"));
}

TEST(HfCheckpointTest, TakesTheTokenizerFromAGgufWhenAsked) {
  ScratchDir dir;
  const std::string hf = WriteTinyCheckpoint(dir, {.tokenizer = false});
  absl::Status s = ToGguf(dir, hf);
  EXPECT_THAT(std::string(s.message()), HasSubstr("tokenizer.json: missing; pass --tokenizer-gguf"));
  ASSERT_TRUE(ToGguf(dir, hf, dir.Join("synth.gguf")).ok());
  ExpectSameGguf(dir.Join("synth.gguf"), dir.Join("out.gguf"), {"general.name"});
}

TEST(HfCheckpointTest, CancelLeavesNothingBehind) {
  ScratchDir dir;
  const std::string hf = WriteTinyCheckpoint(dir);
  const std::atomic<bool> cancel{true};
  ConvertOptions c;
  c.input = hf;
  c.output_dir = dir.Join("pack");
  absl::Status s = ConvertGguf(c, nullptr, &cancel).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kCancelled) << s;
  EXPECT_FALSE(std::filesystem::exists(dir.Join("pack")));
  EXPECT_FALSE(std::filesystem::exists(dir.Join("pack.partial")));
  EXPECT_FALSE(std::filesystem::exists(dir.Join("pack.hf.gguf")));
}

TEST(HfCheckpointTest, ConvertRefusesALeftoverTemporaryGguf) {
  ScratchDir dir;
  const std::string hf = WriteTinyCheckpoint(dir);
  std::ofstream(dir.Join("pack.hf.gguf")) << "x";
  ConvertOptions c;
  c.input = hf;
  c.output_dir = dir.Join("pack");
  absl::Status s = ConvertGguf(c, nullptr, nullptr).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()), HasSubstr("pack.hf.gguf exists"));
}

}  // namespace
}  // namespace strata::packtool
