// Deadlines and frame I/O on non-blocking sockets, shared by the store's server and client (see
// store_io.h).
#include "backends/store/store_io.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/types.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "backends/store/frame.h"

namespace braid::store_io {

namespace {

namespace wire = store_wire;

// The body of a frame grows as its bytes arrive, in steps of this, so a peer that announces a
// large frame and then stalls costs memory only for what it actually sent.
constexpr size_t kReadChunk = 1 << 20;

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

}  // namespace

Deadline After(absl::Duration d) {
  if (d == absl::InfiniteDuration()) return kNever;
  if (d < absl::ZeroDuration()) d = absl::ZeroDuration();
  // Anything beyond a year is "never" for our purposes, and stays clear of overflow.
  if (d > absl::Hours(24 * 365)) return kNever;
  return Clock::now() + absl::ToChronoNanoseconds(d);
}

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

std::string QuoteKeys(const std::vector<std::string>& keys) {
  constexpr size_t kShown = 16;
  std::vector<std::string> shown;
  for (size_t i = 0; i < keys.size() && i < kShown; ++i) shown.push_back("'" + keys[i] + "'");
  std::string s = absl::StrJoin(shown, ", ");
  if (keys.size() > kShown) absl::StrAppend(&s, " and ", keys.size() - kShown, " more");
  return s;
}

}  // namespace braid::store_io
