// Connecting to the TCP store and failing well: the client's checks of whoever answers (a fake
// store, a service that is not a store), retrying until a late server starts, an unreachable
// master, a port in use, bad arguments, Stop with clients connected, the connection limit, and
// ConnectStoreFromEnv. The store's behaviour once connected is in tcp_store_test.cc.
#include "backends/store/tcp_store.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "backends/store/frame.h"
#include "backends/store/test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace braid::store_test {
namespace {

namespace wire = store_wire;
using ::testing::HasSubstr;

// A loopback port that is ours and that nothing listens on, for as long as this object lives:
// bound with SO_REUSEADDR, never listened on. The kernel hands a bound port to no one else (not
// by bind(0), not as a connection's source port), connecting to it is refused, and a store (which
// sets SO_REUSEADDR too) can still bind and listen on it. A port bound, closed and then reused
// would race with every other process on the machine.
class HeldPort {
 public:
  HeldPort() {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    EXPECT_EQ(setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)), 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    socklen_t len = sizeof(a);
    getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
  }
  ~HeldPort() { close(fd_); }
  HeldPort(const HeldPort&) = delete;
  HeldPort& operator=(const HeldPort&) = delete;
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
};

// A listening socket on an ephemeral loopback port; *port receives the port.
int Listener(int* port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  EXPECT_EQ(listen(fd, 16), 0);
  socklen_t len = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  *port = ntohs(a.sin_port);
  return fd;
}

// ---- Tests ----------------------------------------------------------------------------------

TEST(TcpStoreTest, ClientVerifiesTheServersProof) {
  // A fake store that greets properly but cannot prove it knows the token.
  int port = 0;
  int lfd = Listener(&port);
  std::thread fake([&] {
    int fd = accept(lfd, nullptr, nullptr);
    wire::Hello h;
    h.nonce.fill(9);
    SendRaw(fd, wire::EncodeHello(h));
    ReadFrameBody(fd);  // the Auth
    wire::AuthResult ok;
    ok.ok = true;
    ok.mac.fill(0);
    SendRaw(fd, wire::EncodeAuthResult(ok));
    ReadUntilClosed(fd);
    close(fd);
  });
  auto c = Connect(port, NewToken(), absl::Seconds(10));
  fake.join();
  close(lfd);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(c.status().message(), HasSubstr("failed to prove it knows the job token"));
  EXPECT_THAT(c.status().message(), HasSubstr(absl::StrCat("127.0.0.1:", port)));
}

TEST(TcpStoreTest, ClientRecognisesAServiceThatIsNotAStore) {
  int port = 0;
  int lfd = Listener(&port);
  std::thread fake([&] {
    int fd = accept(lfd, nullptr, nullptr);
    SendRaw(fd, "SSH-2.0-OpenSSH_9.2\r\n");
    ReadUntilClosed(fd);
    close(fd);
  });
  auto c = Connect(port, NewToken(), absl::Seconds(20));
  fake.join();
  close(lfd);
  ASSERT_FALSE(c.ok());
  // Recognised at once, not retried until the 20 s deadline (which would end in another message).
  EXPECT_THAT(c.status().message(), HasSubstr("is not a Braid store"));
  EXPECT_THAT(c.status().message(), HasSubstr("MASTER_ADDR/MASTER_PORT"));
}

TEST(TcpStoreTest, ClientRetriesUntilALateServerStarts) {
  LogSink log;
  std::string token = NewToken();
  HeldPort held;
  int port = held.port();
  absl::StatusOr<std::unique_ptr<TcpStoreClient>> client = absl::UnknownError("not run");
  // The server starts only once the client has been refused: it must retry to succeed.
  absl::Notification refused;
  std::string first_error;
  TcpStoreClient::Options o;
  o.port = port;
  o.token = token;
  o.connect_timeout = absl::Seconds(20);
  o.on_retry = [&](int attempt, const std::string& error) {
    if (attempt == 1) {
      first_error = error;
      refused.Notify();
    }
  };
  std::thread connector([&] { client = TcpStoreClient::Connect(o); });
  refused.WaitForNotification();
  EXPECT_THAT(first_error, HasSubstr("Connection refused"));
  auto server = StartServer(token, &log, port);
  ASSERT_NE(server, nullptr) << "port " << port;
  connector.join();
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_TRUE((*client)->Set("k", "v").ok());
}

TEST(TcpStoreTest, UnreachableMasterFailsAfterTheDeadline) {
  HeldPort held;
  int port = held.port();
  auto t0 = Clock::now();
  auto c = Connect(port, NewToken(), absl::Milliseconds(700));
  double took = SecondsSince(t0);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(c.status().message(), HasSubstr(absl::StrCat("127.0.0.1:", port)));
  EXPECT_THAT(c.status().message(), HasSubstr("may be down"));
  EXPECT_THAT(c.status().message(), HasSubstr("Connection refused"));
  // Not before its deadline; a hang is the test's timeout's to catch (an upper bound here would
  // only fail on a loaded machine).
  EXPECT_GE(took, 0.69);
}

TEST(TcpStoreTest, PortInUseNamesThePortAndItsHolder) {
  int port = 0;
  int lfd = Listener(&port);
  TcpStoreServer::Options o;
  o.host = "127.0.0.1";
  o.port = port;
  o.token = NewToken();
  auto s = TcpStoreServer::Start(o);
  close(lfd);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(s.status().message(), HasSubstr(absl::StrCat("port ", port, " is already in use")));
  // The holder is this very test process.
  EXPECT_THAT(s.status().message(), HasSubstr(absl::StrCat("pid ", getpid())));
  EXPECT_THAT(s.status().message(), HasSubstr("--master_port"));

  // Two stores on one port: the second is refused the same way.
  LogSink log;
  auto first = StartServer(o.token, &log);
  o.port = first->port();
  auto second = TcpStoreServer::Start(o);
  ASSERT_FALSE(second.ok());
  EXPECT_THAT(second.status().message(), HasSubstr("already in use"));
}

TEST(TcpStoreTest, BadArguments) {
  TcpStoreServer::Options o;
  o.host = "127.0.0.1";
  EXPECT_THAT(TcpStoreServer::Start(o).status().message(), HasSubstr("empty job token"));
  auto c = Connect(1234, "");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(c.status().message(), HasSubstr("BRAID_JOB_TOKEN"));
  EXPECT_EQ(Connect(0, "t").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(TcpStoreTest, StopWithClientsConnectedEndsEveryone) {
  LogSink log;
  std::string token = NewToken();
  // A handshake timeout far past the test's own: only Stop can close the silent stranger below.
  auto server = StartServer(token, &log, /*port=*/0, absl::Hours(1));
  auto blocked = MustConnect(server->port(), token);
  auto idle = MustConnect(server->port(), token);
  int silent = RawConnect(server->port());  // a stranger mid-handshake
  ASSERT_TRUE(idle->Set("k", "v").ok());
  absl::StatusOr<std::string> got = absl::UnknownError("not run");
  std::thread getter([&] { got = blocked->Get("never-set", absl::Seconds(60)); });
  EXPECT_TRUE(WaitUntil([&] { return server->stats().open == 3; }));
  EXPECT_TRUE(WaitUntil([&] { return server->stats().waiting == 1; }));  // the Get is blocked

  server->Stop();
  getter.join();
  EXPECT_EQ(server->stats().waiting, 0);
  ASSERT_FALSE(got.ok());
  // Unavailable, not the DeadlineExceeded of the Get's 60 s: Stop ended it.
  EXPECT_EQ(got.status().code(), absl::StatusCode::kUnavailable) << got.status();
  EXPECT_THAT(got.status().message(), HasSubstr("'never-set'"));

  absl::Status st = idle->Set("k2", "v");
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable) << st;
  EXPECT_THAT(st.message(), HasSubstr("lost the connection to the Braid store at 127.0.0.1:"));
  // Once broken, a client fails at once with the same explanation.
  EXPECT_EQ(idle->Get("k", absl::Seconds(30)).status().message(), st.message());
  // The stranger got its greeting and then, at Stop, the end of the connection.
  std::string greeting = ReadUntilClosed(silent);
  EXPECT_TRUE(wire::ParseHello(greeting.substr(wire::kFrameHeaderBytes)).ok());
  close(silent);
  EXPECT_EQ(server->stats().open, 0);
  server->Stop();  // idempotent
  server.reset();
}

TEST(TcpStoreTest, ConnectionLimitTurnsNewcomersAway) {
  LogSink log;
  std::string token = NewToken();
  TcpStoreServer::Options o;
  o.host = "127.0.0.1";
  o.token = token;
  o.max_connections = 2;
  o.log = log.fn();
  auto server = TcpStoreServer::Start(o);
  ASSERT_TRUE(server.ok()) << server.status();
  auto a = MustConnect((*server)->port(), token);
  auto b = MustConnect((*server)->port(), token);
  auto c = Connect((*server)->port(), token, absl::Milliseconds(300));
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(log.All(), HasSubstr("(the limit)"));
  a.reset();
  // A slot frees up: a newcomer now gets in.
  EXPECT_TRUE(WaitUntil([&] { return (*server)->stats().open == 1; }));
  EXPECT_TRUE(Connect((*server)->port(), token).ok());
}

TEST(TcpStoreTest, ConnectStoreFromEnv) {
  LogSink log;
  std::string token = NewToken();
  auto server = StartServer(token, &log);
  unsetenv("MASTER_ADDR");
  setenv("MASTER_PORT", std::to_string(server->port()).c_str(), 1);
  setenv("BRAID_JOB_TOKEN", token.c_str(), 1);
  auto c = ConnectStoreFromEnv(absl::Seconds(5));
  EXPECT_THAT(c.status().message(), HasSubstr("MASTER_ADDR is not set"));
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  setenv("MASTER_PORT", "http", 1);
  c = ConnectStoreFromEnv(absl::Seconds(5));
  EXPECT_THAT(c.status().message(), HasSubstr("MASTER_PORT='http' is not a port number"));
  setenv("MASTER_PORT", std::to_string(server->port()).c_str(), 1);
  c = ConnectStoreFromEnv(absl::Seconds(5));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE((*c)->Set("from-env", "1").ok());
  unsetenv("BRAID_JOB_TOKEN");
  EXPECT_THAT(ConnectStoreFromEnv(absl::Seconds(5)).status().message(),
              HasSubstr("BRAID_JOB_TOKEN is not set"));
  unsetenv("MASTER_ADDR");
  unsetenv("MASTER_PORT");
}

}  // namespace
}  // namespace braid::store_test
