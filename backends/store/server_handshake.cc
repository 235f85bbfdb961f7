#include "backends/store/server_handshake.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "backends/store/auth.h"
#include "backends/store/frame.h"
#include "backends/store/store_io.h"
#include "backends/store/tcp_store.h"

namespace braid::store_server {

namespace wire = store_wire;

namespace {

HandshakeOutcome Refused(std::string why, bool read_failed = false) {
  HandshakeOutcome o;
  o.read_failed = read_failed;
  o.refusal = std::move(why);
  return o;
}

}  // namespace

HandshakeOutcome ServeHandshake(int fd, absl::string_view token, absl::Duration timeout) {
  const store_io::Deadline deadline = store_io::After(timeout);
  auto nonce = wire::RandomNonce();
  if (!nonce.ok()) return Refused(nonce.status().ToString());
  wire::Hello hello;
  hello.nonce = *nonce;
  absl::Status st = store_io::SendAll(fd, wire::EncodeHello(hello), deadline);
  if (!st.ok()) return Refused(absl::StrCat("could not send the greeting: ", st.message()));
  auto body = store_io::ReadFrame(fd, wire::kMaxHandshakeFrameBytes, deadline);
  if (!body.ok()) {
    switch (body.status().code()) {
      case absl::StatusCode::kDeadlineExceeded:
        return Refused(
            absl::StrCat("did not authenticate within ", absl::FormatDuration(timeout)), true);
      case absl::StatusCode::kOutOfRange:
        return Refused("closed the connection without authenticating", true);
      case absl::StatusCode::kInvalidArgument:
        return Refused(absl::StrCat("malformed handshake frame: ", body.status().message()),
                       true);
      default:
        return Refused(absl::StrCat("handshake failed: ", body.status().message()), true);
    }
  }
  auto auth = wire::ParseAuth(*body);
  if (!auth.ok()) {
    return Refused(absl::StrCat("malformed handshake frame: ", auth.status().message()));
  }
  auto expected = wire::ClientProof(token, *nonce, auth->nonce);
  if (!expected.ok()) return Refused(expected.status().ToString());
  if (!wire::MacEquals(*expected, auth->mac)) {
    wire::AuthResult fail;
    fail.reason = "job token rejected";
    store_io::SendAll(fd, wire::EncodeAuthResult(fail), deadline).IgnoreError();
    return Refused(absl::StrCat("wrong job token (its proof does not match this job's ",
                                kJobTokenEnv, ")"));
  }
  wire::AuthResult ok;
  ok.ok = true;
  auto proof = wire::ServerProof(token, *nonce, auth->nonce);
  if (!proof.ok()) return Refused(proof.status().ToString());
  ok.mac = *proof;
  st = store_io::SendAll(fd, wire::EncodeAuthResult(ok), deadline);
  if (!st.ok()) {
    return Refused(absl::StrCat("could not send the handshake's answer: ", st.message()));
  }
  HandshakeOutcome in;
  in.authenticated = true;
  return in;
}

}  // namespace braid::store_server
