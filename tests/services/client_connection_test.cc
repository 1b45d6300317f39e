#include "services/client_connection.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "gtest/gtest.h"
#include "tests/testing/wait.h"

namespace strata::services {
namespace {

int PortOf(int fd, bool peer) {
  sockaddr_in address{};
  socklen_t size = sizeof(address);
  if (peer) {
    getpeername(fd, reinterpret_cast<sockaddr*>(&address), &size);
  } else {
    getsockname(fd, reinterpret_cast<sockaddr*>(&address), &size);
  }
  return ntohs(address.sin_port);
}

// A loopback TCP connection: the listening socket, the client's end and the accepted end.
struct Connection {
  int listener = -1, client = -1, accepted = -1;
  Connection() {
    listener = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
    EXPECT_EQ(listen(listener, 1), 0);
    address.sin_port = htons(PortOf(listener, false));
    client = socket(AF_INET, SOCK_STREAM, 0);
    EXPECT_EQ(connect(client, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
    accepted = accept(listener, nullptr, nullptr);
    EXPECT_GE(accepted, 0);
  }
  ~Connection() {
    for (int fd : {listener, client, accepted}) {
      if (fd >= 0) close(fd);
    }
  }
};

TEST(ClientConnectionTest, SeesThePeerCloseItsEnd) {
  Connection c;
  ClientConnection watched("127.0.0.1", PortOf(c.accepted, true), PortOf(c.accepted, false));
  ASSERT_TRUE(watched.found());
  EXPECT_FALSE(watched.Closed());
  ASSERT_EQ(write(c.client, "x", 1), 1);  // data waiting to be read is not a close
  EXPECT_FALSE(watched.Closed());
  close(c.client);
  c.client = -1;
  EXPECT_TRUE(strata::testing::WaitUntil([&] { return watched.Closed(); }));
}

TEST(ClientConnectionTest, AnUnknownConnectionIsNeverClosed) {
  Connection c;
  ClientConnection unknown("127.0.0.1", 1, PortOf(c.accepted, false));  // no peer on port 1
  EXPECT_FALSE(unknown.found());
  EXPECT_FALSE(unknown.Closed());
}

}  // namespace
}  // namespace strata::services
