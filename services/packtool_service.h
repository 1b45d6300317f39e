#ifndef STRATA_SERVICES_PACKTOOL_SERVICE_H_
#define STRATA_SERVICES_PACKTOOL_SERVICE_H_

// strata.v1.PackTool over the packtool library, with the gRPC callback API.
//
// Handlers are thin: they check the request, resolve every path inside the data root (PERMISSION_DENIED
// otherwise, before anything is touched), call the library and convert its status with ToGrpcStatus.
// Convert and Validate run on a thread of their own, so a long job never holds a gRPC thread; Convert
// streams coalesced progress and ends with the manifest, and a cancelled call stops the conversion. Two
// conversions to the same output at once: the second is ABORTED.
//
// Thread-safe. The service must outlive the grpc::Server it is registered with; Server::Shutdown cancels
// running conversions and waits for them, and the destructor waits for any job still running.

#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "services/call_gate.h"
#include "services/data_root.h"
#include "services/packtool_metrics.h"
#include "strata/v1/packtool.grpc.pb.h"

namespace strata::services {

struct PackToolServiceOptions {
  std::string data_root;    // required: an existing directory
  int default_threads = 0;  // for requests with threads = 0; 0 = one per core this process may use
  PackToolMetrics* metrics = nullptr;  // counts conversions and validations when set; outlives the service
  CallGate* gate = nullptr;  // every call passes it first; not owned, outlives the service; null: all admitted
};

class PackToolServiceImpl final : public v1::PackTool::CallbackService {
 public:
  static absl::StatusOr<std::unique_ptr<PackToolServiceImpl>> Create(const PackToolServiceOptions& options);
  ~PackToolServiceImpl() override;

  grpc::ServerWriteReactor<v1::ConvertProgress>* Convert(grpc::CallbackServerContext* context,
                                                         const v1::ConvertRequest* request) override;
  grpc::ServerUnaryReactor* Validate(grpc::CallbackServerContext* context, const v1::ValidateRequest* request,
                                     v1::ValidateReport* report) override;
  grpc::ServerUnaryReactor* Inspect(grpc::CallbackServerContext* context, const v1::InspectRequest* request,
                                    v1::InspectReport* report) override;

  const DataRoot& data_root() const { return *root_; }

 private:
  friend class ConvertReactor;
  friend class ValidateReactor;

  PackToolServiceImpl(std::unique_ptr<DataRoot> root, int default_threads, PackToolMetrics* metrics, CallGate* gate)
      : root_(std::move(root)), default_threads_(default_threads), metrics_(metrics), gate_(gate) {}

  // OK, or the gate's refusal (the ticket is then empty).
  absl::Status Admit(const grpc::CallbackServerContext& context, CallGate::Ticket* ticket);

  // The thread count for a request's `threads` field; INVALID_ARGUMENT when absurd.
  absl::StatusOr<int> Threads(uint32_t requested) const;

  // Marks `output` (a resolved path) as being converted to; false when it already is.
  bool ClaimOutput(const std::string& output) ABSL_LOCKS_EXCLUDED(mu_);
  void ReleaseOutput(const std::string& output) ABSL_LOCKS_EXCLUDED(mu_);

  // Counts the job threads, which the destructor waits for.
  void JobStarted() ABSL_LOCKS_EXCLUDED(mu_);
  void JobFinished() ABSL_LOCKS_EXCLUDED(mu_);

  const std::unique_ptr<DataRoot> root_;
  const int default_threads_;
  PackToolMetrics* const metrics_;
  CallGate* const gate_;

  absl::Mutex mu_;
  absl::flat_hash_set<std::string> outputs_in_flight_ ABSL_GUARDED_BY(mu_);
  int running_jobs_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace strata::services

#endif  // STRATA_SERVICES_PACKTOOL_SERVICE_H_
