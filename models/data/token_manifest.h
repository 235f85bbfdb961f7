// A prepared token data set (written by //tools:prepare_data, docs/DATA.md): a folder of shard
// files of little-endian u16 or u32 token ids and a manifest.json that says what they are:
//
//   {"format": "braid-tokens-1", "tokenizer": "gpt2", "vocab_size": 50257, "eot_id": 50256,
//    "dtype": "u16", "seed": 1234, "val_fraction": 0.1,
//    "documents": {"train": 122, "validation": 13},
//    "shards": [{"file": "train-00000.bin", "split": "train", "tokens": 271039,
//                "max_token_id": 50256, "sha256": "..."}, ...]}
//
// Documents (a text file, or a line of a JSON-lines file) were split into train and validation
// whole, by a seeded shuffle; each split's documents are written in input order, each followed
// by eot_id (absent when the tokenizer has none), and a split's shards read one after another
// are its token stream. The reader checks everything before training reads a token, so a
// missing, truncated, damaged or foreign shard, or an id the model has no row for, is one
// message at start naming the file and what to do.
#ifndef BRAID_MODELS_DATA_TOKEN_MANIFEST_H_
#define BRAID_MODELS_DATA_TOKEN_MANIFEST_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "models/data/token_data.h"

namespace braid::data {

inline constexpr char kTokenManifestFormat[] = "braid-tokens-1";
inline constexpr char kTokenManifestName[] = "manifest.json";

enum class Split { kTrain, kValidation };
const char* SplitName(Split s);  // "train", "validation"

struct TokenShard {
  std::string file;  // a plain file name, in the manifest's folder
  Split split = Split::kTrain;
  int64_t tokens = 0;  // >= 1
  uint32_t max_token_id = 0;
  std::string sha256;  // of the file's bytes, 64 lower-case hex digits
};

struct TokenManifest {
  std::string tokenizer;  // text::Tokenizer::name() of what wrote the ids ("gpt2", "byte", ...)
  uint32_t vocab_size = 0;
  std::optional<uint32_t> eot_id;  // the token after each document, if the tokenizer has one
  TokenType dtype = TokenType::kU16;  // kU16 or kU32
  uint64_t seed = 0;          // of the split's shuffle
  double val_fraction = 0;    // asked for; the documents below are what it gave
  int64_t train_documents = 0;
  int64_t validation_documents = 0;
  std::vector<TokenShard> shards;  // each split's in stream order

  int64_t Tokens(Split s) const;
  std::vector<const TokenShard*> Shards(Split s) const;
};

bool operator==(const TokenShard& a, const TokenShard& b);
bool operator==(const TokenManifest& a, const TokenManifest& b);
inline bool operator!=(const TokenManifest& a, const TokenManifest& b) { return !(a == b); }

// Reads a manifest's text (no file is touched); `where` names it in errors, which are
// InvalidArgument, one line, and say what to do.
absl::StatusOr<TokenManifest> ParseTokenManifest(const std::string& text, const std::string& where);
// The manifest as prepare_data writes it: keys sorted, one shard a line, newline at the end; the
// same manifest always gives the same bytes.
std::string TokenManifestToJson(const TokenManifest& m);

// Checks a prepared data set's ids against a model's vocabulary from its manifest alone, for
// the start of a run (before the model is built): OK when every shard's max_token_id and the
// tokenizer's vocabulary fit; otherwise the data set is opened to name the shard and offset
// (TokenDataset::CheckVocab). A manifest that does not read is its error.
absl::Status CheckTokenDatasetVocab(const std::string& path, int64_t vocab_size);

// True when a data.path means a prepared data set (a folder, or a file ending in .json) rather
// than a flat token file.
bool IsTokenDatasetPath(const std::string& path);

// A prepared data set on disk, checked.
class TokenDataset {
 public:
  // `path`: the manifest, or the folder holding manifest.json. Checks that every shard is there,
  // holds exactly its tokens (size = tokens x width) and has its SHA-256 (reads every shard
  // once).
  static absl::StatusOr<TokenDataset> Open(const std::string& path);

  const TokenManifest& manifest() const { return manifest_; }
  const std::string& manifest_path() const { return manifest_path_; }
  std::string ShardPath(const TokenShard& s) const { return dir_ + "/" + s.file; }

  // OK when every id is < vocab_size (a model's embedding rows); else InvalidArgument naming
  // the first shard and offset holding a larger id (found from max_token_id, then a scan of
  // that shard only).
  absl::Status CheckVocab(int64_t vocab_size) const;

  // The split's shards one after another, memory-mapped. NotFound (saying to prepare with
  // --val_fraction) when the split has no tokens.
  absl::StatusOr<std::shared_ptr<const TokenFile>> Tokens(Split s) const;

 private:
  TokenManifest manifest_;
  std::string manifest_path_;
  std::string dir_;
};

}  // namespace braid::data

#endif  // BRAID_MODELS_DATA_TOKEN_MANIFEST_H_
