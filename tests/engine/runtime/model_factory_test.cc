#include "engine/runtime/model_factory.h"

#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "engine/model/model_config.h"
#include "engine/pack/pack.h"
#include "engine/pack/routing_profile.h"
#include "engine/runtime/engine.h"
#include "gtest/gtest.h"
#include "packtool/synth.h"
#include "tests/testing/test_util.h"

namespace strata::runtime {
namespace {

using ::strata::testing::ScratchDir;

std::string TinyPack(const ScratchDir& dir, const std::string& arch = "qwen3moe") {
  packtool::SynthOptions o;
  o.geometry = *packtool::PresetGeometry(arch, "tiny");
  o.pack_scheme = kernels::Scheme::kS4;
  o.exact_quantize = false;
  o.output = dir.Join("pack");
  EXPECT_TRUE(packtool::SynthesizePack(o, nullptr, nullptr).ok());
  return o.output;
}

EngineOptions Options(const std::string& pack, const std::string& device) {
  EngineOptions o;
  o.pack_dir = pack;
  o.threads = 1;
  o.max_seqs = 1;
  o.max_ctx = 64;
  o.device.device = device;
  return o;
}

TEST(ModelFactoryTest, CpuIsAlwaysAvailable) {
  ScratchDir dir;
  auto engine = Engine::Create(Options(TinyPack(dir), "cpu"));
  ASSERT_TRUE(engine.ok()) << engine.status();
  EXPECT_EQ((*engine)->info().backend.device, "cpu");
  EXPECT_FALSE((*engine)->info().backend.isa.empty());
  EXPECT_EQ((*engine)->info().source_kind, "arena");
}

TEST(ModelFactoryTest, AnUnknownDeviceIsRefusedByName) {
  ScratchDir dir;
  auto engine = Engine::Create(Options(TinyPack(dir), "tpu"));
  EXPECT_THAT(engine.status(), StatusIsWith(absl::StatusCode::kInvalidArgument, "device: 'tpu'"));
}

TEST(ModelFactoryTest, BadDeviceOptionsAreRefusedByFieldBeforeThePackIsRead) {
  DeviceOptions ok;
  EXPECT_TRUE(CheckDeviceOptions(ok).ok());
  DeviceOptions o = ok;
  o.vram_gib = -1;
  EXPECT_THAT(CheckDeviceOptions(o), StatusIsWith(absl::StatusCode::kInvalidArgument, "vram_gib"));
  o.vram_gib = std::nan("");
  EXPECT_THAT(CheckDeviceOptions(o), StatusIsWith(absl::StatusCode::kInvalidArgument, "vram_gib"));
  o = ok;
  o.vram_experts = -2;
  EXPECT_THAT(CheckDeviceOptions(o), StatusIsWith(absl::StatusCode::kInvalidArgument, "vram_experts"));
  o = ok;
  o.cache_policy = "fifo";
  EXPECT_THAT(CheckDeviceOptions(o), StatusIsWith(absl::StatusCode::kInvalidArgument, "cache_policy: 'fifo'"));
  o = ok;
  o.miss_path = "disk";
  EXPECT_THAT(CheckDeviceOptions(o),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "miss_path: 'disk' is not a miss path (gpu, cpu or both)"));
  o = ok;
  o.prompt_math = "split-tf32";
  EXPECT_TRUE(CheckDeviceOptions(o).ok());
  o.prompt_math = "tf32";
  EXPECT_THAT(CheckDeviceOptions(o),
              StatusIsWith(absl::StatusCode::kInvalidArgument,
                           "prompt_math: 'tf32' is not a prompt math (fp32 or split-tf32)"));
  // The engine refuses them before it opens the pack: a missing pack is not what gets reported.
  EngineOptions e = Options("/nonexistent/pack", "cpu");
  e.device.cache_policy = "fifo";
  EXPECT_THAT(Engine::Create(e).status(), StatusIsWith(absl::StatusCode::kInvalidArgument, "cache_policy"));
}

TEST(ModelFactoryTest, ExpertCacheOptionsCarryThePacksRoutingProfileScaledToTheDecayWindow) {
  ScratchDir dir;
  const std::string pack_dir = TinyPack(dir);
  DeviceOptions device;
  device.cache_policy = "static";
  {
    auto pack = pack::Pack::Open(pack_dir);
    ASSERT_TRUE(pack.ok()) << pack.status();
    auto options = ExpertCacheOptions(**pack, device, 3);
    ASSERT_TRUE(options.ok()) << options.status();
    EXPECT_EQ(options->slots, 3);
    EXPECT_EQ(options->policy, model::CachePolicy::kStatic);
    EXPECT_TRUE(options->warm_counts.empty());
  }
  auto manifest = pack::ReadManifest(pack_dir);
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  // 512 tokens, top-2 of 8 experts: layer 0 picks experts 5 and 2, layer 1 mostly 7 and 1.
  pack::RoutingProfile profile = pack::EmptyRoutingProfile(*manifest);
  profile.tokens = 512;
  profile.counts = {0, 0, 512, 0, 0, 512, 0, 0, /* layer 1 */ 0, 500, 12, 0, 0, 0, 0, 512};
  ASSERT_THAT(pack::WriteRoutingProfile(profile, *manifest, pack_dir), IsOk());
  auto pack = pack::Pack::Open(pack_dir);
  ASSERT_TRUE(pack.ok()) << pack.status();
  auto options = ExpertCacheOptions(**pack, device, 3);
  ASSERT_TRUE(options.ok()) << options.status();
  ASSERT_EQ(options->warm_counts.size(), 16u);
  // Picks per decay window (256 tokens): half the counts.
  EXPECT_DOUBLE_EQ(options->warm_counts[2], 256.0);
  EXPECT_DOUBLE_EQ(options->warm_counts[9], 250.0);
  EXPECT_DOUBLE_EQ(options->warm_counts[10], 6.0);
  EXPECT_DOUBLE_EQ(options->warm_counts[0], 0.0);
  // The cache starts with the hottest experts, ties to the lower blob.
  model::ExpertCachePolicy policy(*options, 2, 8);
  auto warm = policy.WarmStart(options->warm_counts);
  ASSERT_TRUE(warm.ok()) << warm.status();
  EXPECT_EQ(*warm, (std::vector<uint64_t>{2, 5, 15}));

  device.cache_policy = "fifo";
  EXPECT_THAT(ExpertCacheOptions(**pack, device, 3).status(),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "cache_policy: 'fifo'"));
}

// Without a usable device (this build has no CUDA, or no GPU is visible) --device cuda is refused and auto
// falls back to the CPU; with one, both run on it.
TEST(ModelFactoryTest, CudaRunsWhereADeviceIsVisibleAndIsRefusedElsewhere) {
  ScratchDir dir;
  const std::string pack = TinyPack(dir);
  std::string why;
  const bool available = CudaDeviceAvailable(&why);
  EXPECT_FALSE(why.empty());
  auto cuda = Engine::Create(Options(pack, "cuda"));
  auto automatic = Engine::Create(Options(pack, "auto"));
  ASSERT_TRUE(automatic.ok()) << automatic.status();
  if (available) {
    ASSERT_TRUE(cuda.ok()) << cuda.status();
    EXPECT_EQ((*cuda)->info().backend.device, "cuda");
    EXPECT_EQ((*automatic)->info().backend.device, "cuda");
  } else {
    EXPECT_THAT(cuda.status(), StatusIsWith(absl::StatusCode::kUnavailable, "device: cuda was asked for, but"));
    EXPECT_EQ((*automatic)->info().backend.device, "cpu");
  }
}

// The CUDA backend has every block of every architecture (deepseek2's grouped router and latent attention the
// last to land): the factory's check passes each on both devices. It is the check LoadModel runs before building
// the CUDA backend, so it is tested here without a GPU; the refusal that names a missing block is
// CheckBackendBlocks' (model_config_test).
TEST(ModelFactoryTest, EveryArchitectureHasItsBlocksOnBothBackends) {
  for (const std::string arch : {"qwen2moe", "olmoe", "glm4moe", "gpt-oss", "deepseek2", "qwen3moe", "mixtral"}) {
    ScratchDir dir;
    auto pack = pack::Pack::Open(TinyPack(dir, arch));
    ASSERT_TRUE(pack.ok()) << pack.status();
    auto model = model::Model::Create(**pack);
    ASSERT_TRUE(model.ok()) << model.status();
    EXPECT_TRUE(CheckDeviceBlocks((*model)->config(), "cpu").ok()) << arch;
    const absl::Status cuda = CheckDeviceBlocks((*model)->config(), "cuda");
    EXPECT_TRUE(cuda.ok()) << arch << ": " << cuda;
    // --device auto runs it on the GPU when one is visible.
    auto automatic = Engine::Create(Options((*pack)->dir(), "auto"));
    ASSERT_TRUE(automatic.ok()) << automatic.status();
    std::string why;
    EXPECT_EQ((*automatic)->info().backend.device, CudaDeviceAvailable(&why) ? "cuda" : "cpu") << arch;
  }
}

}  // namespace
}  // namespace strata::runtime
