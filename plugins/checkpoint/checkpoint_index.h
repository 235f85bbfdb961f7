// A checkpoint's index.json (plugins/checkpoint): which files the checkpoint has (size and CRC-32
// of each), which global tensors, and where each tensor's elements are (chunks: a key in one file
// and the runs of the global flat index it holds), with each rank's `extra` strings.
//
// The index is the one file of a checkpoint that is read before anything is checked against it,
// so it is parsed as outside bytes: a parseable but damaged index (a hand edit, a bit flip in a
// value) must give an error naming the field, which lets Latest() fall back to an older
// checkpoint, never an exception that ends the process. It is its own unit so that it can be
// fuzzed (checkpoint_index_fuzzer.cc) and tested without a communicator or files.
//
// It depends on absl and nlohmann/json only (not on core): the plugin, its tests and the fuzzer
// all link it as it is.
#ifndef BRAID_PLUGINS_CHECKPOINT_CHECKPOINT_INDEX_H_
#define BRAID_PLUGINS_CHECKPOINT_CHECKPOINT_INDEX_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace braid::checkpoint {

// The index's "format". 2: each file's CRC-32 covers the whole file (1: its tensors' data in key
// order, which cannot be checked in one pass; such a checkpoint is refused with its own message).
inline constexpr char kIndexFormat[] = "braid-checkpoint-2";

struct IndexedFile {
  int64_t bytes = 0;   // the file's size
  uint32_t crc32 = 0;  // zlib's CRC-32 of every byte of the file
};

struct IndexedChunk {
  std::string file;  // in CheckpointIndex::files
  std::string key;   // the tensor's name in that file
  // [begin, end) ranges of the global tensor's row-major flat index, whose concatenation is the
  // file tensor's elements in order (core/state_chunks.h's Runs).
  std::vector<std::pair<int64_t, int64_t>> runs;
};

struct IndexedTensor {
  std::vector<int64_t> shape;  // of the whole (global) tensor
  std::string dtype;           // core/dtype.h's name: "f32", "bf16", ...
  std::vector<IndexedChunk> chunks;
};

// What ParseCheckpointIndex accepts, as the writer guarantees it:
//  - step >= 0; world_size >= 1, and one file per rank (files has world_size entries);
//  - every file name is a plain name in the checkpoint's folder (no '/', not "." or ".."), its
//    bytes >= 0 and its crc32 a 32-bit value;
//  - every shape's sizes >= 0, with at most 2^63 - 1 elements in all;
//  - every chunk's file is in `files`; no (file, key) is named by two chunks;
//  - every run has 0 <= begin <= end <= the tensor's element count, and no element of a tensor
//    is in two runs (the writer saves each element once: DDP's replicas and tensor-parallel
//    copies are written by one rank only);
//  - extra's keys are ranks below world_size, written in decimal.
struct CheckpointIndex {
  int64_t step = 0;
  int64_t world_size = 0;
  std::map<std::string, IndexedFile> files;      // by file name (in the checkpoint's folder)
  std::map<std::string, IndexedTensor> tensors;  // by global tensor name
  std::map<int, std::map<std::string, std::string>> extra;  // by rank
};

bool operator==(const IndexedFile& a, const IndexedFile& b);
bool operator==(const IndexedChunk& a, const IndexedChunk& b);
bool operator==(const IndexedTensor& a, const IndexedTensor& b);
bool operator==(const CheckpointIndex& a, const CheckpointIndex& b);
inline bool operator!=(const CheckpointIndex& a, const CheckpointIndex& b) { return !(a == b); }

// Parses and checks the text of an index.json. `where` names it in errors (the file's path).
// Never throws. Errors are kDataLoss:
//   "<where> is damaged: tensors.wte.weight.chunks[2].runs[0] is not a pair of integers; ..."
// naming the field, or "<where> is not JSON (...)", or, for an index of format
// braid-checkpoint-1, "<where> was written by an older Braid ...".
absl::StatusOr<CheckpointIndex> ParseCheckpointIndex(const std::string& text, const std::string& where);

// The index as index.json holds it: compact JSON, keys sorted, as every Braid writer since
// format 2 has written it (byte for byte). Never throws; a string that is not valid UTF-8 (no
// parsed index has one) is written with U+FFFD in place of its invalid bytes.
std::string CheckpointIndexToJson(const CheckpointIndex& index);

// Adds rank `rank`'s part to `into`, as rank 0 assembles the index from every rank's part. A part
// is the index of that rank's file alone, as if the world were that one rank (world_size 1, its
// one file, its chunks, its extra under rank 0): so it is sent as index text and checked by
// ParseCheckpointIndex like any index. Chunks are appended in the order parts are added; `into`'s
// step and world_size are the caller's to set. Fails (kInternal: a bug in some strategy's chunks,
// not damage) where the part names a file or rank `into` already has, or gives a tensor another
// shape or dtype than an earlier part did.
absl::Status MergeCheckpointIndex(const CheckpointIndex& part, int rank, CheckpointIndex* into);

}  // namespace braid::checkpoint

#endif  // BRAID_PLUGINS_CHECKPOINT_CHECKPOINT_INDEX_H_
