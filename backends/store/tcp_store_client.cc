// The store's client: the braid::Store that every worker uses to reach the job's store
// (TcpStoreClient, ConnectStoreFromEnv). Split from the server (tcp_store_server.cc), which runs
// only in node 0's launcher and shares only store_io.h, frame.h and auth.h with it; the protocol
// is described in tcp_store.h.
#include "backends/store/tcp_store.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "backends/store/auth.h"
#include "backends/store/frame.h"
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
using store_io::PollMs;
using store_io::QuoteKeys;
using store_io::ReadFrame;
using store_io::SendAll;
using store_io::SetNoDelay;

// One connection attempt may take this long before the next try (a SYN to an unreachable host
// would otherwise block for the kernel's ~2 minutes).
constexpr auto kConnectAttemptTimeout = std::chrono::seconds(10);
constexpr auto kFirstBackoff = std::chrono::milliseconds(20);
constexpr auto kMaxBackoff = std::chrono::seconds(1);

std::string Describe(const wire::Request& r) {
  return absl::StrCat(wire::MessageTypeName(static_cast<uint8_t>(r.op)), "(", QuoteKeys(r.keys),
                      ")");
}

int64_t ToTimeoutMs(absl::Duration d) {
  if (d <= absl::ZeroDuration()) return 0;
  if (d >= absl::Milliseconds(wire::kMaxTimeoutMs)) return wire::kMaxTimeoutMs;
  return absl::ToInt64Milliseconds(d);
}

}  // namespace

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
    if (options.on_retry) options.on_retry(attempts, last_error);
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
