// Data preparation (//tools:prepare_data, docs/DATA.md): text files, folders and JSON-lines files
// in, a prepared token data set out (models/data/token_manifest.h).
//
// Documents are whole: a text file is one, a non-blank line of a JSON-lines file is one (its
// `jsonl_field`). They are split into train and validation by a seeded shuffle before any is
// tokenized, tokenized in parallel (one document per thread at a time), and written in input
// order, each followed by the end-of-text id, to shards of at most `shard_tokens` ids. The output
// depends only on the inputs and the options, never on the thread count or timing.
//
// Nothing a training run would accept is left half-written: shards are written under
// "<name>.partial" names, and only once every document is tokenized is the old manifest removed,
// the shards renamed into place and the new manifest written (last, itself through a rename). A
// run that stops early leaves the folder's previous data set as it was.
#ifndef BRAID_TOOLS_PREPARE_DATA_PREPARE_H_
#define BRAID_TOOLS_PREPARE_DATA_PREPARE_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "models/data/token_manifest.h"
#include "models/text/tokenizer.h"

namespace braid::tools {

struct PrepareOptions {
  std::vector<std::string> inputs;  // files and folders, in this order
  std::string out_dir;              // created if missing
  std::string jsonl_field = "text";
  double val_fraction = 0.1;  // of the documents, rounded, at least 1 of each when above 0
  uint64_t seed = 1234;
  int threads = 1;
  int64_t shard_tokens = 100'000'000;
  std::optional<uint32_t> eot_id;
  // Tests: stop (as if killed) once this many shards are written under their temporary names.
  int crash_after_shards = -1;
};

// How far the tokenization is, for a progress line.
struct PrepareProgress {
  int64_t bytes_done = 0, bytes_total = 0;
  int64_t tokens = 0;
  double seconds = 0;
};

// What a folder counts as text: these endings (".jsonl" and ".ndjson" are JSON lines).
bool IsTextFileName(const std::string& name);
bool IsJsonLinesFileName(const std::string& name);

// The end-of-text id a tokenizer defines: GPT-2's <|endoftext|>, a SentencePiece model's </s>;
// none for the byte tokenizer (all 256 ids are bytes).
std::optional<uint32_t> DefaultEndOfText(const text::Tokenizer& tokenizer);

// Every error is one line naming the input file (and line) or the output folder and what to do.
absl::StatusOr<data::TokenManifest> PrepareData(
    const text::Tokenizer& tokenizer, const PrepareOptions& options,
    const std::function<void(const PrepareProgress&)>& progress = nullptr);

}  // namespace braid::tools

#endif  // BRAID_TOOLS_PREPARE_DATA_PREPARE_H_
