#include "services/client_connection.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <cstdlib>
#include <filesystem>
#include <system_error>

namespace strata::services {
namespace {

// The address and port of a socket end, numeric, as httplib writes them (IPv4-mapped IPv6 as IPv4).
bool Endpoint(const sockaddr_storage& address, std::string* host, int* port) {
  char text[INET6_ADDRSTRLEN] = {};
  if (address.ss_family == AF_INET) {
    const auto* v4 = reinterpret_cast<const sockaddr_in*>(&address);
    inet_ntop(AF_INET, &v4->sin_addr, text, sizeof(text));
    *port = ntohs(v4->sin_port);
  } else if (address.ss_family == AF_INET6) {
    const auto* v6 = reinterpret_cast<const sockaddr_in6*>(&address);
    if (IN6_IS_ADDR_V4MAPPED(&v6->sin6_addr)) {
      inet_ntop(AF_INET, &v6->sin6_addr.s6_addr[12], text, sizeof(text));
    } else {
      inet_ntop(AF_INET6, &v6->sin6_addr, text, sizeof(text));
    }
    *port = ntohs(v6->sin6_port);
  } else {
    return false;
  }
  *host = text;
  return true;
}

}  // namespace

ClientConnection::ClientConnection(const std::string& remote_addr, int remote_port, int local_port) {
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd", error)) {
    int fd = 0;
    const std::string name = entry.path().filename().string();
    char* end = nullptr;
    fd = static_cast<int>(std::strtol(name.c_str(), &end, 10));
    if (end == name.c_str() || *end != '\0') continue;
    sockaddr_storage local{}, peer{};
    socklen_t local_size = sizeof(local), peer_size = sizeof(peer);
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &local_size) != 0) continue;  // not a socket
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_size) != 0) continue;    // not connected
    std::string local_host, peer_host;
    int local_port_of_fd = 0, peer_port = 0;
    if (!Endpoint(local, &local_host, &local_port_of_fd) || !Endpoint(peer, &peer_host, &peer_port)) continue;
    if (local_port_of_fd == local_port && peer_port == remote_port && peer_host == remote_addr) {
      socket_ = fd;
      return;
    }
  }
}

bool ClientConnection::Closed() const {
  if (!socket_.has_value()) return false;
  pollfd p{};
  p.fd = *socket_;
  p.events = POLLIN | POLLRDHUP;
  if (poll(&p, 1, 0) <= 0) return false;
  if (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) return true;
  if (p.revents & POLLIN) {
    // Readable: either the client sent more (a pipelined request: still there) or it closed (0 bytes).
    char byte = 0;
    return recv(*socket_, &byte, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
  }
  return false;
}

}  // namespace strata::services
