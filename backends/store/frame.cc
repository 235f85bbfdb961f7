#include "backends/store/frame.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace braid::store_wire {

namespace {

// Propagate a failed step of a parse: every step's error already names the message and field.
#define BRAID_WIRE_TRY(expr)             \
  do {                                   \
    absl::Status _wire_st = (expr);      \
    if (!_wire_st.ok()) return _wire_st; \
  } while (0)
#define BRAID_WIRE_ASSIGN(lhs, expr)            \
  do {                                          \
    auto _wire_v = (expr);                      \
    if (!_wire_v.ok()) return _wire_v.status(); \
    lhs = std::move(*_wire_v);                  \
  } while (0)

// Appends big-endian fields to a frame and patches the length header at the end.
class Writer {
 public:
  explicit Writer(MessageType type) : out_(kFrameHeaderBytes, '\0') {
    U8(static_cast<uint8_t>(type));
  }
  void U8(uint8_t v) { out_.push_back(static_cast<char>(v)); }
  void U32(uint32_t v) {
    for (int s = 24; s >= 0; s -= 8) out_.push_back(static_cast<char>((v >> s) & 0xff));
  }
  void I64(int64_t v) {
    uint64_t u = static_cast<uint64_t>(v);
    for (int s = 56; s >= 0; s -= 8) out_.push_back(static_cast<char>((u >> s) & 0xff));
  }
  void Fixed(const uint8_t* p, size_t n) { out_.append(reinterpret_cast<const char*>(p), n); }
  void Bytes(absl::string_view s) {
    U32(static_cast<uint32_t>(s.size()));
    out_.append(s.data(), s.size());
  }
  std::string Finish() && {
    uint32_t n = static_cast<uint32_t>(out_.size() - kFrameHeaderBytes);
    for (int i = 0; i < 4; ++i) out_[i] = static_cast<char>((n >> (24 - 8 * i)) & 0xff);
    return std::move(out_);
  }

 private:
  std::string out_;
};

// Bounds-checked reads from a body; every failure says which message and field broke, and at
// which byte, so a log line about a bad frame is enough to tell a bug from a stranger.
class Reader {
 public:
  Reader(absl::string_view body, const char* what) : body_(body), what_(what) {}

  absl::Status Need(size_t n, const char* field) {
    if (body_.size() - pos_ >= n) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(what_, ": truncated at byte ", pos_, " reading ",
                                                   field, " (need ", n, " bytes, have ",
                                                   body_.size() - pos_, ")"));
  }
  absl::StatusOr<uint8_t> U8(const char* field) {
    BRAID_WIRE_TRY(Need(1, field));
    return static_cast<uint8_t>(body_[pos_++]);
  }
  absl::StatusOr<uint32_t> U32(const char* field) {
    BRAID_WIRE_TRY(Need(4, field));
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v = (v << 8) | static_cast<uint8_t>(body_[pos_++]);
    return v;
  }
  absl::StatusOr<int64_t> I64(const char* field) {
    BRAID_WIRE_TRY(Need(8, field));
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v = (v << 8) | static_cast<uint8_t>(body_[pos_++]);
    return static_cast<int64_t>(v);
  }
  absl::Status Fixed(uint8_t* out, size_t n, const char* field) {
    BRAID_WIRE_TRY(Need(n, field));
    std::memcpy(out, body_.data() + pos_, n);
    pos_ += n;
    return absl::OkStatus();
  }
  // A length-prefixed string of at most `max` bytes. The limit is checked before anything is
  // copied, so an announced length can never cause an allocation beyond it.
  absl::StatusOr<std::string> Bytes(size_t max, const char* field) {
    auto n = U32(field);
    if (!n.ok()) return n.status();
    if (*n > max) {
      return absl::InvalidArgumentError(
          absl::StrCat(what_, ": ", field, " of ", *n, " bytes is over the ", max, "-byte limit"));
    }
    BRAID_WIRE_TRY(Need(*n, field));
    std::string s(body_.data() + pos_, *n);
    pos_ += *n;
    return s;
  }
  absl::Status End() {
    if (pos_ == body_.size()) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat(what_, ": ", body_.size() - pos_, " unexpected trailing bytes"));
  }

 private:
  absl::string_view body_;
  size_t pos_ = 0;
  const char* what_;
};

absl::Status ExpectType(absl::string_view body, MessageType want) {
  if (body.empty()) return absl::InvalidArgumentError("empty frame body");
  uint8_t got = static_cast<uint8_t>(body[0]);
  if (got == static_cast<uint8_t>(want)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("expected a ",
                                                 MessageTypeName(static_cast<uint8_t>(want)),
                                                 " message, got ", MessageTypeName(got)));
}

bool IsRequestType(uint8_t t) {
  return t >= static_cast<uint8_t>(MessageType::kSet) &&
         t <= static_cast<uint8_t>(MessageType::kDelete);
}

}  // namespace

std::string MessageTypeName(uint8_t type) {
  switch (static_cast<MessageType>(type)) {
    case MessageType::kHello:
      return "Hello";
    case MessageType::kAuth:
      return "Auth";
    case MessageType::kAuthOk:
      return "AuthOk";
    case MessageType::kAuthFail:
      return "AuthFail";
    case MessageType::kSet:
      return "Set";
    case MessageType::kGet:
      return "Get";
    case MessageType::kWait:
      return "Wait";
    case MessageType::kAdd:
      return "Add";
    case MessageType::kCompareSet:
      return "CompareSet";
    case MessageType::kDelete:
      return "Delete";
    case MessageType::kResponse:
      return "Response";
  }
  return absl::StrCat("type ", static_cast<int>(type));
}

absl::StatusOr<size_t> DecodeFrameLength(absl::string_view header, size_t max_body) {
  if (header.size() != kFrameHeaderBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("frame header of ", header.size(), " bytes (want ", kFrameHeaderBytes, ")"));
  }
  uint32_t n = 0;
  for (char c : header) n = (n << 8) | static_cast<uint8_t>(c);
  if (n == 0) return absl::InvalidArgumentError("frame with an empty body");
  if (n > max_body) {
    return absl::InvalidArgumentError(
        absl::StrCat("frame of ", n, " bytes is over the ", max_body, "-byte limit"));
  }
  return static_cast<size_t>(n);
}

absl::StatusOr<FrameSplit> SplitFrame(absl::string_view stream, size_t max_body) {
  FrameSplit split;
  if (stream.size() < kFrameHeaderBytes) return split;
  auto n = DecodeFrameLength(stream.substr(0, kFrameHeaderBytes), max_body);
  if (!n.ok()) return n.status();
  if (stream.size() - kFrameHeaderBytes < *n) return split;
  split.complete = true;
  split.consumed = kFrameHeaderBytes + *n;
  split.body = stream.substr(kFrameHeaderBytes, *n);
  return split;
}

// ---- Encoders ---------------------------------------------------------------------------------

std::string EncodeHello(const Hello& m) {
  Writer w(MessageType::kHello);
  w.Fixed(reinterpret_cast<const uint8_t*>(kMagic), sizeof(kMagic));
  w.U32(m.version);
  w.Fixed(m.nonce.data(), m.nonce.size());
  return std::move(w).Finish();
}

std::string EncodeAuth(const Auth& m) {
  Writer w(MessageType::kAuth);
  w.Fixed(m.nonce.data(), m.nonce.size());
  w.Fixed(m.mac.data(), m.mac.size());
  return std::move(w).Finish();
}

std::string EncodeAuthResult(const AuthResult& m) {
  if (m.ok) {
    Writer w(MessageType::kAuthOk);
    w.Fixed(m.mac.data(), m.mac.size());
    return std::move(w).Finish();
  }
  Writer w(MessageType::kAuthFail);
  w.Bytes(m.reason);
  return std::move(w).Finish();
}

std::string EncodeRequest(const Request& m) {
  Writer w(m.op);
  auto key = [&] { w.Bytes(m.keys.empty() ? std::string() : m.keys[0]); };
  switch (m.op) {
    case MessageType::kSet:
      key();
      w.Bytes(m.value);
      break;
    case MessageType::kGet:
      key();
      w.I64(m.timeout_ms);
      break;
    case MessageType::kWait:
      w.U32(static_cast<uint32_t>(m.keys.size()));
      for (const auto& k : m.keys) w.Bytes(k);
      w.I64(m.timeout_ms);
      break;
    case MessageType::kAdd:
      key();
      w.I64(m.delta);
      break;
    case MessageType::kCompareSet:
      key();
      w.Bytes(m.expected);
      w.Bytes(m.value);
      break;
    default:  // kDelete; ValidateRequest rejects every other type before anything is encoded
      key();
      break;
  }
  return std::move(w).Finish();
}

std::string EncodeResponse(const Response& m) {
  Writer w(MessageType::kResponse);
  w.U8(static_cast<uint8_t>(m.code));
  w.I64(m.number);
  w.Bytes(m.text);
  return std::move(w).Finish();
}

// ---- Parsers ----------------------------------------------------------------------------------

absl::StatusOr<Hello> ParseHello(absl::string_view body) {
  BRAID_WIRE_TRY(ExpectType(body, MessageType::kHello));
  Reader r(body.substr(1), "Hello");
  char magic[sizeof(kMagic)];
  BRAID_WIRE_TRY(r.Fixed(reinterpret_cast<uint8_t*>(magic), sizeof(magic), "magic"));
  if (std::memcmp(magic, kMagic, sizeof(kMagic)) != 0) {
    return absl::InvalidArgumentError("Hello: wrong magic (not a Braid store)");
  }
  Hello h;
  BRAID_WIRE_ASSIGN(h.version, r.U32("version"));
  BRAID_WIRE_TRY(r.Fixed(h.nonce.data(), h.nonce.size(), "nonce"));
  BRAID_WIRE_TRY(r.End());
  return h;
}

absl::StatusOr<Auth> ParseAuth(absl::string_view body) {
  BRAID_WIRE_TRY(ExpectType(body, MessageType::kAuth));
  Reader r(body.substr(1), "Auth");
  Auth a;
  BRAID_WIRE_TRY(r.Fixed(a.nonce.data(), a.nonce.size(), "nonce"));
  BRAID_WIRE_TRY(r.Fixed(a.mac.data(), a.mac.size(), "mac"));
  BRAID_WIRE_TRY(r.End());
  return a;
}

absl::StatusOr<AuthResult> ParseAuthResult(absl::string_view body) {
  if (body.empty()) return absl::InvalidArgumentError("empty frame body");
  AuthResult a;
  if (static_cast<uint8_t>(body[0]) == static_cast<uint8_t>(MessageType::kAuthOk)) {
    Reader r(body.substr(1), "AuthOk");
    a.ok = true;
    BRAID_WIRE_TRY(r.Fixed(a.mac.data(), a.mac.size(), "mac"));
    BRAID_WIRE_TRY(r.End());
    return a;
  }
  BRAID_WIRE_TRY(ExpectType(body, MessageType::kAuthFail));
  Reader r(body.substr(1), "AuthFail");
  BRAID_WIRE_ASSIGN(a.reason, r.Bytes(kMaxHandshakeFrameBytes, "reason"));
  BRAID_WIRE_TRY(r.End());
  return a;
}

absl::StatusOr<Request> ParseRequest(absl::string_view body) {
  if (body.empty()) return absl::InvalidArgumentError("empty frame body");
  uint8_t type = static_cast<uint8_t>(body[0]);
  if (!IsRequestType(type)) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected a request, got a message of ", MessageTypeName(type)));
  }
  std::string what = MessageTypeName(type);
  Reader r(body.substr(1), what.c_str());
  Request q;
  q.op = static_cast<MessageType>(type);
  if (q.op == MessageType::kWait) {
    uint32_t n = 0;
    BRAID_WIRE_ASSIGN(n, r.U32("key count"));
    if (n == 0 || n > kMaxWaitKeys) {
      return absl::InvalidArgumentError(
          absl::StrCat("Wait: ", n, " keys (want 1 to ", kMaxWaitKeys, ")"));
    }
    for (uint32_t i = 0; i < n; ++i) {
      std::string k;
      BRAID_WIRE_ASSIGN(k, r.Bytes(kMaxKeyBytes, "key"));
      q.keys.push_back(std::move(k));
    }
    BRAID_WIRE_ASSIGN(q.timeout_ms, r.I64("timeout"));
  } else {
    std::string k;
    BRAID_WIRE_ASSIGN(k, r.Bytes(kMaxKeyBytes, "key"));
    q.keys.push_back(std::move(k));
    switch (q.op) {
      case MessageType::kSet:
        BRAID_WIRE_ASSIGN(q.value, r.Bytes(kMaxValueBytes, "value"));
        break;
      case MessageType::kGet:
        BRAID_WIRE_ASSIGN(q.timeout_ms, r.I64("timeout"));
        break;
      case MessageType::kAdd:
        BRAID_WIRE_ASSIGN(q.delta, r.I64("delta"));
        break;
      case MessageType::kCompareSet:
        BRAID_WIRE_ASSIGN(q.expected, r.Bytes(kMaxValueBytes, "expected value"));
        BRAID_WIRE_ASSIGN(q.value, r.Bytes(kMaxValueBytes, "desired value"));
        break;
      default:  // kDelete: the key only
        break;
    }
  }
  BRAID_WIRE_TRY(r.End());
  BRAID_WIRE_TRY(ValidateRequest(q));
  return q;
}

absl::StatusOr<Response> ParseResponse(absl::string_view body) {
  BRAID_WIRE_TRY(ExpectType(body, MessageType::kResponse));
  Reader r(body.substr(1), "Response");
  Response p;
  uint8_t code = 0;
  BRAID_WIRE_ASSIGN(code, r.U8("status code"));
  // absl::StatusCode's values are 0..16 and stable (they are gRPC's codes).
  if (code > static_cast<uint8_t>(absl::StatusCode::kUnauthenticated)) {
    return absl::InvalidArgumentError(absl::StrCat("Response: unknown status code ", code));
  }
  p.code = static_cast<absl::StatusCode>(code);
  BRAID_WIRE_ASSIGN(p.number, r.I64("number"));
  BRAID_WIRE_ASSIGN(p.text, r.Bytes(2 * kMaxValueBytes, "text"));
  BRAID_WIRE_TRY(r.End());
  return p;
}

absl::Status ValidateRequest(const Request& r) {
  std::string what = MessageTypeName(static_cast<uint8_t>(r.op));
  if (!IsRequestType(static_cast<uint8_t>(r.op))) {
    return absl::InvalidArgumentError(absl::StrCat(what, " is not a request"));
  }
  if (r.op == MessageType::kWait) {
    if (r.keys.empty() || r.keys.size() > kMaxWaitKeys) {
      return absl::InvalidArgumentError(
          absl::StrCat("Wait on ", r.keys.size(), " keys (want 1 to ", kMaxWaitKeys, ")"));
    }
  } else if (r.keys.size() != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " with ", r.keys.size(), " keys (want 1)"));
  }
  for (const auto& k : r.keys) {
    if (k.empty()) return absl::InvalidArgumentError(absl::StrCat(what, ": empty key"));
    if (k.size() > kMaxKeyBytes) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": key '", k.substr(0, 64), "...' of ",
                                                     k.size(), " bytes is over the ", kMaxKeyBytes,
                                                     "-byte limit"));
    }
  }
  for (const std::string* v : {&r.value, &r.expected}) {
    if (v->size() > kMaxValueBytes) {
      return absl::InvalidArgumentError(absl::StrCat(what, " of key '", r.keys[0], "': value of ",
                                                     v->size(), " bytes is over the ",
                                                     kMaxValueBytes, "-byte limit"));
    }
  }
  if (r.timeout_ms < 0 || r.timeout_ms > kMaxTimeoutMs) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": timeout of ", r.timeout_ms, " ms (want 0 to ", kMaxTimeoutMs, ")"));
  }
  // Fields a request type does not carry must be empty, so that what is validated is exactly what
  // goes on the wire (an encoder never silently drops data).
  bool has_value = r.op == MessageType::kSet || r.op == MessageType::kCompareSet;
  bool has_timeout = r.op == MessageType::kGet || r.op == MessageType::kWait;
  if ((!has_value && !r.value.empty()) ||
      (r.op != MessageType::kCompareSet && !r.expected.empty()) ||
      (r.op != MessageType::kAdd && r.delta != 0) || (!has_timeout && r.timeout_ms != 0)) {
    return absl::InvalidArgumentError(absl::StrCat(what, " carries a field it does not use"));
  }
  return absl::OkStatus();
}

}  // namespace braid::store_wire
