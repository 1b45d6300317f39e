#include "services/http_listener.h"

#include <sys/socket.h>

#include <chrono>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "engine/status_macros.h"
#include "services/server_runner.h"

namespace strata::services {

absl::StatusOr<std::unique_ptr<HttpListener>> HttpListener::Start(std::unique_ptr<httplib::Server> server,
                                                                  const std::string& address, absl::string_view what) {
  if (address.rfind("unix:", 0) == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": '", address, "': unix sockets are not supported here; give host:port"));
  }
  if (absl::Status status = CheckListenAddress(address); !status.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", status.message()));
  }
  const size_t colon = address.rfind(':');
  std::string host = address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  int port = 0;
  (void)absl::SimpleAtoi(address.substr(colon + 1), &port);  // checked above
  // httplib's default sets SO_REUSEPORT too, which lets a second server bind a busy port and share its
  // connections; a busy port must be an error instead (as for the gRPC listeners). SO_REUSEADDR stays, so a
  // restart does not wait for old connections' TIME_WAIT.
  server->set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  const int bound = port == 0 ? server->bind_to_any_port(host) : (server->bind_to_port(host, port) ? port : -1);
  if (bound <= 0) {
    return absl::UnavailableError(
        absl::StrCat(what, ": cannot listen on '", address, "': the address is in use or not this host's"));
  }
  std::unique_ptr<HttpListener> listener(new HttpListener(std::move(server), bound));
  httplib::Server* raw = listener->server_.get();
  listener->thread_ = std::thread([raw] { raw->listen_after_bind(); });
  // httplib's stop() is a no-op until the accept loop runs: wait for it, so that Stop() always ends it.
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!raw->is_running() && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return listener;
}

HttpListener::~HttpListener() { Stop(); }

void HttpListener::Stop() {
  if (!thread_.joinable()) return;
  server_->stop();  // closes the listening socket the accept loop polls; the loop then joins its workers
  thread_.join();
}

}  // namespace strata::services
