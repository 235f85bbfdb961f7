// libFuzzer target for the checkpoint index reader (checkpoint_index.h): index.json is the one
// file of a checkpoint read before anything is checked against it, and a damaged one must be an
// error that lets Latest() try an older checkpoint, never a crash.
//
// Beyond "no crash": an index that reads must survive a round trip (written by the writer's
// own CheckpointIndexToJson and read again, it is the same index, and writing that gives the same
// text), and a refusal must say why. Seeds: real indexes (real_*) and damaged ones in
// fuzz_corpus/checkpoint_index_fuzzer/. Replayed by
// //plugins/checkpoint:checkpoint_index_fuzzer_corpus_test; fuzzed by tools/fuzz/run.sh.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "plugins/checkpoint/checkpoint_index.h"

namespace {

void Fail(const std::string& what) {
  std::fprintf(stderr, "checkpoint_index_fuzzer: %s\n", what.c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using braid::checkpoint::CheckpointIndex;
  const std::string text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<CheckpointIndex> got = braid::checkpoint::ParseCheckpointIndex(text, "index.json");
  if (!got.ok()) {
    if (got.status().message().empty()) Fail("a refusal without a message");
    if (got.status().code() != absl::StatusCode::kDataLoss) {
      Fail("a refusal that is not kDataLoss: " + got.status().ToString());
    }
    return 0;
  }
  const std::string written = braid::checkpoint::CheckpointIndexToJson(*got);
  absl::StatusOr<CheckpointIndex> back = braid::checkpoint::ParseCheckpointIndex(written, "index.json");
  if (!back.ok()) Fail("an index that reads, written again, does not read: " + back.status().ToString());
  if (*back != *got) Fail("the index differs after a round trip:\n" + written);
  if (braid::checkpoint::CheckpointIndexToJson(*back) != written) {
    Fail("writing the index again gives other text");
  }
  return 0;
}
