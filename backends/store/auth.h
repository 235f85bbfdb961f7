// The cryptography of the store's handshake (see tcp_store.h for the protocol): OpenSSL's
// HMAC-SHA256 and random bytes, kept behind these few functions so that the rest of the store
// (and its tests, which act as hostile peers) never touch OpenSSL directly.
#ifndef BRAID_BACKENDS_STORE_AUTH_H_
#define BRAID_BACKENDS_STORE_AUTH_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "backends/store/frame.h"

namespace braid::store_wire {

// Fills out[0..n) from OpenSSL's CSPRNG (Internal error if it cannot be seeded).
absl::Status RandomBytes(uint8_t* out, size_t n);
absl::StatusOr<Nonce> RandomNonce();

// Frees what OpenSSL keeps per thread (the thread's random generator, made by the first
// RandomBytes on it). A thread that drew random bytes calls it just before it ends: OpenSSL's
// own clean-up at thread exit is not guaranteed to have run when the process ends, which
// LeakSanitizer reported as an intermittent leak of the store's connection threads.
void ReleaseThreadCryptoState();

// The two proofs of the handshake. Each side's proof covers both nonces in its own order and a
// distinct label, so that neither can be replayed as the other (a server cannot echo a client's
// proof back to it) nor reused on another connection (the peer's nonce is fresh each time).
// An error (OpenSSL out of memory) must fail the handshake: never fall back to a fixed mac.
absl::StatusOr<Mac> ClientProof(absl::string_view token, const Nonce& server_nonce,
                                const Nonce& client_nonce);
absl::StatusOr<Mac> ServerProof(absl::string_view token, const Nonce& server_nonce,
                                const Nonce& client_nonce);

// Constant-time comparison (CRYPTO_memcmp): how long it takes says nothing about where the
// first differing byte is.
bool MacEquals(const Mac& a, const Mac& b);

}  // namespace braid::store_wire

#endif  // BRAID_BACKENDS_STORE_AUTH_H_
