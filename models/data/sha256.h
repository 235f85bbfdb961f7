// SHA-256 through OpenSSL's libcrypto, as lower-case hex: the checksum a prepared data set's
// manifest keeps for each shard (token_manifest.h), so a truncated, damaged or foreign shard is
// refused before training reads it.
#ifndef BRAID_MODELS_DATA_SHA256_H_
#define BRAID_MODELS_DATA_SHA256_H_

#include <cstddef>
#include <string>

#include "absl/status/statusor.h"

namespace braid::data {

// Incremental: Update any number of times, then Hex once.
class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  void Update(const void* data, size_t n);
  std::string Hex();  // 64 lower-case hex digits; ends the digest

 private:
  void* ctx_;  // EVP_MD_CTX, kept out of the header
};

std::string Sha256Hex(const void* data, size_t n);
// The file's digest, read in blocks; NotFound naming the file when it cannot be read.
absl::StatusOr<std::string> Sha256OfFile(const std::string& path);

}  // namespace braid::data

#endif  // BRAID_MODELS_DATA_SHA256_H_
