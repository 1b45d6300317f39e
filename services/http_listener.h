#ifndef STRATA_SERVICES_HTTP_LISTENER_H_
#define STRATA_SERVICES_HTTP_LISTENER_H_

// Runs a cpp-httplib server on "host:port" in a thread of its own (the OpenAI-compatible API and the
// /metrics endpoint). The listener owns the httplib server; its handlers' captures must outlive Stop().
// Start and Stop are for the owning thread; port() for any.

#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "httplib.h"

namespace strata::services {

class HttpListener {
 public:
  // Binds `address` ("host:port", "[v6]:port"; port 0: any free port) and starts serving `server` (with its
  // routes set). `what` names the flag in errors ("--http-listen"): INVALID_ARGUMENT for a malformed
  // address, UNAVAILABLE when it cannot be bound (in use, not this host's: the port is never shared).
  static absl::StatusOr<std::unique_ptr<HttpListener>> Start(std::unique_ptr<httplib::Server> server,
                                                             const std::string& address, absl::string_view what);
  ~HttpListener();  // Stop()
  HttpListener(const HttpListener&) = delete;
  HttpListener& operator=(const HttpListener&) = delete;

  int port() const { return port_; }
  // Stops accepting and waits for the requests being handled to end. Idempotent.
  void Stop();

 private:
  HttpListener(std::unique_ptr<httplib::Server> server, int port) : server_(std::move(server)), port_(port) {}

  std::unique_ptr<httplib::Server> server_;
  const int port_;
  std::thread thread_;
};

}  // namespace strata::services

#endif  // STRATA_SERVICES_HTTP_LISTENER_H_
