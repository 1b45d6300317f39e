#ifndef STRATA_SERVICES_CANCEL_WATCHER_H_
#define STRATA_SERVICES_CANCEL_WATCHER_H_

// Turns a cancel flag (e.g. set by a signal handler) into a cancelled gRPC call for clients that block in
// a synchronous call or Read(): while alive, a thread polls the flag and calls TryCancel on the context
// once it is set; a flag set already cancels the call at once. A null flag starts no thread. The context
// must outlive the watcher.

#include <atomic>
#include <thread>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "grpcpp/client_context.h"

namespace strata::services {

class CancelWatcher {
 public:
  CancelWatcher(const std::atomic<bool>* cancel, grpc::ClientContext* context) {
    if (cancel == nullptr) return;
    if (cancel->load()) {  // already set: the call is cancelled as soon as it starts
      context->TryCancel();
      return;
    }
    thread_ = std::thread([this, cancel, context] {
      while (!done_.WaitForNotificationWithTimeout(absl::Milliseconds(20))) {
        if (cancel->load()) {
          context->TryCancel();
          return;
        }
      }
    });
  }
  ~CancelWatcher() {
    done_.Notify();
    if (thread_.joinable()) thread_.join();
  }
  CancelWatcher(const CancelWatcher&) = delete;
  CancelWatcher& operator=(const CancelWatcher&) = delete;

 private:
  absl::Notification done_;
  std::thread thread_;
};

}  // namespace strata::services

#endif  // STRATA_SERVICES_CANCEL_WATCHER_H_
