// The server's side of the store's handshake (the protocol is in tcp_store.h): greet with a
// fresh nonce, read the client's proof, answer with ours or a refusal. Internal to
// //backends/store. It is a function of one connected socket and the token, apart from the
// server's threads and bookkeeping, so that the fuzzer (handshake_fuzzer.cc) drives exactly the
// code a stranger meets, over a socketpair, thousands of times a second, where a real loopback
// connection and a server thread per input managed ~200.
#ifndef BRAID_BACKENDS_STORE_SERVER_HANDSHAKE_H_
#define BRAID_BACKENDS_STORE_SERVER_HANDSHAKE_H_

#include <string>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace braid::store_server {

struct HandshakeOutcome {
  bool authenticated = false;
  // Set when the client's frame could not be read (it closed, timed out, or the stream broke),
  // as opposed to a frame that was read and refused: a stopping server does not log the former.
  bool read_failed = false;
  // Why the client was refused, for the server's log; empty when it got in.
  std::string refusal;
};

// Runs the handshake on `fd`, a connected non-blocking stream socket, within `timeout`.
HandshakeOutcome ServeHandshake(int fd, absl::string_view token, absl::Duration timeout);

}  // namespace braid::store_server

#endif  // BRAID_BACKENDS_STORE_SERVER_HANDSHAKE_H_
