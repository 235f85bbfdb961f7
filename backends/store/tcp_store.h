// The rendezvous store of a multi-process job: a key-value server that node 0's launcher runs at
// MASTER_ADDR:MASTER_PORT, and the client (a braid::Store) that every worker uses to find the
// others. Gloo's rendezvous and the NCCL unique-id exchange both run over it.
//
// Protocol (version 1). Every message is a frame: a 4-byte big-endian body length, then the body,
// whose first byte is the message type (frame.h has the exact layouts).
//   1. server -> client  Hello    magic "BRAIDSTR", version, 32-byte server nonce Ns
//   2. client -> server  Auth     32-byte client nonce Nc, HMAC-SHA256(token, "client" || Ns || Nc)
//   3. server -> client  AuthOk   HMAC-SHA256(token, "server" || Nc || Ns)
//                     or AuthFail reason, and the server closes the connection
//   4. then any number of request/response pairs, one at a time:
//        Set(key, value)  Get(key, timeout)  Wait(keys, timeout)  Add(key, delta)
//        CompareSet(key, expected, desired)  Delete(key)  ->  Response(status code, number, text)
// Why a challenge-response and not the token itself: the token never crosses the network, and a
// recorded handshake is useless later because the server's nonce is fresh on every connection.
// Why mutual: a worker that reaches a *different* job's store on a reused port (a stale master)
// learns it at once ("store failed to prove it knows the job token") instead of exchanging
// addresses with strangers. The server runs no command before step 3 succeeds and answers a
// stranger with nothing but AuthFail; it logs every rejected or malformed connection with the
// peer's address. What this does NOT give: confidentiality or integrity after the handshake (the
// store carries addresses and ids, not secrets; an attacker able to rewrite packets between the
// nodes is outside the threat model -- run jobs on a private network).
//
// Limits (frame.h), and why:
//   key <= 4 KiB, value <= 64 MiB, <= 1024 keys per Wait: rendezvous data is small; the bounds
//     keep one message from exhausting the server's memory.
//   handshake frames <= 256 bytes, and the handshake must finish within
//     Options::handshake_timeout (10 s): a stranger can make the server allocate 256 bytes and
//     hold one thread for 10 s, nothing more.
//   Get/Wait timeouts <= 7 days (longer ones, absl::InfiniteDuration included, are clamped).
// A frame that breaks any rule (bad length, unknown type, truncated or trailing bytes, a field over
// its limit) closes that one connection; the server and its other clients carry on.
//
// Concurrency: the server runs one thread per connection (a Wait blocks its thread, not others)
// plus an accept thread; it holds at most Options::max_connections at once. A client holds one
// connection and sends one request at a time: its methods are thread-safe but serialized, so a
// long Get/Wait on one client delays that client's other callers (use one client per thread that
// must block independently).
//
// The frame parser is fuzzed with libFuzzer: briefly in `bazel test` (frame_fuzz_smoke_test),
// for longer on demand (see frame_fuzz_smoke_test.sh).
#ifndef BRAID_BACKENDS_STORE_TCP_STORE_H_
#define BRAID_BACKENDS_STORE_TCP_STORE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/store.h"

namespace braid {

// The environment contract between the launcher and its workers.
inline constexpr char kMasterAddrEnv[] = "MASTER_ADDR";
inline constexpr char kMasterPortEnv[] = "MASTER_PORT";
inline constexpr char kJobTokenEnv[] = "BRAID_JOB_TOKEN";

// A fresh job token: 32 bytes from OpenSSL's CSPRNG, as 64 lowercase hex characters.
absl::StatusOr<std::string> GenerateJobToken();

class TcpStoreServer {
 public:
  struct Options {
    // Address to listen on: "0.0.0.0" (every IPv4 interface), "127.0.0.1", "::", a host name...
    std::string host = "0.0.0.0";
    // 0 picks a free port; port() tells which.
    int port = 0;
    // The job token (non-empty); clients must prove they know it.
    std::string token;
    // How long a new connection may take to authenticate before it is dropped.
    absl::Duration handshake_timeout = absl::Seconds(10);
    // Connections beyond this are closed at once (and logged), bounding the server's threads.
    int max_connections = 4096;
    // Where rejected strangers, malformed frames and shutdown are reported; null: stderr.
    std::function<void(const std::string&)> log;
  };

  // Counters, for tests and for the launcher's diagnostics.
  struct Stats {
    int64_t accepted = 0;       // connections accepted
    int64_t authenticated = 0;  // ... that passed the handshake
    int64_t rejected = 0;       // ... that failed it (wrong token, garbage, timeout, overflow)
    int64_t malformed = 0;      // authenticated connections closed for a bad frame
    int64_t open = 0;           // connections open now
    int64_t waiting = 0;        // Gets and Waits blocked now on keys not yet set
  };

  // Binds, listens and starts serving. Errors name host:port; a port already in use says so and,
  // where /proc shows it, which process holds it.
  static absl::StatusOr<std::unique_ptr<TcpStoreServer>> Start(Options options);

  ~TcpStoreServer();  // Stop()s
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  // Closes the listener and every connection (pending Get/Wait calls fail on their clients with
  // "connection lost") and joins all threads. Idempotent; bounded time.
  void Stop();

  int port() const;
  const std::string& host() const;
  Stats stats() const;

 private:
  class Impl;
  explicit TcpStoreServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

class TcpStoreClient final : public Store {
 public:
  struct Options {
    std::string host = "127.0.0.1";
    int port = 0;
    std::string token;
    // How long Connect keeps retrying (with exponential back-off, 20 ms doubling to 1 s) while
    // the master is not up yet.
    absl::Duration connect_timeout = absl::Minutes(5);
    // How long any send or receive may stall before the connection is declared dead; a Get or
    // Wait gets its own timeout on top of this.
    absl::Duration io_timeout = absl::Minutes(2);
    // Called after each failed attempt, before the back-off (attempt number from 1, the error):
    // for a "still waiting for the master" message, and how a test knows the client is retrying.
    std::function<void(int attempt, const std::string& error)> on_retry;
  };

  // Connects (retrying until connect_timeout) and authenticates. Errors name host:port and say
  // what to check: an unreachable master, a rejected token, a service that is not a Braid store.
  static absl::StatusOr<std::unique_ptr<TcpStoreClient>> Connect(Options options);

  ~TcpStoreClient() override;

  absl::Status Set(const std::string& key, const std::string& value) override;
  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override;
  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) override;
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) override;
  absl::StatusOr<std::string> CompareSet(const std::string& key, const std::string& expected,
                                         const std::string& desired) override;
  absl::Status Delete(const std::string& key) override;

  // "host:port", as errors name it.
  const std::string& address() const;

 private:
  class Impl;
  explicit TcpStoreClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Connects to the job's store as a worker: MASTER_ADDR, MASTER_PORT and BRAID_JOB_TOKEN from the
// environment (the launcher sets them). Errors name a missing or invalid variable.
absl::StatusOr<std::unique_ptr<TcpStoreClient>> ConnectStoreFromEnv(
    absl::Duration connect_timeout = absl::Minutes(5));

}  // namespace braid

#endif  // BRAID_BACKENDS_STORE_TCP_STORE_H_
