#include "services/packtool_service.h"

#include <atomic>
#include <filesystem>
#include <optional>
#include <system_error>
#include <thread>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/status_macros.h"
#include "kernels/format/scheme.h"
#include "packtool/convert.h"
#include "packtool/inspect.h"
#include "packtool/pack_writer.h"
#include "packtool/source_scheme.h"
#include "packtool/validate.h"
#include "services/grpc_status.h"
#include "services/packtool_protos.h"
#include "spdlog/spdlog.h"

namespace strata::services {
namespace {

namespace fs = std::filesystem;

bool PathExists(const std::string& path) {
  std::error_code ec;
  return fs::exists(fs::symlink_status(path, ec));
}

// Ends a Convert call that was refused before any work started.
class RefusedConvert final : public grpc::ServerWriteReactor<v1::ConvertProgress> {
 public:
  RefusedConvert(const absl::Status& status, PackToolMetrics* metrics) {
    if (metrics != nullptr) metrics->CountConversion(status);
    Finish(ToGrpcStatus(status));
  }
  void OnDone() override { delete this; }
};

}  // namespace

// One Validate call: the validation runs on its own (detached) thread, since checksumming a large pack
// takes a while, and stops early when the client cancels or its deadline passes. Finish is the last thing
// that thread does with the reactor, which deletes itself in OnDone.
class ValidateReactor final : public grpc::ServerUnaryReactor {
 public:
  ValidateReactor(PackToolServiceImpl* service, std::string dir, packtool::ValidateOptions options,
                  v1::ValidateReport* report, CallGate::Ticket ticket)
      : service_(service), dir_(std::move(dir)), options_(std::move(options)), report_(report),
        ticket_(std::move(ticket)) {
    options_.cancel = &cancel_;
    service_->JobStarted();
    std::thread([this] { Run(); }).detach();
  }

  void OnCancel() override { cancel_.store(true); }
  void OnDone() override { delete this; }

 private:
  void Run() {
    absl::StatusOr<packtool::ValidationReport> result = packtool::ValidatePack(dir_, options_);
    if (result.ok()) *report_ = ValidationReportToProto(*result);
    if (absl::IsCancelled(result.status())) spdlog::info("{}", std::string(result.status().message()));
    PackToolServiceImpl* const service = service_;
    if (service->metrics_ != nullptr) service->metrics_->CountValidation(result.status(), result.ok() && !result->ok());
    Finish(ToGrpcStatus(service->data_root().Relative(result.status())));  // the reactor may be gone from here on
    service->JobFinished();
  }

  PackToolServiceImpl* const service_;
  const std::string dir_;
  packtool::ValidateOptions options_;
  v1::ValidateReport* const report_;
  std::atomic<bool> cancel_{false};
  CallGate::Ticket ticket_;  // the call's admission, held until the reactor is deleted
};

// One Convert call: the conversion runs on its own (detached) thread and hands progress to the stream.
// While a write is in flight only the newest progress is kept; the manifest message is never dropped.
// Finish is called exactly once, after the conversion has returned and no write is in flight, and is the
// last thing any thread does with the reactor, which deletes itself in OnDone.
class ConvertReactor final : public grpc::ServerWriteReactor<v1::ConvertProgress> {
 public:
  // `options.output_dir` has been claimed from `service`; the reactor releases it.
  ConvertReactor(PackToolServiceImpl* service, packtool::ConvertOptions options, CallGate::Ticket ticket)
      : service_(service), options_(std::move(options)), ticket_(std::move(ticket)) {
    service_->JobStarted();
    std::thread([this] { Run(); }).detach();
  }

  void OnWriteDone(bool ok) override {
    {
      absl::MutexLock lock(&mu_);
      write_in_flight_ = false;
      if (!ok) {
        // The client is gone: stop converting and write nothing more.
        stream_broken_ = true;
        pending_.reset();
        cancel_.store(true);
      }
    }
    Pump();
  }

  void OnCancel() override { cancel_.store(true); }

  void OnDone() override { delete this; }

 private:
  void Run() {
    spdlog::info("convert {} -> {} ({}, dense {}, {} threads)", options_.input, options_.output_dir,
                 kernels::SchemeName(options_.scheme), packtool::DenseTargetName(options_.dense_type),
                 options_.threads);
    absl::StatusOr<pack::v1::Manifest> manifest = packtool::ConvertGguf(
        options_, [this](const packtool::ConvertProgress& progress) { OnProgress(progress); }, &cancel_);
    if (manifest.ok()) {
      spdlog::info("convert {}: done", options_.output_dir);
    } else {
      spdlog::warn("convert {}: {}", options_.output_dir, manifest.status().ToString());
    }
    PackToolServiceImpl* const service = service_;
    if (service->metrics_ != nullptr) service->metrics_->CountConversion(manifest.status());
    service->ReleaseOutput(options_.output_dir);
    Action action;
    grpc::Status status;
    {
      absl::MutexLock lock(&mu_);
      done_ = true;
      pending_.reset();
      if (manifest.ok()) {
        if (!stream_broken_) pending_ = FinalProgress(last_ ? &*last_ : nullptr, *manifest);
        final_status_ = grpc::Status::OK;
      } else {
        final_status_ = ToGrpcStatus(service->data_root().Relative(manifest.status()));
      }
      action = NextActionLocked(&status);
    }
    // Once mu_ is released a gRPC thread may finish and delete the reactor, unless this thread took the
    // next action itself; so `this` is touched only to carry that action out.
    Act(action, status);
    service->JobFinished();
  }

  // Called on the converting thread.
  void OnProgress(const packtool::ConvertProgress& progress) {
    {
      absl::MutexLock lock(&mu_);
      last_ = progress;
      // "done" goes out with the manifest.
      if (stream_broken_ || progress.phase == "done") return;
      pending_ = ProgressToProto(progress);
    }
    Pump();
  }

  // Starts the next write, or the finish, when one is due and nothing is in flight. Called without mu_ from
  // either thread; the decision is made under mu_, so only one caller acts.
  void Pump() {
    Action action;
    grpc::Status status;
    {
      absl::MutexLock lock(&mu_);
      action = NextActionLocked(&status);
    }
    Act(action, status);
  }

  enum class Action { kNone, kWrite, kFinish };

  // Claims the next write or the finish, if one is due and nothing is in flight.
  Action NextActionLocked(grpc::Status* status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (write_in_flight_ || finish_started_) return Action::kNone;
    if (pending_.has_value()) {
      writing_ = std::move(*pending_);
      pending_.reset();
      write_in_flight_ = true;
      return Action::kWrite;
    }
    if (done_) {
      finish_started_ = true;
      *status = final_status_;
      return Action::kFinish;
    }
    return Action::kNone;
  }

  // `writing_` is not touched again until OnWriteDone clears write_in_flight_; after Finish the reactor may
  // be gone.
  void Act(Action action, const grpc::Status& status) {
    if (action == Action::kWrite) StartWrite(&writing_);
    if (action == Action::kFinish) Finish(status);
  }

  PackToolServiceImpl* const service_;
  const packtool::ConvertOptions options_;
  CallGate::Ticket ticket_;  // the call's admission, held until the reactor is deleted
  std::atomic<bool> cancel_{false};

  absl::Mutex mu_;
  std::optional<packtool::ConvertProgress> last_ ABSL_GUARDED_BY(mu_);
  std::optional<v1::ConvertProgress> pending_ ABSL_GUARDED_BY(mu_);  // newest message not yet written
  bool write_in_flight_ ABSL_GUARDED_BY(mu_) = false;
  bool stream_broken_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;  // the conversion has returned
  bool finish_started_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status final_status_ ABSL_GUARDED_BY(mu_);
  v1::ConvertProgress writing_;  // owned by the write in flight
};

absl::StatusOr<std::unique_ptr<PackToolServiceImpl>> PackToolServiceImpl::Create(
    const PackToolServiceOptions& options) {
  RETURN_IF_ERROR(packtool::CheckThreads(options.default_threads, "default threads"));
  ASSIGN_OR_RETURN(std::unique_ptr<DataRoot> root, DataRoot::Create(options.data_root));
  return std::unique_ptr<PackToolServiceImpl>(
      new PackToolServiceImpl(std::move(root), options.default_threads, options.metrics, options.gate));
}

absl::Status PackToolServiceImpl::Admit(const grpc::CallbackServerContext& context, CallGate::Ticket* ticket) {
  if (gate_ == nullptr) return absl::OkStatus();
  absl::StatusOr<CallGate::Ticket> admitted = gate_->Admit(context);
  if (!admitted.ok()) return admitted.status();
  *ticket = *std::move(admitted);
  return absl::OkStatus();
}

PackToolServiceImpl::~PackToolServiceImpl() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](int* running) { return *running == 0; }, &running_jobs_));
}

absl::StatusOr<int> PackToolServiceImpl::Threads(uint32_t requested) const {
  RETURN_IF_ERROR(packtool::CheckThreads(requested, "threads"));
  return requested == 0 ? default_threads_ : static_cast<int>(requested);
}

bool PackToolServiceImpl::ClaimOutput(const std::string& output) {
  absl::MutexLock lock(&mu_);
  return outputs_in_flight_.insert(output).second;
}

void PackToolServiceImpl::ReleaseOutput(const std::string& output) {
  absl::MutexLock lock(&mu_);
  outputs_in_flight_.erase(output);
}

void PackToolServiceImpl::JobStarted() {
  absl::MutexLock lock(&mu_);
  ++running_jobs_;
}

void PackToolServiceImpl::JobFinished() {
  absl::MutexLock lock(&mu_);
  --running_jobs_;
}

grpc::ServerWriteReactor<v1::ConvertProgress>* PackToolServiceImpl::Convert(grpc::CallbackServerContext* context,
                                                                            const v1::ConvertRequest* request) {
  CallGate::Ticket ticket;
  if (absl::Status admitted = Admit(*context, &ticket); !admitted.ok()) return new RefusedConvert(admitted, metrics_);
  // Paths and arguments first: nothing is looked at before every path is known to lie inside the root.
  absl::StatusOr<std::string> input = root_->Resolve(request->input(), "input");
  if (!input.ok()) return new RefusedConvert(input.status(), metrics_);
  absl::StatusOr<std::string> output = root_->Resolve(request->output_dir(), "output_dir");
  if (!output.ok()) return new RefusedConvert(output.status(), metrics_);
  if (*output == root_->path()) {
    return new RefusedConvert(absl::InvalidArgumentError("output_dir: is the data root itself"), metrics_);
  }
  std::string tokenizer_gguf;  // empty: tokenizer.json
  if (!request->tokenizer_gguf().empty()) {
    absl::StatusOr<std::string> resolved = root_->Resolve(request->tokenizer_gguf(), "tokenizer_gguf");
    if (!resolved.ok()) return new RefusedConvert(resolved.status(), metrics_);
    tokenizer_gguf = *std::move(resolved);
  }
  // Beside the output, so inside the root too; the library writes there first.
  const std::string partial = *output + ".partial";
  if (request->scheme().empty()) {
    return new RefusedConvert(absl::InvalidArgumentError("scheme: is empty; expected auto, f16, s8, s4, s2 or mxfp4"), metrics_);
  }
  absl::StatusOr<std::optional<kernels::Scheme>> choice = packtool::ParseSchemeChoice(request->scheme(), "scheme");
  if (!choice.ok()) return new RefusedConvert(choice.status(), metrics_);
  absl::StatusOr<int> threads = Threads(request->threads());
  if (!threads.ok()) return new RefusedConvert(threads.status(), metrics_);
  absl::StatusOr<packtool::DenseTarget> dense_type = packtool::ParseDenseTarget(
      request->dense_type().empty() ? "keep" : request->dense_type(), "dense_type");
  if (!dense_type.ok()) return new RefusedConvert(dense_type.status(), metrics_);

  // While a conversion runs its .partial directory exists, so the claim is checked before existence.
  if (!ClaimOutput(*output)) {
    return new RefusedConvert(absl::AbortedError(
        absl::StrCat("output_dir: '", request->output_dir(), "' is being converted to by another request")), metrics_);
  }
  absl::Status refused;
  if (!PathExists(*input)) {
    refused = absl::NotFoundError(absl::StrCat("input: '", request->input(), "' does not exist"));
  } else if (PathExists(*output)) {
    refused = absl::AlreadyExistsError(absl::StrCat("output_dir: '", request->output_dir(), "' already exists"));
  } else if (PathExists(partial)) {
    // The same codes as packtool::CheckOutputFree, with the names the client gave (the root stays hidden).
    refused = absl::FailedPreconditionError(absl::StrCat("output_dir: '", request->output_dir(),
                                                         ".partial' exists (an interrupted conversion?); remove it"));
  }
  if (!refused.ok()) {
    ReleaseOutput(*output);
    return new RefusedConvert(refused, metrics_);
  }

  // "auto": the scheme the source's expert types call for (reads the GGUF's header only).
  absl::StatusOr<kernels::Scheme> scheme = choice->has_value() ? **choice : packtool::DefaultSchemeForModel(*input);
  if (!scheme.ok()) {
    ReleaseOutput(*output);
    return new RefusedConvert(root_->Relative(scheme.status()), metrics_);
  }
  packtool::ConvertOptions options;
  options.input = *std::move(input);
  options.output_dir = *std::move(output);
  options.scheme = *scheme;
  options.threads = *threads;
  options.dense_type = *dense_type;
  options.tokenizer_gguf = std::move(tokenizer_gguf);
  return new ConvertReactor(this, std::move(options), std::move(ticket));
}

grpc::ServerUnaryReactor* PackToolServiceImpl::Validate(grpc::CallbackServerContext* context,
                                                        const v1::ValidateRequest* request,
                                                        v1::ValidateReport* report) {
  CallGate::Ticket ticket;
  if (absl::Status admitted = Admit(*context, &ticket); !admitted.ok()) {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(ToGrpcStatus(admitted));
    return reactor;
  }
  absl::StatusOr<std::string> dir = root_->Resolve(request->pack_dir(), "pack_dir");
  absl::StatusOr<int> threads = Threads(request->threads());
  absl::Status status = !dir.ok() ? dir.status() : threads.status();
  if (status.ok() && !PathExists(*dir)) {
    status = absl::NotFoundError(absl::StrCat("pack_dir: '", request->pack_dir(), "' does not exist"));
  }
  if (!status.ok()) {
    if (metrics_ != nullptr) metrics_->CountValidation(status, false);
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(ToGrpcStatus(status));
    return reactor;
  }
  packtool::ValidateOptions options;
  options.quick = request->quick();
  options.threads = *threads;
  return new ValidateReactor(this, *std::move(dir), options, report, std::move(ticket));
}

grpc::ServerUnaryReactor* PackToolServiceImpl::Inspect(grpc::CallbackServerContext* context,
                                                       const v1::InspectRequest* request, v1::InspectReport* report) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  CallGate::Ticket ticket;
  if (absl::Status admitted = Admit(*context, &ticket); !admitted.ok()) {
    reactor->Finish(ToGrpcStatus(admitted));
    return reactor;
  }
  absl::StatusOr<std::string> path = root_->Resolve(request->path(), "path");
  if (!path.ok()) {
    reactor->Finish(ToGrpcStatus(path.status()));
    return reactor;
  }
  if (!PathExists(*path)) {
    reactor->Finish(ToGrpcStatus(absl::NotFoundError(absl::StrCat("path: '", request->path(), "' does not exist"))));
    return reactor;
  }
  // Reads headers only: quick enough to answer on this thread.
  absl::StatusOr<packtool::Inspection> inspection = packtool::Inspect(*path);
  if (inspection.ok()) *report = InspectionToProto(*inspection);
  reactor->Finish(ToGrpcStatus(root_->Relative(inspection.status())));
  return reactor;
}

}  // namespace strata::services
