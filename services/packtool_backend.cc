#include "services/packtool_backend.h"

#include <chrono>
#include <optional>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/status_macros.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"
#include "kernels/format/scheme.h"
#include "packtool/convert.h"
#include "packtool/inspect.h"
#include "packtool/source_scheme.h"
#include "packtool/validate.h"
#include "services/cancel_watcher.h"
#include "services/grpc_status.h"
#include "services/packtool_protos.h"
#include "strata/v1/packtool.grpc.pb.h"

namespace strata::services {
namespace {

constexpr int kMaxMessageBytes = 256 << 20;
constexpr std::chrono::seconds kInspectDeadline{60};

class LocalBackend final : public PackToolBackend {
 public:
  absl::StatusOr<v1::ConvertProgress> Convert(const v1::ConvertRequest& request, const ProgressFn& progress,
                                              const std::atomic<bool>* cancel) override {
    absl::StatusOr<std::optional<kernels::Scheme>> choice = packtool::ParseSchemeChoice(request.scheme(), "scheme");
    if (!choice.ok()) return choice.status();
    absl::StatusOr<kernels::Scheme> scheme =
        choice->has_value() ? **choice : packtool::DefaultSchemeForModel(request.input());
    if (!scheme.ok()) return scheme.status();
    absl::StatusOr<packtool::DenseTarget> dense_type = packtool::ParseDenseTarget(
        request.dense_type().empty() ? "keep" : request.dense_type(), "dense_type");
    if (!dense_type.ok()) return dense_type.status();
    packtool::ConvertOptions options;
    options.input = request.input();
    options.output_dir = request.output_dir();
    options.scheme = *scheme;
    options.threads = static_cast<int>(request.threads());
    options.dense_type = *dense_type;
    options.tokenizer_gguf = request.tokenizer_gguf();
    packtool::ConvertProgress last;
    bool have_last = false;
    absl::StatusOr<pack::v1::Manifest> manifest = packtool::ConvertGguf(
        options,
        [&](const packtool::ConvertProgress& p) {
          last = p;
          have_last = true;
          if (p.phase != "done" && progress) progress(ProgressToProto(p));
        },
        cancel);
    if (!manifest.ok()) return manifest.status();
    return FinalProgress(have_last ? &last : nullptr, *manifest);
  }

  absl::StatusOr<v1::ValidateReport> Validate(const v1::ValidateRequest& request,
                                              const std::atomic<bool>* cancel) override {
    packtool::ValidateOptions options;
    options.quick = request.quick();
    options.threads = static_cast<int>(request.threads());
    options.cancel = cancel;
    absl::StatusOr<packtool::ValidationReport> report = packtool::ValidatePack(request.pack_dir(), options);
    if (!report.ok()) return report.status();
    return ValidationReportToProto(*report);
  }

  absl::StatusOr<v1::InspectReport> Inspect(const v1::InspectRequest& request,
                                            const std::atomic<bool>* /*cancel: headers only, quick*/) override {
    absl::StatusOr<packtool::Inspection> inspection = packtool::Inspect(request.path());
    if (!inspection.ok()) return inspection.status();
    return InspectionToProto(*inspection);
  }
};

class RemoteBackend final : public PackToolBackend {
 public:
  RemoteBackend(std::shared_ptr<grpc::Channel> channel, std::string address)
      : channel_(std::move(channel)), stub_(v1::PackTool::NewStub(channel_)), address_(std::move(address)) {}

  absl::StatusOr<v1::ConvertProgress> Convert(const v1::ConvertRequest& request, const ProgressFn& progress,
                                              const std::atomic<bool>* cancel) override {
    grpc::ClientContext context;
    std::unique_ptr<grpc::ClientReader<v1::ConvertProgress>> reader = stub_->Convert(&context, request);
    CancelWatcher watcher(cancel, &context);  // Read() blocks
    v1::ConvertProgress message;
    v1::ConvertProgress final_message;
    bool have_final = false;
    while (reader->Read(&message)) {
      if (message.has_manifest()) {
        final_message = std::move(message);
        have_final = true;
      } else if (progress) {
        progress(message);
      }
    }
    const grpc::Status status = reader->Finish();
    if (!status.ok()) return Annotate(status);
    if (!have_final) {
      return absl::InternalError(absl::StrCat("strata-packd at ", address_, " ended Convert without a manifest"));
    }
    return final_message;
  }

  absl::StatusOr<v1::ValidateReport> Validate(const v1::ValidateRequest& request,
                                              const std::atomic<bool>* cancel) override {
    grpc::ClientContext context;
    v1::ValidateReport report;
    grpc::Status status;
    {
      CancelWatcher watcher(cancel, &context);  // the server stops checksumming when the call is cancelled
      status = stub_->Validate(&context, request, &report);
    }
    if (!status.ok()) return Annotate(status);
    return report;
  }

  absl::StatusOr<v1::InspectReport> Inspect(const v1::InspectRequest& request,
                                            const std::atomic<bool>* cancel) override {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + kInspectDeadline);
    v1::InspectReport report;
    grpc::Status status;
    {
      CancelWatcher watcher(cancel, &context);
      status = stub_->Inspect(&context, request, &report);
    }
    if (!status.ok()) return Annotate(status);
    return report;
  }

 private:
  // The server's messages name the field; an unreachable server is named here, and a server of another
  // kind (a strata-server) by FromGrpcStatusAt.
  absl::Status Annotate(const grpc::Status& status) const {
    absl::Status converted = FromGrpcStatusAt(status, channel_, address_, v1::PackTool::service_full_name());
    if (converted.code() == absl::StatusCode::kUnimplemented) return converted;
    if (converted.code() == absl::StatusCode::kUnavailable || converted.code() == absl::StatusCode::kDeadlineExceeded) {
      return WithContext(converted, absl::StrCat("strata-packd at ", address_));
    }
    return converted;
  }

  const std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::PackTool::Stub> stub_;
  const std::string address_;
};

}  // namespace

std::unique_ptr<PackToolBackend> NewLocalBackend() { return std::make_unique<LocalBackend>(); }

std::unique_ptr<PackToolBackend> NewRemoteBackend(std::shared_ptr<grpc::Channel> channel, std::string address) {
  return std::make_unique<RemoteBackend>(std::move(channel), std::move(address));
}

std::shared_ptr<grpc::Channel> NewPackToolChannel(const std::string& address) {
  grpc::ChannelArguments arguments;
  arguments.SetMaxReceiveMessageSize(kMaxMessageBytes);
  arguments.SetMaxSendMessageSize(kMaxMessageBytes);
  return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), arguments);
}

}  // namespace strata::services
