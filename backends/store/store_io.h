// What the store's server and client share beyond the wire format (frame.h) and the handshake's
// cryptography (auth.h): deadlines, reading and writing whole frames on a non-blocking socket, and
// how addresses and keys are written in messages. Internal to //backends/store (not in the
// library's public headers); it is its own file so that the server (tcp_store_server.cc) and the
// client (tcp_store_client.cc) can each be read without the other.
#ifndef BRAID_BACKENDS_STORE_STORE_IO_H_
#define BRAID_BACKENDS_STORE_STORE_IO_H_

#include <sys/socket.h>

#include <chrono>
#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace braid::store_io {

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;
inline constexpr Deadline kNever = Deadline::max();

// The deadline `d` from now; an infinite (or very long) duration is kNever, a negative one is now.
Deadline After(absl::Duration d);

// poll()'s timeout for `d`: -1 for never, else the remaining milliseconds rounded up.
int PollMs(Deadline d);

std::string ErrnoText(int e);

// "host:port", with an IPv6 host in brackets.
std::string HostPort(const std::string& host, int port);

// Turns off Nagle's algorithm on a connected socket.
void SetNoDelay(int fd);

// Writes all of `data` to a non-blocking socket, polling until `d`: Unavailable when the
// connection broke, DeadlineExceeded when the peer stopped reading.
absl::Status SendAll(int fd, absl::string_view data, Deadline d);

// Reads one frame body. Errors: OutOfRange when the peer closed cleanly between frames (not worth
// a log line), InvalidArgument for a bad header (announced length 0 or over max_body),
// Unavailable when the stream broke mid-frame, DeadlineExceeded.
absl::StatusOr<std::string> ReadFrame(int fd, size_t max_body, Deadline d);

// Keys in error messages: quoted, at most 16 of them.
std::string QuoteKeys(const std::vector<std::string>& keys);

}  // namespace braid::store_io

#endif  // BRAID_BACKENDS_STORE_STORE_IO_H_
