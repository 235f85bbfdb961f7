#include "backends/store/tcp_store.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <list>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "backends/store/auth.h"
#include "backends/store/frame.h"
#include "core/check.h"

namespace braid {

namespace {

namespace wire = store_wire;

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;
constexpr Deadline kNever = Deadline::max();

// A stuck peer (one that stops reading) may hold a server thread this long at most.
constexpr auto kServerSendTimeout = std::chrono::minutes(2);
// A Get/Wait re-checks whether its client is still there this often, so that a client that
// gave up does not leave a server thread waiting out a long timeout.
constexpr auto kWaitSlice = std::chrono::milliseconds(200);
// One connection attempt may take this long before the next try (a SYN to an unreachable host
// would otherwise block for the kernel's ~2 minutes).
constexpr auto kConnectAttemptTimeout = std::chrono::seconds(10);
constexpr auto kFirstBackoff = std::chrono::milliseconds(20);
constexpr auto kMaxBackoff = std::chrono::seconds(1);
// The body of a frame grows as its bytes arrive, in steps of this, so a peer that announces a
// large frame and then stalls costs memory only for what it actually sent.
constexpr size_t kReadChunk = 1 << 20;

Deadline After(absl::Duration d) {
  if (d == absl::InfiniteDuration()) return kNever;
  if (d < absl::ZeroDuration()) d = absl::ZeroDuration();
  // Anything beyond a year is "never" for our purposes, and stays clear of overflow.
  if (d > absl::Hours(24 * 365)) return kNever;
  return Clock::now() + absl::ToChronoNanoseconds(d);
}

// poll()'s timeout for `d`: -1 for never, else the remaining milliseconds rounded up.
int PollMs(Deadline d) {
  if (d == kNever) return -1;
  auto left = d - Clock::now();
  if (left <= Clock::duration::zero()) return 0;
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(left).count() + 1;
  return static_cast<int>(std::min<int64_t>(ms, INT_MAX));
}

std::string ErrnoText(int e) { return std::strerror(e); }

std::string HostPort(const std::string& host, int port) {
  if (host.find(':') != std::string::npos) return absl::StrCat("[", host, "]:", port);
  return absl::StrCat(host, ":", port);
}

std::string PeerAddress(const sockaddr* sa, socklen_t len) {
  char host[NI_MAXHOST], serv[NI_MAXSERV];
  if (getnameinfo(sa, len, host, sizeof(host), serv, sizeof(serv),
                  NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
    return "an unknown address";
  }
  int port = 0;
  if (!absl::SimpleAtoi(serv, &port)) port = 0;
  return HostPort(host, port);
}

void SetNoDelay(int fd) {
  // Requests and answers are small and strictly alternate: Nagle plus delayed ACKs would add
  // ~40 ms to every round trip.
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

absl::Status SendAll(int fd, absl::string_view data, Deadline d) {
  size_t sent = 0;
  while (sent < data.size()) {
    // MSG_NOSIGNAL: a peer that closed must cost us an EPIPE, never a SIGPIPE that kills the
    // launcher.
    ssize_t n = send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
      return absl::UnavailableError(absl::StrCat("send failed: ", ErrnoText(errno)));
    }
    int ms = PollMs(d);
    pollfd p{fd, POLLOUT, 0};
    int r = ms == 0 ? 0 : poll(&p, 1, ms);
    if (r == 0) {
      return absl::DeadlineExceededError(
          absl::StrCat("send timed out after ", sent, " of ", data.size(), " bytes"));
    }
    if (r < 0 && errno != EINTR) {
      return absl::UnavailableError(absl::StrCat("poll failed: ", ErrnoText(errno)));
    }
  }
  return absl::OkStatus();
}

// Reads exactly n bytes. End of stream is Unavailable with *got telling how far it came.
absl::Status RecvExact(int fd, char* buf, size_t n, Deadline d, size_t* got) {
  *got = 0;
  while (*got < n) {
    ssize_t r = recv(fd, buf + *got, n - *got, 0);
    if (r > 0) {
      *got += static_cast<size_t>(r);
      continue;
    }
    if (r == 0) return absl::UnavailableError("connection closed by the peer");
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      return absl::UnavailableError(absl::StrCat("receive failed: ", ErrnoText(errno)));
    }
    int ms = PollMs(d);
    pollfd p{fd, POLLIN, 0};
    int pr = ms == 0 ? 0 : poll(&p, 1, ms);
    if (pr == 0) return absl::DeadlineExceededError("timed out waiting for data");
    if (pr < 0 && errno != EINTR) {
      return absl::UnavailableError(absl::StrCat("poll failed: ", ErrnoText(errno)));
    }
  }
  return absl::OkStatus();
}

// Reads one frame body. Errors: OutOfRange when the peer closed cleanly between frames (not worth
// a log line), InvalidArgument for a bad header (announced length 0 or over max_body),
// Unavailable when the stream broke mid-frame, DeadlineExceeded.
absl::StatusOr<std::string> ReadFrame(int fd, size_t max_body, Deadline d) {
  char header[wire::kFrameHeaderBytes];
  size_t got = 0;
  absl::Status st = RecvExact(fd, header, sizeof(header), d, &got);
  if (!st.ok()) {
    if (got == 0 && st.code() == absl::StatusCode::kUnavailable &&
        absl::StrContains(st.message(), "closed by the peer")) {
      return absl::OutOfRangeError("connection closed by the peer");
    }
    if (got > 0 && st.code() == absl::StatusCode::kUnavailable) {
      return absl::UnavailableError(
          absl::StrCat("connection closed after ", got, " bytes of a frame header"));
    }
    return st;
  }
  auto n = wire::DecodeFrameLength(absl::string_view(header, sizeof(header)), max_body);
  if (!n.ok()) return n.status();
  std::string body;
  size_t have = 0;
  while (have < *n) {
    size_t step = std::min(kReadChunk, *n - have);
    body.resize(have + step);
    st = RecvExact(fd, &body[have], step, d, &got);
    have += got;
    if (!st.ok()) {
      if (st.code() == absl::StatusCode::kUnavailable) {
        return absl::UnavailableError(absl::StrCat("connection closed after ", have, " of ", *n,
                                                   " bytes of a frame body (", st.message(), ")"));
      }
      return absl::Status(st.code(), absl::StrCat(st.message(), " after ", have, " of ", *n,
                                                  " bytes of a frame body"));
    }
  }
  return body;
}

// Keys in error messages: quoted, at most 16 of them.
std::string QuoteKeys(const std::vector<std::string>& keys) {
  constexpr size_t kShown = 16;
  std::vector<std::string> shown;
  for (size_t i = 0; i < keys.size() && i < kShown; ++i) shown.push_back("'" + keys[i] + "'");
  std::string s = absl::StrJoin(shown, ", ");
  if (keys.size() > kShown) absl::StrAppend(&s, " and ", keys.size() - kShown, " more");
  return s;
}

std::string Describe(const wire::Request& r) {
  return absl::StrCat(wire::MessageTypeName(static_cast<uint8_t>(r.op)), "(", QuoteKeys(r.keys),
                      ")");
}

int64_t ToTimeoutMs(absl::Duration d) {
  if (d <= absl::ZeroDuration()) return 0;
  if (d >= absl::Milliseconds(wire::kMaxTimeoutMs)) return wire::kMaxTimeoutMs;
  return absl::ToInt64Milliseconds(d);
}

// Which process listens on `port` (this network namespace), from /proc: "pid 42 (launcher)", or
// "" when nothing visible listens there. Best effort: it only makes the error friendlier.
std::string DescribePortHolder(int port) {
  namespace fs = std::filesystem;
  std::set<std::string> inodes;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // column titles
    while (std::getline(in, line)) {
      std::vector<std::string> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
      if (f.size() < 10 || f[3] != "0A") continue;  // 0A: LISTEN
      size_t colon = f[1].rfind(':');
      if (colon == std::string::npos) continue;
      int local_port = static_cast<int>(std::strtol(f[1].c_str() + colon + 1, nullptr, 16));
      if (local_port == port) inodes.insert("socket:[" + f[9] + "]");
    }
  }
  if (inodes.empty()) return "";
  std::error_code ec;
  for (fs::directory_iterator proc("/proc", ec), end; !ec && proc != end; proc.increment(ec)) {
    std::string pid = proc->path().filename().string();
    if (pid.empty() ||
        !std::all_of(pid.begin(), pid.end(), [](char ch) { return ch >= '0' && ch <= '9'; }))
      continue;
    std::error_code fd_ec;
    for (fs::directory_iterator fd(proc->path() / "fd", fd_ec), fd_end; !fd_ec && fd != fd_end;
         fd.increment(fd_ec)) {
      std::error_code link_ec;
      fs::path target = fs::read_symlink(fd->path(), link_ec);
      if (link_ec || !inodes.count(target.string())) continue;
      std::string comm;
      std::ifstream(proc->path() / "comm") >> comm;
      return absl::StrCat("pid ", pid, comm.empty() ? "" : absl::StrCat(" (", comm, ")"));
    }
  }
  return "a process this user cannot inspect";
}

}  // namespace

// ---- Job token ----------------------------------------------------------------------------------

absl::StatusOr<std::string> GenerateJobToken() {
  uint8_t bytes[32];
  BRAID_RETURN_IF_ERROR(wire::RandomBytes(bytes, sizeof(bytes)));
  return absl::BytesToHexString(absl::string_view(reinterpret_cast<char*>(bytes), sizeof(bytes)));
}

// ---- Server -------------------------------------------------------------------------------------

class TcpStoreServer::Impl {
 public:
  explicit Impl(Options options) : options_(std::move(options)) {}
  ~Impl() { Stop(); }

  absl::Status Listen();
  void Stop();
  int port() const { return port_; }
  const std::string& host() const { return options_.host; }
  Stats stats() const {
    std::lock_guard<std::mutex> lock(conns_mu_);
    return stats_;
  }

 private:
  struct Connection {
    int fd = -1;  // closed by the connection's own thread, which then sets it to -1
    std::string peer;
    std::thread thread;
    bool done = false;
  };

  void AcceptLoop();
  void Serve(Connection* c);
  bool Handshake(int fd, const std::string& peer);
  void Reject(const std::string& peer, const std::string& why);
  wire::Response Execute(const wire::Request& r, int fd);
  absl::Status WaitForKeys(const std::vector<std::string>& keys, int64_t timeout_ms, int fd,
                           std::unique_lock<std::mutex>& lock);
  void ReapFinished();
  void Log(const std::string& msg) const;

  Options options_;
  int port_ = 0;
  std::string address_;  // host:port, in log lines
  int listen_fd_ = -1;
  int wake_pipe_[2] = {-1, -1};  // Stop() writes to it to end the accept loop's poll
  std::thread accept_thread_;
  std::atomic<bool> stopping_{false};
  std::mutex stop_mu_;
  bool stopped_ = false;

  mutable std::mutex conns_mu_;
  std::list<Connection> conns_;  // a list: Serve() keeps a pointer to its element
  Stats stats_;                  // guarded by conns_mu_

  // The data; every change wakes the waiters on data_cv_.
  std::mutex data_mu_;
  std::condition_variable data_cv_;
  std::map<std::string, std::string> data_;
};

void TcpStoreServer::Impl::Log(const std::string& msg) const {
  std::string line = absl::StrCat("braid store ", address_, ": ", msg);
  if (options_.log) {
    options_.log(line);
  } else {
    line += "\n";
    std::fwrite(line.data(), 1, line.size(), stderr);
  }
}

absl::Status TcpStoreServer::Impl::Listen() {
  address_ = HostPort(options_.host, options_.port);
  if (options_.token.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot start the Braid store on ", address_,
        ": empty job token (pass one, e.g. from GenerateJobToken() or ", kJobTokenEnv, ")"));
  }
  if (options_.port < 0 || options_.port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("store port ", options_.port, " is not a port number (0 to 65535)"));
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  std::string port_str = std::to_string(options_.port);
  int gai = getaddrinfo(options_.host.empty() ? nullptr : options_.host.c_str(), port_str.c_str(),
                        &hints, &res);
  if (gai != 0) {
    return absl::InvalidArgumentError(absl::StrCat("cannot start the Braid store on ", address_,
                                                   ": cannot resolve '", options_.host,
                                                   "': ", gai_strerror(gai)));
  }
  // CLOEXEC on every socket: the launcher forks workers, and an inherited listener would keep the
  // port bound after the launcher is gone.
  int fd = socket(res->ai_family, res->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    int e = errno;
    freeaddrinfo(res);
    return absl::InternalError(absl::StrCat("store ", address_, ": socket: ", ErrnoText(e)));
  }
  // SO_REUSEADDR lets a restarted launcher rebind while old connections sit in TIME_WAIT; it does
  // not allow two listeners on one port.
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  int rc = bind(fd, res->ai_addr, res->ai_addrlen);
  int e = errno;
  freeaddrinfo(res);
  if (rc != 0) {
    close(fd);
    if (e == EADDRINUSE) {
      std::string holder = DescribePortHolder(options_.port);
      return absl::AlreadyExistsError(absl::StrCat(
          "cannot start the Braid store on ", address_, ": port ", options_.port,
          " is already in use", holder.empty() ? "" : absl::StrCat(" (held by ", holder, ")"),
          ". Another job, or an earlier run of this one, may still be serving there: stop it or "
          "choose another --master_port"));
    }
    if (e == EADDRNOTAVAIL) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cannot start the Braid store on ", address_, ": '", options_.host,
          "' is not an address of this machine (the master address must be one of node 0's)"));
    }
    return absl::UnavailableError(
        absl::StrCat("cannot start the Braid store on ", address_, ": bind: ", ErrnoText(e)));
  }
  if (listen(fd, 1024) != 0) {
    e = errno;
    close(fd);
    return absl::UnavailableError(
        absl::StrCat("cannot start the Braid store on ", address_, ": listen: ", ErrnoText(e)));
  }
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
  port_ = ntohs(ss.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port
                                         : reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  address_ = HostPort(options_.host, port_);
  if (pipe2(wake_pipe_, O_CLOEXEC | O_NONBLOCK) != 0) {
    e = errno;
    close(fd);
    return absl::InternalError(absl::StrCat("store ", address_, ": pipe: ", ErrnoText(e)));
  }
  listen_fd_ = fd;
  accept_thread_ = std::thread([this] { AcceptLoop(); });
  return absl::OkStatus();
}

void TcpStoreServer::Impl::AcceptLoop() {
  while (!stopping_.load()) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_pipe_[0], POLLIN, 0}};
    // The timeout only paces the reaping of finished connection threads.
    int r = poll(fds, 2, 1000);
    ReapFinished();
    if (stopping_.load()) break;
    if (r <= 0 || !(fds[0].revents & POLLIN)) continue;
    sockaddr_storage ss{};
    socklen_t len = sizeof(ss);
    int fd =
        accept4(listen_fd_, reinterpret_cast<sockaddr*>(&ss), &len, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        Log(absl::StrCat("cannot accept a connection: ", ErrnoText(errno),
                         " (retrying in 100 ms)"));
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
      continue;  // EAGAIN, EINTR, ECONNABORTED: nothing to do
    }
    std::string peer = PeerAddress(reinterpret_cast<sockaddr*>(&ss), len);
    std::lock_guard<std::mutex> lock(conns_mu_);
    if (stats_.open >= options_.max_connections) {
      ++stats_.rejected;
      close(fd);
      Log(absl::StrCat("refused connection from ", peer, ": already ", stats_.open,
                       " connections (the limit)"));
      continue;
    }
    SetNoDelay(fd);
    conns_.emplace_back();
    Connection* c = &conns_.back();
    c->fd = fd;
    c->peer = peer;
    try {
      c->thread = std::thread([this, c] { Serve(c); });
    } catch (const std::system_error& e) {
      close(fd);
      conns_.pop_back();
      ++stats_.rejected;
      Log(absl::StrCat("refused connection from ", peer, ": cannot start a thread (", e.what(),
                       ")"));
      continue;
    }
    ++stats_.accepted;
    ++stats_.open;
  }
}

void TcpStoreServer::Impl::ReapFinished() {
  std::list<Connection> finished;
  {
    std::lock_guard<std::mutex> lock(conns_mu_);
    for (auto it = conns_.begin(); it != conns_.end();) {
      auto next = std::next(it);
      if (it->done) finished.splice(finished.end(), conns_, it);
      it = next;
    }
  }
  for (auto& c : finished) c.thread.join();
}

void TcpStoreServer::Impl::Reject(const std::string& peer, const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(conns_mu_);
    ++stats_.rejected;
  }
  Log(absl::StrCat("rejected connection from ", peer, ": ", why));
}

bool TcpStoreServer::Impl::Handshake(int fd, const std::string& peer) {
  Deadline deadline = After(options_.handshake_timeout);
  auto nonce = wire::RandomNonce();
  if (!nonce.ok()) {
    Reject(peer, nonce.status().ToString());
    return false;
  }
  wire::Hello hello;
  hello.nonce = *nonce;
  absl::Status st = SendAll(fd, wire::EncodeHello(hello), deadline);
  if (!st.ok()) {
    Reject(peer, absl::StrCat("could not send the greeting: ", st.message()));
    return false;
  }
  auto body = ReadFrame(fd, wire::kMaxHandshakeFrameBytes, deadline);
  if (!body.ok()) {
    if (stopping_.load()) return false;
    switch (body.status().code()) {
      case absl::StatusCode::kDeadlineExceeded:
        Reject(peer, absl::StrCat("did not authenticate within ",
                                  absl::FormatDuration(options_.handshake_timeout)));
        break;
      case absl::StatusCode::kOutOfRange:
        Reject(peer, "closed the connection without authenticating");
        break;
      case absl::StatusCode::kInvalidArgument:
        Reject(peer, absl::StrCat("malformed handshake frame: ", body.status().message()));
        break;
      default:
        Reject(peer, absl::StrCat("handshake failed: ", body.status().message()));
    }
    return false;
  }
  auto auth = wire::ParseAuth(*body);
  if (!auth.ok()) {
    Reject(peer, absl::StrCat("malformed handshake frame: ", auth.status().message()));
    return false;
  }
  auto expected = wire::ClientProof(options_.token, *nonce, auth->nonce);
  if (!expected.ok()) {
    Reject(peer, expected.status().ToString());
    return false;
  }
  if (!wire::MacEquals(*expected, auth->mac)) {
    wire::AuthResult fail;
    fail.reason = "job token rejected";
    SendAll(fd, wire::EncodeAuthResult(fail), deadline).IgnoreError();
    Reject(peer, absl::StrCat("wrong job token (its proof does not match this job's ", kJobTokenEnv,
                              ")"));
    return false;
  }
  wire::AuthResult ok;
  ok.ok = true;
  auto proof = wire::ServerProof(options_.token, *nonce, auth->nonce);
  if (!proof.ok()) {
    Reject(peer, proof.status().ToString());
    return false;
  }
  ok.mac = *proof;
  st = SendAll(fd, wire::EncodeAuthResult(ok), deadline);
  if (!st.ok()) {
    Reject(peer, absl::StrCat("could not send the handshake's answer: ", st.message()));
    return false;
  }
  std::lock_guard<std::mutex> lock(conns_mu_);
  ++stats_.authenticated;
  return true;
}

void TcpStoreServer::Impl::Serve(Connection* c) {
  const int fd = c->fd;
  if (Handshake(fd, c->peer)) {
    while (!stopping_.load()) {
      // Authenticated clients may stay idle between requests for as long as the job runs.
      auto body = ReadFrame(fd, wire::kMaxFrameBytes, kNever);
      absl::Status bad;
      if (!body.ok()) {
        if (body.status().code() == absl::StatusCode::kOutOfRange || stopping_.load()) break;
        bad = body.status();
      } else {
        auto req = wire::ParseRequest(*body);
        if (req.ok()) {
          std::string reply = wire::EncodeResponse(Execute(*req, fd));
          absl::Status st = SendAll(fd, reply, Clock::now() + kServerSendTimeout);
          if (st.ok()) continue;
          if (!stopping_.load()) {
            Log(absl::StrCat("dropped client ", c->peer, ": ", st.message()));
          }
          break;
        }
        bad = req.status();
      }
      if (bad.code() == absl::StatusCode::kInvalidArgument) {
        std::lock_guard<std::mutex> lock(conns_mu_);
        ++stats_.malformed;
      }
      Log(absl::StrCat("closed connection from ", c->peer, ": ",
                       bad.code() == absl::StatusCode::kInvalidArgument ? "malformed frame: " : "",
                       bad.message()));
      break;
    }
  }
  std::lock_guard<std::mutex> lock(conns_mu_);
  close(fd);
  c->fd = -1;
  c->done = true;
  --stats_.open;
}

absl::Status TcpStoreServer::Impl::WaitForKeys(const std::vector<std::string>& keys,
                                               int64_t timeout_ms, int fd,
                                               std::unique_lock<std::mutex>& lock) {
  Deadline deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    std::vector<std::string> missing;
    for (const auto& k : keys) {
      if (!data_.count(k)) missing.push_back(k);
    }
    if (missing.empty()) return absl::OkStatus();
    if (stopping_.load()) return absl::UnavailableError("the store is shutting down");
    Deadline now = Clock::now();
    if (now >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "waited ", absl::FormatDuration(absl::Milliseconds(timeout_ms)), " for ",
          missing.size() == 1 ? "key " : "keys ", QuoteKeys(missing),
          ", which no client has set (a rank that has not arrived, or a different key name)"));
    }
    data_cv_.wait_until(lock, std::min(deadline, now + kWaitSlice));
    char b;
    ssize_t r = recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
      return absl::CancelledError("the client went away");
    }
  }
}

wire::Response TcpStoreServer::Impl::Execute(const wire::Request& r, int fd) {
  wire::Response out;
  auto fail = [&out](const absl::Status& st) {
    out.code = st.code();
    out.text = std::string(st.message());
  };
  const std::string& key = r.keys[0];
  std::unique_lock<std::mutex> lock(data_mu_);
  switch (r.op) {
    case wire::MessageType::kSet:
      data_[key] = r.value;
      lock.unlock();
      data_cv_.notify_all();
      break;
    case wire::MessageType::kGet: {
      absl::Status st = WaitForKeys(r.keys, r.timeout_ms, fd, lock);
      if (st.ok()) {
        out.text = data_[key];
      } else {
        fail(st);
      }
      break;
    }
    case wire::MessageType::kWait: {
      absl::Status st = WaitForKeys(r.keys, r.timeout_ms, fd, lock);
      if (!st.ok()) fail(st);
      break;
    }
    case wire::MessageType::kAdd: {
      int64_t v = 0;
      auto it = data_.find(key);
      if (it != data_.end() && !absl::SimpleAtoi(it->second, &v)) {
        fail(absl::FailedPreconditionError(absl::StrCat(
            "Add on key '", key, "' whose value ('", absl::CHexEscape(it->second.substr(0, 32)),
            it->second.size() > 32 ? "...')" : "')", " is not an integer")));
        break;
      }
      if (__builtin_add_overflow(v, r.delta, &v)) {
        fail(absl::OutOfRangeError(
            absl::StrCat("Add of ", r.delta, " to key '", key, "' overflows 64 bits")));
        break;
      }
      data_[key] = std::to_string(v);
      out.number = v;
      lock.unlock();
      data_cv_.notify_all();
      break;
    }
    case wire::MessageType::kCompareSet: {
      auto it = data_.find(key);
      const bool present = it != data_.end();
      if ((present ? it->second : std::string()) == r.expected) {
        data_[key] = r.value;
        out.text = r.value;
        lock.unlock();
        data_cv_.notify_all();
      } else {
        out.text = present ? it->second : "";
      }
      break;
    }
    default:  // kDelete (ParseRequest admits nothing else)
      data_.erase(key);
      break;
  }
  return out;
}

void TcpStoreServer::Impl::Stop() {
  std::lock_guard<std::mutex> stop_lock(stop_mu_);
  if (stopped_ || listen_fd_ < 0) return;
  stopped_ = true;
  stopping_.store(true);
  char b = 1;
  ssize_t ignored = write(wake_pipe_[1], &b, 1);
  (void)ignored;
  accept_thread_.join();
  close(listen_fd_);
  close(wake_pipe_[0]);
  close(wake_pipe_[1]);
  // No new connection can appear now; wake every connection thread: blocked reads and writes end
  // with shutdown(), waiters see stopping_ when notified.
  {
    std::lock_guard<std::mutex> lock(conns_mu_);
    for (auto& c : conns_) {
      if (c.fd >= 0) shutdown(c.fd, SHUT_RDWR);
    }
  }
  { std::lock_guard<std::mutex> lock(data_mu_); }
  data_cv_.notify_all();
  // Only this thread changes the list now (the accept loop has ended), so it can be walked
  // without the lock that the finishing threads need.
  for (auto& c : conns_) c.thread.join();
  conns_.clear();
}

TcpStoreServer::TcpStoreServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TcpStoreServer::~TcpStoreServer() = default;

absl::StatusOr<std::unique_ptr<TcpStoreServer>> TcpStoreServer::Start(Options options) {
  auto impl = std::make_unique<Impl>(std::move(options));
  BRAID_RETURN_IF_ERROR(impl->Listen());
  return std::unique_ptr<TcpStoreServer>(new TcpStoreServer(std::move(impl)));
}

void TcpStoreServer::Stop() { impl_->Stop(); }
int TcpStoreServer::port() const { return impl_->port(); }
const std::string& TcpStoreServer::host() const { return impl_->host(); }
TcpStoreServer::Stats TcpStoreServer::stats() const { return impl_->stats(); }

// ---- Client -------------------------------------------------------------------------------------

class TcpStoreClient::Impl {
 public:
  Impl(Options options, int fd, std::string address)
      : options_(std::move(options)), fd_(fd), address_(std::move(address)) {}
  ~Impl() {
    if (fd_ >= 0) close(fd_);
  }

  // One request, one answer; the answer's status carries the server's error, prefixed with our
  // address.
  absl::StatusOr<wire::Response> Call(const wire::Request& r);
  const std::string& address() const { return address_; }

 private:
  absl::Status Break(const wire::Request& r, const absl::Status& cause);

  Options options_;
  std::mutex mu_;  // one request on the wire at a time
  int fd_;         // -1 once broken: every later call fails at once with broken_
  std::string broken_;
  std::string address_;
};

absl::Status TcpStoreClient::Impl::Break(const wire::Request& r, const absl::Status& cause) {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
  broken_ = absl::StrCat("lost the connection to the Braid store at ", address_, " during ",
                         Describe(r), ": ", cause.message(),
                         ". The master process (node 0's launcher) may have exited, or the "
                         "network between the nodes failed");
  return absl::UnavailableError(broken_);
}

absl::StatusOr<wire::Response> TcpStoreClient::Impl::Call(const wire::Request& r) {
  BRAID_RETURN_IF_ERROR(wire::ValidateRequest(r));
  std::lock_guard<std::mutex> lock(mu_);
  if (fd_ < 0) return absl::UnavailableError(broken_);
  absl::Status st = SendAll(fd_, wire::EncodeRequest(r), After(options_.io_timeout));
  if (!st.ok()) return Break(r, st);
  auto body = ReadFrame(fd_, wire::kMaxFrameBytes,
                        After(options_.io_timeout + absl::Milliseconds(r.timeout_ms)));
  if (!body.ok()) return Break(r, body.status());
  auto resp = wire::ParseResponse(*body);
  if (!resp.ok()) {
    return Break(r,
                 absl::InternalError(absl::StrCat("malformed answer: ", resp.status().message())));
  }
  if (resp->code != absl::StatusCode::kOk) {
    return absl::Status(resp->code,
                        absl::StrCat("store at ", address_, ": ", Describe(r), ": ", resp->text));
  }
  return resp;
}

namespace {

// One attempt to open a TCP connection to host:port (any of its addresses).
absl::StatusOr<int> Dial(const std::string& host, int port, Deadline deadline) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int gai = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
  if (gai != 0) {
    return absl::UnavailableError(absl::StrCat("cannot resolve '", host, "': ", gai_strerror(gai)));
  }
  std::string last = "no address";
  for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
      last = absl::StrCat("socket: ", ErrnoText(errno));
      continue;
    }
    int rc = connect(fd, ai->ai_addr, ai->ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      int pr;
      do {
        pr = poll(&p, 1, PollMs(deadline));
      } while (pr < 0 && errno == EINTR);
      int err = 0;
      socklen_t len = sizeof(err);
      if (pr == 0) {
        err = ETIMEDOUT;
      } else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) {
        err = errno;
      }
      rc = err == 0 ? 0 : -1;
      errno = err;
    }
    if (rc == 0) {
      freeaddrinfo(res);
      SetNoDelay(fd);
      return fd;
    }
    last = absl::StrCat("connect: ", ErrnoText(errno));
    close(fd);
  }
  freeaddrinfo(res);
  return absl::UnavailableError(last);
}

// The client's side of the handshake on a connected socket. Unavailable means "try again" (the
// server closed on us: starting, stopping, or full); any other error is final.
absl::Status ClientHandshake(int fd, const std::string& address, const std::string& token,
                             Deadline deadline) {
  auto body = ReadFrame(fd, wire::kMaxHandshakeFrameBytes, deadline);
  if (!body.ok()) {
    switch (body.status().code()) {
      case absl::StatusCode::kDeadlineExceeded:
        return absl::DeadlineExceededError(
            absl::StrCat("the service at ", address,
                         " sent no greeting: it is not a Braid store, or it is "
                         "overloaded (check MASTER_ADDR/MASTER_PORT)"));
      case absl::StatusCode::kInvalidArgument:
        return absl::FailedPreconditionError(
            absl::StrCat("the service at ", address, " is not a Braid store (",
                         body.status().message(), "): check MASTER_ADDR/MASTER_PORT"));
      default:
        return absl::UnavailableError(
            absl::StrCat("connection closed before the greeting (", body.status().message(), ")"));
    }
  }
  auto hello = wire::ParseHello(*body);
  if (!hello.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("the service at ", address, " is not a Braid store (",
                     hello.status().message(), "): check MASTER_ADDR/MASTER_PORT"));
  }
  if (hello->version != wire::kProtocolVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat("the Braid store at ", address, " speaks protocol version ", hello->version,
                     " and this client version ", wire::kProtocolVersion,
                     ": the launcher and the workers come from different Braid builds"));
  }
  wire::Auth auth;
  BRAID_ASSIGN_OR_RETURN(auth.nonce, wire::RandomNonce());
  BRAID_ASSIGN_OR_RETURN(auth.mac, wire::ClientProof(token, hello->nonce, auth.nonce));
  absl::Status st = SendAll(fd, wire::EncodeAuth(auth), deadline);
  if (!st.ok()) return absl::UnavailableError(absl::StrCat("sending Auth: ", st.message()));
  body = ReadFrame(fd, wire::kMaxHandshakeFrameBytes, deadline);
  if (!body.ok()) {
    return absl::UnavailableError(
        absl::StrCat("no answer to Auth (", body.status().message(), ")"));
  }
  auto result = wire::ParseAuthResult(*body);
  if (!result.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("the Braid store at ", address,
                     " answered Auth with a malformed frame: ", result.status().message()));
  }
  if (!result->ok) {
    return absl::PermissionDeniedError(
        absl::StrCat("job token rejected by the store at ", address, ": check ", kJobTokenEnv,
                     " (every node of a job must use the token of the launcher on node 0)"));
  }
  auto want = wire::ServerProof(token, hello->nonce, auth.nonce);
  if (!want.ok()) return want.status();
  if (!wire::MacEquals(*want, result->mac)) {
    return absl::PermissionDeniedError(
        absl::StrCat("the store at ", address,
                     " failed to prove it knows the job token: it belongs to "
                     "another job (a stale master on a reused port?) or ",
                     kJobTokenEnv, " differs between nodes"));
  }
  return absl::OkStatus();
}

}  // namespace

TcpStoreClient::TcpStoreClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TcpStoreClient::~TcpStoreClient() = default;

absl::StatusOr<std::unique_ptr<TcpStoreClient>> TcpStoreClient::Connect(Options options) {
  const std::string address = HostPort(options.host, options.port);
  if (options.token.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("cannot connect to the Braid store at ", address,
                                                   ": empty job token (", kJobTokenEnv,
                                                   " must hold the token of the job's launcher)"));
  }
  if (options.port < 1 || options.port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("cannot connect to the Braid store at ", address,
                                                   ": not a port number (1 to 65535)"));
  }
  const Deadline deadline = After(options.connect_timeout);
  auto backoff = std::chrono::duration_cast<Clock::duration>(kFirstBackoff);
  int attempts = 0;
  std::string last_error;
  for (;;) {
    ++attempts;
    auto fd =
        Dial(options.host, options.port, std::min(deadline, Clock::now() + kConnectAttemptTimeout));
    if (fd.ok()) {
      // The handshake gets at least a few seconds even when the connect deadline is nearly spent:
      // the server is there, so its answer is worth waiting for.
      Deadline hs = std::max(deadline, Clock::now() + std::chrono::seconds(5));
      hs = std::min(hs, After(options.io_timeout));
      absl::Status st = ClientHandshake(*fd, address, options.token, hs);
      if (st.ok()) {
        auto impl = std::make_unique<Impl>(options, *fd, address);
        return std::unique_ptr<TcpStoreClient>(new TcpStoreClient(std::move(impl)));
      }
      close(*fd);
      if (st.code() != absl::StatusCode::kUnavailable) return st;
      last_error = std::string(st.message());
    } else {
      last_error = std::string(fd.status().message());
    }
    Deadline now = Clock::now();
    if (now >= deadline) break;
    std::this_thread::sleep_for(std::min(backoff, deadline - now));
    backoff = std::min(backoff * 2, std::chrono::duration_cast<Clock::duration>(kMaxBackoff));
  }
  return absl::UnavailableError(
      absl::StrCat("could not connect to the Braid store at ", address, " within ",
                   absl::FormatDuration(options.connect_timeout), " (", attempts,
                   " attempts; last error: ", last_error,
                   "). The master (node 0's launcher) may be down or not started yet, unreachable "
                   "from this node, or MASTER_ADDR/MASTER_PORT may be wrong"));
}

const std::string& TcpStoreClient::address() const { return impl_->address(); }

absl::Status TcpStoreClient::Set(const std::string& key, const std::string& value) {
  wire::Request r;
  r.op = wire::MessageType::kSet;
  r.keys = {key};
  r.value = value;
  return impl_->Call(r).status();
}

absl::StatusOr<std::string> TcpStoreClient::Get(const std::string& key, absl::Duration timeout) {
  wire::Request r;
  r.op = wire::MessageType::kGet;
  r.keys = {key};
  r.timeout_ms = ToTimeoutMs(timeout);
  BRAID_ASSIGN_OR_RETURN(wire::Response resp, impl_->Call(r));
  return std::move(resp.text);
}

absl::Status TcpStoreClient::Wait(const std::vector<std::string>& keys, absl::Duration timeout) {
  wire::Request r;
  r.op = wire::MessageType::kWait;
  r.keys = keys;
  r.timeout_ms = ToTimeoutMs(timeout);
  return impl_->Call(r).status();
}

absl::StatusOr<int64_t> TcpStoreClient::Add(const std::string& key, int64_t delta) {
  wire::Request r;
  r.op = wire::MessageType::kAdd;
  r.keys = {key};
  r.delta = delta;
  BRAID_ASSIGN_OR_RETURN(wire::Response resp, impl_->Call(r));
  return resp.number;
}

absl::StatusOr<std::string> TcpStoreClient::CompareSet(const std::string& key,
                                                       const std::string& expected,
                                                       const std::string& desired) {
  wire::Request r;
  r.op = wire::MessageType::kCompareSet;
  r.keys = {key};
  r.expected = expected;
  r.value = desired;
  BRAID_ASSIGN_OR_RETURN(wire::Response resp, impl_->Call(r));
  return std::move(resp.text);
}

absl::Status TcpStoreClient::Delete(const std::string& key) {
  wire::Request r;
  r.op = wire::MessageType::kDelete;
  r.keys = {key};
  return impl_->Call(r).status();
}

absl::StatusOr<std::unique_ptr<TcpStoreClient>> ConnectStoreFromEnv(
    absl::Duration connect_timeout) {
  auto env = [](const char* name) -> absl::StatusOr<std::string> {
    const char* v = std::getenv(name);
    if (v == nullptr || *v == '\0') {
      return absl::FailedPreconditionError(
          absl::StrCat(name, " is not set: workers get ", kMasterAddrEnv, ", ", kMasterPortEnv,
                       " and ", kJobTokenEnv, " from the launcher (bazel run //launcher -- ...)"));
    }
    return std::string(v);
  };
  TcpStoreClient::Options o;
  BRAID_ASSIGN_OR_RETURN(o.host, env(kMasterAddrEnv));
  BRAID_ASSIGN_OR_RETURN(std::string port, env(kMasterPortEnv));
  BRAID_ASSIGN_OR_RETURN(o.token, env(kJobTokenEnv));
  if (!absl::SimpleAtoi(port, &o.port) || o.port < 1 || o.port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat(kMasterPortEnv, "='", port, "' is not a port number (1 to 65535)"));
  }
  o.connect_timeout = connect_timeout;
  return TcpStoreClient::Connect(std::move(o));
}

}  // namespace braid
