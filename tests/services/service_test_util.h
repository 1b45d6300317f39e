#ifndef STRATA_TESTS_SERVICES_SERVICE_TEST_UTIL_H_
#define STRATA_TESTS_SERVICES_SERVICE_TEST_UTIL_H_

// Shared fixtures of the services tests: synthetic models made once per binary, and a PackTool server
// started in this process. Header-only: the test binary compiles *_test.cc files only.

#include <filesystem>
#include <memory>
#include <string>

#include "grpcpp/server.h"
#include "grpcpp/support/channel_arguments.h"
#include "gtest/gtest.h"
#include "packtool/convert.h"
#include "packtool/synth.h"
#include "services/packtool_service.h"
#include "services/server_runner.h"
#include "strata/v1/packtool.grpc.pb.h"
#include "tests/testing/test_util.h"

namespace strata::services::testing {

// A tiny model (the "tiny" preset) for round trips, its s8 pack, and a larger F32 model whose s2 conversion
// with one thread takes long enough to cancel or race. Made once per test binary; tests only read them.
struct SharedModels {
  strata::testing::ScratchDir dir;
  std::string tiny_gguf;  // dir/tiny.gguf
  std::string tiny_pack;  // dir/tiny-pack
  std::string big_gguf;   // dir/big.gguf

  SharedModels() {
    tiny_gguf = dir.Join("tiny.gguf");
    tiny_pack = dir.Join("tiny-pack");
    big_gguf = dir.Join("big.gguf");
    packtool::SynthOptions tiny;
    tiny.geometry = *packtool::PresetGeometry("qwen3moe", "tiny");
    tiny.expert_type = gguf::GgmlType::kF16;
    tiny.seed = 3;
    tiny.output = tiny_gguf;
    tiny.threads = 2;
    absl::Status status = packtool::SynthesizeGguf(tiny);
    EXPECT_TRUE(status.ok()) << status;

    packtool::ConvertOptions convert;
    convert.input = tiny_gguf;
    convert.output_dir = tiny_pack;
    convert.scheme = kernels::Scheme::kS8;
    convert.threads = 2;
    absl::StatusOr<pack::v1::Manifest> manifest = packtool::ConvertGguf(convert, nullptr, nullptr);
    EXPECT_TRUE(manifest.ok()) << manifest.status();

    packtool::SynthOptions big = tiny;
    // s2 quantizes one of these experts in tens of milliseconds on one thread: the conversion runs for
    // about a second, and a cancel is seen within one expert.
    big.geometry.n_layer = 2;
    big.geometry.n_expert = 16;
    big.geometry.n_embd = 256;
    big.geometry.expert_ff = 256;
    big.expert_type = gguf::GgmlType::kF32;
    big.output = big_gguf;
    status = packtool::SynthesizeGguf(big);
    EXPECT_TRUE(status.ok()) << status;
  }
};

inline const SharedModels& Models() {
  static const SharedModels models;  // removed at exit
  return models;
}

// Copies a file or directory tree.
inline void CopyTree(const std::string& from, const std::string& to) {
  std::filesystem::copy(from, to, std::filesystem::copy_options::recursive);
}

// A PackTool server on `data_root`, in this process; `listen` empty: in-process channel only. `metrics`, when
// set, counts its conversions and validations (and must outlive the server).
class TestServer {
 public:
  explicit TestServer(const std::string& data_root, const std::string& listen = "", int default_threads = 2,
                      PackToolMetrics* metrics = nullptr) {
    PackToolServiceOptions options;
    options.data_root = data_root;
    options.default_threads = default_threads;
    options.metrics = metrics;
    auto service = PackToolServiceImpl::Create(options);
    EXPECT_TRUE(service.ok()) << service.status();
    service_ = *std::move(service);
    ServerConfig config;
    config.listen_address = listen;
    auto started = StartServer(config, {{service_.get(), v1::PackTool::service_full_name()}});
    EXPECT_TRUE(started.ok()) << started.status();
    started_ = *std::move(started);
    channel_ = started_.server->InProcessChannel(grpc::ChannelArguments());
    stub_ = v1::PackTool::NewStub(channel_);
  }

  ~TestServer() {
    started_.server->Shutdown();
    started_.server->Wait();
    started_.server.reset();
    service_.reset();
  }

  std::shared_ptr<grpc::Channel> channel() const { return channel_; }
  v1::PackTool::Stub& stub() const { return *stub_; }
  int port() const { return started_.port; }

 private:
  std::unique_ptr<PackToolServiceImpl> service_;
  StartedServer started_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::PackTool::Stub> stub_;
};

}  // namespace strata::services::testing

#endif  // STRATA_TESTS_SERVICES_SERVICE_TEST_UTIL_H_
