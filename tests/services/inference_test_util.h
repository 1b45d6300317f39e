#ifndef STRATA_TESTS_SERVICES_INFERENCE_TEST_UTIL_H_
#define STRATA_TESTS_SERVICES_INFERENCE_TEST_UTIL_H_

// Shared fixtures of the inference service tests: a tiny synthesized pack made once per test binary, an
// expert source that slows every read (so that a generation lasts long enough to cancel, time out or fill
// the queue), and a strata.v1.Inference server in this process. Header-only: the test binary compiles
// *_test.cc files only.

#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "engine/runtime/engine.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/server.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/channel_arguments.h"
#include "gtest/gtest.h"
#include "packtool/synth.h"
#include "services/inference_service.h"
#include "services/server_runner.h"
#include "strata/v1/inference.grpc.pb.h"
#include "tests/testing/test_util.h"

namespace strata::services::testing {

// The "tiny" qwen3moe preset with its built-in byte-level vocabulary, as an s4 pack. Made once per binary.
inline const std::string& TinyPack() {
  struct Made {
    strata::testing::ScratchDir dir;
    std::string pack = dir.Join("tiny");
    Made() {
      packtool::SynthOptions o;
      o.geometry = *packtool::PresetGeometry("qwen3moe", "tiny");
      o.seed = 5;
      o.output = pack;
      o.pack_scheme = kernels::Scheme::kS4;
      o.threads = 2;
      auto manifest = packtool::SynthesizePack(o, nullptr, nullptr);
      EXPECT_TRUE(manifest.ok()) << manifest.status();
    }
  };
  static const Made made;  // removed at exit
  return made.pack;
}

// Delays every blob read by `delay`, so that each decode step takes at least that long.
class SlowSource : public pack::ExpertSource {
 public:
  SlowSource(std::unique_ptr<pack::ExpertSource> inner, absl::Duration delay)
      : inner_(std::move(inner)), delay_(delay) {}
  absl::StatusOr<const uint8_t*> Blob(int64_t layer, int64_t expert) override {
    std::this_thread::sleep_for(absl::ToChronoMicroseconds(delay_));
    return inner_->Blob(layer, expert);
  }
  std::string_view kind() const override { return "slow"; }
  uint64_t blob_bytes() const override { return inner_->blob_bytes(); }

 private:
  std::unique_ptr<pack::ExpertSource> inner_;
  absl::Duration delay_;
};

// Engine options for the tiny pack: one compute thread (the test machines are small and shared), a
// 256-position context. `slow`: every expert read sleeps a millisecond.
inline runtime::EngineOptions TinyEngineOptions(int max_seqs = 8, bool slow = false) {
  runtime::EngineOptions o;
  o.pack_dir = TinyPack();
  o.threads = 1;
  o.max_seqs = max_seqs;
  o.max_ctx = 256;
  if (slow) {
    o.source_factory = [](const pack::Pack& p) -> std::unique_ptr<pack::ExpertSource> {
      auto inner = pack::OpenExpertSource(p, {.kind = "arena", .verify = false, .threads = 1}, nullptr);
      EXPECT_TRUE(inner.ok()) << inner.status();
      return inner.ok() ? std::make_unique<SlowSource>(*std::move(inner), absl::Milliseconds(1)) : nullptr;
    };
  }
  return o;
}

// A strata.v1.Inference server in this process, reached through an in-process channel. Without
// `load`, the engine is attached only by Load(), as strata-server does once its pack has loaded.
// `service_options` may name a gate, which must outlive the server.
class InferenceTestServer {
 public:
  explicit InferenceTestServer(runtime::EngineOptions options, bool load = true,
                               InferenceServiceOptions service_options = {})
      : options_(std::move(options)) {
    service_ = std::make_unique<InferenceServiceImpl>(std::move(service_options));
    auto started = StartServer(ServerConfig(), {{service_.get(), v1::Inference::service_full_name()}});
    EXPECT_TRUE(started.ok()) << started.status();
    started_ = *std::move(started);
    SetInferenceServing(started_.server.get(), false);
    channel_ = started_.server->InProcessChannel(grpc::ChannelArguments());
    stub_ = v1::Inference::NewStub(channel_);
    if (load) Load();
  }

  ~InferenceTestServer() {
    started_.server->Shutdown();
    started_.server->Wait();
    started_.server.reset();
    service_.reset();
  }

  void Load() {
    auto engine = runtime::Engine::Create(options_);
    ASSERT_TRUE(engine.ok()) << engine.status();
    service_->AttachEngine(*std::move(engine));
    SetInferenceServing(started_.server.get(), true);
  }

  runtime::Engine& engine() const { return *service_->engine(); }
  InferenceServiceImpl& service() const { return *service_; }
  std::shared_ptr<grpc::Channel> channel() const { return channel_; }
  v1::Inference::Stub& stub() const { return *stub_; }

  // Waits up to `timeout` for the engine to hold no sequence and no KV cache; false if it still does.
  bool WaitUntilIdle(absl::Duration timeout = absl::Seconds(20)) const {
    const absl::Time end = absl::Now() + timeout;
    while (absl::Now() < end) {
      const runtime::EngineStats s = engine().stats();
      if (s.active == 0 && s.queued == 0 && s.kv_bytes_in_use == 0) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return false;
  }

 private:
  runtime::EngineOptions options_;
  std::unique_ptr<InferenceServiceImpl> service_;
  StartedServer started_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Inference::Stub> stub_;
};

// grpc.health.v1.Health/Check for `service`: HealthCheckResponse.status (1 = SERVING, 2 = NOT_SERVING),
// or -1 when the call failed. Both messages are one field, number 1, written here by hand.
inline int HealthStatus(const std::shared_ptr<grpc::Channel>& channel, const std::string& service) {
  std::string request;
  if (!service.empty()) {
    request.push_back(static_cast<char>(0x0a));  // field 1, length-delimited
    request.push_back(static_cast<char>(service.size()));  // < 128 bytes: one-byte varint
    request += service;
  }
  grpc::Slice slice(request);
  grpc::ByteBuffer request_buffer(&slice, 1);
  grpc::ByteBuffer response_buffer;
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  absl::Notification done;
  grpc::Status status;
  stub.UnaryCall(&context, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request_buffer, &response_buffer,
                 [&](grpc::Status s) {
                   status = std::move(s);
                   done.Notify();
                 });
  done.WaitForNotification();
  if (!status.ok()) return -1;
  std::vector<grpc::Slice> slices;
  if (!response_buffer.Dump(&slices).ok()) return -1;
  std::string bytes;
  for (const grpc::Slice& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  // HealthCheckResponse{status = 1}: 0x08 then the enum as a one-byte varint; empty means UNKNOWN (0).
  if (bytes.empty()) return 0;
  return bytes.size() == 2 && bytes[0] == 0x08 ? bytes[1] : -1;
}

}  // namespace strata::services::testing

#endif  // STRATA_TESTS_SERVICES_INFERENCE_TEST_UTIL_H_
