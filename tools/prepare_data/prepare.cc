#include "tools/prepare_data/prepare.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/check.h"
#include "models/data/random.h"
#include "models/data/sha256.h"
#include "models/text/gpt2_tokenizer.h"
#include "models/text/sentencepiece_tokenizer.h"
#include "nlohmann/json.hpp"

namespace braid::tools {
namespace {

namespace fs = std::filesystem;
using data::Split;
using data::TokenManifest;
using data::TokenShard;
using data::TokenType;
using json = nlohmann::json;

constexpr char kPartial[] = ".partial";
// Text per batch of documents handed to the threads: bounds the ids held in memory at once.
constexpr int64_t kChunkBytes = int64_t{64} << 20;

// An input file. JSON-lines files are memory-mapped for the run (their lines are listed before
// any is read); a text file is read whole by the thread that tokenizes it, so that a folder of
// many files holds neither a mapping nor a descriptor per file.
class Source {
 public:
  static absl::StatusOr<std::unique_ptr<Source>> Open(const std::string& path,
                                                      const std::string& name, bool jsonl) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return absl::NotFoundError(absl::StrCat(name, ": cannot read it (", std::strerror(errno), ")"));
    struct stat st;
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      ::close(fd);
      return absl::InvalidArgumentError(absl::StrCat(name, ": not a regular file"));
    }
    auto s = std::unique_ptr<Source>(new Source(path, name, jsonl));
    s->size_ = size_t(st.st_size);
    if (s->size_ == 0) {
      ::close(fd);
      return absl::InvalidArgumentError(
          absl::StrCat(name, " is empty: give it text, or leave it out of the inputs"));
    }
    if (!jsonl) {
      ::close(fd);
      return s;
    }
    void* m = ::mmap(nullptr, s->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    const int e = errno;
    ::close(fd);
    if (m == MAP_FAILED) return absl::InternalError(absl::StrCat(name, ": cannot map it (", std::strerror(e), ")"));
    s->bytes_ = static_cast<const char*>(m);
    return s;
  }
  ~Source() {
    if (bytes_ != nullptr) ::munmap(const_cast<char*>(bytes_), size_);
  }
  const std::string& name() const { return name_; }
  bool jsonl() const { return jsonl_; }
  size_t size() const { return size_; }
  // A JSON-lines file's bytes.
  absl::string_view bytes() const { return absl::string_view(bytes_, size_); }
  // A text file's bytes, read now; the file must still be the size it was when listed.
  absl::Status Read(std::string* out) const {
    FILE* f = std::fopen(path_.c_str(), "rb");
    if (f == nullptr) return absl::NotFoundError(absl::StrCat(name_, ": cannot read it (", std::strerror(errno), ")"));
    out->resize(size_ + 1);
    const size_t got = std::fread(&(*out)[0], 1, size_ + 1, f);
    std::fclose(f);
    if (got != size_) {
      return absl::FailedPreconditionError(absl::StrCat(
          name_, " changed while it was being prepared (", size_, " bytes, then ", got,
          "): run again once it is written"));
    }
    out->resize(size_);
    return absl::OkStatus();
  }

 private:
  Source(std::string path, std::string name, bool jsonl)
      : path_(std::move(path)), name_(std::move(name)), jsonl_(jsonl) {}
  std::string path_;
  std::string name_;
  bool jsonl_;
  const char* bytes_ = nullptr;
  size_t size_ = 0;
};

struct Doc {
  uint32_t source = 0;
  uint64_t begin = 0, size = 0;
  uint64_t line = 0;  // 1-based line of a JSON-lines document; 0 for a whole file
};

std::string Join(const std::string& base, const std::string& path) {
  if (base.empty() || path.empty() || path[0] == '/') return path;
  return absl::StrCat(base, "/", path);
}

// The inputs as files, in order; folders walked recursively in byte order of their paths,
// hidden entries (".name") skipped.
absl::StatusOr<std::vector<std::unique_ptr<Source>>> OpenInputs(const PrepareOptions& o,
                                                                const std::string& base) {
  std::vector<std::unique_ptr<Source>> out;
  if (o.inputs.empty()) {
    return absl::InvalidArgumentError("no input: name text files, folders or JSON-lines files");
  }
  for (const std::string& input : o.inputs) {
    const std::string path = Join(base, input);
    std::error_code ec;
    const fs::file_status st = fs::status(path, ec);
    if (ec || !fs::exists(st)) {
      return absl::NotFoundError(absl::StrCat(input, ": no such file or folder"));
    }
    if (!fs::is_directory(st)) {
      BRAID_ASSIGN_OR_RETURN(auto s, Source::Open(path, input, IsJsonLinesFileName(input)));
      out.push_back(std::move(s));
      continue;
    }
    std::vector<std::string> found;  // relative to the folder
    fs::recursive_directory_iterator it(path, ec), end;
    if (ec) return absl::PermissionDeniedError(absl::StrCat(input, ": cannot list it (", ec.message(), ")"));
    for (; it != end; it.increment(ec)) {
      if (ec) return absl::PermissionDeniedError(absl::StrCat(input, ": cannot list it (", ec.message(), ")"));
      const std::string leaf = it->path().filename().string();
      if (!leaf.empty() && leaf[0] == '.') {
        if (it->is_directory(ec)) it.disable_recursion_pending();
        continue;
      }
      if (it->is_regular_file(ec) && IsTextFileName(leaf)) {
        found.push_back(fs::relative(it->path(), path, ec).string());
      }
    }
    if (found.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "folder ", input, " holds no text: no file in it ends in .txt, .md, .text, .jsonl or "
          ".ndjson; name the files themselves to read others"));
    }
    std::sort(found.begin(), found.end());
    for (const std::string& rel : found) {
      const std::string name = absl::StrCat(input, absl::EndsWith(input, "/") ? "" : "/", rel);
      BRAID_ASSIGN_OR_RETURN(auto s, Source::Open(Join(path + "/", rel), name, IsJsonLinesFileName(rel)));
      out.push_back(std::move(s));
    }
  }
  return out;
}

// A whole text file is one document; each non-blank line of a JSON-lines file is one.
absl::StatusOr<std::vector<Doc>> ListDocuments(const std::vector<std::unique_ptr<Source>>& sources) {
  std::vector<Doc> docs;
  for (uint32_t i = 0; i < sources.size(); ++i) {
    if (!sources[i]->jsonl()) {
      docs.push_back(Doc{i, 0, sources[i]->size(), 0});
      continue;
    }
    const absl::string_view b = sources[i]->bytes();
    const size_t before = docs.size();
    uint64_t line = 0;
    for (size_t pos = 0; pos < b.size();) {
      size_t nl = b.find('\n', pos);
      if (nl == absl::string_view::npos) nl = b.size();
      ++line;
      const absl::string_view text = b.substr(pos, nl - pos);
      if (text.find_first_not_of(" \t\r") != absl::string_view::npos) {
        docs.push_back(Doc{i, pos, nl - pos, line});
      }
      pos = nl + 1;
    }
    if (docs.size() == before) {
      return absl::InvalidArgumentError(
          absl::StrCat(sources[i]->name(), " has no JSON lines: it holds only blank lines"));
    }
  }
  return docs;
}

// The document's text: the whole file, or the line's field.
absl::StatusOr<absl::string_view> DocumentText(const Source& s, const Doc& d, const std::string& field,
                                               std::string* storage) {
  if (!s.jsonl()) {
    BRAID_RETURN_IF_ERROR(s.Read(storage));
    return absl::string_view(*storage);
  }
  const absl::string_view bytes = s.bytes().substr(d.begin, d.size);
  const json v = json::parse(bytes.begin(), bytes.end(), nullptr, /*allow_exceptions=*/false);
  const std::string at = absl::StrCat(s.name(), ":", d.line);
  if (v.is_discarded()) {
    return absl::InvalidArgumentError(
        absl::StrCat(at, ": not JSON; each line of a JSON-lines file is one JSON object"));
  }
  if (!v.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(at, ": not a JSON object"));
  }
  auto it = v.find(field);
  if (it == v.end() || !it->is_string()) {
    std::vector<std::string> keys;
    for (auto k = v.begin(); k != v.end() && keys.size() < 8; ++k) keys.push_back(k.key());
    return absl::InvalidArgumentError(absl::StrCat(
        at, ": no string field \"", field, "\"",
        keys.empty() ? " (the object is empty)"
                     : absl::StrCat(" (its fields: ", absl::StrJoin(keys, ", "), ")"),
        "; name the text's field with --jsonl_field"));
  }
  *storage = it->get<std::string>();
  return absl::string_view(*storage);
}

// One split's shards, written under temporary names, with their checksums and largest ids.
class ShardWriter {
 public:
  ShardWriter(std::string dir, Split split, TokenType dtype, int64_t shard_tokens)
      : dir_(std::move(dir)), split_(split), dtype_(dtype), shard_tokens_(shard_tokens) {}
  ~ShardWriter() {
    if (file_ != nullptr) std::fclose(file_);
  }

  absl::Status Append(const std::vector<uint32_t>& ids, int* shards_closed) {
    size_t i = 0;
    while (i < ids.size()) {
      if (file_ == nullptr) BRAID_RETURN_IF_ERROR(StartShard());
      const size_t take = size_t(std::min<int64_t>(int64_t(ids.size() - i), shard_tokens_ - current_.tokens));
      buf_.clear();
      for (size_t k = i; k < i + take; ++k) {
        const uint32_t id = ids[k];
        current_.max_token_id = std::max(current_.max_token_id, id);
        buf_.push_back(char(id & 0xff));
        buf_.push_back(char((id >> 8) & 0xff));
        if (dtype_ == TokenType::kU32) {
          buf_.push_back(char((id >> 16) & 0xff));
          buf_.push_back(char(id >> 24));
        }
      }
      if (std::fwrite(buf_.data(), 1, buf_.size(), file_) != buf_.size()) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "writing ", TempPath(), " failed (", std::strerror(errno), "): free disk space"));
      }
      sha_->Update(buf_.data(), buf_.size());
      current_.tokens += int64_t(take);
      i += take;
      if (current_.tokens == shard_tokens_) {
        BRAID_RETURN_IF_ERROR(CloseShard());
        ++*shards_closed;
      }
    }
    return absl::OkStatus();
  }

  absl::Status Finish(int* shards_closed) {
    if (file_ == nullptr) return absl::OkStatus();
    ++*shards_closed;
    return CloseShard();
  }

  const std::vector<TokenShard>& shards() const { return shards_; }

 private:
  std::string FinalName() const {
    return absl::StrFormat("%s-%05d.bin", data::SplitName(split_), int(shards_.size()));
  }
  std::string TempPath() const { return absl::StrCat(dir_, "/", FinalName(), kPartial); }

  absl::Status StartShard() {
    file_ = std::fopen(TempPath().c_str(), "wb");
    if (file_ == nullptr) {
      return absl::PermissionDeniedError(
          absl::StrCat("cannot write ", TempPath(), " (", std::strerror(errno), ")"));
    }
    current_ = TokenShard();
    current_.file = FinalName();
    current_.split = split_;
    sha_ = std::make_unique<data::Sha256>();
    return absl::OkStatus();
  }

  absl::Status CloseShard() {
    const bool ok = std::fflush(file_) == 0 && ::fsync(fileno(file_)) == 0;
    const bool closed = std::fclose(file_) == 0;
    file_ = nullptr;
    if (!ok || !closed) {
      return absl::ResourceExhaustedError(
          absl::StrCat("writing ", TempPath(), " failed: free disk space"));
    }
    current_.sha256 = sha_->Hex();
    shards_.push_back(current_);
    return absl::OkStatus();
  }

  std::string dir_;
  Split split_;
  TokenType dtype_;
  int64_t shard_tokens_;
  FILE* file_ = nullptr;
  TokenShard current_;
  std::unique_ptr<data::Sha256> sha_;
  std::vector<char> buf_;
  std::vector<TokenShard> shards_;
};

bool IsShardName(const std::string& name) {
  for (const char* split : {"train-", "validation-"}) {
    if (absl::StartsWith(name, split) &&
        (absl::EndsWith(name, ".bin") || absl::EndsWith(name, absl::StrCat(".bin", kPartial)))) {
      return true;
    }
  }
  return absl::StartsWith(name, data::kTokenManifestName) && absl::EndsWith(name, kPartial);
}

// Temporary files of an earlier run that stopped early.
void RemovePartials(const std::string& dir) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (IsShardName(name) && absl::EndsWith(name, kPartial)) fs::remove(e.path(), ec);
  }
}

absl::Status WriteFileAtomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + kPartial;
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) return absl::PermissionDeniedError(absl::StrCat("cannot write ", tmp));
  bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  ok = std::fflush(f) == 0 && ::fsync(fileno(f)) == 0 && ok;
  ok = std::fclose(f) == 0 && ok;
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    return absl::ResourceExhaustedError(absl::StrCat("writing ", path, " failed: free disk space"));
  }
  return absl::OkStatus();
}

// The documents that go to validation: the first k of a seeded Fisher-Yates shuffle.
absl::StatusOr<std::vector<bool>> ChooseValidation(const std::vector<Doc>& docs,
                                                   const std::vector<std::unique_ptr<Source>>& sources,
                                                   double fraction, uint64_t seed) {
  const uint64_t n = docs.size();
  std::vector<bool> val(n, false);
  if (fraction <= 0) return val;
  if (n < 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the input is one document (", sources[docs[0].source]->name(),
        "), and the train/validation split keeps documents whole: give several files, a "
        "folder or a JSON-lines file, or pass --val_fraction=0 for no validation split"));
  }
  const uint64_t k = std::clamp<uint64_t>(uint64_t(std::llround(double(n) * fraction)), 1, n - 1);
  std::vector<uint64_t> order(n);
  for (uint64_t i = 0; i < n; ++i) order[i] = i;
  data::SplitMix64 rng(seed);
  for (uint64_t i = 0; i < k; ++i) {
    std::swap(order[i], order[i + data::UniformBelow(rng, n - i)]);
    val[order[i]] = true;
  }
  return val;
}

}  // namespace

bool IsJsonLinesFileName(const std::string& name) {
  return absl::EndsWith(name, ".jsonl") || absl::EndsWith(name, ".ndjson");
}

bool IsTextFileName(const std::string& name) {
  for (const char* ext : {".txt", ".md", ".text"}) {
    if (absl::EndsWith(name, ext)) return true;
  }
  return IsJsonLinesFileName(name);
}

std::optional<uint32_t> DefaultEndOfText(const text::Tokenizer& tokenizer) {
  if (const auto* g = dynamic_cast<const text::Gpt2Tokenizer*>(&tokenizer)) {
    for (uint32_t id = g->vocab_size(); id-- > 0;) {  // GPT-2's is the last id
      if (g->model().token(id) == "<|endoftext|>") return id;
    }
  }
  if (const auto* s = dynamic_cast<const text::SentencePieceTokenizer*>(&tokenizer)) {
    return s->eos_id();
  }
  return std::nullopt;
}

namespace {

absl::StatusOr<TokenManifest> Prepare(const text::Tokenizer& tokenizer, const PrepareOptions& o,
                                      const std::function<void(const PrepareProgress&)>& progress,
                                      bool* touched_output) {
  if (!(o.val_fraction >= 0 && o.val_fraction < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--val_fraction=", o.val_fraction, ": give a fraction in [0, 1), e.g. 0.1"));
  }
  if (o.shard_tokens < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--shard_tokens=", o.shard_tokens, ": give at least 1"));
  }
  if (o.eot_id.has_value() && *o.eot_id >= tokenizer.vocab_size()) {
    return absl::InvalidArgumentError(absl::StrCat("--eot_id=", *o.eot_id, " is outside the ", tokenizer.name(),
                                                   " vocabulary (", tokenizer.vocab_size(), " ids)"));
  }
  if (o.out_dir.empty()) return absl::InvalidArgumentError("--out names no folder");
  // Every input is read and listed before the output folder is touched.
  BRAID_ASSIGN_OR_RETURN(std::vector<std::unique_ptr<Source>> sources, OpenInputs(o, ""));
  BRAID_ASSIGN_OR_RETURN(std::vector<Doc> docs, ListDocuments(sources));
  BRAID_ASSIGN_OR_RETURN(std::vector<bool> is_val,
                         ChooseValidation(docs, sources, o.val_fraction, o.seed));
  std::error_code ec;
  fs::create_directories(o.out_dir, ec);
  if (ec || !fs::is_directory(o.out_dir)) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot create the output folder ", o.out_dir, " (", ec.message(), ")"));
  }
  *touched_output = true;
  RemovePartials(o.out_dir);

  TokenManifest m;
  m.tokenizer = tokenizer.name();
  m.vocab_size = tokenizer.vocab_size();
  m.eot_id = o.eot_id;
  m.dtype = m.vocab_size <= 65536 ? TokenType::kU16 : TokenType::kU32;
  m.seed = o.seed;
  m.val_fraction = o.val_fraction;
  ShardWriter train(o.out_dir, Split::kTrain, m.dtype, o.shard_tokens);
  ShardWriter validation(o.out_dir, Split::kValidation, m.dtype, o.shard_tokens);
  int shards_closed = 0;
  auto crashed = [&] { return o.crash_after_shards >= 0 && shards_closed >= o.crash_after_shards; };
  auto stop = [&] {
    return absl::AbortedError(absl::StrCat("stopped after ", shards_closed, " shard(s) (--crash_after_shards)"));
  };

  PrepareProgress p;
  for (const Doc& d : docs) p.bytes_total += int64_t(d.size);
  const auto start = std::chrono::steady_clock::now();
  std::atomic<int64_t> bytes_done{0};
  const int threads = std::max(1, o.threads);

  for (size_t first = 0; first < docs.size();) {
    size_t last = first;
    for (int64_t bytes = 0; last < docs.size() && (last == first || bytes + int64_t(docs[last].size) <= kChunkBytes); ++last) {
      bytes += int64_t(docs[last].size);
    }
    const size_t n = last - first;
    std::vector<std::vector<uint32_t>> ids(n);
    std::vector<absl::Status> errors(n);
    std::atomic<size_t> next{0};
    std::atomic<int> running{0};
    std::mutex mu;
    std::condition_variable cv;
    auto work = [&] {
      std::string storage;
      for (size_t i; (i = next.fetch_add(1)) < n;) {
        const Doc& d = docs[first + i];
        absl::StatusOr<absl::string_view> text =
            DocumentText(*sources[d.source], d, o.jsonl_field, &storage);
        if (!text.ok()) {
          errors[i] = text.status();
        } else if (!text->empty()) {
          tokenizer.Encode(*text, &ids[i]);
          if (o.eot_id.has_value()) ids[i].push_back(*o.eot_id);
        }
        bytes_done += int64_t(d.size);
      }
      std::lock_guard<std::mutex> l(mu);
      if (--running == 0) cv.notify_all();
    };
    running = threads;
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) pool.emplace_back(work);
    {
      std::unique_lock<std::mutex> l(mu);
      // Wakes to report progress; the work's result never depends on these waits.
      while (!cv.wait_for(l, std::chrono::milliseconds(250), [&] { return running == 0; })) {
        if (progress) {
          p.bytes_done = bytes_done;
          p.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
          progress(p);
        }
      }
    }
    for (std::thread& t : pool) t.join();
    for (size_t i = 0; i < n; ++i) {
      if (!errors[i].ok()) return errors[i];  // the first in input order
      if (ids[i].empty()) continue;  // an empty JSON text: no document
      const bool val = is_val[first + i];
      (val ? m.validation_documents : m.train_documents) += 1;
      p.tokens += int64_t(ids[i].size());
      BRAID_RETURN_IF_ERROR((val ? validation : train).Append(ids[i], &shards_closed));
      if (crashed()) return stop();
      std::vector<uint32_t>().swap(ids[i]);
    }
    first = last;
  }
  BRAID_RETURN_IF_ERROR(train.Finish(&shards_closed));
  if (crashed()) return stop();
  BRAID_RETURN_IF_ERROR(validation.Finish(&shards_closed));
  if (crashed()) return stop();
  if (m.train_documents == 0) {
    return absl::InvalidArgumentError("every document's text is empty: there is nothing to train on");
  }
  if (o.val_fraction > 0 && m.validation_documents == 0) {
    return absl::InvalidArgumentError(
        "every validation document's text is empty: pass another --seed or --val_fraction=0");
  }
  for (const auto* w : {&train, &validation}) {
    for (const TokenShard& s : w->shards()) m.shards.push_back(s);
  }
  if (progress) {
    p.bytes_done = p.bytes_total;
    p.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    progress(p);
  }

  // Into place: the old manifest goes first, so that from here until the new one is written the
  // folder holds no data set at all rather than a mixed one.
  const std::string manifest_path = absl::StrCat(o.out_dir, "/", data::kTokenManifestName);
  fs::remove(manifest_path, ec);
  if (ec) return absl::PermissionDeniedError(absl::StrCat("cannot replace ", manifest_path, " (", ec.message(), ")"));
  for (const TokenShard& s : m.shards) {
    const std::string final_path = absl::StrCat(o.out_dir, "/", s.file);
    if (std::rename((final_path + kPartial).c_str(), final_path.c_str()) != 0) {
      return absl::PermissionDeniedError(absl::StrCat("cannot rename ", final_path, kPartial, " (", std::strerror(errno), ")"));
    }
  }
  // Shards of an earlier, larger run that this manifest does not list.
  for (const auto& e : fs::directory_iterator(o.out_dir, ec)) {
    const std::string name = e.path().filename().string();
    if (!IsShardName(name) || absl::EndsWith(name, kPartial)) continue;
    if (std::none_of(m.shards.begin(), m.shards.end(), [&](const TokenShard& s) { return s.file == name; })) {
      fs::remove(e.path(), ec);
    }
  }
  BRAID_RETURN_IF_ERROR(WriteFileAtomically(manifest_path, data::TokenManifestToJson(m)));
  return m;
}

}  // namespace

absl::StatusOr<TokenManifest> PrepareData(const text::Tokenizer& tokenizer, const PrepareOptions& o,
                                          const std::function<void(const PrepareProgress&)>& progress) {
  bool touched_output = false;
  absl::StatusOr<TokenManifest> m = Prepare(tokenizer, o, progress, &touched_output);
  // A refusal part-way (a bad line in a later file, a full disk) takes back its temporary files;
  // a simulated crash leaves them, as a real one would.
  if (!m.ok() && touched_output && !absl::IsAborted(m.status())) RemovePartials(o.out_dir);
  return m;
}

}  // namespace braid::tools
