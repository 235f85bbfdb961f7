// libFuzzer target for the store server's handshake: what a stranger who connects to the
// rendezvous port can send before it has proven it knows the job token. A real server listens on
// the loopback; each input is one connection's bytes after the server's greeting, then the
// connection's end.
//
// Beyond "no crash": the server must never let such a client in (it cannot forge the HMAC proof
// without the token), must close the connection once the bytes end (no hang: a wait here would
// be a stuck handshake thread), and whatever it answers must be a well-formed refusal.
// Replayed by //backends/store:handshake_fuzzer_corpus_test; fuzzed by tools/fuzz/run.sh.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "backends/store/frame.h"
#include "backends/store/tcp_store.h"

namespace {

namespace wire = braid::store_wire;

void Fail(const std::string& what) {
  std::fprintf(stderr, "handshake_fuzzer: %s\n", what.c_str());
  std::abort();
}

braid::TcpStoreServer& Server() {
  static std::unique_ptr<braid::TcpStoreServer> server = [] {
    braid::TcpStoreServer::Options o;
    o.host = "127.0.0.1";
    o.port = 0;  // the kernel picks a free one
    o.token = "the job token no fuzzer knows";
    o.log = [](const std::string&) {};  // every input is a rejected stranger: no need to say so
    auto s = braid::TcpStoreServer::Start(o);
    if (!s.ok()) Fail("cannot start the server: " + s.status().ToString());
    return std::move(*s);
  }();
  return *server;
}

// Reads until the server closes the connection; a minute without a byte or the close is a hang.
// *reset: the close was a reset (the server closed with our bytes unread), which may drop what
// it had sent before, so the answer cannot be judged.
std::string ReadToEnd(int fd, bool* reset) {
  *reset = false;
  std::string got;
  char buf[4096];
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::minutes(1);
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        give_up - std::chrono::steady_clock::now());
    if (left.count() <= 0) Fail("the server neither answered nor closed the connection");
    pollfd p{fd, POLLIN, 0};
    const int r = poll(&p, 1, int(left.count()));
    // libFuzzer's once-a-second timer (for -timeout) interrupts the wait: not a verdict.
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) Fail(std::string("poll() failed: ") + std::strerror(errno));
    if (r == 0) continue;  // the deadline check above decides
    ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      *reset = true;
      return got;
    }
    if (n == 0) return got;
    got.append(buf, size_t(n));
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  braid::TcpStoreServer& server = Server();
  const int64_t let_in_before = server.stats().authenticated;
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) Fail("socket() failed");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(uint16_t(server.port()));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) Fail("connect() failed");
  // The bytes, then our end of the connection; the server may close first (a frame it refused).
  size_t sent = 0;
  while (sent < size) {
    ssize_t n = send(fd, data + sent, size - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    sent += size_t(n);
  }
  shutdown(fd, SHUT_WR);
  bool reset = false;
  const std::string answer = ReadToEnd(fd, &reset);
  close(fd);
  if (server.stats().authenticated != let_in_before) Fail("a client without the token was let in");
  if (reset) return 0;
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
