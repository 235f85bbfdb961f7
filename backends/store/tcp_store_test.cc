#include "backends/store/tcp_store.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "backends/store/auth.h"
#include "backends/store/frame.h"
#include "core/store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace braid {
namespace {

namespace wire = store_wire;
using ::testing::HasSubstr;
using ::testing::Not;
using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Polls `pred` until it holds or `seconds` pass (bounded: tests never hang on a broken server).
bool WaitUntil(const std::function<bool()>& pred, double seconds = 10) {
  auto t0 = Clock::now();
  while (SecondsSince(t0) < seconds) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return pred();
}

// Holds each of n threads until all n have arrived, so that their requests really race.
void StartTogether(std::atomic<int>& ready, int n) {
  ++ready;
  WaitUntil([&] { return ready.load() >= n; });
}

// Collects the server's log lines.
class LogSink {
 public:
  std::function<void(const std::string&)> fn() {
    return [this](const std::string& line) {
      std::lock_guard<std::mutex> lock(mu_);
      lines_.push_back(line);
    };
  }
  int Count(const std::string& needle) {
    std::lock_guard<std::mutex> lock(mu_);
    int n = 0;
    for (const auto& l : lines_) n += absl::StrContains(l, needle);
    return n;
  }
  bool WaitFor(const std::string& needle, int count = 1) {
    return WaitUntil([&] { return Count(needle) >= count; });
  }
  std::string All() {
    std::lock_guard<std::mutex> lock(mu_);
    return absl::StrJoin(lines_, "\n");
  }

 private:
  std::mutex mu_;
  std::vector<std::string> lines_;
};

std::string NewToken() {
  auto t = GenerateJobToken();
  EXPECT_TRUE(t.ok()) << t.status();
  return *t;
}

std::unique_ptr<TcpStoreServer> StartServer(const std::string& token, LogSink* sink, int port = 0,
                                            absl::Duration handshake = absl::Seconds(10)) {
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

absl::StatusOr<std::unique_ptr<TcpStoreClient>> Connect(
    int port, const std::string& token, absl::Duration timeout = absl::Seconds(10)) {
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

// ---- Raw sockets: the test plays strangers and hand-made peers ------------------------------

// A blocking loopback socket whose reads give up after 5 s.
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

// Everything the peer sends until it closes (or 5 s of silence).
std::string ReadUntilClosed(int fd) {
  std::string out;
  char buf[4096];
  for (;;) {
    ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) return out;
    out.append(buf, n);
  }
}

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

// One frame body, or "" when the peer closed or fell silent.
std::string ReadFrameBody(int fd) {
  std::string header, body;
  if (!ReadExact(fd, &header, 4)) return "";
  auto n = wire::DecodeFrameLength(header, wire::kMaxFrameBytes);
  if (!n.ok() || !ReadExact(fd, &body, *n)) return "";
  return body;
}

// A raw connection that has passed the handshake (the test then misbehaves on it).
int RawAuthenticated(int port, const std::string& token) {
  int fd = RawConnect(port);
  auto hello = wire::ParseHello(ReadFrameBody(fd));
  EXPECT_TRUE(hello.ok()) << hello.status();
  wire::Auth auth;
  auth.nonce.fill(42);
  auth.mac = *wire::ClientProof(token, hello->nonce, auth.nonce);
  SendRaw(fd, wire::EncodeAuth(auth));
  auto result = wire::ParseAuthResult(ReadFrameBody(fd));
  EXPECT_TRUE(result.ok() && result->ok);
  return fd;
}

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

TEST(TcpStoreTest, JobTokensAreFreshHex) {
  std::string a = NewToken(), b = NewToken();
  EXPECT_EQ(a.size(), 64u);
  EXPECT_EQ(a.find_first_not_of("0123456789abcdef"), std::string::npos) << a;
  EXPECT_NE(a, b);
}

// Random operations on the TCP store and on InMemoryStore (the reference) give the same results.
TEST(TcpStoreTest, AgreesWithInMemoryStore) {
  LogSink log;
  std::string token = NewToken();
  auto server = StartServer(token, &log);
  ASSERT_NE(server, nullptr);
  EXPECT_GT(server->port(), 0);
  auto client = MustConnect(server->port(), token);
  ASSERT_NE(client, nullptr);
  InMemoryStore ref;
  std::mt19937 rng(7);
  const std::vector<std::string> keys = {"a", "b", "n", std::string("bin\0ary", 7)};
  auto value = [&] {
    switch (rng() % 4) {
      case 0:
        return std::string();
      case 1:
        return std::to_string(static_cast<int>(rng() % 100) - 50);
      case 2:
        return std::string("\0\xff", 2);
      default:
        return std::string("text");
    }
  };
  for (int i = 0; i < 400; ++i) {
    const std::string& k = keys[rng() % keys.size()];
    SCOPED_TRACE(absl::StrCat("step ", i));
    switch (rng() % 6) {
      case 0: {
        std::string v = value();
        ASSERT_TRUE(client->Set(k, v).ok());
        ASSERT_TRUE(ref.Set(k, v).ok());
        break;
      }
      case 1: {
        auto got = client->Get(k, absl::ZeroDuration());
        auto want = ref.Get(k, absl::ZeroDuration());
        ASSERT_EQ(got.status().code(), want.status().code());
        if (want.ok()) {
          ASSERT_EQ(*got, *want);
        }
        break;
      }
      case 2: {
        int64_t d = static_cast<int64_t>(rng() % 21) - 10;
        auto got = client->Add(k, d);
        auto want = ref.Add(k, d);
        ASSERT_EQ(got.status().code(), want.status().code()) << got.status();
        if (want.ok()) {
          ASSERT_EQ(*got, *want);
        }
        break;
      }
      case 3: {
        std::string e = value(), d = value();
        auto got = client->CompareSet(k, e, d);
        auto want = ref.CompareSet(k, e, d);
        ASSERT_TRUE(got.ok() && want.ok());
        ASSERT_EQ(*got, *want);
        break;
      }
      case 4:
        ASSERT_TRUE(client->Delete(k).ok());
        ASSERT_TRUE(ref.Delete(k).ok());
        break;
      default: {
        auto got = client->Wait({k, "a"}, absl::ZeroDuration());
        auto want = ref.Wait({k, "a"}, absl::ZeroDuration());
        ASSERT_EQ(got.code(), want.code()) << got;
      }
    }
  }
}

TEST(TcpStoreTest, LargeValuesAndLimits) {
  LogSink log;
  std::string token = NewToken();
  auto server = StartServer(token, &log);
  auto client = MustConnect(server->port(), token);
  ASSERT_NE(client, nullptr);
  std::string big(8 << 20, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 131 + (i >> 12));
  ASSERT_TRUE(client->Set("blob", big).ok());
  auto got = client->Get("blob", absl::Seconds(1));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(*got == big);

  // Refused before anything is sent: the connection stays usable.
  std::string too_big(wire::kMaxValueBytes + 1, 'x');
  absl::Status st = client->Set("too-big", too_big);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), HasSubstr("too-big"));
  EXPECT_THAT(st.message(), HasSubstr("67108864-byte limit"));
  st = client->Set(std::string(wire::kMaxKeyBytes + 1, 'k'), "v");
  EXPECT_THAT(st.message(), HasSubstr("4096-byte limit"));
  EXPECT_EQ(client->Set("", "v").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(*client->Add("after", 3), 3);
}

TEST(TcpStoreTest, ConcurrentAddsGiveEveryValueOnce) {
  LogSink log;
  std::string token = NewToken();
  auto server = StartServer(token, &log);
  constexpr int kThreads = 8, kAdds = 150;
  std::vector<std::vector<int64_t>> seen(kThreads);
  std::vector<std::thread> threads;
  std::atomic<int> ready{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      auto c = MustConnect(server->port(), token);
      StartTogether(ready, kThreads);
      if (c == nullptr) return;
      for (int i = 0; i < kAdds; ++i) {
        auto v = c->Add("counter", 1);
        if (!v.ok()) {
          ADD_FAILURE() << v.status();
          return;
        }
        seen[t].push_back(*v);
      }
    });
  }
  for (auto& th : threads) th.join();
  std::set<int64_t> all;
  for (const auto& s : seen) all.insert(s.begin(), s.end());
  // Every Add returned a distinct value, and together they are exactly 1..N.
  EXPECT_EQ(all.size(), static_cast<size_t>(kThreads * kAdds));
  EXPECT_EQ(*all.begin(), 1);
  EXPECT_EQ(*all.rbegin(), kThreads * kAdds);
  auto c = MustConnect(server->port(), token);
  EXPECT_EQ(*c->Get("counter", absl::Seconds(1)), std::to_string(kThreads * kAdds));
}

TEST(TcpStoreTest, CompareSetRacesAreExact) {
  LogSink log;
  std::string token = NewToken();
  auto server = StartServer(token, &log);
  constexpr int kThreads = 6, kIncrements = 40;
  std::atomic<int> wins{0}, elected{0};
  std::vector<std::string> leaders(kThreads);
  std::vector<std::thread> threads;
  std::atomic<int> ready{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      auto c = MustConnect(server->port(), token);
      StartTogether(ready, kThreads);
      if (c == nullptr) return;
      // Election: one CompareSet from "" (absent) wins, and everyone learns the same winner.
      std::string me = absl::StrCat("rank ", t);
      auto leader = c->CompareSet("leader", "", me);
      ASSERT_TRUE(leader.ok()) << leader.status();
      leaders[t] = *leader;
      if (*leader == me) ++elected;
      // A counter incremented only through CompareSet; lost races retry from the value seen.
      // Each written value is unique ("count|thread|step"), so "the value after the call is
      // mine" means exactly "my swap happened".
      auto count = [](const std::string& v) { return v.empty() ? 0 : std::stoi(v); };
      std::string cur;
      for (int i = 0; i < kIncrements;) {
        std::string next = absl::StrCat(count(cur) + 1, "|", t, "|", i);
        auto after = c->CompareSet("cas-counter", cur, next);
        ASSERT_TRUE(after.ok()) << after.status();
        if (*after == next) {
          ++wins;
          ++i;
        }
        cur = *after;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(elected.load(), 1);
  for (const auto& l : leaders) EXPECT_EQ(l, leaders[0]);
  EXPECT_EQ(wins.load(), kThreads * kIncrements);
  auto c = MustConnect(server->port(), token);
  auto final_value = c->Get("cas-counter", absl::Seconds(1));
  ASSERT_TRUE(final_value.ok());
  EXPECT_EQ(std::stoi(*final_value), kThreads * kIncrements) << *final_value;
}

TEST(TcpStoreTest, WaitAndGetBlockUntilAnotherClientSets) {
  LogSink log;
  std::string token = NewToken();
  auto server = StartServer(token, &log);
  auto waiter = MustConnect(server->port(), token);
  auto setter = MustConnect(server->port(), token);
  absl::Status wait_status = absl::UnknownError("not run");
  absl::StatusOr<std::string> got = absl::UnknownError("not run");
  auto t0 = Clock::now();
  std::thread w([&] {
    wait_status = waiter->Wait({"x", "y"}, absl::Seconds(20));
    got = waiter->Get("z", absl::Seconds(20));
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ASSERT_TRUE(setter->Set("x", "1").ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ASSERT_TRUE(setter->Set("y", "2").ok());
  ASSERT_TRUE(setter->Set("z", "zz").ok());
  w.join();
  EXPECT_TRUE(wait_status.ok()) << wait_status;
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "zz");
  EXPECT_GE(SecondsSince(t0), 0.2);
  EXPECT_LT(SecondsSince(t0), 10);
}

TEST(TcpStoreTest, TimeoutsNameTheMissingKeys) {
  LogSink log;
  std::string token = NewToken();
  auto server = StartServer(token, &log);
  auto c = MustConnect(server->port(), token);
  ASSERT_TRUE(c->Set("present", "1").ok());
  auto t0 = Clock::now();
  auto got = c->Get("rank/3/addr", absl::Milliseconds(300));
  double took = SecondsSince(t0);
  ASSERT_EQ(got.status().code(), absl::StatusCode::kDeadlineExceeded) << got.status();
  EXPECT_THAT(got.status().message(), HasSubstr("'rank/3/addr'"));
  EXPECT_THAT(got.status().message(), HasSubstr(absl::StrCat("127.0.0.1:", server->port())));
  EXPECT_GE(took, 0.29);
  EXPECT_LT(took, 5);

  absl::Status st = c->Wait({"present", "missing-one"}, absl::Milliseconds(200));
  ASSERT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded) << st;
  // The server's part of the message names what is missing, and only that.
  EXPECT_THAT(st.message(), HasSubstr("for key 'missing-one', which"));
  EXPECT_THAT(st.message(), Not(HasSubstr("for keys")));
  // The connection is still good after a timeout.
  EXPECT_EQ(*c->Add("n", 2), 2);
}

TEST(TcpStoreTest, WrongTokenIsRejectedAndTheServerKeepsServing) {
  LogSink log;
  std::string token = NewToken();
  auto server = StartServer(token, &log);
  auto good = MustConnect(server->port(), token);
  ASSERT_TRUE(good->Set("k", "v").ok());

  auto t0 = Clock::now();
  auto bad = Connect(server->port(), NewToken(), absl::Seconds(30));
  ASSERT_FALSE(bad.ok());
  // No retrying a rejection: the answer is immediate, not after the 30 s connect timeout.
  EXPECT_LT(SecondsSince(t0), 5);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(bad.status().message(),
              HasSubstr(absl::StrCat("job token rejected by the store at 127.0.0.1:",
                                     server->port(), ": check BRAID_JOB_TOKEN")));
  EXPECT_TRUE(log.WaitFor("wrong job token")) << log.All();
  EXPECT_THAT(log.All(), HasSubstr("rejected connection from 127.0.0.1:"));
  EXPECT_EQ(server->stats().rejected, 1);

  EXPECT_EQ(*good->Get("k", absl::Seconds(1)), "v");
  auto again = MustConnect(server->port(), token);
  ASSERT_NE(again, nullptr);
  EXPECT_EQ(*again->Get("k", absl::Seconds(1)), "v");
}

TEST(TcpStoreTest, ServerRunsNoCommandForAStranger) {
  LogSink log;
  std::string token = NewToken();
  auto server = StartServer(token, &log);
  // A stranger that skips the handshake and sends a well-formed Set.
  int fd = RawConnect(server->port());
  wire::Request set;
  set.op = wire::MessageType::kSet;
  set.keys = {"planted"};
  set.value = "evil";
  SendRaw(fd, wire::EncodeRequest(set));
  std::string reply = ReadUntilClosed(fd);
  close(fd);
  // All it got was the greeting (a Hello frame), never a Response.
  auto split = wire::SplitFrame(reply, wire::kMaxHandshakeFrameBytes);
  ASSERT_TRUE(split.ok() && split->complete);
  EXPECT_TRUE(wire::ParseHello(split->body).ok());
  EXPECT_EQ(split->consumed, reply.size());
  auto c = MustConnect(server->port(), token);
  EXPECT_EQ(c->Get("planted", absl::ZeroDuration()).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(log.WaitFor("malformed handshake")) << log.All();
}

TEST(TcpStoreTest, StrangersSendingGarbageDoNotDisturbAGoodClient) {
  LogSink log;
  std::string token = NewToken();
  auto server = StartServer(token, &log, 0, absl::Milliseconds(500));
  auto good = MustConnect(server->port(), token);
  std::atomic<bool> done{false};
  std::atomic<int> adds{0};
  std::thread worker([&] {
    while (!done.load()) {
      auto v = good->Add("busy", 1);
      ASSERT_TRUE(v.ok()) << v.status();
      ++adds;
    }
  });
  std::vector<std::function<void(int)>> strangers = {
      // Plain text, as from a browser or a port scanner.
      [](int fd) { SendRaw(fd, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"); },
      // A frame announcing 4 GiB.
      [](int fd) { SendRaw(fd, std::string("\xff\xff\xff\xff", 4) + "junk"); },
      // Half a frame, then close (our sending side; we still read what the server says).
      [](int fd) {
        SendRaw(fd, std::string("\x00\x00\x00\x41\x02", 5) + std::string(20, 'a'));
        shutdown(fd, SHUT_WR);
      },
      // A well-formed Auth with a made-up proof.
      [](int fd) {
        wire::Auth a;
        a.nonce.fill(1);
        a.mac.fill(2);
        SendRaw(fd, wire::EncodeAuth(a));
      },
      // Connects and says nothing: dropped after the handshake timeout.
      [](int) {},
      // Random bytes.
      [](int fd) {
        std::mt19937 rng(3);
        std::string junk(3000, '\0');
        for (auto& ch : junk) ch = static_cast<char>(rng());
        SendRaw(fd, junk);
      },
  };
  for (size_t i = 0; i < strangers.size(); ++i) {
    SCOPED_TRACE(absl::StrCat("stranger ", i));
    int fd = RawConnect(server->port());
    strangers[i](fd);
    auto t0 = Clock::now();
    std::string got = ReadUntilClosed(fd);
    EXPECT_LT(SecondsSince(t0), 4) << "the server did not close the stranger's connection";
    close(fd);
    // It received the greeting and at most an AuthFail: no data.
    auto first = wire::SplitFrame(got, wire::kMaxHandshakeFrameBytes);
    ASSERT_TRUE(first.ok() && first->complete);
    EXPECT_TRUE(wire::ParseHello(first->body).ok());
    std::string rest = got.substr(first->consumed);
    if (!rest.empty()) {
      auto second = wire::SplitFrame(rest, wire::kMaxHandshakeFrameBytes);
      ASSERT_TRUE(second.ok() && second->complete);
      auto result = wire::ParseAuthResult(second->body);
      ASSERT_TRUE(result.ok());
      EXPECT_FALSE(result->ok);
    }
  }
  // A stranger that connects and closes at once.
  close(RawConnect(server->port()));
  const int kStrangers = static_cast<int>(strangers.size()) + 1;
  EXPECT_TRUE(WaitUntil([&] { return server->stats().rejected == kStrangers; }))
      << server->stats().rejected << "\n"
      << log.All();
  done = true;
  worker.join();
  EXPECT_GT(adds.load(), 0);
  EXPECT_EQ(*good->Get("busy", absl::Seconds(1)), std::to_string(adds.load()));
  // Every stranger left a log line with its address.
  EXPECT_EQ(log.Count("rejected connection from 127.0.0.1:"), kStrangers) << log.All();
  EXPECT_EQ(log.Count("did not authenticate within 500ms"), 1) << log.All();
  EXPECT_EQ(log.Count("wrong job token"), 1) << log.All();
  EXPECT_EQ(log.Count("connection closed after 21 of 65 bytes"), 1) << log.All();
  EXPECT_EQ(log.Count("over the 256-byte limit"), 3) << log.All();
  EXPECT_EQ(server->stats().authenticated, 1);
  EXPECT_TRUE(WaitUntil([&] { return server->stats().open == 1; }));
}

TEST(TcpStoreTest, MalformedFramesFromAnAuthenticatedPeerCloseOnlyThatConnection) {
  LogSink log;
  std::string token = NewToken();
  auto server = StartServer(token, &log);
  auto good = MustConnect(server->port(), token);

  // The raw peer speaks the protocol correctly first...
  int fd = RawAuthenticated(server->port(), token);
  wire::Request add;
  add.op = wire::MessageType::kAdd;
  add.keys = {"n"};
  add.delta = 5;
  SendRaw(fd, wire::EncodeRequest(add));
  auto resp = wire::ParseResponse(ReadFrameBody(fd));
  ASSERT_TRUE(resp.ok()) << resp.status();
  EXPECT_EQ(resp->number, 5);
  // ...then sends an unknown message type.
  SendRaw(fd, std::string("\x00\x00\x00\x01\x4d", 5));
  EXPECT_EQ(ReadUntilClosed(fd), "");
  close(fd);

  // A frame over the size limit, announced after authentication.
  fd = RawAuthenticated(server->port(), token);
  uint32_t huge = static_cast<uint32_t>(wire::kMaxFrameBytes + 1);
  std::string header = {static_cast<char>(huge >> 24), static_cast<char>(huge >> 16),
                        static_cast<char>(huge >> 8), static_cast<char>(huge)};
  SendRaw(fd, header);
  EXPECT_EQ(ReadUntilClosed(fd), "");
  close(fd);

  // A Set whose value length runs past the end of its frame.
  fd = RawAuthenticated(server->port(), token);
  SendRaw(fd, std::string("\x00\x00\x00\x0b\x10\x00\x00\x00\x01k\x00\x00\x01\x00v", 15));
  EXPECT_EQ(ReadUntilClosed(fd), "");
  close(fd);

  EXPECT_TRUE(WaitUntil([&] { return server->stats().malformed == 3; })) << log.All();
  EXPECT_EQ(log.Count("malformed frame"), 3) << log.All();
  EXPECT_EQ(*good->Add("n", 1), 6);
}

TEST(TcpStoreTest, ServerNoticesAWaiterThatWentAway) {
  LogSink log;
  std::string token = NewToken();
  auto server = StartServer(token, &log);
  int fd = RawAuthenticated(server->port(), token);
  wire::Request get;
  get.op = wire::MessageType::kGet;
  get.keys = {"never"};
  get.timeout_ms = 600000;
  SendRaw(fd, wire::EncodeRequest(get));
  EXPECT_TRUE(WaitUntil([&] { return server->stats().open == 1; }));
  close(fd);
  // The server thread gives up the 10-minute wait within its re-check interval.
  EXPECT_TRUE(WaitUntil([&] { return server->stats().open == 0; }, 3)) << server->stats().open;
}

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
  auto t0 = Clock::now();
  auto c = Connect(port, NewToken(), absl::Seconds(20));
  fake.join();
  close(lfd);
  ASSERT_FALSE(c.ok());
  EXPECT_LT(SecondsSince(t0), 5);
  EXPECT_THAT(c.status().message(), HasSubstr("is not a Braid store"));
  EXPECT_THAT(c.status().message(), HasSubstr("MASTER_ADDR/MASTER_PORT"));
}

TEST(TcpStoreTest, ClientRetriesUntilALateServerStarts) {
  LogSink log;
  std::string token = NewToken();
  HeldPort held;
  int port = held.port();
  absl::StatusOr<std::unique_ptr<TcpStoreClient>> client = absl::UnknownError("not run");
  auto t0 = Clock::now();
  std::thread connector([&] { client = Connect(port, token, absl::Seconds(20)); });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  auto server = StartServer(token, &log, port);
  ASSERT_NE(server, nullptr) << "port " << port;
  connector.join();
  ASSERT_TRUE(client.ok()) << client.status();
  double took = SecondsSince(t0);
  EXPECT_GE(took, 0.3);
  // Back-off is capped at 1 s, so the client notices the server soon after it comes up: far
  // sooner than its 20 s deadline (the bound leaves room for a loaded machine, not for waiting).
  EXPECT_LT(took, 10);
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
  EXPECT_GE(took, 0.69);
  EXPECT_LT(took, 10);  // ends at its deadline: no hang (room for a loaded machine)
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
  auto server = StartServer(token, &log);
  auto blocked = MustConnect(server->port(), token);
  auto idle = MustConnect(server->port(), token);
  int silent = RawConnect(server->port());  // a stranger mid-handshake
  ASSERT_TRUE(idle->Set("k", "v").ok());
  absl::StatusOr<std::string> got = absl::UnknownError("not run");
  std::thread getter([&] { got = blocked->Get("never-set", absl::Seconds(60)); });
  EXPECT_TRUE(WaitUntil([&] { return server->stats().open == 3; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // let the Get reach the server

  auto t0 = Clock::now();
  server->Stop();
  // Far below the Get's 60 s: Stop ended it rather than letting it time out.
  EXPECT_LT(SecondsSince(t0), 30);
  getter.join();
  EXPECT_LT(SecondsSince(t0), 30);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), absl::StatusCode::kUnavailable) << got.status();
  EXPECT_THAT(got.status().message(), HasSubstr("'never-set'"));

  absl::Status st = idle->Set("k2", "v");
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable) << st;
  EXPECT_THAT(st.message(), HasSubstr("lost the connection to the Braid store at 127.0.0.1:"));
  // Once broken, a client fails at once with the same explanation.
  EXPECT_EQ(idle->Get("k", absl::Seconds(30)).status().message(), st.message());
  // The stranger got its greeting and then, at Stop, the end of the connection.
  t0 = Clock::now();
  std::string greeting = ReadUntilClosed(silent);
  EXPECT_LT(SecondsSince(t0), 5);  // Stop closed it, before the 10 s handshake timeout would
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

TEST(TcpStoreTest, ServesIpv6Loopback) {
  LogSink log;
  std::string token = NewToken();
  TcpStoreServer::Options o;
  o.host = "::1";
  o.token = token;
  o.log = log.fn();
  auto server = TcpStoreServer::Start(o);
  // Runs only where third_party/host found an IPv6 loopback (tcp_store_test_ipv6).
  ASSERT_TRUE(server.ok()) << "no IPv6 loopback here: " << server.status();
  TcpStoreClient::Options co;
  co.host = "::1";
  co.port = (*server)->port();
  co.token = token;
  co.connect_timeout = absl::Seconds(5);
  auto c = TcpStoreClient::Connect(co);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ((*c)->address(), absl::StrCat("[::1]:", (*server)->port()));
  EXPECT_EQ(*(*c)->Add("v6", 4), 4);
}

// The store behind a PrefixStore, as the communicators use it.
TEST(TcpStoreTest, WorksBehindAPrefixStore) {
  LogSink log;
  std::string token = NewToken();
  auto server = StartServer(token, &log);
  auto c = MustConnect(server->port(), token);
  PrefixStore group("group0", c.get());
  ASSERT_TRUE(group.Set("addr/1", "x").ok());
  EXPECT_EQ(*c->Get("group0/addr/1", absl::Seconds(1)), "x");
  EXPECT_TRUE(group.Wait({"addr/1"}, absl::Seconds(1)).ok());
}

}  // namespace
}  // namespace braid
