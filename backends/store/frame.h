// Wire format of the rendezvous store: message types, limits, encoders and a pure parser.
//
// Kept apart from the sockets (store_io.cc, tcp_store_server.cc, tcp_store_client.cc) and the
// cryptography (auth.cc) so that everything that reads bytes from the network can be fuzzed on its
// own (frame_fuzzer.cc). The protocol as a whole -- handshake, commands, what the limits protect --
// is described in tcp_store.h.
//
// A frame is a 4-byte big-endian body length followed by the body; the body's first byte is its
// MessageType. Integers are big-endian; a string is a 4-byte length and its bytes. Every parse
// function checks every length against the remaining bytes and the limits below, rejects trailing
// bytes, and never reads out of bounds: whatever arrives from the network either parses into a
// valid message or yields an InvalidArgument status saying what was wrong and where.
#ifndef BRAID_BACKENDS_STORE_FRAME_H_
#define BRAID_BACKENDS_STORE_FRAME_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace braid::store_wire {

// ---- Limits -----------------------------------------------------------------------------------
// Keys name ranks, groups and rendezvous steps: a few dozen bytes in practice.
inline constexpr size_t kMaxKeyBytes = 4 << 10;
// Values hold addresses and NCCL/Gloo ids (bytes to kilobytes); 64 MiB leaves room for a small
// blob such as a serialized config while bounding what one message can make the server hold.
inline constexpr size_t kMaxValueBytes = 64 << 20;
// One Wait names at most this many keys (a barrier over a large world waits on one counter key,
// not on one key per rank).
inline constexpr size_t kMaxWaitKeys = 1024;
// The largest legitimate body: a CompareSet carries a key and two values.
inline constexpr size_t kMaxFrameBytes = 2 * kMaxValueBytes + kMaxKeyBytes + 64;
// Before authentication nothing legitimate is larger than an Auth message, so a stranger can
// never make the server allocate more than this.
inline constexpr size_t kMaxHandshakeFrameBytes = 256;
// Wait and Get timeouts travel in milliseconds; a week stands in for "forever".
inline constexpr int64_t kMaxTimeoutMs = int64_t{7} * 24 * 3600 * 1000;
inline constexpr size_t kFrameHeaderBytes = 4;
inline constexpr size_t kNonceBytes = 32;
inline constexpr size_t kMacBytes = 32;  // HMAC-SHA256
inline constexpr uint32_t kProtocolVersion = 1;
// The server's greeting starts with this, so a client that dialled the wrong port (some other
// service) says so instead of reporting a protocol error.
inline constexpr char kMagic[8] = {'B', 'R', 'A', 'I', 'D', 'S', 'T', 'R'};

using Nonce = std::array<uint8_t, kNonceBytes>;
using Mac = std::array<uint8_t, kMacBytes>;

enum class MessageType : uint8_t {
  kHello = 1,     // server -> client: magic, version, server nonce
  kAuth = 2,      // client -> server: client nonce, client proof
  kAuthOk = 3,    // server -> client: server proof
  kAuthFail = 4,  // server -> client: reason, then the server closes
  kSet = 16,      // client -> server requests ...
  kGet = 17,
  kWait = 18,
  kAdd = 19,
  kCompareSet = 20,
  kDelete = 21,
  kResponse = 32,  // server -> client: the answer to one request
};

// "Set", "Get", ... ; "type 77" for an unknown byte.
std::string MessageTypeName(uint8_t type);

struct Hello {
  uint32_t version = kProtocolVersion;
  Nonce nonce{};
};

struct Auth {
  Nonce nonce{};
  Mac mac{};
};

// The server's answer to Auth: either its own proof (ok) or a reason for the rejection.
struct AuthResult {
  bool ok = false;
  Mac mac{};
  std::string reason;
};

struct Request {
  MessageType op = MessageType::kSet;  // one of kSet..kDelete
  std::vector<std::string> keys;       // exactly one, except Wait: 1..kMaxWaitKeys
  std::string value;                   // Set: the value; CompareSet: the desired value
  std::string expected;                // CompareSet
  int64_t delta = 0;                   // Add
  int64_t timeout_ms = 0;              // Get, Wait: 0..kMaxTimeoutMs

  bool operator==(const Request& o) const {
    return op == o.op && keys == o.keys && value == o.value && expected == o.expected &&
           delta == o.delta && timeout_ms == o.timeout_ms;
  }
};

// One shape for every answer: `code` is an absl::StatusCode; `text` is the value (Get,
// CompareSet) when ok and the error message otherwise; `number` is Add's result.
struct Response {
  absl::StatusCode code = absl::StatusCode::kOk;
  int64_t number = 0;
  std::string text;

  bool operator==(const Response& o) const {
    return code == o.code && number == o.number && text == o.text;
  }
};

// ---- Framing ----------------------------------------------------------------------------------
// The body length announced by a 4-byte header, or InvalidArgument if it is 0 or over max_body.
absl::StatusOr<size_t> DecodeFrameLength(absl::string_view header, size_t max_body);

// Splits the first frame off `stream`: complete=false when more bytes are needed (consumed 0).
struct FrameSplit {
  bool complete = false;
  size_t consumed = 0;
  absl::string_view body;
};
absl::StatusOr<FrameSplit> SplitFrame(absl::string_view stream, size_t max_body);

// ---- Messages ---------------------------------------------------------------------------------
// Encoders return a whole frame (header included). They assume valid input (see
// ValidateRequest); a message they produce always parses back to itself.
std::string EncodeHello(const Hello& m);
std::string EncodeAuth(const Auth& m);
std::string EncodeAuthResult(const AuthResult& m);
std::string EncodeRequest(const Request& m);
std::string EncodeResponse(const Response& m);

// Parsers take a frame body (header removed).
absl::StatusOr<Hello> ParseHello(absl::string_view body);
absl::StatusOr<Auth> ParseAuth(absl::string_view body);
absl::StatusOr<AuthResult> ParseAuthResult(absl::string_view body);
absl::StatusOr<Request> ParseRequest(absl::string_view body);
absl::StatusOr<Response> ParseResponse(absl::string_view body);

// Checks a request against the limits (the client calls it before sending, the parser after
// decoding); the error names the request and the offending key or size.
absl::Status ValidateRequest(const Request& r);

}  // namespace braid::store_wire

#endif  // BRAID_BACKENDS_STORE_FRAME_H_
