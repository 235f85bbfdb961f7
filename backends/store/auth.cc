#include "backends/store/auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <string>

#include "absl/strings/str_cat.h"

namespace braid::store_wire {

namespace {

constexpr absl::string_view kClientLabel = "braid-store-v1 client proof";
constexpr absl::string_view kServerLabel = "braid-store-v1 server proof";

absl::StatusOr<Mac> Proof(absl::string_view token, absl::string_view label, const Nonce& first,
                          const Nonce& second) {
  std::string msg(label.data(), label.size());
  msg.append(reinterpret_cast<const char*>(first.data()), first.size());
  msg.append(reinterpret_cast<const char*>(second.data()), second.size());
  Mac mac{};
  unsigned int len = 0;
  if (HMAC(EVP_sha256(), token.data(), static_cast<int>(token.size()),
           reinterpret_cast<const unsigned char*>(msg.data()), msg.size(), mac.data(),
           &len) == nullptr ||
      len != mac.size()) {
    return absl::InternalError("OpenSSL's HMAC-SHA256 failed (out of memory?)");
  }
  return mac;
}

}  // namespace

absl::Status RandomBytes(uint8_t* out, size_t n) {
  if (RAND_bytes(out, static_cast<int>(n)) != 1) {
    return absl::InternalError(
        "OpenSSL's RAND_bytes failed: the system random generator is not available");
  }
  return absl::OkStatus();
}

absl::StatusOr<Nonce> RandomNonce() {
  Nonce n{};
  absl::Status st = RandomBytes(n.data(), n.size());
  if (!st.ok()) return st;
  return n;
}

void ReleaseThreadCryptoState() { OPENSSL_thread_stop(); }

absl::StatusOr<Mac> ClientProof(absl::string_view token, const Nonce& server_nonce,
                                const Nonce& client_nonce) {
  return Proof(token, kClientLabel, server_nonce, client_nonce);
}

absl::StatusOr<Mac> ServerProof(absl::string_view token, const Nonce& server_nonce,
                                const Nonce& client_nonce) {
  return Proof(token, kServerLabel, client_nonce, server_nonce);
}

bool MacEquals(const Mac& a, const Mac& b) {
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace braid::store_wire
