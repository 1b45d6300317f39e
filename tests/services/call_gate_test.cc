#include "services/call_gate.h"

#include <fstream>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/test_util.h"

namespace strata::services {
namespace {

using ::testing::HasSubstr;

constexpr char kToken[] = "gate-token-0123456789";

TEST(PeerHostTest, DropsThePort) {
  EXPECT_EQ(PeerHost("ipv4:10.0.0.7:41234"), "10.0.0.7");
  EXPECT_EQ(PeerHost("ipv6:[::1]:41234"), "[::1]");
  EXPECT_EQ(PeerHost("unix:/run/strata.sock"), "unix:/run/strata.sock");
}

TEST(CallGateTest, AnOpenGateAdmitsAndCountsCalls) {
  CallGate gate;
  auto first = gate.Admit("ipv4:127.0.0.1:1000", "");
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = gate.Admit("ipv4:127.0.0.1:1001", "");
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(gate.in_flight(), 2);
  first->Release();
  EXPECT_EQ(gate.in_flight(), 1);
  CallGate::Ticket moved = *std::move(second);
  EXPECT_EQ(gate.in_flight(), 1);
  moved = CallGate::Ticket();
  EXPECT_EQ(gate.in_flight(), 0);
}

TEST(CallGateTest, ADrainingGateRefusesWithUnavailable) {
  CallGate gate;
  auto running = gate.Admit("ipv4:127.0.0.1:1000", "");
  ASSERT_TRUE(running.ok());
  gate.StartDraining();
  EXPECT_TRUE(gate.draining());
  auto refused = gate.Admit("ipv4:127.0.0.1:1001", "");
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(refused.status().message(), HasSubstr("draining"));
  EXPECT_FALSE(gate.WaitUntilIdle(absl::Now() + absl::Milliseconds(10)));
  std::thread ender([&] { running->Release(); });
  EXPECT_TRUE(gate.WaitUntilIdle(absl::Now() + absl::Seconds(60)));
  ender.join();
}

TEST(CallGateTest, TokensAreCheckedBeforeAnythingElse) {
  strata::testing::ScratchDir dir;
  std::ofstream(dir.Join("tokens")) << kToken << "\n";
  auto tokens = AuthTokens::Load(dir.Join("tokens"));
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  CallGate gate({.tokens = tokens->get()});
  auto missing = gate.Admit("ipv4:127.0.0.1:1000", "");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(missing.status().message(), HasSubstr("no bearer token"));
  auto wrong = gate.Admit("ipv4:127.0.0.1:1000", "Bearer wrong-token-0123456789");
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(wrong.status().message(), HasSubstr("not accepted"));
  EXPECT_EQ(gate.in_flight(), 0);
  auto right = gate.Admit("ipv4:127.0.0.1:1000", std::string("Bearer ") + kToken);
  EXPECT_TRUE(right.ok()) << right.status();
}

TEST(CallGateTest, PerClientLimitCountsEachAddressApart) {
  CallGate gate({.max_calls_per_client = 2});
  auto a1 = gate.Admit("ipv4:10.0.0.1:1000", "");
  auto a2 = gate.Admit("ipv4:10.0.0.1:1001", "");  // another connection of the same host
  ASSERT_TRUE(a1.ok() && a2.ok());
  auto a3 = gate.Admit("ipv4:10.0.0.1:1002", "");
  EXPECT_EQ(a3.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(a3.status().message(), HasSubstr("--max-calls-per-client"));
  EXPECT_THAT(a3.status().message(), HasSubstr("10.0.0.1"));
  EXPECT_THAT(a3.status().message(), HasSubstr("limit is 2"));
  auto b1 = gate.Admit("ipv4:10.0.0.2:1000", "");
  EXPECT_TRUE(b1.ok()) << b1.status();
  a1->Release();
  EXPECT_TRUE(gate.Admit("ipv4:10.0.0.1:1003", "").ok());
}

TEST(CallGateTest, WithTokensTheLimitIsPerToken) {
  strata::testing::ScratchDir dir;
  const std::string other = "other-token-0123456789";
  std::ofstream(dir.Join("tokens")) << kToken << "\n" << other << "\n";
  auto tokens = AuthTokens::Load(dir.Join("tokens"));
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  CallGate gate({.tokens = tokens->get(), .max_calls_per_client = 1});
  auto first = gate.Admit("ipv4:10.0.0.1:1000", std::string("Bearer ") + kToken);
  ASSERT_TRUE(first.ok());
  // Another host with the same token is the same client; the same host with another token is not.
  auto same_token = gate.Admit("ipv4:10.0.0.9:1000", std::string("Bearer ") + kToken);
  EXPECT_EQ(same_token.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(same_token.status().message(), Not(HasSubstr(kToken)));
  EXPECT_TRUE(gate.Admit("ipv4:10.0.0.1:1001", "Bearer " + other).ok());
}

}  // namespace
}  // namespace strata::services
