// libFuzzer target for the token manifest reader (token_manifest.h): a prepared data set's
// manifest.json is read before any shard is checked against it, so damaged text must be a
// refusal with a message, never a crash. Beyond that: a manifest that reads is written by
// TokenManifestToJson, reads back equal, and writing it again gives the same bytes (prepare_data's
// re-runs are byte-identical because of that). Seeds in fuzz_corpus/token_manifest_fuzzer/;
// replayed by //models/data:token_manifest_fuzzer_corpus_test, fuzzed by tools/fuzz/run.sh.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "models/data/token_manifest.h"

namespace {

void Fail(const std::string& what) {
  std::fprintf(stderr, "token_manifest_fuzzer: %s\n", what.c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using braid::data::TokenManifest;
  const std::string text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<TokenManifest> got = braid::data::ParseTokenManifest(text, "manifest.json");
  if (!got.ok()) {
    if (got.status().message().empty()) Fail("a refusal without a message");
    if (got.status().message().find('\n') != std::string::npos) Fail("a refusal of several lines");
    return 0;
  }
  const std::string written = braid::data::TokenManifestToJson(*got);
  absl::StatusOr<TokenManifest> back = braid::data::ParseTokenManifest(written, "manifest.json");
  if (!back.ok()) Fail("a manifest that reads, written again, does not read: " + back.status().ToString());
  if (*back != *got) Fail("the manifest differs after a round trip:\n" + written);
  if (braid::data::TokenManifestToJson(*back) != written) Fail("writing it again gives other text");
  return 0;
}
