// The shared helpers of the TCP store's tests (test_util.h).
#include "backends/store/test_util.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "backends/store/frame.h"
#include "backends/store/tcp_store.h"
#include "gtest/gtest.h"

namespace braid::store_test {

namespace wire = store_wire;

namespace {

bool ReadExact(int fd, std::string* out, size_t n) {
  out->resize(n);
  size_t got = 0;
  while (got < n) {
    ssize_t r = recv(fd, &(*out)[got], n - got, 0);
    if (r <= 0) return false;
    got += r;
  }
  return true;
}

}  // namespace

double SecondsSince(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

bool WaitUntil(const std::function<bool()>& pred, double seconds) {
  auto t0 = Clock::now();
  while (SecondsSince(t0) < seconds) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return pred();
}

std::string NewToken() {
  auto t = GenerateJobToken();
  EXPECT_TRUE(t.ok()) << t.status();
  return *t;
}

std::unique_ptr<TcpStoreServer> StartServer(const std::string& token, LogSink* sink, int port,
                                            absl::Duration handshake) {
  TcpStoreServer::Options o;
  o.host = "127.0.0.1";
  o.port = port;
  o.token = token;
  o.handshake_timeout = handshake;
  o.log = sink->fn();
  auto s = TcpStoreServer::Start(o);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? std::move(*s) : nullptr;
}

absl::StatusOr<std::unique_ptr<TcpStoreClient>> Connect(int port, const std::string& token,
                                                        absl::Duration timeout) {
  TcpStoreClient::Options o;
  o.host = "127.0.0.1";
  o.port = port;
  o.token = token;
  o.connect_timeout = timeout;
  o.io_timeout = absl::Seconds(20);
  return TcpStoreClient::Connect(o);
}

std::unique_ptr<TcpStoreClient> MustConnect(int port, const std::string& token) {
  auto c = Connect(port, token);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? std::move(*c) : nullptr;
}

int RawConnect(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    ADD_FAILURE() << "connect to 127.0.0.1:" << port << " failed";
  }
  return fd;
}

void SendRaw(int fd, const std::string& bytes) {
  ASSERT_EQ(send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL), static_cast<ssize_t>(bytes.size()));
}

std::string ReadUntilClosed(int fd) {
  std::string out;
  char buf[4096];
  for (;;) {
    ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) return out;
    out.append(buf, n);
  }
}

std::string ReadFrameBody(int fd) {
  std::string header, body;
  if (!ReadExact(fd, &header, 4)) return "";
  auto n = wire::DecodeFrameLength(header, wire::kMaxFrameBytes);
  if (!n.ok() || !ReadExact(fd, &body, *n)) return "";
  return body;
}

}  // namespace braid::store_test
