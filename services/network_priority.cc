#include "services/network_priority.h"

#include <pthread.h>
#include <sched.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"

namespace strata::services {

absl::StatusOr<NetworkPriority> ParseNetworkPriority(std::string_view name, std::string_view field) {
  if (name == "normal") return NetworkPriority::kNormal;
  if (name == "idle") return NetworkPriority::kIdle;
  return absl::InvalidArgumentError(
      absl::StrCat(std::string(field), ": '", std::string(name), "' is not a network priority (expected normal or idle)"));
}

std::string_view NetworkPriorityName(NetworkPriority priority) {
  return priority == NetworkPriority::kIdle ? "idle" : "normal";
}

absl::Status SetThisThreadNetworkPriority(NetworkPriority priority) {
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

}  // namespace strata::services
