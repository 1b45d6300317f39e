#ifndef STRATA_SERVICES_NETWORK_PRIORITY_H_
#define STRATA_SERVICES_NETWORK_PRIORITY_H_

// How the threads that serve the network (gRPC's pollers, executors and callback threads) are scheduled
// beside the engine's compute threads, which take every core and spin between parallel jobs while they
// decode.

#include <atomic>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace strata::services {

enum class NetworkPriority {
  // kIdle when the compute threads take every core, kNormal when they leave some free (see
  // ResolveNetworkPriority).
  kAuto,
  // The default policy. A woken network thread preempts a compute thread, often in the middle of a task,
  // and the whole parallel job waits for that task: a few tens of microseconds of network work per token
  // cost several times that in decode speed.
  kNormal,
  // SCHED_IDLE: network threads run when a compute thread leaves its core (between jobs, or when the
  // engine has nothing to do) and never preempt one. On a machine whose cores are busy with other
  // programs they get very little CPU, so use kNormal there.
  kIdle,
};

// "auto", "normal" or "idle"; INVALID_ARGUMENT naming `field` otherwise.
absl::StatusOr<NetworkPriority> ParseNetworkPriority(std::string_view name, std::string_view field);
std::string_view NetworkPriorityName(NetworkPriority priority);

// kAuto becomes kIdle when `compute_threads` (0: one per core) take all `cores`, else kNormal: cores left
// free take the network work without preempting anyone, and on a machine the server shares with other
// programs the network keeps its share. Other values are returned as they are.
NetworkPriority ResolveNetworkPriority(NetworkPriority requested, int compute_threads, int cores);

// Puts the calling thread under `priority`; the threads it creates from then on inherit it. An
// unprivileged thread cannot leave SCHED_IDLE again, so call this only on a thread that will start no
// compute threads. FAILED_PRECONDITION with the reason when the system refuses; INVALID_ARGUMENT for
// kAuto, which is to be resolved first.
absl::Status SetThisThreadNetworkPriority(NetworkPriority priority);

// The live threads of this process: thread id and name (/proc/self/task; empty where that is missing).
struct ThreadName {
  int tid = 0;
  std::string name;
};
std::vector<ThreadName> ListThreads();

// Puts the threads of this process under SCHED_IDLE, except those whose name starts with one of
// `keep_prefixes` and those already there; returns how many it moved. For threads gRPC starts after the
// server was built, from whichever thread queued the work (e.g. an executor thread started by a compute
// thread that was writing a stream), which inherit the normal policy.
int MoveThreadsToIdle(const std::vector<std::string>& keep_prefixes);

// While alive, moves such threads every `period` from a thread of its own, keeping the engine's threads
// (named strata-*, as the binaries' main threads are) and CUDA's. StartServer runs one for an idle server.
class IdleThreadSweeper {
 public:
  explicit IdleThreadSweeper(absl::Duration period);
  ~IdleThreadSweeper();
  IdleThreadSweeper(const IdleThreadSweeper&) = delete;
  IdleThreadSweeper& operator=(const IdleThreadSweeper&) = delete;

  int moved() const { return moved_.load(); }  // threads moved so far

 private:
  absl::Notification stop_;
  std::atomic<int> moved_{0};
  std::thread thread_;
};

}  // namespace strata::services

#endif  // STRATA_SERVICES_NETWORK_PRIORITY_H_
