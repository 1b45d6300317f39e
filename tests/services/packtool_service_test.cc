#include "services/packtool_service.h"

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "engine/gguf/gguf_file.h"
#include "gmock/gmock.h"
#include "google/protobuf/unknown_field_set.h"
#include "grpcpp/client_context.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/support/byte_buffer.h"
#include "gtest/gtest.h"
#include "tests/services/service_test_util.h"
#include "tests/testing/wait.h"

namespace strata::services {
namespace {

namespace fs = std::filesystem;
using ::google::protobuf::UnknownFieldSet;
using ::strata::services::testing::CopyTree;
using ::strata::services::testing::Models;
using ::strata::services::testing::TestServer;
using ::strata::testing::ScratchDir;
using ::testing::HasSubstr;
using ::testing::Not;

// A deadline for every call: a server that never answers fails the test as DEADLINE_EXCEEDED instead of
// hanging it.
void SetHangDeadline(grpc::ClientContext* context) {
  context->set_deadline(std::chrono::system_clock::now() + absl::ToChronoSeconds(strata::testing::kHangDeadline));
}

// Every message of a Convert call and its status.
struct ConvertResult {
  std::vector<v1::ConvertProgress> messages;
  grpc::Status status;
};

ConvertResult RunConvert(v1::PackTool::Stub& stub, const v1::ConvertRequest& request) {
  grpc::ClientContext context;
  SetHangDeadline(&context);
  ConvertResult result;
  auto reader = stub.Convert(&context, request);
  v1::ConvertProgress message;
  while (reader->Read(&message)) result.messages.push_back(message);
  result.status = reader->Finish();
  return result;
}

v1::ConvertRequest MakeConvert(const std::string& input, const std::string& output, const std::string& scheme = "s4",
                               uint32_t threads = 0, const std::string& dense_type = "") {
  v1::ConvertRequest request;
  request.set_dense_type(dense_type);
  request.set_input(input);
  request.set_output_dir(output);
  request.set_scheme(scheme);
  request.set_threads(threads);
  return request;
}

grpc::Status RunValidate(v1::PackTool::Stub& stub, const std::string& dir, v1::ValidateReport* report,
                         bool quick = false) {
  grpc::ClientContext context;
  SetHangDeadline(&context);
  v1::ValidateRequest request;
  request.set_pack_dir(dir);
  request.set_quick(quick);
  return stub.Validate(&context, request, report);
}

grpc::Status RunInspect(v1::PackTool::Stub& stub, const std::string& path, v1::InspectReport* report) {
  grpc::ClientContext context;
  SetHangDeadline(&context);
  v1::InspectRequest request;
  request.set_path(path);
  return stub.Inspect(&context, request, report);
}

// A data root with the shared models copied in, and a directory beside it that requests must not reach.
class PackToolServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = scratch_.Join("root");
    outside_ = scratch_.Join("outside");
    fs::create_directories(root_ + "/packs");
    fs::create_directories(outside_);
    fs::copy_file(Models().tiny_gguf, root_ + "/tiny.gguf");
    CopyTree(Models().tiny_pack, root_ + "/tiny-pack");
    CopyTree(Models().tiny_gguf, outside_ + "/tiny.gguf");
    server_ = std::make_unique<TestServer>(root_);
  }

  // Everything under `outside_`, to check that a refused request touched nothing there.
  std::vector<std::string> OutsideListing() const {
    std::vector<std::string> names;
    for (const auto& entry : fs::recursive_directory_iterator(outside_)) names.push_back(entry.path().string());
    std::sort(names.begin(), names.end());
    return names;
  }

  // Puts the big model into the root without copying it (a symlink would point outside the root).
  void LinkBigModel() { fs::create_hard_link(Models().big_gguf, root_ + "/big.gguf"); }

  ScratchDir scratch_;
  std::string root_;
  std::string outside_;
  std::unique_ptr<TestServer> server_;
};

TEST_F(PackToolServiceTest, ConvertStreamsProgressAndEndsWithTheManifest) {
  const ConvertResult result = RunConvert(server_->stub(), MakeConvert("tiny.gguf", "packs/tiny-s4", "s4", 1));
  ASSERT_TRUE(result.status.ok()) << result.status.error_message();
  ASSERT_GE(result.messages.size(), 2u);
  for (size_t i = 0; i + 1 < result.messages.size(); ++i) {
    EXPECT_FALSE(result.messages[i].has_manifest()) << i;
    EXPECT_NE(result.messages[i].phase(), "done");
  }
  EXPECT_EQ(result.messages.front().phase(), "dense");
  const v1::ConvertProgress& last = result.messages.back();
  EXPECT_EQ(last.phase(), "done");
  ASSERT_TRUE(last.has_manifest());
  const pack::v1::Manifest& manifest = last.manifest();
  EXPECT_EQ(manifest.scheme(), "s4");
  EXPECT_EQ(manifest.architecture(), "qwen3moe");
  EXPECT_EQ(manifest.geometry().n_expert(), 8u);
  EXPECT_EQ(last.experts_total(), uint64_t{manifest.geometry().n_moe_layers()} * manifest.geometry().n_expert());
  EXPECT_EQ(last.experts_done(), last.experts_total());
  EXPECT_EQ(last.bytes_done(), manifest.experts_bytes());
  EXPECT_EQ(manifest.quant_error_size(), 3);
  EXPECT_TRUE(fs::is_directory(root_ + "/packs/tiny-s4"));
  EXPECT_FALSE(fs::exists(root_ + "/packs/tiny-s4.partial"));

  v1::ValidateReport report;
  ASSERT_TRUE(RunValidate(server_->stub(), "packs/tiny-s4", &report).ok());
  EXPECT_TRUE(report.ok());
}

TEST_F(PackToolServiceTest, ConvertStoresTheDenseWeightsInTheTypeAsked) {
  const ConvertResult result =
      RunConvert(server_->stub(), MakeConvert("tiny.gguf", "packs/tiny-q8", "s4", 1, "q8_0"));
  ASSERT_TRUE(result.status.ok()) << result.status.error_message();
  ASSERT_FALSE(result.messages.empty());
  const pack::v1::Manifest& manifest = result.messages.back().manifest();
  ASSERT_EQ(manifest.quant_error_size(), 4);
  EXPECT_EQ(manifest.quant_error(3).role(), "dense");
  EXPECT_GT(manifest.quant_error(3).rel_rms(), 0.0);
  auto dense = gguf::GgufFile::Open(root_ + "/packs/tiny-q8/dense.gguf");
  ASSERT_TRUE(dense.ok()) << dense.status();
  const gguf::TensorInfo* wq = (*dense)->FindTensor("blk.0.attn_q.weight");
  ASSERT_NE(wq, nullptr);
  EXPECT_EQ(wq->type, gguf::GgmlType::kQ8_0);
}

TEST_F(PackToolServiceTest, AutoPicksTheSchemeTheSourceExpertsCallFor) {
  const ConvertResult result = RunConvert(server_->stub(), MakeConvert("tiny.gguf", "packs/tiny-auto", "auto", 1));
  ASSERT_TRUE(result.status.ok()) << result.status.error_message();
  ASSERT_FALSE(result.messages.empty());
  EXPECT_EQ(result.messages.back().manifest().scheme(), "s4");  // f16 experts
  // A file that is no model is refused before anything is written, named as the client gave it.
  std::ofstream(root_ + "/junk.gguf") << "not a gguf";
  const ConvertResult junk = RunConvert(server_->stub(), MakeConvert("junk.gguf", "packs/junk", "auto", 1));
  EXPECT_EQ(junk.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << junk.status.error_message();
  EXPECT_THAT(junk.status.error_message(), HasSubstr("junk.gguf"));
  EXPECT_THAT(junk.status.error_message(), Not(HasSubstr(root_)));
  EXPECT_FALSE(fs::exists(root_ + "/packs/junk.partial"));
}

TEST_F(PackToolServiceTest, ValidateGoodPack) {
  v1::ValidateReport report;
  const grpc::Status status = RunValidate(server_->stub(), "tiny-pack", &report);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_TRUE(report.ok());
  EXPECT_EQ(report.problems_size(), 0);
  EXPECT_EQ(report.blobs_checked(), 2u * 8u);
  EXPECT_GT(report.bytes_checked(), 0u);
}

TEST_F(PackToolServiceTest, ValidateAMissingPackNamesTheFieldNotTheRoot) {
  v1::ValidateReport report;
  const grpc::Status status = RunValidate(server_->stub(), "no-such-pack", &report);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(status.error_message(), "pack_dir: 'no-such-pack' does not exist");
}

// What the library says about a resolved path comes back with the path as the client gave it.
TEST_F(PackToolServiceTest, LibraryErrorsNameThePathRelativeToTheRoot) {
  {
    std::ofstream(root_ + "/junk.gguf") << "not a gguf file at all";
  }
  v1::ValidateReport report;
  grpc::Status status = RunValidate(server_->stub(), "junk.gguf", &report);  // a file, not a directory
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("junk.gguf"));
  EXPECT_THAT(status.error_message(), Not(HasSubstr(root_)));

  v1::InspectReport inspect;
  status = RunInspect(server_->stub(), "junk.gguf", &inspect);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("junk.gguf"));
  EXPECT_THAT(status.error_message(), Not(HasSubstr(root_)));
}

TEST_F(PackToolServiceTest, ValidateBadPackListsTheProblem) {
  CopyTree(root_ + "/tiny-pack", root_ + "/bad-pack");
  {
    std::fstream experts(root_ + "/bad-pack/experts.bin", std::ios::in | std::ios::out | std::ios::binary);
    experts.seekp(100);
    experts.put('\x5a');
    experts.put('\xa5');
  }
  v1::ValidateReport report;
  const grpc::Status status = RunValidate(server_->stub(), "bad-pack", &report);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_FALSE(report.ok());
  ASSERT_GE(report.problems_size(), 1);
  EXPECT_EQ(report.problems(0).file(), "experts.bin");

  // --quick skips the checksums and so misses it.
  v1::ValidateReport quick;
  ASSERT_TRUE(RunValidate(server_->stub(), "bad-pack", &quick, /*quick=*/true).ok());
  EXPECT_TRUE(quick.ok());
}

TEST_F(PackToolServiceTest, InspectPackAndGguf) {
  v1::InspectReport pack;
  grpc::Status status = RunInspect(server_->stub(), "tiny-pack", &pack);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(pack.kind(), "pack");
  EXPECT_EQ(pack.architecture(), "qwen3moe");
  EXPECT_EQ(pack.scheme(), "s8");
  EXPECT_EQ(pack.geometry().n_expert(), 8u);
  EXPECT_GT(pack.tensors_size(), 0);
  EXPECT_THAT(pack.text(), HasSubstr("qwen3moe"));

  v1::InspectReport model;
  status = RunInspect(server_->stub(), root_ + "/tiny.gguf", &model);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(model.kind(), "gguf");
  EXPECT_EQ(model.geometry().n_embd(), 128u);
  EXPECT_GT(model.tensors_size(), pack.tensors_size());  // the GGUF has the expert tensors too
}

TEST_F(PackToolServiceTest, PathsOutsideTheRootAreDeniedAndTouchNothing) {
  fs::create_symlink(outside_ + "/tiny.gguf", root_ + "/escape.gguf");
  fs::create_directory_symlink(outside_, root_ + "/out-link");
  const std::vector<std::string> before = OutsideListing();

  struct Case {
    std::string input, output;
  };
  const Case cases[] = {
      {"../outside/tiny.gguf", "packs/a"},   // .. out of the root
      {outside_ + "/tiny.gguf", "packs/b"},  // absolute path outside
      {"escape.gguf", "packs/c"},            // symlink inside pointing outside
      {"tiny.gguf", "../outside/pack"},      // output outside
      {"tiny.gguf", outside_ + "/pack"},     // absolute output outside
      {"tiny.gguf", "out-link/pack"},        // output whose parent is a symlink outside
  };
  for (const Case& c : cases) {
    const ConvertResult result = RunConvert(server_->stub(), MakeConvert(c.input, c.output));
    EXPECT_EQ(result.status.error_code(), grpc::StatusCode::PERMISSION_DENIED) << c.input << " -> " << c.output;
    EXPECT_THAT(result.status.error_message(), HasSubstr("outside the data root"));
    EXPECT_TRUE(result.messages.empty());
  }
  v1::ValidateReport report;
  EXPECT_EQ(RunValidate(server_->stub(), "../outside", &report).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(RunValidate(server_->stub(), "out-link", &report).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  v1::InspectReport inspect;
  EXPECT_EQ(RunInspect(server_->stub(), "escape.gguf", &inspect).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(RunInspect(server_->stub(), "/etc/passwd", &inspect).error_code(), grpc::StatusCode::PERMISSION_DENIED);

  // A dangling .partial symlink pointing outside: the conversion would write through it.
  fs::create_symlink(outside_ + "/planted", root_ + "/packs/d.partial");
  const ConvertResult planted = RunConvert(server_->stub(), MakeConvert("tiny.gguf", "packs/d"));
  EXPECT_EQ(planted.status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);

  EXPECT_EQ(OutsideListing(), before);
  EXPECT_FALSE(fs::exists(root_ + "/packs/a"));
  EXPECT_FALSE(fs::exists(root_ + "/packs/c.partial"));
}

TEST_F(PackToolServiceTest, BadArgumentsNameTheField) {
  struct Case {
    v1::ConvertRequest request;
    grpc::StatusCode code;
    std::string field;
  };
  fs::create_directories(root_ + "/packs/existing");
  fs::create_directories(root_ + "/packs/stale.partial");
  const Case cases[] = {
      {MakeConvert("", "packs/x"), grpc::StatusCode::INVALID_ARGUMENT, "input"},
      {MakeConvert("tiny.gguf", ""), grpc::StatusCode::INVALID_ARGUMENT, "output_dir"},
      {MakeConvert("tiny.gguf", "packs/x", "s3"), grpc::StatusCode::INVALID_ARGUMENT, "scheme"},
      {MakeConvert("tiny.gguf", "packs/x", ""), grpc::StatusCode::INVALID_ARGUMENT, "scheme"},
      {MakeConvert("tiny.gguf", "packs/x", "s4", 100000), grpc::StatusCode::INVALID_ARGUMENT, "threads"},
      {MakeConvert("tiny.gguf", "packs/x", "s4", 0, "q4_0"), grpc::StatusCode::INVALID_ARGUMENT, "dense_type: unknown 'q4_0'"},
      {MakeConvert("missing.gguf", "packs/x"), grpc::StatusCode::NOT_FOUND, "input"},
      {MakeConvert("tiny.gguf", "packs/existing"), grpc::StatusCode::ALREADY_EXISTS, "output_dir"},
      {MakeConvert("tiny.gguf", "tiny-pack"), grpc::StatusCode::ALREADY_EXISTS, "output_dir"},
      {MakeConvert("tiny.gguf", "packs/stale"), grpc::StatusCode::FAILED_PRECONDITION, ".partial"},
      {MakeConvert("tiny.gguf", "."), grpc::StatusCode::INVALID_ARGUMENT, "output_dir"},
  };
  for (const Case& c : cases) {
    const ConvertResult result = RunConvert(server_->stub(), c.request);
    EXPECT_EQ(result.status.error_code(), c.code) << c.request.ShortDebugString();
    EXPECT_THAT(result.status.error_message(), HasSubstr(c.field)) << c.request.ShortDebugString();
  }
  EXPECT_FALSE(fs::exists(root_ + "/packs/x"));
  EXPECT_FALSE(fs::exists(root_ + "/packs/x.partial"));
  EXPECT_TRUE(fs::is_empty(root_ + "/packs/existing"));

  v1::ValidateReport report;
  grpc::Status status = RunValidate(server_->stub(), "", &report);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("pack_dir"));
  v1::InspectReport inspect;
  status = RunInspect(server_->stub(), "", &inspect);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("path"));
  status = RunInspect(server_->stub(), "nothing-here", &inspect);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
}

// Polls until a Convert to `output` is no longer refused as in flight, i.e. the previous conversion to it
// has ended on the server; false if it is still in flight at the hang deadline.
bool WaitUntilOutputReleased(v1::PackTool::Stub& stub, const std::string& output) {
  return strata::testing::WaitUntil([&] {
    // A missing input: refused as NOT_FOUND once the claim is free, without starting anything.
    const ConvertResult probe = RunConvert(stub, MakeConvert("missing.gguf", output));
    return probe.status.error_code() != grpc::StatusCode::ABORTED;
  });
}

TEST_F(PackToolServiceTest, CancelStopsTheConversionAndLeavesNothing) {
  LinkBigModel();
  grpc::ClientContext context;
  SetHangDeadline(&context);
  auto reader = server_->stub().Convert(&context, MakeConvert("big.gguf", "packs/big", "s2", 1));
  // Cancel once the experts are being converted, so that the per-expert check is what stops it.
  v1::ConvertProgress progress;
  do {
    ASSERT_TRUE(reader->Read(&progress));
    EXPECT_FALSE(progress.has_manifest());
  } while (progress.phase() != "experts");
  context.TryCancel();
  v1::ConvertProgress rest;
  while (reader->Read(&rest)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);

  // No bound on how long stopping takes (that is the library's per-expert check, which convert_test pins
  // down); what this test shows is that the server's conversion ended without finishing: a conversion
  // that ignored the cancel would run to its end and leave packs/big.
  ASSERT_TRUE(WaitUntilOutputReleased(server_->stub(), "packs/big")) << "the conversion never ended";
  EXPECT_FALSE(fs::exists(root_ + "/packs/big"));
  EXPECT_FALSE(fs::exists(root_ + "/packs/big.partial"));
}

TEST_F(PackToolServiceTest, SecondConvertToTheSameOutputIsAborted) {
  LinkBigModel();
  grpc::ClientContext context;
  SetHangDeadline(&context);
  auto reader = server_->stub().Convert(&context, MakeConvert("big.gguf", "packs/big", "s2", 1));
  v1::ConvertProgress first;
  ASSERT_TRUE(reader->Read(&first));  // the first conversion is running

  const ConvertResult second = RunConvert(server_->stub(), MakeConvert("tiny.gguf", "packs/big"));
  EXPECT_EQ(second.status.error_code(), grpc::StatusCode::ABORTED);
  EXPECT_THAT(second.status.error_message(), HasSubstr("output_dir"));
  // Another output is not affected.
  const ConvertResult other = RunConvert(server_->stub(), MakeConvert("tiny.gguf", "packs/other", "s8"));
  EXPECT_TRUE(other.status.ok()) << other.status.error_message();

  context.TryCancel();
  v1::ConvertProgress rest;
  while (reader->Read(&rest)) {
  }
  reader->Finish();
  ASSERT_TRUE(WaitUntilOutputReleased(server_->stub(), "packs/big")) << "the conversion never ended";
  EXPECT_FALSE(fs::exists(root_ + "/packs/big.partial"));
}

TEST_F(PackToolServiceTest, ConcurrentValidatesAllSucceed) {
  std::vector<std::thread> threads;
  std::vector<int> ok(4, 0);
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] {
      v1::ValidateReport report;
      const grpc::Status status = RunValidate(server_->stub(), "tiny-pack", &report);
      ok[i] = status.ok() && report.ok() && report.blobs_checked() == 16;
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(ok, std::vector<int>(4, 1));
}

// Raw protobuf wire bytes <-> grpc::ByteBuffer, for services whose generated code is not installed.
grpc::ByteBuffer ToBuffer(const std::string& bytes) {
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

std::string FromBuffer(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(buffer.Dump(&slices).ok());
  std::string bytes;
  for (const grpc::Slice& slice : slices) bytes.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  return bytes;
}

// Sends one message on `method` and reads one back (works for unary and streaming methods alike).
class OneExchange final : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  OneExchange(grpc::GenericStub* stub, const std::string& method, const std::string& request)
      : request_(ToBuffer(request)) {
    SetHangDeadline(&context_);  // OnDone comes by then at the latest
    stub->PrepareBidiStreamingCall(&context_, method, grpc::StubOptions(), this);
    StartWriteLast(&request_, grpc::WriteOptions());
    StartRead(&response_);
    StartCall();
  }
  void OnReadDone(bool ok) override { got_response_ = ok; }
  void OnDone(const grpc::Status& status) override {
    status_ = status;
    done_.Notify();
  }
  // The response's bytes, or empty with the status.
  std::string Wait(grpc::Status* status) {
    done_.WaitForNotification();
    *status = status_;
    return got_response_ ? FromBuffer(response_) : std::string();
  }

 private:
  grpc::ClientContext context_;
  grpc::ByteBuffer request_;
  grpc::ByteBuffer response_;
  bool got_response_ = false;
  grpc::Status status_;
  absl::Notification done_;
};

// grpc.health.v1.HealthCheckResponse.status for `service` (field 1 of the request and the response).
int HealthStatus(std::shared_ptr<grpc::Channel> channel, const std::string& service, grpc::Status* status) {
  grpc::GenericStub stub(std::move(channel));
  UnknownFieldSet request;
  if (!service.empty()) request.AddLengthDelimited(1, service);
  std::string bytes;
  request.SerializeToString(&bytes);
  OneExchange call(&stub, "/grpc.health.v1.Health/Check", bytes);
  UnknownFieldSet response;
  EXPECT_TRUE(response.ParseFromString(call.Wait(status)));
  for (int i = 0; i < response.field_count(); ++i) {
    if (response.field(i).number() == 1) return static_cast<int>(response.field(i).varint());
  }
  return 0;  // UNKNOWN, the proto3 default
}

TEST_F(PackToolServiceTest, HealthReportsServing) {
  constexpr int kServing = 1;
  grpc::Status status;
  EXPECT_EQ(HealthStatus(server_->channel(), "", &status), kServing);
  EXPECT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(HealthStatus(server_->channel(), "strata.v1.PackTool", &status), kServing);
  EXPECT_TRUE(status.ok()) << status.error_message();
  HealthStatus(server_->channel(), "no.such.Service", &status);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(PackToolServiceTest, ReflectionListsThePackToolService) {
  grpc::GenericStub stub(server_->channel());
  // ServerReflectionRequest{list_services: ""} (field 7).
  UnknownFieldSet request;
  request.AddLengthDelimited(7, "");
  std::string bytes;
  request.SerializeToString(&bytes);
  OneExchange call(&stub, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", bytes);
  grpc::Status status;
  UnknownFieldSet response;
  ASSERT_TRUE(response.ParseFromString(call.Wait(&status)));
  ASSERT_TRUE(status.ok()) << status.error_message();
  // ServerReflectionResponse.list_services_response (6) -> repeated ServiceResponse service (1) -> name (1).
  std::vector<std::string> names;
  for (int i = 0; i < response.field_count(); ++i) {
    if (response.field(i).number() != 6) continue;
    UnknownFieldSet list;
    ASSERT_TRUE(list.ParseFromString(response.field(i).length_delimited()));
    for (int j = 0; j < list.field_count(); ++j) {
      UnknownFieldSet service;
      ASSERT_TRUE(service.ParseFromString(list.field(j).length_delimited()));
      for (int k = 0; k < service.field_count(); ++k) names.push_back(service.field(k).length_delimited());
    }
  }
  EXPECT_THAT(names, ::testing::Contains("strata.v1.PackTool"));
}

TEST(PackToolServiceCreateTest, RefusesAMissingDataRoot) {
  PackToolServiceOptions options;
  options.data_root = "/nonexistent/strata/root";
  EXPECT_FALSE(PackToolServiceImpl::Create(options).ok());
  options.data_root = "";
  EXPECT_EQ(PackToolServiceImpl::Create(options).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace strata::services
