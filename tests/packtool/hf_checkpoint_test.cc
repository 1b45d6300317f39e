#include "packtool/hf_checkpoint.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <random>

#include "engine/gguf/gguf_file.h"
#include "engine/model/ops.h"
#include "kernels/format/fp16.h"
#include "absl/strings/match.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "packtool/convert.h"
#include "packtool/safetensors.h"
#include "packtool/source_scheme.h"
#include "packtool/synth.h"
#include "tests/packtool/hf_test_util.h"
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
using testing::EditConfig;
using testing::EditShards;
using testing::ExpectSameGguf;

class HfCheckpointArchTest : public ::testing::TestWithParam<std::string> {};

// The checkpoint written from a synthetic GGUF converts back to that GGUF exactly (bar general.name), and
// to the same pack.
// Synthesizes `synth` as a GGUF, writes it as a Hugging Face checkpoint and converts both: the same GGUF, the
// same default scheme, the same pack.
void ExpectHfConvertsAsTheGguf(SynthOptions synth, const HfWriteOptions& w) {
  ScratchDir dir;
  const std::string gguf_path = dir.Join("synth.gguf"), hf_dir = dir.Join("hf");
  synth.output = gguf_path;
  ASSERT_TRUE(SynthesizeGguf(synth).ok());
  std::filesystem::create_directory(hf_dir);
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

TEST_P(HfCheckpointArchTest, ConvertsToTheSameGgufAndPack) {
  // BF16 experts for Mixtral, F16 for Qwen3: both dtypes travel unchanged; MXFP4 for gpt-oss, as it ships.
  const gguf::GgmlType expert_type = GetParam() == "mixtral"   ? gguf::GgmlType::kBF16
                                     : GetParam() == "gpt-oss" ? gguf::GgmlType::kMXFP4
                                                               : gguf::GgmlType::kF16;
  HfWriteOptions w;
  w.shards = 3;
  w.array_merges = GetParam() == "mixtral";
  ExpectHfConvertsAsTheGguf(testing::HfTinyOptions(GetParam(), "", expert_type), w);
}

// GLM-4.5 (not Air): use_qk_norm and self_attn.q_norm / k_norm become the GGUF's attn_q_norm / attn_k_norm.
TEST(HfCheckpointTest, Glm45WithItsQkNormConvertsToTheSameGgufAndPack) {
  SynthOptions synth = testing::HfTinyOptions("glm4moe", "", gguf::GgmlType::kF16);
  synth.geometry.head_qk_norm = true;
  HfWriteOptions w;
  w.shards = 2;
  ExpectHfConvertsAsTheGguf(synth, w);
}

INSTANTIATE_TEST_SUITE_P(Archs, HfCheckpointArchTest,
                         ::testing::Values("qwen3moe", "mixtral", "gpt-oss", "qwen2moe", "olmoe", "glm4moe"),
                         [](const auto& info) { return info.param == "gpt-oss" ? std::string("gpt_oss") : info.param; });

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
  return testing::WriteSynthCheckpoint(dir, testing::HfTinyOptions("qwen3moe", "", gguf::GgmlType::kF16), w);
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
  // Values of another type are refused too, not taken as the default.
  EditConfig(hf, [](nlohmann::json& c) { c["mlp_only_layers"] = "all"; });
  EXPECT_THAT(std::string(ToGguf(dir, hf).message()),
              HasSubstr("config.json: mlp_only_layers: \"all\" is not supported"));
  EditConfig(hf, [](nlohmann::json& c) {
    c["mlp_only_layers"] = nlohmann::json::array();
    c["norm_topk_prob"] = "yes";
  });
  EXPECT_THAT(std::string(ToGguf(dir, hf).message()),
              HasSubstr("config.json: norm_topk_prob: \"yes\" is not supported"));
  EditConfig(hf, [](nlohmann::json& c) { c.erase("norm_topk_prob"); c["tie_word_embeddings"] = "true"; });
  EXPECT_THAT(std::string(ToGguf(dir, hf).message()),
              HasSubstr("config.json: tie_word_embeddings: expected true or false"));
  EditConfig(hf, [](nlohmann::json& c) { c.erase("tie_word_embeddings"); });
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


using ::strata::testing::SafetensorsEntry;
using ::strata::testing::SplitDeepseekKvB;

// A DeepSeek checkpoint in `dir`/hf from the synthetic GGUF `dir`/synth.gguf.
std::string WriteDeepseekCheckpoint(const ScratchDir& dir, const std::string& version, const HfWriteOptions& w = {}) {
  return testing::WriteSynthCheckpoint(dir, testing::DeepseekOptions(version, ""), w);
}

ConvertOptions S8(const std::string& input, const std::string& output_dir) {
  ConvertOptions c;
  c.scheme = kernels::Scheme::kS8;
  c.threads = 2;
  c.input = input;
  c.output_dir = output_dir;
  return c;
}

class HfDeepseekTest : public ::testing::TestWithParam<std::string> {};

// The checkpoint converts to the GGUF llama.cpp's converter writes from it (attn_kv_b split, one kv head, the
// _mla keys), byte for byte, to the same pack as that GGUF, and to the same model as the GGUF it was written
// from (attn_kv_b whole): the engine's logits agree.
TEST_P(HfDeepseekTest, ConvertsToTheGgufLlamaCppWritesAndTheSameModel) {
  ScratchDir dir;
  const std::string hf = WriteDeepseekCheckpoint(dir, GetParam(), {.shards = 3});
  std::ifstream config(hf + "/config.json");
  EXPECT_EQ(nlohmann::json::parse(config)["architectures"][0],
            GetParam() == "v3" ? "DeepseekV3ForCausalLM" : "DeepseekV2ForCausalLM");
  ASSERT_TRUE(SplitDeepseekKvB(dir.Join("synth.gguf"), dir.Join("split.gguf")).ok());
  const absl::Status s = HfCheckpointToGguf({hf, dir.Join("from_hf.gguf"), ""});
  ASSERT_TRUE(s.ok()) << s;
  ExpectSameGguf(dir.Join("split.gguf"), dir.Join("from_hf.gguf"), {"general.name"});

  auto from_split = ConvertGguf(S8(dir.Join("split.gguf"), dir.Join("pack_split")), nullptr, nullptr);
  auto from_hf = ConvertGguf(S8(hf, dir.Join("pack_hf")), nullptr, nullptr);
  auto from_whole = ConvertGguf(S8(dir.Join("synth.gguf"), dir.Join("pack_whole")), nullptr, nullptr);
  ASSERT_TRUE(from_split.ok() && from_hf.ok() && from_whole.ok()) << from_hf.status() << from_whole.status();
  EXPECT_EQ(ReadFileBytes(dir.Join("pack_split/experts.bin")), ReadFileBytes(dir.Join("pack_hf/experts.bin")));
  ExpectSameGguf(dir.Join("pack_split/dense.gguf"), dir.Join("pack_hf/dense.gguf"), {"general.name"});
  EXPECT_EQ(ReadFileBytes(dir.Join("pack_whole/experts.bin")), ReadFileBytes(dir.Join("pack_hf/experts.bin")));
  EXPECT_EQ(*DefaultSchemeForModel(hf), *DefaultSchemeForModel(dir.Join("synth.gguf")));

  const std::vector<int32_t> tokens = {5, 77, 300, 12, 9, 401};
  const std::vector<float> want = testing::EngineLogits(dir.Join("pack_whole"), tokens);
  const std::vector<float> got = testing::EngineLogits(dir.Join("pack_hf"), tokens);
  ASSERT_EQ(got.size(), want.size());
  ASSERT_FALSE(got.empty());
  for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-4f * (1.0f + std::abs(want[i]))) << i;
}

INSTANTIATE_TEST_SUITE_P(Versions, HfDeepseekTest, ::testing::Values("v2", "v3"));

// The test's own E4M3 decoding (sign, 4 exponent bits of bias 7, 3 mantissa bits; exponent 0 subnormal).
float E4m3Value(uint8_t code) {
  const int e = (code >> 3) & 15, m = code & 7;
  const float v = e == 0 ? static_cast<float>(m) / 512.0f : (1.0f + static_cast<float>(m) / 8.0f) * std::exp2f(static_cast<float>(e - 7));
  return (code & 0x80) ? -v : v;
}

// The E4M3 code nearest `x` (|x| <= 448).
uint8_t NearestE4m3(float x) {
  static const std::vector<float> kPositive = [] {  // codes 0 .. 0x7E, increasing
    std::vector<float> v;
    for (int c = 0; c < 0x7F; ++c) v.push_back(E4m3Value(static_cast<uint8_t>(c)));
    return v;
  }();
  const float a = std::abs(x);
  size_t c = static_cast<size_t>(std::lower_bound(kPositive.begin(), kPositive.end(), a) - kPositive.begin());
  if (c == kPositive.size() || (c > 0 && a - kPositive[c - 1] < kPositive[c] - a)) --c;
  return static_cast<uint8_t>(x < 0 ? c | 0x80 : c);
}

bool IsDeepseekLinear(const SafetensorsEntry& e) {
  return e.shape.size() == 2 && absl::StartsWith(e.name, "model.layers.") && absl::EndsWith(e.name, "_proj.weight");
}

// Rewrites the BF16 checkpoint at `fp8_dir` as DeepSeek-V3 ships it: every linear weight of the layers in
// F8_E4M3 with an F32 `_scale_inv` per 128 x 128 block (powers of two, varied between blocks, so that the
// products are exact in bf16), and quantization_config; `decoded_dir` (a copy of the same checkpoint) gets
// the BF16 values those FP8 weights stand for. Returns how many codes are E4M3 subnormals.
int64_t RewriteAsFp8(const std::string& fp8_dir, const std::string& decoded_dir) {
  int64_t subnormals = 0;
  std::map<std::string, std::vector<uint8_t>> decoded;  // name -> bf16 bytes
  EditShards(fp8_dir, [&](std::vector<SafetensorsEntry>& entries) {
    std::vector<SafetensorsEntry> scales;
    for (SafetensorsEntry& e : entries) {
      if (!IsDeepseekLinear(e)) continue;
      ASSERT_EQ(e.dtype, "BF16") << e.name;
      const int64_t rows = e.shape[0], cols = e.shape[1], br = (rows + 127) / 128, bc = (cols + 127) / 128;
      std::vector<float> values(rows * cols), scale(br * bc);
      for (size_t i = 0; i < values.size(); ++i) values[i] = kernels::Bf16ToFloat(kernels::LoadHalf(&e.bytes[2 * i]));
      for (int64_t b = 0; b < br * bc; ++b) {
        float max_abs = 0;
        for (int64_t r = (b / bc) * 128; r < std::min(rows, (b / bc + 1) * 128); ++r) {
          for (int64_t c = (b % bc) * 128; c < std::min(cols, (b % bc + 1) * 128); ++c) max_abs = std::max(max_abs, std::abs(values[r * cols + c]));
        }
        // Up to 4x coarser than needed, so that small values fall into E4M3's subnormals.
        scale[b] = std::exp2f(std::ceil(std::log2(max_abs / 448.0f)) + static_cast<float>(b % 3));
      }
      std::vector<uint8_t> codes(values.size()), bf16(values.size() * 2);
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < cols; ++c) {
          const float s = scale[(r / 128) * bc + c / 128];
          const size_t i = static_cast<size_t>(r * cols + c);
          codes[i] = NearestE4m3(values[i] / s);
          subnormals += (codes[i] & 0x78) == 0 && (codes[i] & 7) != 0;
          kernels::StoreHalf(kernels::FloatToBf16(E4m3Value(codes[i]) * s), &bf16[2 * i]);
        }
      }
      decoded[e.name] = std::move(bf16);
      e.dtype = "F8_E4M3";
      e.bytes = std::move(codes);
      std::vector<uint8_t> scale_bytes(scale.size() * 4);
      std::memcpy(scale_bytes.data(), scale.data(), scale_bytes.size());
      scales.push_back({e.name + "_scale_inv", "F32", {br, bc}, std::move(scale_bytes)});
    }
    entries.insert(entries.end(), scales.begin(), scales.end());
  });
  EditShards(decoded_dir, [&](std::vector<SafetensorsEntry>& entries) {
    for (SafetensorsEntry& e : entries) {
      if (decoded.contains(e.name)) e.bytes = decoded[e.name];
    }
  });
  EditConfig(fp8_dir, [](nlohmann::json& c) {
    c["quantization_config"] = {{"activation_scheme", "dynamic"}, {"fmt", "e4m3"}, {"quant_method", "fp8"},
                                {"weight_block_size", {128, 128}}};
  });
  return subnormals;
}

TEST(HfDeepseekFp8Test, BlockScaledWeightsImportAsTheBf16ValuesTheyStandFor) {
  ScratchDir dir;
  const std::string hf = WriteDeepseekCheckpoint(dir, "v3");
  std::filesystem::copy(hf, dir.Join("decoded"));
  EXPECT_GT(RewriteAsFp8(hf, dir.Join("decoded")), 100) << "subnormal codes, which decode differently";
  ASSERT_TRUE(HfCheckpointToGguf({hf, dir.Join("fp8.gguf"), ""}).ok());
  ASSERT_TRUE(HfCheckpointToGguf({dir.Join("decoded"), dir.Join("decoded.gguf"), ""}).ok());
  ExpectSameGguf(dir.Join("decoded.gguf"), dir.Join("fp8.gguf"), {"general.name"});
  // The experts are BF16 in the GGUF, so the default scheme is BF16's.
  EXPECT_EQ(*DefaultSchemeForModel(hf), *DefaultSchemeFor(gguf::GgmlType::kBF16));
  auto fp8 = gguf::GgufFile::Open(dir.Join("fp8.gguf"));
  ASSERT_TRUE(fp8.ok());
  EXPECT_EQ((*fp8)->FindTensor("blk.1.ffn_up_exps.weight")->type, gguf::GgmlType::kBF16);
  EXPECT_EQ((*fp8)->FindTensor("blk.0.attn_k_b.weight")->type, gguf::GgmlType::kBF16);
}

TEST(HfDeepseekFp8Test, RefusesOtherLayoutsNamingTheTensor) {
  ScratchDir dir;
  const std::string hf = WriteDeepseekCheckpoint(dir, "v3", {.shards = 1});
  std::filesystem::copy(hf, dir.Join("decoded"));
  RewriteAsFp8(hf, dir.Join("decoded"));
  const std::string name = "model.layers.0.mlp.down_proj.weight";  // [128, 256]: 1 x 2 blocks
  auto expect_refusal = [&](const std::function<void(std::vector<SafetensorsEntry>&)>& edit, const std::string& message) {
    std::filesystem::copy(hf, dir.Join("edited"));
    EditShards(dir.Join("edited"), edit);
    EXPECT_THAT(std::string(HfCheckpointToGguf({dir.Join("edited"), dir.Join("out.gguf"), ""}).message()),
                HasSubstr(message));
    std::filesystem::remove_all(dir.Join("edited"));
  };
  expect_refusal([&](auto& e) { std::erase_if(e, [&](const auto& t) { return t.name == name + "_scale_inv"; }); },
                 "tensor '" + name + "' is F8_E4M3 but its block scales '" + name + "_scale_inv' are missing");
  expect_refusal(
      [&](auto& e) {
        for (auto& t : e) {
          if (t.name == name + "_scale_inv") t.shape = {1, 1}, t.bytes.resize(4);
        }
      },
      "tensor '" + name + "_scale_inv' is F32 [1, 1], expected F32 [1, 2]: one scale per 128 x 128 block of '" +
          name + "'");
  expect_refusal(
      [&](auto& e) {
        for (auto& t : e) {
          if (t.name == name + "_scale_inv") t.dtype = "BF16", t.bytes.resize(4);
        }
      },
      "is BF16 [1, 2], expected F32 [1, 2]");
  // A scale_inv whose weight is not FP8 is a stray tensor.
  expect_refusal([&](auto& e) { e.push_back({"model.norm.weight_scale_inv", "F32", {1, 1}, std::vector<uint8_t>(4)}); },
                 "tensor 'model.norm.weight_scale_inv' has no place");
  expect_refusal(
      [&](auto& e) {
        for (auto& t : e) {
          if (t.name == "model.norm.weight") t.dtype = "F8_E4M3", t.bytes.resize(t.bytes.size() / 4);
        }
      },
      "tensor 'model.norm.weight' is F8_E4M3 of 1 dimensions");
  EditConfig(hf, [](nlohmann::json& c) { c.erase("quantization_config"); });
  EXPECT_THAT(std::string(HfCheckpointToGguf({hf, dir.Join("out.gguf"), ""}).message()),
              HasSubstr("is F8_E4M3 but config.json has no quantization_config"));
  EditConfig(hf, [](nlohmann::json& c) {
    c["quantization_config"] = {{"quant_method", "fbgemm_fp8"}, {"weight_block_size", {128, 128}}};
  });
  EXPECT_THAT(std::string(HfCheckpointToGguf({hf, dir.Join("out.gguf"), ""}).message()),
              HasSubstr("quantization_config.quant_method: 'fbgemm_fp8' is not supported"));
}

// The score-correction bias belongs to V3's sigmoid router: with softmax it is a stray tensor. A missing
// kv_b_proj is named.
TEST(HfDeepseekCheckpointTest, RefusesStrayAndMissingTensorsNamingThem) {
  ScratchDir dir;
  const std::string hf = WriteDeepseekCheckpoint(dir, "v3", {.shards = 1});
  EditConfig(hf, [](nlohmann::json& c) { c["scoring_func"] = "softmax", c["topk_method"] = "group_limited_greedy"; });
  EXPECT_THAT(std::string(ToGguf(dir, hf).message()),
              HasSubstr("tensor 'model.layers.1.mlp.gate.e_score_correction_bias' has no place in a DeepseekV3ForCausalLM"));
  EditConfig(hf, [](nlohmann::json& c) { c["scoring_func"] = "sigmoid", c["topk_method"] = "noaux_tc"; });
  ASSERT_TRUE(ToGguf(dir, hf).ok());
  EditShards(hf, [](auto& e) { std::erase_if(e, [](const auto& t) { return t.name == "model.layers.2.self_attn.kv_b_proj.weight"; }); });
  EXPECT_THAT(std::string(ToGguf(dir, hf).message()), HasSubstr("tensor 'model.layers.2.self_attn.kv_b_proj.weight' is missing"));
}

// DeepSeek-V3 ships a multi-token-prediction layer after the model's (model.layers.<n_layer>.*): left out as
// llama.cpp's converter does when config.json says so, a stray tensor otherwise.
TEST(HfDeepseekCheckpointTest, LeavesOutTheMultiTokenPredictionLayers) {
  ScratchDir dir;
  const std::string hf = WriteDeepseekCheckpoint(dir, "v3", {.shards = 1});
  EditShards(hf, [](auto& e) {
    e.push_back({"model.layers.3.eh_proj.weight", "BF16", {4, 8}, std::vector<uint8_t>(64)});
    e.push_back({"model.layers.3.mlp.experts.0.up_proj.weight", "BF16", {4, 4}, std::vector<uint8_t>(32)});
  });
  EXPECT_THAT(std::string(HfCheckpointToGguf({hf, dir.Join("out.gguf"), ""}).message()),
              HasSubstr("tensor 'model.layers.3.eh_proj.weight' has no place"));
  EditConfig(hf, [](nlohmann::json& c) { c["num_nextn_predict_layers"] = 1; });
  ASSERT_TRUE(HfCheckpointToGguf({hf, dir.Join("out.gguf"), ""}).ok());
  ASSERT_TRUE(SplitDeepseekKvB(dir.Join("synth.gguf"), dir.Join("split.gguf")).ok());
  ExpectSameGguf(dir.Join("split.gguf"), dir.Join("out.gguf"), {"general.name"});
}


// A tiny gpt-oss checkpoint in `dir`/hf from the synthetic GGUF `dir`/synth.gguf with `expert_type` experts.
std::string WriteGptOssCheckpoint(const ScratchDir& dir, gguf::GgmlType expert_type) {
  return testing::WriteSynthCheckpoint(dir, testing::HfTinyOptions("gpt-oss", "", expert_type), {.shards = 1});
}

// Dequantized gpt-oss checkpoints hold the experts as floats, transposed ([E, K, rows]): imported as they are.
TEST(HfGptOssCheckpointTest, ReadsFloatExpertsOfDequantizedCheckpoints) {
  ScratchDir dir;
  const std::string hf = WriteGptOssCheckpoint(dir, gguf::GgmlType::kBF16);
  ASSERT_TRUE(std::ifstream(hf + "/config.json").good());
  EXPECT_FALSE(nlohmann::json::parse(std::ifstream(hf + "/config.json")).contains("quantization_config"));
  const absl::Status s = HfCheckpointToGguf({hf, dir.Join("out.gguf"), ""});
  ASSERT_TRUE(s.ok()) << s;
  ExpectSameGguf(dir.Join("synth.gguf"), dir.Join("out.gguf"), {"general.name"});
}

// Without quantization_config the experts are expected as floats: the MXFP4 ones are not where they would be.
// MXFP4 blocks and scales must be U8 and present.
TEST(HfGptOssCheckpointTest, RefusesMissingAndMistypedExpertTensorsNamingThem) {
  ScratchDir dir;
  const std::string hf = WriteGptOssCheckpoint(dir, gguf::GgmlType::kMXFP4);
  nlohmann::json original;
  EditConfig(hf, [&](nlohmann::json& c) { original = c; });
  EditConfig(hf, [](nlohmann::json& c) { c.erase("quantization_config"); });
  EXPECT_THAT(std::string(ToGguf(dir, hf).message()), HasSubstr("tensor 'model.layers.0.mlp.experts.gate_up_proj' is missing"));
  EditConfig(hf, [&](nlohmann::json& c) { c = original; });
  EditShards(hf, [](auto& e) {
    for (auto& t : e) {
      if (t.name == "model.layers.1.mlp.experts.down_proj_scales") t.dtype = "F8_E4M3";
    }
  });
  EXPECT_THAT(std::string(ToGguf(dir, hf).message()),
              HasSubstr("tensor 'model.layers.1.mlp.experts.down_proj_scales' is F8_E4M3, expected U8 (MXFP4)"));
  EditShards(hf, [](auto& e) { std::erase_if(e, [](const auto& t) { return t.name == "model.layers.1.mlp.experts.down_proj_scales"; }); });
  EXPECT_THAT(std::string(ToGguf(dir, hf).message()), HasSubstr("tensor 'model.layers.1.mlp.experts.down_proj_scales' is missing"));
}

// A tiny checkpoint of synth architecture `arch` in `dir`/hf from `dir`/synth.gguf.
std::string WriteArchCheckpoint(const ScratchDir& dir, const std::string& arch) {
  return testing::WriteSynthCheckpoint(dir, testing::HfTinyOptions(arch, "", gguf::GgmlType::kBF16), {.shards = 1});
}

// GLM-4.5's multi-token-prediction layer (model.layers.<n_layer>.*) is left out when config.json says so, as
// for DeepSeek; a stray tensor otherwise.
TEST(HfCheckpointTest, LeavesOutGlm4MoesMultiTokenPredictionLayer) {
  ScratchDir dir;
  const std::string hf = WriteArchCheckpoint(dir, "glm4moe");
  EditShards(hf, [](auto& e) {
    e.push_back({"model.layers.2.eh_proj.weight", "BF16", {4, 8}, std::vector<uint8_t>(64)});
  });
  EXPECT_THAT(std::string(ToGguf(dir, hf).message()), HasSubstr("tensor 'model.layers.2.eh_proj.weight' has no place"));
  EditConfig(hf, [](nlohmann::json& c) { c["num_nextn_predict_layers"] = 1; });
  ASSERT_TRUE(ToGguf(dir, hf).ok());
  ExpectSameGguf(dir.Join("synth.gguf"), dir.Join("out.gguf"), {"general.name"});
}

// The checkpoint with its MTP layer and the GGUF llama.cpp's converter writes of it (the MTP layer as block
// <n_layer> with its nextn tensors) convert to the same pack.
TEST(HfCheckpointTest, Glm4MoeWithItsMtpLayerConvertsToThePackOfTheGgufWithTheNextnBlock) {
  ScratchDir dir;
  const std::string hf = WriteArchCheckpoint(dir, "glm4moe");
  EditShards(hf, [](auto& e) {
    e.push_back({"model.layers.2.eh_proj.weight", "BF16", {4, 8}, std::vector<uint8_t>(64)});
    e.push_back({"model.layers.2.mlp.experts.0.up_proj.weight", "BF16", {4, 4}, std::vector<uint8_t>(32)});
  });
  EditConfig(hf, [](nlohmann::json& c) { c["num_nextn_predict_layers"] = 1; });
  SynthOptions o = testing::HfTinyOptions("glm4moe", dir.Join("mtp.gguf"), gguf::GgmlType::kBF16);
  o.geometry.n_mtp_layers = 1;
  ASSERT_TRUE(SynthesizeGguf(o).ok());
  auto from_hf = ConvertGguf(S8(hf, dir.Join("pack_hf")), nullptr, nullptr);
  auto from_mtp = ConvertGguf(S8(dir.Join("mtp.gguf"), dir.Join("pack_mtp")), nullptr, nullptr);
  ASSERT_TRUE(from_hf.ok()) << from_hf.status();
  ASSERT_TRUE(from_mtp.ok()) << from_mtp.status();
  EXPECT_EQ(from_hf->geometry().SerializeAsString(), from_mtp->geometry().SerializeAsString());
  EXPECT_EQ(from_mtp->geometry().n_layer(), 2u);
  EXPECT_EQ(ReadFileBytes(dir.Join("pack_hf/experts.bin")), ReadFileBytes(dir.Join("pack_mtp/experts.bin")));
  ExpectSameGguf(dir.Join("pack_mtp/dense.gguf"), dir.Join("pack_hf/dense.gguf"), {"general.name"});
}

}  // namespace
}  // namespace strata::packtool
