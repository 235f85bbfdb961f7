#include "plugins/checkpoint/checkpoint_index.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/json_syntax_error.h"
#include "core/json_values.h"
#include "nlohmann/json.hpp"

namespace braid::checkpoint {
namespace {

using json = nlohmann::json;

constexpr char kOldFormat[] = "braid-checkpoint-1";
// What a user can do about a damaged index (Latest() also falls back on its own, when an older
// checkpoint reads).
constexpr char kWhatToDo[] = "; restore the file, or delete the checkpoint's folder to resume "
                             "from an older checkpoint";

// Reads the parsed document into a CheckpointIndex, checking every value before it is taken:
// each accessor below tests the JSON type first, so nothing here can throw.
class IndexReader {
 public:
  explicit IndexReader(const std::string& where) : where_(where) {}

  absl::Status Damaged(const std::string& field, const std::string& what) const {
    return absl::DataLossError(absl::StrCat(where_, " is damaged: ", field, " ", what, kWhatToDo));
  }

  absl::StatusOr<CheckpointIndex> Read(const json& doc) {
    CheckpointIndex index;
    if (absl::Status s = ReadInt(doc, "step", "", 0, &index.step); !s.ok()) return s;
    if (absl::Status s = ReadInt(doc, "world_size", "", 1, &index.world_size); !s.ok()) return s;
    if (absl::Status s = ReadFiles(doc, &index); !s.ok()) return s;
    if (absl::Status s = ReadTensors(doc, &index); !s.ok()) return s;
    if (absl::Status s = ReadExtra(doc, &index); !s.ok()) return s;
    return index;
  }

 private:
  // The value as an int64 (JSON keeps non-negative integers unsigned; larger than int64 or with
  // a fraction or exponent is not one).
  static bool AsInt64(const json& v, int64_t* out) {
    if (v.is_number_unsigned()) {
      const uint64_t u = v.get<uint64_t>();
      if (u > uint64_t(std::numeric_limits<int64_t>::max())) return false;
      *out = int64_t(u);
      return true;
    }
    if (v.is_number_integer()) {
      *out = v.get<int64_t>();
      return true;
    }
    return false;
  }

  // object[key] as an integer >= min; `path` is the object's field path ("" at the top).
  absl::Status ReadInt(const json& object, const std::string& key, const std::string& path, int64_t min,
                       int64_t* out) const {
    const std::string field = path.empty() ? key : absl::StrCat(path, ".", key);
    const json* v = JsonMember(object, key);
    if (v == nullptr) return Damaged(field, "is missing");
    if (!AsInt64(*v, out) || *out < min) {
      return Damaged(field, absl::StrCat("is ", DescribeJson(*v), ", not an integer of at least ", min));
    }
    return absl::OkStatus();
  }

  absl::Status ReadFiles(const json& doc, CheckpointIndex* index) const {
    const json* files = JsonMember(doc, "files");
    if (files == nullptr) return Damaged("files", "is missing");
    if (!files->is_object()) return Damaged("files", "is not an object of file names");
    for (const auto& [name, f] : files->items()) {
      const std::string field = absl::StrCat("files.", name);
      // The name is joined to the checkpoint's folder: it must stay inside it.
      if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos ||
          name.find('\0') != std::string::npos) {
        return Damaged("files", absl::StrCat("has '", name, "', which is not the name of a file in the "
                                             "checkpoint's folder"));
      }
      if (!f.is_object()) return Damaged(field, "is not an object with bytes and crc32");
      IndexedFile& out = index->files[name];
      if (absl::Status s = ReadInt(f, "bytes", field, 0, &out.bytes); !s.ok()) return s;
      const json* crc = JsonMember(f, "crc32");
      if (crc == nullptr) return Damaged(field + ".crc32", "is missing");
      if (!crc->is_number_unsigned() || crc->get<uint64_t>() > 0xffffffffu) {
        return Damaged(field + ".crc32", "is not a 32-bit checksum (an integer from 0 to 4294967295)");
      }
      out.crc32 = uint32_t(crc->get<uint64_t>());
    }
    // Every rank writes one file, even one that holds no chunks.
    if (int64_t(index->files.size()) != index->world_size) {
      return Damaged("files", absl::StrCat("lists ", index->files.size(), " file(s), but world_size is ",
                                           index->world_size, " (one file per rank)"));
    }
    return absl::OkStatus();
  }

  // A tensor's shape, and its element count in *numel.
  absl::Status ReadShape(const json& t, const std::string& field, std::vector<int64_t>* shape,
                         int64_t* numel) const {
    const json* s = JsonMember(t, "shape");
    if (s == nullptr) return Damaged(field, "is missing");
    if (!s->is_array()) return Damaged(field, "is not a list of sizes");
    *numel = 1;
    for (size_t i = 0; i < s->size(); ++i) {
      int64_t d;
      if (!AsInt64((*s)[i], &d) || d < 0) {
        return Damaged(absl::StrCat(field, "[", i, "]"), "is not a size (an integer >= 0)");
      }
      if (d > 0 && *numel > std::numeric_limits<int64_t>::max() / d) {
        return Damaged(field, "has more elements than a 64-bit count holds");
      }
      *numel *= d;
      shape->push_back(d);
    }
    return absl::OkStatus();
  }

  absl::Status ReadTensors(const json& doc, CheckpointIndex* index) const {
    const json* tensors = JsonMember(doc, "tensors");
    if (tensors == nullptr) return Damaged("tensors", "is missing");
    if (!tensors->is_object()) return Damaged("tensors", "is not an object of tensor names");
    // (file, key) -> the chunk that names it: two chunks cannot be one tensor of one file.
    std::map<std::pair<std::string, std::string>, std::string> keys;
    for (const auto& [name, t] : tensors->items()) {
      const std::string field = absl::StrCat("tensors.", name);
      if (!t.is_object()) return Damaged(field, "is not an object with shape, dtype and chunks");
      IndexedTensor& out = index->tensors[name];
      int64_t numel = 0;
      if (absl::Status s = ReadShape(t, field + ".shape", &out.shape, &numel); !s.ok()) return s;
      const json* dtype = JsonMember(t, "dtype");
      if (dtype == nullptr) return Damaged(field + ".dtype", "is missing");
      if (!dtype->is_string() || dtype->get_ref<const std::string&>().empty()) {
        return Damaged(field + ".dtype", "is not a dtype name");
      }
      out.dtype = dtype->get<std::string>();
      const json* chunks = JsonMember(t, "chunks");
      if (chunks == nullptr) return Damaged(field + ".chunks", "is missing");
      if (!chunks->is_array()) return Damaged(field + ".chunks", "is not a list");
      for (size_t i = 0; i < chunks->size(); ++i) {
        const std::string at = absl::StrCat(field, ".chunks[", i, "]");
        out.chunks.emplace_back();
        if (absl::Status s = ReadChunk((*chunks)[i], at, numel, *index, &out.chunks.back()); !s.ok()) return s;
        auto [it, fresh] = keys.emplace(std::make_pair(out.chunks.back().file, out.chunks.back().key), at);
        if (!fresh) return Damaged(at, absl::StrCat("names the same tensor of the same file as ", it->second));
      }
      if (absl::Status s = CheckDisjoint(out, field); !s.ok()) return s;
    }
    return absl::OkStatus();
  }

  absl::Status ReadChunk(const json& c, const std::string& at, int64_t numel, const CheckpointIndex& index,
                         IndexedChunk* out) const {
    if (!c.is_object()) return Damaged(at, "is not an object with file, key and runs");
    const json* file = JsonMember(c, "file");
    if (file == nullptr) return Damaged(at + ".file", "is missing");
    if (!file->is_string()) return Damaged(at + ".file", "is not a file name");
    out->file = file->get<std::string>();
    if (index.files.count(out->file) == 0) {
      return Damaged(at + ".file", absl::StrCat("names '", out->file, "', which files does not list"));
    }
    const json* key = JsonMember(c, "key");
    if (key == nullptr) return Damaged(at + ".key", "is missing");
    if (!key->is_string() || key->get_ref<const std::string&>().empty()) {
      return Damaged(at + ".key", "is not a tensor name");
    }
    out->key = key->get<std::string>();
    const json* runs = JsonMember(c, "runs");
    if (runs == nullptr) return Damaged(at + ".runs", "is missing");
    if (!runs->is_array()) return Damaged(at + ".runs", "is not a list of [begin, end) pairs");
    for (size_t j = 0; j < runs->size(); ++j) {
      const std::string rf = absl::StrCat(at, ".runs[", j, "]");
      const json& r = (*runs)[j];
      int64_t b, e;
      if (!r.is_array() || r.size() != 2 || !AsInt64(r[0], &b) || !AsInt64(r[1], &e)) {
        return Damaged(rf, "is not a pair of integers");
      }
      if (b < 0 || b > e || e > numel) {
        return Damaged(rf, absl::StrCat("is [", b, ", ", e, "), not a range within the tensor's ", numel,
                                        " element(s)"));
      }
      out->runs.emplace_back(b, e);
    }
    return absl::OkStatus();
  }

  // No element of a tensor is in two runs: the writer saves each once, and a load that found one
  // twice would count it twice.
  absl::Status CheckDisjoint(const IndexedTensor& t, const std::string& field) const {
    struct Run {
      int64_t begin, end;
      size_t chunk, run;
    };
    std::vector<Run> all;
    for (size_t i = 0; i < t.chunks.size(); ++i) {
      for (size_t j = 0; j < t.chunks[i].runs.size(); ++j) {
        const auto& [b, e] = t.chunks[i].runs[j];
        if (b < e) all.push_back({b, e, i, j});
      }
    }
    std::sort(all.begin(), all.end(), [](const Run& x, const Run& y) {
      return x.begin != y.begin ? x.begin < y.begin : x.chunk != y.chunk ? x.chunk < y.chunk : x.run < y.run;
    });
    const Run* reach = nullptr;  // of the runs so far, the one that ends last
    for (const Run& r : all) {
      if (reach != nullptr && r.begin < reach->end) {
        return Damaged(absl::StrCat(field, ".chunks[", r.chunk, "].runs[", r.run, "]"),
                       absl::StrCat("overlaps ", field, ".chunks[", reach->chunk, "].runs[", reach->run,
                                    "]: element ", r.begin, " is saved twice"));
      }
      if (reach == nullptr || r.end > reach->end) reach = &r;
    }
    return absl::OkStatus();
  }

  absl::Status ReadExtra(const json& doc, CheckpointIndex* index) const {
    const json* extra = JsonMember(doc, "extra");
    if (extra == nullptr) return Damaged("extra", "is missing");
    if (!extra->is_object()) return Damaged("extra", "is not an object of ranks");
    for (const auto& [key, strings] : extra->items()) {
      const std::string field = absl::StrCat("extra.", key);
      // A rank in decimal as the writer spells it (no sign, no leading zero): one spelling per
      // rank, so that no two keys are one rank.
      int64_t rank = 0;
      bool decimal = !key.empty() && key.size() <= 18 && (key == "0" || key[0] != '0');
      for (char ch : key) {
        decimal = decimal && ch >= '0' && ch <= '9';
        if (decimal) rank = rank * 10 + (ch - '0');
      }
      if (!decimal || rank >= index->world_size) {
        return Damaged(field, absl::StrCat("is not a rank (0 to ", index->world_size - 1, ")"));
      }
      if (!strings.is_object()) return Damaged(field, "is not an object of strings");
      std::map<std::string, std::string>& out = index->extra[int(rank)];
      for (const auto& [k, v] : strings.items()) {
        if (!v.is_string()) return Damaged(absl::StrCat(field, ".", k), "is not a string");
        out[k] = v.get<std::string>();
      }
    }
    return absl::OkStatus();
  }

  const std::string& where_;
};

}  // namespace

bool operator==(const IndexedFile& a, const IndexedFile& b) { return a.bytes == b.bytes && a.crc32 == b.crc32; }
bool operator==(const IndexedChunk& a, const IndexedChunk& b) {
  return a.file == b.file && a.key == b.key && a.runs == b.runs;
}
bool operator==(const IndexedTensor& a, const IndexedTensor& b) {
  return a.shape == b.shape && a.dtype == b.dtype && a.chunks == b.chunks;
}
bool operator==(const CheckpointIndex& a, const CheckpointIndex& b) {
  return a.step == b.step && a.world_size == b.world_size && a.files == b.files && a.tensors == b.tensors &&
         a.extra == b.extra;
}

absl::StatusOr<CheckpointIndex> ParseCheckpointIndex(const std::string& text, const std::string& where) {
  const json doc = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) {
    return absl::DataLossError(absl::StrCat(where, " is not JSON (", JsonSyntaxError(text),
                                            "): it is damaged or cut short", kWhatToDo));
  }
  auto not_index = [&](const std::string& why) {
    return absl::DataLossError(absl::StrCat(where, " is not a Braid checkpoint index (", why, ")"));
  };
  if (!doc.is_object()) return not_index("not a JSON object");
  auto format = doc.find("format");
  if (format == doc.end() || !format->is_string()) return not_index("it has no format");
  const std::string& name = format->get_ref<const std::string&>();
  if (name == kOldFormat) {
    return absl::DataLossError(absl::StrCat(where, " was written by an older Braid (format ", kOldFormat,
                                            ", whose checksums cannot be checked in one pass); delete its "
                                            "folder or resume with the Braid that wrote it"));
  }
  if (name != kIndexFormat) {
    return not_index(absl::StrCat("its format is '", name, "'; this Braid reads ", kIndexFormat));
  }
  return IndexReader(where).Read(doc);
}

std::string CheckpointIndexToJson(const CheckpointIndex& index) {
  // nlohmann's objects keep their keys sorted, so the text is the same whatever order the
  // fields are set in: the format every writer since braid-checkpoint-2 wrote, byte for byte.
  json files = json::object(), tensors = json::object(), extra = json::object();
  for (const auto& [name, f] : index.files) files[name] = {{"bytes", f.bytes}, {"crc32", f.crc32}};
  for (const auto& [name, t] : index.tensors) {
    json chunks = json::array();
    for (const IndexedChunk& c : t.chunks) {
      json runs = json::array();
      for (const auto& [b, e] : c.runs) runs.push_back(json::array({b, e}));
      chunks.push_back({{"file", c.file}, {"key", c.key}, {"runs", std::move(runs)}});
    }
    tensors[name] = {{"chunks", std::move(chunks)}, {"dtype", t.dtype}, {"shape", t.shape}};
  }
  for (const auto& [rank, strings] : index.extra) extra[std::to_string(rank)] = strings;
  const json doc = {{"extra", std::move(extra)},     {"files", std::move(files)}, {"format", kIndexFormat},
                    {"step", index.step},            {"tensors", std::move(tensors)},
                    {"world_size", index.world_size}};
  // `replace`: dump() would throw on a string that is not UTF-8; no parsed index has one.
  return doc.dump(-1, ' ', false, json::error_handler_t::replace);
}

absl::Status MergeCheckpointIndex(const CheckpointIndex& part, int rank, CheckpointIndex* into) {
  auto bug = [&](const std::string& what) {
    return absl::InternalError(absl::StrCat("rank ", rank, "'s part of the checkpoint index ", what));
  };
  for (const auto& [name, f] : part.files) {
    if (!into->files.emplace(name, f).second) {
      return bug(absl::StrCat("names file ", name, ", as an earlier part does"));
    }
  }
  for (const auto& [r, strings] : part.extra) {
    if (r != 0) return bug(absl::StrCat("has extra strings of rank ", r, " (a part has its own, as rank 0)"));
    if (!into->extra.emplace(rank, strings).second) return bug("repeats an earlier part's rank");
  }
  for (const auto& [name, t] : part.tensors) {
    auto [it, fresh] = into->tensors.emplace(name, IndexedTensor{t.shape, t.dtype, {}});
    if (!fresh && (it->second.shape != t.shape || it->second.dtype != t.dtype)) {
      return bug(absl::StrCat("gives ", name, " shape [", absl::StrJoin(t.shape, ", "), "] and dtype ", t.dtype,
                              ", but an earlier part [", absl::StrJoin(it->second.shape, ", "), "] and ",
                              it->second.dtype));
    }
    it->second.chunks.insert(it->second.chunks.end(), t.chunks.begin(), t.chunks.end());
  }
  return absl::OkStatus();
}

}  // namespace braid::checkpoint
