#include "services/network_priority.h"

#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <string>
#include <thread>

#include "gtest/gtest.h"
#include "services/server_runner.h"

namespace strata::services {
namespace {

// From the kernel: glibc's pthread_getschedparam may answer from a cache that a change made by thread id
// (MoveThreadsToIdle) does not update.
int PolicyOfThisThread() { return sched_getscheduler(0); }

// Threads of this process under `policy`.
int ThreadsUnderPolicy(int policy) {
  int count = 0;
  for (const ThreadName& t : ListThreads()) count += sched_getscheduler(t.tid) == policy;
  return count;
}

TEST(NetworkPriorityTest, ParsesItsNamesAndRefusesOthersNamingTheField) {
  EXPECT_EQ(*ParseNetworkPriority("idle", "--network-priority"), NetworkPriority::kIdle);
  EXPECT_EQ(*ParseNetworkPriority("normal", "--network-priority"), NetworkPriority::kNormal);
  EXPECT_EQ(*ParseNetworkPriority("auto", "--network-priority"), NetworkPriority::kAuto);
  EXPECT_EQ(NetworkPriorityName(NetworkPriority::kIdle), "idle");
  EXPECT_EQ(NetworkPriorityName(NetworkPriority::kNormal), "normal");
  EXPECT_EQ(NetworkPriorityName(NetworkPriority::kAuto), "auto");
  for (const char* bad : {"", "IDLE", "low", "batch"}) {
    absl::StatusOr<NetworkPriority> p = ParseNetworkPriority(bad, "--network-priority");
    ASSERT_FALSE(p.ok()) << bad;
    EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(p.status().message().find("--network-priority"), std::string::npos) << p.status();
    EXPECT_NE(p.status().message().find("auto, normal or idle"), std::string::npos) << p.status();
  }
}

TEST(NetworkPriorityTest, AutoIsIdleOnlyWhenTheComputeThreadsTakeEveryCore) {
  constexpr NetworkPriority kAuto = NetworkPriority::kAuto;
  EXPECT_EQ(ResolveNetworkPriority(kAuto, 0, 16), NetworkPriority::kIdle);  // 0: one thread per core
  EXPECT_EQ(ResolveNetworkPriority(kAuto, 16, 16), NetworkPriority::kIdle);
  EXPECT_EQ(ResolveNetworkPriority(kAuto, 32, 16), NetworkPriority::kIdle);
  EXPECT_EQ(ResolveNetworkPriority(kAuto, 15, 16), NetworkPriority::kNormal);
  EXPECT_EQ(ResolveNetworkPriority(kAuto, 1, 2), NetworkPriority::kNormal);
  // Explicit choices stand.
  EXPECT_EQ(ResolveNetworkPriority(NetworkPriority::kNormal, 0, 16), NetworkPriority::kNormal);
  EXPECT_EQ(ResolveNetworkPriority(NetworkPriority::kIdle, 1, 16), NetworkPriority::kIdle);
  // Unresolved, it cannot be applied.
  EXPECT_EQ(SetThisThreadNetworkPriority(kAuto).code(), absl::StatusCode::kInvalidArgument);
}

TEST(NetworkPriorityTest, IdleAppliesToTheThreadAndWhatItStartsNotToOthers) {
  const int caller_policy = PolicyOfThisThread();
  int set_policy = -1, child_policy = -1;
  std::thread network([&] {
    ASSERT_TRUE(SetThisThreadNetworkPriority(NetworkPriority::kIdle).ok());
    set_policy = PolicyOfThisThread();
    std::thread child([&] { child_policy = PolicyOfThisThread(); });
    child.join();
  });
  network.join();
  EXPECT_EQ(set_policy, SCHED_IDLE);
  EXPECT_EQ(child_policy, SCHED_IDLE);
  EXPECT_EQ(PolicyOfThisThread(), caller_policy);

  std::thread normal([&] {
    ASSERT_TRUE(SetThisThreadNetworkPriority(NetworkPriority::kNormal).ok());
    set_policy = PolicyOfThisThread();
  });
  normal.join();
  EXPECT_EQ(set_policy, caller_policy);
}

TEST(NetworkPriorityTest, ServerBuiltUnderIdleLeavesTheCallerAlone) {
  const int caller_policy = PolicyOfThisThread();
  ASSERT_NE(caller_policy, SCHED_IDLE);
  const int idle_before = ThreadsUnderPolicy(SCHED_IDLE);
  ServerConfig config;
  config.listen_address = "127.0.0.1:0";
  config.network_priority = NetworkPriority::kIdle;
  absl::StatusOr<StartedServer> started = StartServer(config, {});
  ASSERT_TRUE(started.ok()) << started.status();
  EXPECT_GT(started->port, 0);
  // gRPC started its threads for the server under SCHED_IDLE; this thread kept its policy; a sweeper
  // looks after the threads gRPC starts later.
  EXPECT_GT(ThreadsUnderPolicy(SCHED_IDLE), idle_before);
  EXPECT_EQ(PolicyOfThisThread(), caller_policy);
  EXPECT_EQ(started->network_priority, NetworkPriority::kIdle);
  EXPECT_NE(started->sweeper, nullptr);
  started->server->Shutdown();
  started->server->Wait();

  config.network_priority = NetworkPriority::kNormal;
  absl::StatusOr<StartedServer> normal = StartServer(config, {});
  ASSERT_TRUE(normal.ok()) << normal.status();
  EXPECT_EQ(normal->network_priority, NetworkPriority::kNormal);
  EXPECT_EQ(normal->sweeper, nullptr);
  normal->server->Shutdown();
  normal->server->Wait();
}

// A thread started outside the server's build thread is moved; the engine's (by name) and this one stay.
TEST(NetworkPriorityTest, MoveThreadsToIdleMovesLateThreadsAndKeepsNamedOnes) {
  char own_name[16] = {};
  ASSERT_EQ(pthread_getname_np(pthread_self(), own_name, sizeof own_name), 0);
  const int own_policy = PolicyOfThisThread();
  std::atomic<bool> moved{false};
  std::atomic<int> ready{0};
  int late_policy = -1, kept_policy = -1;
  auto start = [&](const char* name, int* policy) {
    return std::thread([&, name, policy] {
      pthread_setname_np(pthread_self(), name);
      ready.fetch_add(1);
      while (!moved.load()) std::this_thread::yield();
      *policy = PolicyOfThisThread();
    });
  };
  std::thread late = start("late-network", &late_policy);
  std::thread kept = start("strata-pool", &kept_policy);
  while (ready.load() < 2) std::this_thread::yield();
  EXPECT_GE(MoveThreadsToIdle({"strata-", own_name}), 1);
  moved.store(true);
  late.join();
  kept.join();
  EXPECT_EQ(late_policy, SCHED_IDLE);
  EXPECT_EQ(kept_policy, own_policy);
  EXPECT_EQ(PolicyOfThisThread(), own_policy);
  // Nothing left to move among them.
  EXPECT_EQ(MoveThreadsToIdle({"strata-", own_name}), 0);
}

}  // namespace
}  // namespace strata::services

namespace strata::services {
namespace {

TEST(ServerRunnerTest, ABusyPortIsAnErrorNotASharedPort) {
  ServerConfig config;
  config.listen_address = "127.0.0.1:0";
  absl::StatusOr<StartedServer> first = StartServer(config, {});
  ASSERT_TRUE(first.ok()) << first.status();
  config.listen_address = "127.0.0.1:" + std::to_string(first->port);
  absl::StatusOr<StartedServer> second = StartServer(config, {});
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable) << second.status();
  EXPECT_NE(second.status().message().find("cannot listen on '" + config.listen_address + "'"), std::string::npos)
      << second.status();
  if (second.ok()) second->server->Shutdown();
  first->server->Shutdown();
  first->server->Wait();
}

TEST(ServerRunnerTest, PortsOutsideTheirRangeAreRefusedNotWrapped) {
  for (const char* bad : {"127.0.0.1:99999", "127.0.0.1:65536", "127.0.0.1:-1", "127.0.0.1:", "127.0.0.1:80x",
                          "127.0.0.1"}) {
    EXPECT_EQ(CheckListenAddress(bad).code(), absl::StatusCode::kInvalidArgument) << bad;
    ServerConfig config;
    config.listen_address = bad;
    absl::StatusOr<StartedServer> started = StartServer(config, {});
    EXPECT_EQ(started.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    if (started.ok()) started->server->Shutdown();
  }
  EXPECT_NE(CheckListenAddress("127.0.0.1:99999").message().find("port '99999' is not a number in 0..65535"),
            std::string::npos);
  for (const char* good : {"127.0.0.1:0", "0.0.0.0:65535", "[::1]:50051", "localhost:8080", "unix:/tmp/s.sock"}) {
    EXPECT_TRUE(CheckListenAddress(good).ok()) << good;
  }
}

}  // namespace
}  // namespace strata::services
