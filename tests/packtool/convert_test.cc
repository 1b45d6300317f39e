#include "packtool/convert.h"

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "engine/gguf/gguf_file.h"
#include "engine/gguf/gguf_writer.h"
#include "engine/model/model_config.h"
#include "engine/pack/pack_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/quantize.h"
#include "packtool/pack_writer.h"
#include "packtool/validate.h"
#include "tests/packtool/packtool_test_util.h"
#include "tests/testing/test_util.h"

namespace strata::packtool {
namespace {

namespace fs = std::filesystem;
using kernels::Scheme;
using ::strata::testing::ReadFileBytes;
using ::strata::testing::ScratchDir;
using testing::TinyOptions;

ConvertOptions Options(const std::string& in, const std::string& out, Scheme scheme) {
  ConvertOptions c;
  c.input = in;
  c.output_dir = out;
  c.scheme = scheme;
  c.threads = 2;
  return c;
}

class ConvertSchemeTest : public ::testing::TestWithParam<Scheme> {};

TEST_P(ConvertSchemeTest, WritesAConsistentPackWhoseBlobsAreTheQuantizedExperts) {
  ScratchDir dir;
  const std::string model = dir.Join("m.gguf"), out = dir.Join("pack");
  ASSERT_THAT(SynthesizeGguf(TinyOptions(model)), IsOk());
  std::vector<ConvertProgress> reports;
  auto manifest = ConvertGguf(Options(model, out, GetParam()), [&](const ConvertProgress& p) { reports.push_back(p); },
                              nullptr);
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  EXPECT_THAT(pack::CheckManifest(*manifest), IsOk());
  EXPECT_FALSE(fs::exists(out + ".partial"));
  EXPECT_EQ(manifest->scheme(), kernels::SchemeName(GetParam()));
  EXPECT_EQ(manifest->geometry().n_moe_layers(), 2u);
  EXPECT_EQ(manifest->geometry().n_expert(), 8u);
  EXPECT_EQ(manifest->sources_size(), 1);
  EXPECT_EQ(manifest->sources(0).name(), "m.gguf");
  // The source is hashed beside the conversion, and the hash is the whole file's.
  auto source_hash = HashFile(model);
  ASSERT_TRUE(source_hash.ok()) << source_hash.status();
  EXPECT_EQ(manifest->sources(0).size(), fs::file_size(model));
  EXPECT_EQ(manifest->sources(0).xxh3(), pack::HashHex(source_hash->second));
  EXPECT_EQ(fs::file_size(out + "/experts.bin"), manifest->experts_bytes());
  ASSERT_FALSE(reports.empty());
  EXPECT_EQ(reports.front().phase, "dense");
  EXPECT_EQ(reports.back().phase, "done");
  EXPECT_EQ(reports.back().experts_done, 16u);

  // Blob (layer 1, expert 5) is exactly QuantizeRole of the source expert.
  auto src = gguf::GgufFile::Open(model);
  ASSERT_TRUE(src.ok());
  auto layout = pack::LayoutFromManifest(*manifest);
  ASSERT_TRUE(layout.ok());
  const std::vector<uint8_t> experts = ReadFileBytes(out + "/experts.bin");
  const uint8_t* blob = experts.data() + pack::BlobIndex(*manifest, 1, 5) * manifest->blob_bytes();
  const char* names[3] = {"blk.1.ffn_gate_exps.weight", "blk.1.ffn_up_exps.weight", "blk.1.ffn_down_exps.weight"};
  for (int r = 0; r < 3; ++r) {
    const gguf::TensorInfo* t = (*src)->FindTensor(names[r]);
    ASSERT_NE(t, nullptr);
    const float* f = reinterpret_cast<const float*>(t->data) + 5 * 128 * 128;
    std::vector<uint8_t> expected(layout->role_bytes[r]);
    kernels::QuantizeRole(GetParam(), f, 128, 128, expected.data());
    EXPECT_EQ(0, std::memcmp(expected.data(), blob + layout->role_offset[r], expected.size())) << names[r];
  }

  // The reported error per role is the error of the blobs as written: recomputed here from every blob of
  // experts.bin, decoded, against the source weights decoded by gguf::Dequantize.
  ASSERT_EQ(manifest->quant_error_size(), 3);
  struct RoleSums {
    double err2 = 0, ref2 = 0, max_abs = 0;
  } sums[3];
  const int64_t n_embd = manifest->geometry().n_embd(), ff = manifest->geometry().expert_ff();
  const int64_t rows[3] = {ff, ff, n_embd}, cols[3] = {n_embd, n_embd, ff};
  ASSERT_EQ(experts.size(), manifest->experts_bytes());
  for (uint32_t l = 0; l < manifest->geometry().n_moe_layers(); ++l) {
    for (uint32_t e = 0; e < manifest->geometry().n_expert(); ++e) {
      const uint8_t* written = experts.data() + pack::BlobIndex(*manifest, l, e) * manifest->blob_bytes();
      for (int r = 0; r < 3; ++r) {
        const std::string name = absl::StrCat("blk.", manifest->geometry().moe_layers(l), ".ffn_",
                                              r == 0 ? "gate" : r == 1 ? "up" : "down", "_exps.weight");
        const gguf::TensorInfo* t = (*src)->FindTensor(name);
        ASSERT_NE(t, nullptr) << name;
        const int64_t n = rows[r] * cols[r];
        const uint64_t expert_bytes = t->bytes / manifest->geometry().n_expert();
        std::vector<float> source(n), decoded(n);
        ASSERT_THAT(gguf::Dequantize(t->type, t->data + e * expert_bytes, source.data(), n), IsOk()) << name;
        kernels::DequantizeRole(GetParam(), written + layout->role_offset[r], rows[r], cols[r], decoded.data());
        for (int64_t i = 0; i < n; ++i) {
          const double err = static_cast<double>(source[i]) - decoded[i];
          sums[r].err2 += err * err;
          sums[r].ref2 += static_cast<double>(source[i]) * source[i];
          sums[r].max_abs = std::max(sums[r].max_abs, std::fabs(err));
        }
      }
    }
  }
  double err2_all = 0, ref2_all = 0;
  for (int r = 0; r < 3; ++r) {
    const pack::v1::RoleError& reported = manifest->quant_error(r);
    EXPECT_EQ(reported.role(), pack::kRoleNames[r]);
    const double rel_rms = std::sqrt(sums[r].err2 / sums[r].ref2);
    EXPECT_GT(rel_rms, 0.0) << reported.role();  // f16 rounds f32 weights too
    EXPECT_NEAR(reported.rel_rms(), rel_rms, 1e-9 * rel_rms) << reported.role();
    EXPECT_NEAR(reported.max_abs(), sums[r].max_abs, 1e-9 * sums[r].max_abs) << reported.role();
    err2_all += sums[r].err2;
    ref2_all += sums[r].ref2;
  }
  // The last progress report carries the error over all roles.
  EXPECT_NEAR(reports.back().rel_rms_error, std::sqrt(err2_all / ref2_all), 1e-9 * std::sqrt(err2_all / ref2_all));
  // And the error is what the scheme promises.
  const double bound = GetParam() == Scheme::kF16 ? 1e-3 : GetParam() == Scheme::kS8 ? 0.02
                       : GetParam() == Scheme::kS4 ? 0.15 : 0.45;
  for (const auto& e : manifest->quant_error()) EXPECT_LT(e.rel_rms(), bound) << e.role();

  // dense.gguf holds every other tensor, byte for byte, and no expert tensor.
  auto dense = gguf::GgufFile::Open(out + "/dense.gguf");
  ASSERT_TRUE(dense.ok()) << dense.status();
  EXPECT_EQ((*dense)->tensors().size(), (*src)->tensors().size() - 6);
  for (const gguf::TensorInfo& t : (*dense)->tensors()) {
    EXPECT_EQ(t.name.find("_exps"), std::string::npos);
    const gguf::TensorInfo* s = (*src)->FindTensor(t.name);
    ASSERT_NE(s, nullptr);
    ASSERT_EQ(s->bytes, t.bytes);
    EXPECT_EQ(0, std::memcmp(s->data, t.data, t.bytes)) << t.name;
  }
  EXPECT_EQ(*(*dense)->metadata().GetString("tokenizer.ggml.model"), "gpt2");
  // The chat template is carried into the pack as it is.
  absl::StatusOr<std::string> chat_template = (*dense)->metadata().GetString("tokenizer.chat_template");
  ASSERT_TRUE(chat_template.ok()) << chat_template.status();
  EXPECT_EQ(*chat_template, *(*src)->metadata().GetString("tokenizer.chat_template"));
  EXPECT_NE(chat_template->find("<|im_start|>"), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(AllSchemes, ConvertSchemeTest, ::testing::Values(Scheme::kF16, Scheme::kS8, Scheme::kS4, Scheme::kS2),
                         [](const auto& info) { return std::string(kernels::SchemeName(info.param)); });

TEST(ConvertTest, RefusesAnExistingOutputOrPartial) {
  ScratchDir dir;
  const std::string model = dir.Join("m.gguf");
  ASSERT_THAT(SynthesizeGguf(TinyOptions(model)), IsOk());
  fs::create_directory(dir.Join("taken"));
  EXPECT_THAT(ConvertGguf(Options(model, dir.Join("taken"), Scheme::kS8), nullptr, nullptr).status(),
              StatusIsWith(absl::StatusCode::kAlreadyExists, "taken"));
  fs::create_directory(dir.Join("busy.partial"));
  EXPECT_THAT(ConvertGguf(Options(model, dir.Join("busy"), Scheme::kS8), nullptr, nullptr).status(),
              StatusIsWith(absl::StatusCode::kFailedPrecondition, "busy.partial"));
  EXPECT_TRUE(fs::exists(dir.Join("busy.partial")));  // someone else's: left alone
}

TEST(ConvertTest, CancelLeavesNothingBehind) {
  ScratchDir dir;
  const std::string model = dir.Join("m.gguf"), out = dir.Join("pack");
  ASSERT_THAT(SynthesizeGguf(TinyOptions(model)), IsOk());
  std::atomic<bool> cancel{false};
  auto result = ConvertGguf(Options(model, out, Scheme::kS8),
                            [&](const ConvertProgress& p) { if (p.phase == "experts") cancel = true; }, &cancel);
  EXPECT_THAT(result.status(), StatusIs(absl::StatusCode::kCancelled));
  EXPECT_FALSE(fs::exists(out));
  EXPECT_FALSE(fs::exists(out + ".partial"));

  // Cancelled before the first expert (the source shards are hashed beside the conversion, so the hashing
  // thread is stopped too).
  cancel = true;
  result = ConvertGguf(Options(model, out, Scheme::kS8), nullptr, &cancel);
  EXPECT_THAT(result.status(), StatusIsWith(absl::StatusCode::kCancelled, "cancelled"));
  EXPECT_FALSE(fs::exists(out));
  EXPECT_FALSE(fs::exists(out + ".partial"));
}

TEST(ConvertTest, RejectsModelsWithoutExpertsAndMissingInputs) {
  ScratchDir dir;
  gguf::GgufWriter w;
  w.SetString("general.architecture", "llama");
  w.SetUint32("llama.block_count", 1);
  w.SetUint32("llama.expert_used_count", 2);
  w.SetUint32("llama.embedding_length", 64);
  std::vector<float> v(64, 1.0f);
  ASSERT_THAT(w.AddTensorData("blk.0.attn_norm.weight", gguf::GgmlType::kF32, {64},
                              {reinterpret_cast<const uint8_t*>(v.data()), v.size() * 4}),
              IsOk());
  ASSERT_THAT(w.WriteFile(dir.Join("dense.gguf")), IsOk());
  EXPECT_THAT(ConvertGguf(Options(dir.Join("dense.gguf"), dir.Join("p"), Scheme::kS8), nullptr, nullptr).status(),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "not a MoE model"));
  EXPECT_THAT(ConvertGguf(Options(dir.Join("absent.gguf"), dir.Join("p"), Scheme::kS8), nullptr, nullptr).status(),
              StatusIs(absl::StatusCode::kNotFound));
  EXPECT_FALSE(fs::exists(dir.Join("p")));
  EXPECT_FALSE(fs::exists(dir.Join("p.partial")));
}

// The list in the message is the engine's own table, so a new architecture shows up without a test edit.
TEST(ConvertTest, RefusesAnArchitectureTheEngineCannotRunBeforeAnyWork) {
  ScratchDir dir;
  const std::string model = dir.Join("m.gguf"), other = dir.Join("qwen3next.gguf"), out = dir.Join("p");
  ASSERT_THAT(SynthesizeGguf(TinyOptions(model)), IsOk());
  testing::RewriteArchitecture(model, other, "qwen3next");
  int progress_calls = 0;
  const absl::Status s =
      ConvertGguf(Options(other, out, Scheme::kS8), [&](const ConvertProgress&) { ++progress_calls; }, nullptr)
          .status();
  EXPECT_THAT(s, StatusIsWith(absl::StatusCode::kUnimplemented, "general.architecture 'qwen3next' is not supported"));
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr(other));
  for (const model::Architecture& a : model::ArchitectureTable()) {
    EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr(std::string(a.gguf_name)));
  }
  EXPECT_EQ(progress_calls, 0);
  EXPECT_FALSE(fs::exists(out));
  EXPECT_FALSE(fs::exists(out + ".partial"));
}

// qwen2moe's shared expert (its gate, up, down and sigmoid gate) and the q/k/v biases are dense tensors: they
// go to dense.gguf as they are, and only the routed experts to experts.bin. OLMoE's whole-projection q/k
// norms are dense too.
TEST(ConvertTest, SharedExpertsAndBiasesGoToDenseGgufAndRoutedExpertsToExpertsBin) {
  for (const std::string arch : {"qwen2moe", "olmoe", "glm4moe"}) {
    ScratchDir dir;
    SynthOptions o = TinyOptions(dir.Join("m.gguf"));
    o.geometry = *PresetGeometry(arch, "tiny");
    ASSERT_THAT(SynthesizeGguf(o), IsOk());
    auto manifest = ConvertGguf(Options(o.output, dir.Join("p"), Scheme::kS8), nullptr, nullptr);
    ASSERT_TRUE(manifest.ok()) << arch << ": " << manifest.status();
    EXPECT_EQ(manifest->architecture(), arch);
    EXPECT_EQ(manifest->geometry().expert_ff(), static_cast<uint32_t>(o.geometry.expert_ff));
    // glm4moe's first block is dense: its FFN is a dense tensor, not a MoE layer.
    const int64_t n_moe = o.geometry.n_layer - o.geometry.n_dense_lead;
    EXPECT_EQ(manifest->geometry().n_moe_layers(), static_cast<uint32_t>(n_moe));
    EXPECT_EQ(manifest->geometry().moe_layers(0), static_cast<uint32_t>(o.geometry.n_dense_lead));
    auto layout = pack::LayoutFromManifest(*manifest);
    ASSERT_TRUE(layout.ok()) << layout.status();
    EXPECT_EQ(manifest->experts_bytes(), static_cast<uint64_t>(n_moe * o.geometry.n_expert) * layout->blob_bytes);
    auto source = gguf::GgufFile::Open(o.output);
    auto dense = gguf::GgufFile::Open(dir.Join("p/dense.gguf"));
    ASSERT_TRUE(source.ok() && dense.ok());
    int dense_tensors = 0;
    for (const gguf::TensorInfo& t : (*source)->tensors()) {
      const bool routed = absl::EndsWith(t.name, "_exps.weight");
      const gguf::TensorInfo* copy = (*dense)->FindTensor(t.name);
      EXPECT_EQ(copy != nullptr, !routed) << arch << ": " << t.name;
      if (copy == nullptr) continue;
      ++dense_tensors;
      EXPECT_EQ(copy->ne, t.ne) << t.name;
      if (t.ne.size() == 1) {  // norms, biases and the shared expert's gate are copied byte for byte
        EXPECT_EQ(std::vector<uint8_t>(copy->data, copy->data + copy->bytes),
                  std::vector<uint8_t>(t.data, t.data + t.bytes)) << t.name;
      }
    }
    // Per block: attn_norm, q, k, v, output, the FFN norm and the router, and qwen2moe's 3 biases and 4 shared
    // expert tensors, olmoe's 2 q/k norms, glm4moe's 3 biases, expert bias and 3 shared expert tensors (in
    // its dense first block: 3 biases and the FFN's 3 matrices instead of the router).
    const int per_layer = arch == "qwen2moe" ? 14 : arch == "olmoe" ? 9 : 14;
    const int dense_block = arch == "glm4moe" ? 12 : per_layer;
    EXPECT_EQ(dense_tensors, 3 + dense_block * o.geometry.n_dense_lead +
                                 per_layer * (o.geometry.n_layer - o.geometry.n_dense_lead)) << arch;
    if (arch == "qwen2moe") {
      EXPECT_NE((*dense)->FindTensor("blk.1.ffn_gate_inp_shexp.weight"), nullptr);
      EXPECT_NE((*dense)->FindTensor("blk.1.ffn_down_shexp.weight"), nullptr);
      EXPECT_NE((*dense)->FindTensor("blk.0.attn_v.bias"), nullptr);
    }
  }
}

// A dense llama has no llama.expert_* keys: it is told it is not a MoE model, not that a key is missing.
TEST(ConvertTest, ADenseModelOfASupportedArchitectureIsNotAMoeModel) {
  ScratchDir dir;
  gguf::GgufWriter w;
  w.SetString("general.architecture", "llama");
  w.SetUint32("llama.block_count", 1);
  w.SetUint32("llama.embedding_length", 64);
  std::vector<float> v(64, 1.0f);
  ASSERT_THAT(w.AddTensorData("blk.0.attn_norm.weight", gguf::GgmlType::kF32, {64},
                              {reinterpret_cast<const uint8_t*>(v.data()), v.size() * 4}),
              IsOk());
  ASSERT_THAT(w.WriteFile(dir.Join("dense.gguf")), IsOk());
  const absl::Status s = ConvertGguf(Options(dir.Join("dense.gguf"), dir.Join("p"), Scheme::kS8), nullptr, nullptr).status();
  EXPECT_THAT(s, StatusIsWith(absl::StatusCode::kInvalidArgument, "not a MoE model"));
  EXPECT_THAT(std::string(s.message()), ::testing::Not(::testing::HasSubstr("expert_used_count")));
}

// What the engine refuses at load time is refused at convert time too.
TEST(ConvertTest, RefusesHyperParametersTheEngineDoesNotImplement) {
  ScratchDir dir;
  const std::string model = dir.Join("m.gguf"), scaled = dir.Join("scaled.gguf");
  ASSERT_THAT(SynthesizeGguf(TinyOptions(model)), IsOk());
  auto src = gguf::GgufFile::Open(model);
  ASSERT_TRUE(src.ok()) << src.status();
  gguf::GgufWriter w((*src)->alignment());
  for (const auto& [k, v] : (*src)->metadata().entries()) {
    if (k != "general.alignment") w.Set(k, v);
  }
  w.SetFloat32("qwen3moe.rope.scaling.factor", 4.0f);
  for (const gguf::TensorInfo& t : (*src)->tensors()) {
    ASSERT_THAT(w.AddTensorData(t.name, t.type, t.ne, {t.data, t.bytes}), IsOk());
  }
  ASSERT_THAT(w.WriteFile(scaled), IsOk());
  EXPECT_THAT(ConvertGguf(Options(scaled, dir.Join("p"), Scheme::kS8), nullptr, nullptr).status(),
              StatusIsWith(absl::StatusCode::kUnimplemented, "rope.scaling.factor is 4"));
  EXPECT_FALSE(fs::exists(dir.Join("p.partial")));
}

// Splits a model into two shards the way llama.cpp's gguf-split does: split.* keys in every shard, the
// metadata in the first, tensors divided between them.
void WriteSplit(const std::string& model, const std::string& prefix) {
  auto src = gguf::GgufFile::Open(model);
  ASSERT_TRUE(src.ok()) << src.status();
  const auto& tensors = (*src)->tensors();
  const size_t half = tensors.size() / 2;
  for (int shard = 0; shard < 2; ++shard) {
    gguf::GgufWriter w;
    w.Set("split.no", gguf::Value::Uint16(static_cast<uint16_t>(shard)));
    w.Set("split.count", gguf::Value::Uint16(2));
    w.Set("split.tensors.count", gguf::Value::Int32(static_cast<int32_t>(tensors.size())));
    if (shard == 0) {
      for (const auto& [k, v] : (*src)->metadata().entries()) w.Set(k, v);
    }
    for (size_t i = shard == 0 ? 0 : half; i < (shard == 0 ? half : tensors.size()); ++i) {
      ASSERT_THAT(w.AddTensorData(tensors[i].name, tensors[i].type, tensors[i].ne, {tensors[i].data, tensors[i].bytes}),
                  IsOk());
    }
    ASSERT_THAT(w.WriteFile(prefix + (shard == 0 ? "-00001-of-00002.gguf" : "-00002-of-00002.gguf")), IsOk());
  }
}

TEST(ConvertTest, SplitModelGivesTheSameExpertsAsOneFile) {
  ScratchDir dir;
  const pack::v1::Manifest whole = testing::MakeTinyPack(dir.Join("m.gguf"), dir.Join("whole"));
  WriteSplit(dir.Join("m.gguf"), dir.Join("split"));
  auto split = ConvertGguf(Options(dir.Join("split-00001-of-00002.gguf"), dir.Join("fromsplit"), Scheme::kS8), nullptr,
                           nullptr);
  ASSERT_TRUE(split.ok()) << split.status();
  EXPECT_EQ(split->sources_size(), 2);
  ASSERT_EQ(split->blob_xxh3_size(), whole.blob_xxh3_size());
  for (int i = 0; i < whole.blob_xxh3_size(); ++i) EXPECT_EQ(split->blob_xxh3(i), whole.blob_xxh3(i));
  // A missing shard is named.
  fs::remove(dir.Join("split-00002-of-00002.gguf"));
  EXPECT_THAT(ConvertGguf(Options(dir.Join("split-00001-of-00002.gguf"), dir.Join("x"), Scheme::kS8), nullptr, nullptr)
                  .status(),
              StatusIsWith(absl::StatusCode::kNotFound, "00002-of-00002"));
}

// A /proc/self/status field in bytes (its value is in kB), or 0 when absent.
uint64_t StatusBytes(const std::string& key) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind(key, 0) == 0) return std::stoull(line.substr(key.size())) * 1024;
  }
  return 0;
}

// Runs a conversion in a child process and returns how far its resident set rose above what it was before
// the conversion started, in bytes. The child starts as a copy of this test process (which may hold
// earlier tests' memory and, in a CUDA build, the CUDA libraries), so its high-water mark is reset first.
uint64_t PeakRssGrowthOfConversion(const ConvertOptions& options) {
  int fds[2];
  EXPECT_EQ(pipe(fds), 0);
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    { std::ofstream("/proc/self/clear_refs") << "5"; }  // VmHWM := VmRSS
    const uint64_t before = StatusBytes("VmRSS:");
    auto m = ConvertGguf(options, nullptr, nullptr);
    const uint64_t peak = StatusBytes("VmHWM:");
    const uint64_t growth = peak > before ? peak - before : 0;
    const bool wrote = write(fds[1], &growth, sizeof growth) == sizeof growth;
    _exit(m.ok() && wrote && before > 0 ? 0 : 1);
  }
  close(fds[1]);
  uint64_t growth = ~uint64_t{0};
  EXPECT_EQ(read(fds[0], &growth, sizeof growth), static_cast<ssize_t>(sizeof growth));
  close(fds[0]);
  int status = 0;
  EXPECT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  return growth;
}

TEST(ConvertTest, PeakMemoryStaysFarBelowTheModelSize) {
  ScratchDir dir;
  SynthOptions o = TinyOptions(dir.Join("big.gguf"));
  o.geometry.n_layer = 4;
  o.geometry.n_expert = 32;
  o.geometry.n_embd = 512;
  o.geometry.expert_ff = 512;
  ASSERT_THAT(SynthesizeGguf(o), IsOk());
  const uint64_t model_bytes = fs::file_size(o.output);
  ASSERT_GT(model_bytes, 380u << 20);
  const uint64_t growth = PeakRssGrowthOfConversion(Options(o.output, dir.Join("pack"), Scheme::kS8));
  // Streaming keeps one expert per thread (a few MB); a converter that mapped and touched the whole model
  // would grow by about its size.
  EXPECT_LT(growth, model_bytes / 4) << "peak RSS rose by " << growth << " for a model of " << model_bytes
                                     << " bytes";
}

// GLM-4.5's and DeepSeek-V3's GGUFs carry multi-token-prediction blocks after the model's (block_count counts
// them, nextn_predict_layers says how many): the pack is the model without them, byte for byte the pack of the
// same model synthesized without them, and the engine's logits are the same.
class ConvertMtpTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ConvertMtpTest, LeavesOutTheMultiTokenPredictionBlocks) {
  ScratchDir dir;
  SynthOptions o = TinyOptions(dir.Join("plain.gguf"));
  o.geometry = *PresetGeometry(GetParam(), "tiny");
  ASSERT_TRUE(SynthesizeGguf(o).ok());
  o.geometry.n_mtp_layers = 1;
  o.output = dir.Join("mtp.gguf");
  ASSERT_TRUE(SynthesizeGguf(o).ok());
  const int64_t n_layer = o.geometry.n_layer;
  {
    auto mtp = gguf::GgufModel::Open(dir.Join("mtp.gguf"));
    ASSERT_TRUE(mtp.ok()) << mtp.status();
    EXPECT_EQ(*(*mtp)->metadata().GetUint(GetParam() + ".block_count"), static_cast<uint64_t>(n_layer + 1));
    ASSERT_NE((*mtp)->FindTensor(absl::StrCat("blk.", n_layer, ".ffn_up_exps.weight")), nullptr);
    ASSERT_NE((*mtp)->FindTensor(absl::StrCat("blk.", n_layer, ".nextn.eh_proj.weight")), nullptr);
  }

  auto plain = ConvertGguf(Options(dir.Join("plain.gguf"), dir.Join("plain"), Scheme::kS8), nullptr, nullptr);
  auto mtp = ConvertGguf(Options(dir.Join("mtp.gguf"), dir.Join("mtp"), Scheme::kS8), nullptr, nullptr);
  ASSERT_TRUE(plain.ok()) << plain.status();
  ASSERT_TRUE(mtp.ok()) << mtp.status();
  EXPECT_EQ(mtp->geometry().n_layer(), static_cast<uint32_t>(n_layer));
  EXPECT_EQ(mtp->geometry().SerializeAsString(), plain->geometry().SerializeAsString());
  EXPECT_EQ(mtp->experts_bytes(), plain->experts_bytes());
  EXPECT_EQ(ReadFileBytes(dir.Join("mtp/experts.bin")), ReadFileBytes(dir.Join("plain/experts.bin")));
  EXPECT_EQ(ReadFileBytes(dir.Join("mtp/dense.gguf")), ReadFileBytes(dir.Join("plain/dense.gguf")));
  auto dense = gguf::GgufFile::Open(dir.Join("mtp/dense.gguf"));
  ASSERT_TRUE(dense.ok()) << dense.status();
  EXPECT_FALSE((*dense)->metadata().Has(GetParam() + ".nextn_predict_layers"));
  for (const gguf::TensorInfo& t : (*dense)->tensors()) {
    EXPECT_FALSE(absl::StartsWith(t.name, absl::StrCat("blk.", n_layer, "."))) << t.name;
  }

  auto report = ValidatePack(dir.Join("mtp"), {.quick = true, .threads = 2});
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_TRUE(report->problems.empty()) << report->problems.front().file << ": " << report->problems.front().message;

  const std::vector<int32_t> tokens = {3, 141, 59, 26, 5};
  const std::vector<float> want = testing::EngineLogits(dir.Join("plain"), tokens);
  const std::vector<float> got = testing::EngineLogits(dir.Join("mtp"), tokens);
  ASSERT_FALSE(want.empty());
  EXPECT_EQ(got, want);
}

INSTANTIATE_TEST_SUITE_P(Architectures, ConvertMtpTest, ::testing::Values("glm4moe", "deepseek2"));

// Multi-token-prediction blocks that leave no MoE block to run are refused before any work, naming the keys.
TEST(ConvertTest, RefusesMultiTokenPredictionBlocksThatLeaveNothingToRunNamingTheKeys) {
  ScratchDir dir;
  SynthOptions o = TinyOptions(dir.Join("m.gguf"));
  o.geometry = *PresetGeometry("glm4moe", "tiny");  // 2 blocks, the first dense
  o.geometry.n_mtp_layers = 1;
  ASSERT_TRUE(SynthesizeGguf(o).ok());
  // The same tensors, with nextn_predict_layers claiming the MoE block too, then every block.
  for (const uint32_t nextn : {2u, 3u}) {
    const std::string edited = dir.Join(absl::StrCat("nextn", nextn, ".gguf"));
    {
      auto file = gguf::GgufFile::Open(o.output);
      ASSERT_TRUE(file.ok()) << file.status();
      gguf::GgufWriter w((*file)->alignment());
      for (const auto& [key, value] : (*file)->metadata().entries()) {
        if (key == "general.alignment") continue;
        w.Set(key, key == "glm4moe.nextn_predict_layers" ? gguf::Value::Uint32(nextn) : value);
      }
      for (const gguf::TensorInfo& t : (*file)->tensors()) {
        ASSERT_TRUE(w.AddTensorData(t.name, t.type, t.ne, {t.data, t.bytes}).ok()) << t.name;
      }
      ASSERT_TRUE(w.WriteFile(edited).ok());
    }
    auto converted = ConvertGguf(Options(edited, dir.Join(absl::StrCat("pack", nextn)), Scheme::kS8), nullptr, nullptr);
    EXPECT_THAT(converted.status(),
                StatusIsWith(absl::StatusCode::kInvalidArgument, absl::StrCat("glm4moe.nextn_predict_layers is ", nextn)));
    EXPECT_THAT(std::string(converted.status().message()), ::testing::HasSubstr(edited));
    EXPECT_FALSE(fs::exists(dir.Join(absl::StrCat("pack", nextn))));
  }
}

}  // namespace
}  // namespace strata::packtool
