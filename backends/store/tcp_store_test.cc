// The TCP store's behaviour with well-behaved clients and its defences against the rest: results
// against InMemoryStore, size limits, racing Adds and CompareSets, blocking Get/Wait and their
// timeouts, authentication, strangers and malformed frames, IPv6, and use behind a PrefixStore.
// Connecting, retrying, failing and stopping are in tcp_store_failure_test.cc; the helpers both
// share are in test_util.h.
#include "backends/store/tcp_store.h"

#include <arpa/inet.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "backends/store/auth.h"
#include "backends/store/frame.h"
#include "backends/store/test_util.h"
#include "core/store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace braid::store_test {
namespace {

namespace wire = store_wire;
using ::testing::HasSubstr;
using ::testing::Not;

// Holds each of n threads until all n have arrived, so that their requests really race.
void StartTogether(std::atomic<int>& ready, int n) {
  ++ready;
  WaitUntil([&] { return ready.load() >= n; });
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
  EXPECT_GE(SecondsSince(t0), 0.2);  // (a hang is the test's timeout's to catch)
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
  EXPECT_GE(took, 0.29);  // not before the deadline; a hang is the test's timeout's to catch

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

  auto bad = Connect(server->port(), NewToken(), absl::Seconds(30));
  ASSERT_FALSE(bad.ok());
  // No retrying a rejection: PermissionDenied, not the connect timeout's DeadlineExceeded after
  // 30 s.
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
    // The server closes it (a connection it never closed would hang here, for the test's timeout
    // to catch).
    std::string got = ReadUntilClosed(fd);
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
}  // namespace braid::store_test
