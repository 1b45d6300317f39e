#include "services/http_listener.h"

#include <memory>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "tests/testing/test_util.h"

namespace strata::services {
namespace {

std::unique_ptr<httplib::Server> Hello() {
  auto server = std::make_unique<httplib::Server>();
  server->Get("/hello", [](const httplib::Request&, httplib::Response& r) { r.set_content("hi", "text/plain"); });
  return server;
}

TEST(HttpListenerTest, ServesOnAFreePortUntilStopped) {
  auto listener = HttpListener::Start(Hello(), "127.0.0.1:0", "--http-listen");
  ASSERT_TRUE(listener.ok()) << listener.status();
  const int port = (*listener)->port();
  ASSERT_GT(port, 0);
  {
    httplib::Client client("127.0.0.1", port);
    auto response = client.Get("/hello");
    ASSERT_TRUE(response);
    EXPECT_EQ(response->body, "hi");
  }
  (*listener)->Stop();
  (*listener)->Stop();  // idempotent
  httplib::Client client("127.0.0.1", port);
  EXPECT_FALSE(client.Get("/hello"));
}

TEST(HttpListenerTest, BadAddressesNameTheFlag) {
  EXPECT_THAT(HttpListener::Start(Hello(), "127.0.0.1:99999", "--http-listen").status(),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "--http-listen: listen address '127.0.0.1:99999'"));
  EXPECT_THAT(HttpListener::Start(Hello(), "localhost", "--metrics-listen").status(),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "--metrics-listen: listen address 'localhost'"));
  EXPECT_THAT(HttpListener::Start(Hello(), "unix:/tmp/x.sock", "--http-listen").status(),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "unix sockets are not supported"));
}

TEST(HttpListenerTest, ABusyPortIsUnavailable) {
  auto first = HttpListener::Start(Hello(), "127.0.0.1:0", "--http-listen");
  ASSERT_TRUE(first.ok()) << first.status();
  const std::string address = "127.0.0.1:" + std::to_string((*first)->port());
  EXPECT_THAT(HttpListener::Start(Hello(), address, "--http-listen").status(),
              StatusIsWith(absl::StatusCode::kUnavailable, "cannot listen on '" + address + "'"));
}

}  // namespace
}  // namespace strata::services
