// Helpers shared by the TCP store's tests (tcp_store_test.cc, tcp_store_failure_test.cc): bounded
// waiting, a sink for the server's log, starting a server and connecting clients on loopback, and
// raw sockets with which a test plays strangers and hand-made peers.
#ifndef BRAID_BACKENDS_STORE_TEST_UTIL_H_
#define BRAID_BACKENDS_STORE_TEST_UTIL_H_

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "backends/store/tcp_store.h"

namespace braid::store_test {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point t0);

// Polls `pred` until it holds or `seconds` pass (bounded: tests never hang on a broken server).
bool WaitUntil(const std::function<bool()>& pred, double seconds = 10);

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

std::string NewToken();

std::unique_ptr<TcpStoreServer> StartServer(const std::string& token, LogSink* sink, int port = 0,
                                            absl::Duration handshake = absl::Seconds(10));

absl::StatusOr<std::unique_ptr<TcpStoreClient>> Connect(
    int port, const std::string& token, absl::Duration timeout = absl::Seconds(10));

std::unique_ptr<TcpStoreClient> MustConnect(int port, const std::string& token);

// ---- Raw sockets: the test plays strangers and hand-made peers ------------------------------

// A blocking loopback socket whose reads give up after 5 s.
int RawConnect(int port);

void SendRaw(int fd, const std::string& bytes);

// Everything the peer sends until it closes (or 5 s of silence).
std::string ReadUntilClosed(int fd);

// One frame body, or "" when the peer closed or fell silent.
std::string ReadFrameBody(int fd);

}  // namespace braid::store_test

#endif  // BRAID_BACKENDS_STORE_TEST_UTIL_H_
