#ifndef STRATA_SERVICES_CLIENT_CONNECTION_H_
#define STRATA_SERVICES_CLIENT_CONNECTION_H_

// Tells an HTTP handler when its client has gone away, so that a generation nobody waits for is cancelled.
// cpp-httplib (0.11) gives a handler the two ends of its TCP connection but not the socket, and notices a
// closed connection only when a write fails; this finds the accepted socket by its ends and asks the
// kernel whether the peer has closed it, without reading anything.
//
// The socket belongs to httplib and stays open while the handler runs; a ClientConnection must not be used
// after its handler returns. Calls are cheap (one poll); any thread.

#include <optional>
#include <string>

namespace strata::services {

class ClientConnection {
 public:
  // The accepted socket whose local port is `local_port` and whose peer is `remote_addr`:`remote_port`
  // (as httplib::Request reports them); an unknown connection (no such socket) is never seen closed.
  ClientConnection(const std::string& remote_addr, int remote_port, int local_port);

  // True once the client has closed or reset its end.
  bool Closed() const;
  bool found() const { return socket_.has_value(); }

 private:
  std::optional<int> socket_;
};

}  // namespace strata::services

#endif  // STRATA_SERVICES_CLIENT_CONNECTION_H_
