// The store's server: the key-value service that node 0's launcher runs (TcpStoreServer), and
// GenerateJobToken for the token it checks. Split from the client (tcp_store_client.cc), which
// workers use and which shares only store_io.h, frame.h and auth.h with it; the protocol is
// described in tcp_store.h.
#include "backends/store/tcp_store.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <list>
#include <map>
#include <mutex>
#include <set>
#include <system_error>
#include <thread>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "backends/store/auth.h"
#include "backends/store/frame.h"
#include "backends/store/server_handshake.h"
#include "backends/store/store_io.h"
#include "core/check.h"

namespace braid {

namespace {

namespace wire = store_wire;

using store_io::After;
using store_io::Clock;
using store_io::Deadline;
using store_io::ErrnoText;
using store_io::HostPort;
using store_io::kNever;
using store_io::QuoteKeys;
using store_io::ReadFrame;
using store_io::SendAll;
using store_io::SetNoDelay;

// A stuck peer (one that stops reading) may hold a server thread this long at most.
constexpr auto kServerSendTimeout = std::chrono::minutes(2);
// A Get/Wait re-checks whether its client is still there this often, so that a client that
// gave up does not leave a server thread waiting out a long timeout.
constexpr auto kWaitSlice = std::chrono::milliseconds(200);

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
    Stats s = stats_;
    s.waiting = waiting_.load();
    return s;
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
  std::atomic<int64_t> waiting_{0};  // requests blocked in WaitForKeys (a separate lock's worth)
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
  store_server::HandshakeOutcome o =
      store_server::ServeHandshake(fd, options_.token, options_.handshake_timeout);
  if (!o.authenticated) {
    // A stopping server closes its clients' sockets: their failed reads are not news.
    if (!(o.read_failed && stopping_.load())) Reject(peer, o.refusal);
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
  store_wire::ReleaseThreadCryptoState();  // the handshake drew this thread's nonce
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
  // Counted while blocked (stats().waiting), so a test or a diagnosis can tell a request that
  // waits from one that has not arrived.
  bool counted = false;
  struct Uncount {
    std::atomic<int64_t>& n;
    bool& counted;
    ~Uncount() {
      if (counted) --n;
    }
  } uncount{waiting_, counted};
  for (;;) {
    std::vector<std::string> missing;
    for (const auto& k : keys) {
      if (!data_.count(k)) missing.push_back(k);
    }
    if (missing.empty()) return absl::OkStatus();
    if (!counted) {
      counted = true;
      ++waiting_;
    }
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

}  // namespace braid
