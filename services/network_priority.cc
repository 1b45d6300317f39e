#include "services/network_priority.h"

#include <pthread.h>
#include <sched.h>

#include <cerrno>
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

int MoveThreadsToIdle(const std::vector<std::string>& keep_prefixes) {
  int moved = 0;
#ifdef SCHED_IDLE
  std::error_code ec;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task", ec)) {
    std::string name;
    std::ifstream(task.path() / "comm") >> name;  // names hold no spaces here; a partial name still matches
    bool keep = false;
    for (const std::string& prefix : keep_prefixes) keep = keep || name.rfind(prefix, 0) == 0;
    if (keep) continue;
    pid_t tid = 0;
    if (!absl::SimpleAtoi(task.path().filename().string(), &tid)) continue;
    if (sched_getscheduler(tid) == SCHED_IDLE) continue;  // -1 when it has exited: then the set fails too
    sched_param param{};
    if (sched_setscheduler(tid, SCHED_IDLE, &param) == 0) ++moved;
  }
#endif
  return moved;
}

}  // namespace strata::services
