// libFuzzer target for the store server's handshake: what a stranger who connects to the
// rendezvous port can send before it has proven it knows the job token. Each input is one
// connection's bytes after the server's greeting, then the connection's end, handed to the
// server's own handshake code (server_handshake.h, what TcpStoreServer runs on every accepted
// socket) over a socketpair in this thread: a real loopback server with a thread per connection
// ran ~200 inputs a second, too few for a fuzzing run to mean much.
//
// Beyond "no crash": the server must never let such a client in (it cannot forge the HMAC proof
// without the token), must give up once the bytes end (no hang: libFuzzer's -timeout catches a
// wait), must say why it refused, and whatever it answers must be a well-formed refusal.
// Replayed by //backends/store:handshake_fuzzer_corpus_test; fuzzed by tools/fuzz/run.sh.
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/time/time.h"
#include "backends/store/frame.h"
#include "backends/store/server_handshake.h"

namespace {

namespace wire = braid::store_wire;

void Fail(const std::string& what) {
  std::fprintf(stderr, "handshake_fuzzer: %s\n", what.c_str());
  std::abort();
}

// Everything the server wrote, once it has closed its end.
std::string ReadToEnd(int fd) {
  std::string got;
  char buf[4096];
  for (;;) {
    ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) Fail(std::string("read() failed: ") + std::strerror(errno));
    if (n == 0) return got;
    got.append(buf, size_t(n));
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  int fds[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) Fail("socketpair() failed");
  const int client = fds[0], server = fds[1];
  // The server's socket is non-blocking, as an accepted one is. The client writes its bytes
  // before the server runs, so they must fit the socket's buffer: more than a handshake frame
  // can hold (wire::kMaxHandshakeFrameBytes); the rest of a longer input would never be read.
  if (fcntl(server, F_SETFL, O_NONBLOCK) != 0) Fail("fcntl() failed");
  if (fcntl(client, F_SETFL, O_NONBLOCK) != 0) Fail("fcntl() failed");
  size_t sent = 0;
  while (sent < size) {
    ssize_t n = send(client, data + sent, size - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // the buffer is full
    sent += size_t(n);
  }
  shutdown(client, SHUT_WR);
  if (fcntl(client, F_SETFL, 0) != 0) Fail("fcntl() failed");
  const braid::store_server::HandshakeOutcome outcome = braid::store_server::ServeHandshake(
      server, "the job token no fuzzer knows", absl::Seconds(10));
  // What the server left unread is drained before it closes: a Unix socket closed with unread
  // bytes resets its peer, and the answer is what is judged here, not the close.
  char sink[4096];
  while (read(server, sink, sizeof(sink)) > 0) {
  }
  close(server);
  const std::string answer = ReadToEnd(client);
  close(client);
  if (outcome.authenticated) Fail("a client without the token was let in");
  if (outcome.refusal.empty()) Fail("a refusal without a reason for the log");
  // The greeting, then at most a refusal.
  absl::string_view rest = answer;
  auto hello = wire::SplitFrame(rest, wire::kMaxHandshakeFrameBytes);
  if (!hello.ok() || !hello->complete || !wire::ParseHello(hello->body).ok()) {
    Fail("the server's greeting is not a Hello frame");
  }
  rest.remove_prefix(hello->consumed);
  if (!rest.empty()) {
    auto result = wire::SplitFrame(rest, wire::kMaxHandshakeFrameBytes);
    if (!result.ok() || !result->complete || result->consumed != rest.size()) {
      Fail("the server's answer is not one frame");
    }
    auto parsed = wire::ParseAuthResult(result->body);
    if (!parsed.ok() || parsed->ok) Fail("the server's answer is not a refusal");
  }
  return 0;
}
