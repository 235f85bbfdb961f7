#include "models/data/token_manifest.h"

#include <sys/stat.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/check.h"
#include "models/data/sha256.h"
#include "core/json_syntax_error.h"
#include "core/json_values.h"
#include "nlohmann/json.hpp"

namespace braid::data {
namespace {

using json = nlohmann::json;

constexpr char kPrepareAgain[] =
    "prepare the data again (bazel run //tools:prepare_data, docs/DATA.md)";

// Reads the document, testing each value's JSON type before taking it, so nothing throws.
class Reader {
 public:
  explicit Reader(const std::string& where) : where_(where) {}

  absl::Status Bad(const std::string& field, const std::string& what) const {
    return absl::InvalidArgumentError(
        absl::StrCat(where_, ": ", field, " ", what, "; the manifest is damaged: ", kPrepareAgain));
  }

  // An integer in [min, max].
  absl::Status Int(const json& o, const std::string& key, const std::string& field, uint64_t min,
                   uint64_t max, uint64_t* out) const {
    const json* v = JsonMember(o, key);
    if (v == nullptr) return Bad(field, "is missing");
    if (!v->is_number_unsigned() || v->get<uint64_t>() < min || v->get<uint64_t>() > max) {
      return Bad(field, absl::StrCat("is ", DescribeJson(*v), ", not an integer in [", min, ", ", max,
                                     "]"));
    }
    *out = v->get<uint64_t>();
    return absl::OkStatus();
  }

  absl::Status String(const json& o, const std::string& key, const std::string& field,
                      std::string* out) const {
    const json* v = JsonMember(o, key);
    if (v == nullptr) return Bad(field, "is missing");
    if (!v->is_string() || v->get_ref<const std::string&>().empty()) {
      return Bad(field, absl::StrCat("is ", DescribeJson(*v), ", not a non-empty string"));
    }
    *out = v->get<std::string>();
    return absl::OkStatus();
  }

  absl::StatusOr<TokenManifest> Read(const json& doc) const {
    TokenManifest m;
    uint64_t u = 0;
    BRAID_RETURN_IF_ERROR(String(doc, "tokenizer", "tokenizer", &m.tokenizer));
    BRAID_RETURN_IF_ERROR(Int(doc, "vocab_size", "vocab_size", 1, UINT32_MAX, &u));
    m.vocab_size = uint32_t(u);
    std::string dtype;
    BRAID_RETURN_IF_ERROR(String(doc, "dtype", "dtype", &dtype));
    if (dtype == "u16") {
      m.dtype = TokenType::kU16;
    } else if (dtype == "u32") {
      m.dtype = TokenType::kU32;
    } else {
      return Bad("dtype", absl::StrCat("is ", DescribeJson(doc["dtype"]), ", not \"u16\" or \"u32\""));
    }
    if (m.dtype == TokenType::kU16 && m.vocab_size > 65536) {
      return Bad("dtype", absl::StrCat("is \"u16\", which cannot hold the ids of a vocabulary of ",
                                       m.vocab_size));
    }
    if (JsonMember(doc, "eot_id") != nullptr) {
      BRAID_RETURN_IF_ERROR(Int(doc, "eot_id", "eot_id", 0, m.vocab_size - 1, &u));
      m.eot_id = uint32_t(u);
    }
    BRAID_RETURN_IF_ERROR(Int(doc, "seed", "seed", 0, UINT64_MAX, &m.seed));
    const json* f = JsonMember(doc, "val_fraction");
    if (f == nullptr) return Bad("val_fraction", "is missing");
    if (!f->is_number() || !(f->get<double>() >= 0 && f->get<double>() < 1)) {
      return Bad("val_fraction", absl::StrCat("is ", DescribeJson(*f), ", not a number in [0, 1)"));
    }
    m.val_fraction = f->get<double>();
    const json* docs = JsonMember(doc, "documents");
    if (docs == nullptr || !docs->is_object()) return Bad("documents", "is not an object");
    constexpr uint64_t kMaxCount = uint64_t(std::numeric_limits<int64_t>::max());
    BRAID_RETURN_IF_ERROR(Int(*docs, "train", "documents.train", 1, kMaxCount, &u));
    m.train_documents = int64_t(u);
    BRAID_RETURN_IF_ERROR(Int(*docs, "validation", "documents.validation", 0, kMaxCount, &u));
    m.validation_documents = int64_t(u);

    const json* shards = JsonMember(doc, "shards");
    if (shards == nullptr || !shards->is_array() || shards->empty()) {
      return Bad("shards", "is not a non-empty list");
    }
    std::set<std::string> names;
    for (size_t i = 0; i < shards->size(); ++i) {
      const json& s = (*shards)[i];
      const std::string at = absl::StrCat("shards[", i, "]");
      if (!s.is_object()) return Bad(at, "is not an object");
      TokenShard shard;
      BRAID_RETURN_IF_ERROR(String(s, "file", at + ".file", &shard.file));
      if (shard.file == "." || shard.file == ".." ||
          shard.file.find_first_of(std::string("/\\\0", 3)) != std::string::npos) {
        return Bad(at + ".file", absl::StrCat("is ", DescribeJson(s["file"]),
                                              ", not a file name in the manifest's folder"));
      }
      if (!names.insert(shard.file).second) {
        return Bad(at + ".file", absl::StrCat("names ", DescribeJson(s["file"]), " a second time"));
      }
      std::string split;
      BRAID_RETURN_IF_ERROR(String(s, "split", at + ".split", &split));
      if (split == "train") {
        shard.split = Split::kTrain;
      } else if (split == "validation") {
        shard.split = Split::kValidation;
      } else {
        return Bad(at + ".split", absl::StrCat("is ", DescribeJson(s["split"]),
                                               ", not \"train\" or \"validation\""));
      }
      BRAID_RETURN_IF_ERROR(Int(s, "tokens", at + ".tokens", 1,
                                kMaxCount / uint64_t(TokenWidth(m.dtype)), &u));
      shard.tokens = int64_t(u);
      BRAID_RETURN_IF_ERROR(Int(s, "max_token_id", at + ".max_token_id", 0, m.vocab_size - 1, &u));
      shard.max_token_id = uint32_t(u);
      BRAID_RETURN_IF_ERROR(String(s, "sha256", at + ".sha256", &shard.sha256));
      if (shard.sha256.size() != 64 ||
          shard.sha256.find_first_not_of("0123456789abcdef") != std::string::npos) {
        return Bad(at + ".sha256", "is not 64 lower-case hex digits");
      }
      m.shards.push_back(std::move(shard));
    }
    if (m.Shards(Split::kTrain).empty()) return Bad("shards", "lists no train shard");
    const bool has_validation = !m.Shards(Split::kValidation).empty();
    if (has_validation != (m.validation_documents > 0)) {
      return Bad("documents.validation",
                 absl::StrCat("is ", m.validation_documents, " but ",
                              has_validation ? "validation shards are" : "no validation shard is",
                              " listed"));
    }
    int64_t total = 0;
    for (const TokenShard& s : m.shards) {
      if (s.tokens > std::numeric_limits<int64_t>::max() - total) {
        return Bad("shards", "hold more tokens than a 64-bit count");
      }
      total += s.tokens;
    }
    return m;
  }

 private:
  const std::string& where_;
};

json ShardJson(const TokenShard& s) {
  return {{"file", s.file},
          {"max_token_id", s.max_token_id},
          {"sha256", s.sha256},
          {"split", SplitName(s.split)},
          {"tokens", s.tokens}};
}

absl::StatusOr<std::string> ReadWhole(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(std::strerror(errno));
  std::ostringstream buf;
  buf << in.rdbuf();
  return buf.str();
}

bool IsDirectory(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

}  // namespace

const char* SplitName(Split s) { return s == Split::kTrain ? "train" : "validation"; }

int64_t TokenManifest::Tokens(Split s) const {
  int64_t n = 0;
  for (const TokenShard& shard : shards) n += shard.split == s ? shard.tokens : 0;
  return n;
}

std::vector<const TokenShard*> TokenManifest::Shards(Split s) const {
  std::vector<const TokenShard*> out;
  for (const TokenShard& shard : shards) {
    if (shard.split == s) out.push_back(&shard);
  }
  return out;
}

bool operator==(const TokenShard& a, const TokenShard& b) {
  return a.file == b.file && a.split == b.split && a.tokens == b.tokens &&
         a.max_token_id == b.max_token_id && a.sha256 == b.sha256;
}

bool operator==(const TokenManifest& a, const TokenManifest& b) {
  return a.tokenizer == b.tokenizer && a.vocab_size == b.vocab_size && a.eot_id == b.eot_id &&
         a.dtype == b.dtype && a.seed == b.seed && a.val_fraction == b.val_fraction &&
         a.train_documents == b.train_documents &&
         a.validation_documents == b.validation_documents && a.shards == b.shards;
}

absl::StatusOr<TokenManifest> ParseTokenManifest(const std::string& text, const std::string& where) {
  const json doc = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) {
    return absl::InvalidArgumentError(absl::StrCat(where, " is not JSON (", JsonSyntaxError(text),
                                                   "): it is damaged or cut short; ", kPrepareAgain));
  }
  const json* format = JsonMember(doc, "format");
  if (format == nullptr || !format->is_string()) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, " is not a Braid token manifest (it has no \"format\"); give data.path the "
               "folder or manifest.json that //tools:prepare_data wrote"));
  }
  if (format->get_ref<const std::string&>() != kTokenManifestFormat) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, " has format ", DescribeJson(*format), "; this Braid reads \"",
        kTokenManifestFormat, "\": ", kPrepareAgain, " with this Braid"));
  }
  return Reader(where).Read(doc);
}

std::string TokenManifestToJson(const TokenManifest& m) {
  // One key a line and one shard a line, keys sorted: readable, diffable and deterministic.
  std::string out = "{\n";
  out += absl::StrCat("  \"documents\": ",
                      json({{"train", m.train_documents}, {"validation", m.validation_documents}})
                          .dump(),
                      ",\n");
  out += absl::StrCat("  \"dtype\": \"", TokenTypeName(m.dtype), "\",\n");
  if (m.eot_id.has_value()) out += absl::StrCat("  \"eot_id\": ", *m.eot_id, ",\n");
  out += absl::StrCat("  \"format\": \"", kTokenManifestFormat, "\",\n");
  out += absl::StrCat("  \"seed\": ", m.seed, ",\n");
  out += "  \"shards\": [\n";
  for (size_t i = 0; i < m.shards.size(); ++i) {
    out += absl::StrCat("    ", ShardJson(m.shards[i]).dump(-1, ' ', false, json::error_handler_t::replace),
                        i + 1 < m.shards.size() ? ",\n" : "\n");
  }
  out += "  ],\n";
  out += absl::StrCat("  \"tokenizer\": ",
                      json(m.tokenizer).dump(-1, ' ', false, json::error_handler_t::replace), ",\n");
  out += absl::StrCat("  \"val_fraction\": ", json(m.val_fraction).dump(), ",\n");
  out += absl::StrCat("  \"vocab_size\": ", m.vocab_size, "\n");
  out += "}\n";
  return out;
}

bool IsTokenDatasetPath(const std::string& path) {
  return IsDirectory(path) || absl::EndsWith(path, ".json");
}

namespace {

// The manifest of the data set at `path` (its folder or the manifest itself), and that folder.
absl::StatusOr<TokenManifest> ReadManifest(const std::string& path, std::string* manifest_path,
                                           std::string* dir) {
  if (IsDirectory(path)) {
    *dir = path;
    *manifest_path = absl::StrCat(path, "/", kTokenManifestName);
  } else {
    *manifest_path = path;
    const size_t slash = path.rfind('/');
    *dir = slash == std::string::npos ? "." : path.substr(0, slash == 0 ? 1 : slash);
  }
  absl::StatusOr<std::string> text = ReadWhole(*manifest_path);
  if (!text.ok()) {
    return absl::NotFoundError(absl::StrCat(
        "cannot read the token manifest '", *manifest_path, "' (", text.status().message(),
        "): prepare the data first (bazel run //tools:prepare_data, docs/DATA.md), or give "
        "data.path its folder"));
  }
  return ParseTokenManifest(*text, *manifest_path);
}

}  // namespace

absl::Status CheckTokenDatasetVocab(const std::string& path, int64_t vocab_size) {
  std::string manifest_path, dir;
  BRAID_ASSIGN_OR_RETURN(TokenManifest m, ReadManifest(path, &manifest_path, &dir));
  bool fits = int64_t(m.vocab_size) <= vocab_size;
  for (const TokenShard& s : m.shards) fits = fits && int64_t(s.max_token_id) < vocab_size;
  if (fits) return absl::OkStatus();
  BRAID_ASSIGN_OR_RETURN(TokenDataset d, TokenDataset::Open(path));
  return d.CheckVocab(vocab_size);
}

absl::StatusOr<TokenDataset> TokenDataset::Open(const std::string& path) {
  TokenDataset d;
  BRAID_ASSIGN_OR_RETURN(d.manifest_, ReadManifest(path, &d.manifest_path_, &d.dir_));
  const int64_t width = TokenWidth(d.manifest_.dtype);
  for (const TokenShard& s : d.manifest_.shards) {
    const std::string p = d.ShardPath(s);
    struct stat st;
    if (::stat(p.c_str(), &st) != 0) {
      return absl::NotFoundError(absl::StrCat("shard '", p, "' listed in ", d.manifest_path_,
                                              " is missing (", std::strerror(errno), "); ",
                                              kPrepareAgain));
    }
    if (int64_t(st.st_size) != s.tokens * width) {
      return absl::DataLossError(absl::StrCat(
          "shard '", p, "' has ", int64_t(st.st_size), " bytes; ", d.manifest_path_, " says ",
          s.tokens, " ", TokenTypeName(d.manifest_.dtype), " tokens (", s.tokens * width,
          " bytes): it is truncated or from another run; ", kPrepareAgain));
    }
    BRAID_ASSIGN_OR_RETURN(std::string sum, Sha256OfFile(p));
    if (sum != s.sha256) {
      return absl::DataLossError(absl::StrCat(
          "shard '", p, "' does not match its SHA-256 in ", d.manifest_path_,
          ": it is damaged or from another run; ", kPrepareAgain));
    }
  }
  return d;
}

absl::Status TokenDataset::CheckVocab(int64_t vocab_size) const {
  for (const TokenShard& s : manifest_.shards) {
    if (int64_t(s.max_token_id) < vocab_size) continue;
    // The checksum matched, so max_token_id is true: the scan finds the id.
    BRAID_ASSIGN_OR_RETURN(TokenFile f, TokenFile::Open(ShardPath(s), manifest_.dtype));
    for (int64_t i = 0; i < f.size(); ++i) {
      if (f[i] >= vocab_size) {
        return absl::InvalidArgumentError(absl::StrCat(
            "shard '", ShardPath(s), "' holds token id ", f[i], " at offset ", i,
            " (token index in that shard), beyond the model's vocabulary of ", vocab_size,
            ": the data was prepared with tokenizer ", manifest_.tokenizer, " (", manifest_.vocab_size,
            " ids); set model.vocab_size to at least ", manifest_.vocab_size,
            " or prepare the data with the model's tokenizer"));
      }
    }
    BRAID_CHECK(false) << "shard " << ShardPath(s) << " has no id >= " << vocab_size
                       << " though its manifest's max_token_id is " << s.max_token_id;
  }
  if (int64_t(manifest_.vocab_size) > vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        manifest_path_, " was prepared with tokenizer ", manifest_.tokenizer, ", whose ",
        manifest_.vocab_size, " ids are more than the model's vocabulary of ", vocab_size,
        ": set model.vocab_size to at least ", manifest_.vocab_size));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const TokenFile>> TokenDataset::Tokens(Split s) const {
  std::vector<std::string> paths;
  for (const TokenShard* shard : manifest_.Shards(s)) paths.push_back(ShardPath(*shard));
  if (paths.empty()) {
    return absl::NotFoundError(absl::StrCat(
        manifest_path_, " has no ", SplitName(s),
        " split: prepare the data with --val_fraction above 0 (e.g. 0.1)"));
  }
  BRAID_ASSIGN_OR_RETURN(
      TokenFile f, TokenFile::OpenConcatenated(
                       paths, manifest_.dtype, absl::StrCat(manifest_path_, " (", SplitName(s), " split)")));
  return std::shared_ptr<const TokenFile>(std::make_shared<TokenFile>(std::move(f)));
}

}  // namespace braid::data
