#include "services/packtool_metrics.h"

#include <chrono>
#include <fstream>
#include <string>

#include "grpcpp/client_context.h"
#include "gtest/gtest.h"
#include "tests/services/metrics_test_util.h"
#include "tests/services/service_test_util.h"

namespace strata::services {
namespace {

using ::strata::services::testing::CopyTree;
using ::strata::services::testing::Models;
using ::strata::services::testing::ParsePrometheusText;
using ::strata::services::testing::TestServer;

grpc::Status Validate(v1::PackTool::Stub& stub, const std::string& dir) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  v1::ValidateRequest request;
  request.set_pack_dir(dir);
  v1::ValidateReport report;
  return stub.Validate(&context, request, &report);
}

grpc::Status Convert(v1::PackTool::Stub& stub, const std::string& input, const std::string& output,
                     const std::string& scheme) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  v1::ConvertRequest request;
  request.set_input(input);
  request.set_output_dir(output);
  request.set_scheme(scheme);
  request.set_threads(1);
  auto reader = stub.Convert(&context, request);
  v1::ConvertProgress progress;
  while (reader->Read(&progress)) {
  }
  return reader->Finish();
}

TEST(PackToolMetricsTest, ConversionsAndValidationsAreCountedByOutcome) {
  strata::testing::ScratchDir root;
  CopyTree(Models().tiny_gguf, root.Join("tiny.gguf"));
  CopyTree(Models().tiny_pack, root.Join("good"));
  CopyTree(Models().tiny_pack, root.Join("bad"));
  {
    std::fstream experts(root.Join("bad/experts.bin"), std::ios::in | std::ios::out | std::ios::binary);
    experts.seekp(100);
    experts.put('\x5a');
    experts.put('\xa5');
  }
  MetricsRegistry registry;
  PackToolMetrics metrics(&registry);
  TestServer server(root.path(), "", 2, &metrics);

  EXPECT_TRUE(Validate(server.stub(), "good").ok());
  EXPECT_TRUE(Validate(server.stub(), "bad").ok());  // it ran, and found a problem
  EXPECT_EQ(Validate(server.stub(), "missing").error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_TRUE(Convert(server.stub(), "tiny.gguf", "out", "s4").ok());
  EXPECT_EQ(Convert(server.stub(), "tiny.gguf", "out2", "s7").error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Convert(server.stub(), "tiny.gguf", "out", "s4").error_code(), grpc::StatusCode::ALREADY_EXISTS);

  auto parsed = ParsePrometheusText(registry.Render());
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->ValueOr0("strata_packtool_validations_total{outcome=\"valid\"}"), 1);
  EXPECT_EQ(parsed->ValueOr0("strata_packtool_validations_total{outcome=\"invalid\"}"), 1);
  EXPECT_EQ(parsed->ValueOr0("strata_packtool_validations_total{outcome=\"not_found\"}"), 1);
  EXPECT_EQ(parsed->ValueOr0("strata_packtool_conversions_total{outcome=\"ok\"}"), 1);
  EXPECT_EQ(parsed->ValueOr0("strata_packtool_conversions_total{outcome=\"invalid_argument\"}"), 1);
  EXPECT_EQ(parsed->ValueOr0("strata_packtool_conversions_total{outcome=\"already_exists\"}"), 1);
}

}  // namespace
}  // namespace strata::services
