#include "services/network_priority.h"

#include <pthread.h>
#include <sched.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace strata::services {

absl::StatusOr<NetworkPriority> ParseNetworkPriority(std::string_view name, std::string_view field) {
  if (name == "auto") return NetworkPriority::kAuto;
  if (name == "normal") return NetworkPriority::kNormal;
  if (name == "idle") return NetworkPriority::kIdle;
  return absl::InvalidArgumentError(absl::StrCat(std::string(field), ": '", std::string(name),
                                                 "' is not a network priority (expected auto, normal or idle)"));
}

std::string_view NetworkPriorityName(NetworkPriority priority) {
  switch (priority) {
    case NetworkPriority::kAuto:
      return "auto";
    case NetworkPriority::kNormal:
      return "normal";
    case NetworkPriority::kIdle:
      return "idle";
  }
  return "unknown";
}

NetworkPriority ResolveNetworkPriority(NetworkPriority requested, int compute_threads, int cores) {
  if (requested != NetworkPriority::kAuto) return requested;
  return compute_threads <= 0 || compute_threads >= cores ? NetworkPriority::kIdle : NetworkPriority::kNormal;
}

absl::Status SetThisThreadNetworkPriority(NetworkPriority priority) {
  if (priority == NetworkPriority::kAuto) {
    return absl::InvalidArgumentError("network priority auto: resolve it with ResolveNetworkPriority first");
  }
  if (priority == NetworkPriority::kNormal) return absl::OkStatus();
#ifdef SCHED_IDLE
  sched_param param{};
  param.sched_priority = 0;
  if (const int err = pthread_setschedparam(pthread_self(), SCHED_IDLE, &param); err != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot put the network threads under SCHED_IDLE: ", std::strerror(err)));
  }
  return absl::OkStatus();
#else
  return absl::FailedPreconditionError("network priority idle needs SCHED_IDLE, which this system lacks");
#endif
}

std::vector<ThreadName> ListThreads() {
  std::vector<ThreadName> threads;
  std::error_code ec;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task", ec)) {
    ThreadName t;
    if (!absl::SimpleAtoi(task.path().filename().string(), &t.tid)) continue;
    std::ifstream comm(task.path() / "comm");
    if (!std::getline(comm, t.name)) continue;  // it exited meanwhile
    threads.push_back(std::move(t));
  }
  return threads;
}

int MoveThreadsToIdle(const std::vector<std::string>& keep_prefixes) {
  int moved = 0;
#ifdef SCHED_IDLE
  for (const ThreadName& t : ListThreads()) {
    bool keep = false;
    for (const std::string& prefix : keep_prefixes) keep = keep || t.name.rfind(prefix, 0) == 0;
    if (keep || sched_getscheduler(t.tid) == SCHED_IDLE) continue;  // -1 once it exited: the set fails too
    sched_param param{};
    if (sched_setscheduler(t.tid, SCHED_IDLE, &param) == 0) ++moved;
  }
#endif
  return moved;
}

IdleThreadSweeper::IdleThreadSweeper(absl::Duration period) {
  thread_ = std::thread([this, period] {
    pthread_setname_np(pthread_self(), "network-sweep");
    while (!stop_.WaitForNotificationWithTimeout(period)) moved_.fetch_add(MoveThreadsToIdle({"strata-", "cuda"}));
  });
}

IdleThreadSweeper::~IdleThreadSweeper() {
  stop_.Notify();
  thread_.join();
}

}  // namespace strata::services
