#ifndef STRATA_SERVICES_STREAM_WRITER_H_
#define STRATA_SERVICES_STREAM_WRITER_H_

// A thread that starts stream operations (StartWrite, Finish) on behalf of the engine's scheduler thread,
// so that serializing and sending a message never runs inside the decode loop. Post may be called from any
// thread; tasks run in order on the writer thread. The destructor runs what is queued, then joins.

#include <deque>
#include <functional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace strata::services {

class StreamWriterThread {
 public:
  StreamWriterThread();
  ~StreamWriterThread();
  StreamWriterThread(const StreamWriterThread&) = delete;
  StreamWriterThread& operator=(const StreamWriterThread&) = delete;

  void Post(std::function<void()> task);

 private:
  void Loop();
  bool ReadyLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace strata::services

#endif  // STRATA_SERVICES_STREAM_WRITER_H_
