#include "services/stream_writer.h"

#include <utility>

namespace strata::services {

StreamWriterThread::StreamWriterThread() : thread_([this] { Loop(); }) {}

StreamWriterThread::~StreamWriterThread() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

void StreamWriterThread::Post(std::function<void()> task) {
  absl::MutexLock lock(&mu_);
  tasks_.push_back(std::move(task));
}

bool StreamWriterThread::ReadyLocked() const { return stopping_ || !tasks_.empty(); }

void StreamWriterThread::Loop() {
  for (;;) {
    std::function<void()> task;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &StreamWriterThread::ReadyLocked));
      if (tasks_.empty()) return;  // stopping, and everything queued has run
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    task();
  }
}

}  // namespace strata::services
