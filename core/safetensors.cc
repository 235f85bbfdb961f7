#include "core/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/check.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "safetensors data is little-endian and is copied as is: Braid needs a "
              "little-endian host");

namespace braid {
namespace {

// The reference implementation refuses larger headers too; it bounds what a hostile file can
// make us allocate before anything is validated.
constexpr uint64_t kMaxHeaderBytes = uint64_t(100) << 20;
constexpr int kMaxJsonDepth = 64;

struct DTypeEntry {
  DType dtype;
  const char* name;
};
constexpr DTypeEntry kDTypes[] = {
    {DType::kF32, "F32"}, {DType::kBF16, "BF16"}, {DType::kF16, "F16"}, {DType::kI32, "I32"},
    {DType::kI64, "I64"}, {DType::kU8, "U8"},     {DType::kI8, "I8"}};
// Valid in the format, but Braid has no such tensor type.
constexpr const char* kOtherFormatDTypes[] = {"BOOL", "F64",     "I16",     "U16", "U32",
                                              "U64",  "F8_E5M2", "F8_E4M3", "C64", "F8_E8M0",
                                              "F4",   "F6_E2M3", "F6_E3M2"};

const char* FormatName(DType t) {
  for (const DTypeEntry& e : kDTypes) {
    if (e.dtype == t) return e.name;
  }
  BRAID_CHECK(false) << "dtype " << DTypeName(t) << " has no safetensors name";
}

// ----------------------------------------------------------------------------------------------
// JSON. The header is parsed by this small strict parser rather than protobuf's JSON-to-Struct
// (which the machine has): the format needs what Struct hides. Duplicate keys must be errors
// (Struct silently keeps one), offsets and shapes are 64-bit integers (Struct stores every
// number as a double, exact only to 2^53, and cannot tell 3 from 3.0), and errors should point
// at a byte of the header. It also keeps core free of a protobuf dependency.

struct JsonValue {
  enum class Kind { kNull, kBool, kNumber, kString, kArray, kObject };
  Kind kind = Kind::kNull;
  bool boolean = false;
  std::string text;  // a string's decoded value, or a number's source text
  std::vector<JsonValue> items;
  std::vector<std::pair<std::string, JsonValue>> members;  // in file order
};

const char* KindName(JsonValue::Kind k) {
  switch (k) {
    case JsonValue::Kind::kNull:
      return "null";
    case JsonValue::Kind::kBool:
      return "a boolean";
    case JsonValue::Kind::kNumber:
      return "a number";
    case JsonValue::Kind::kString:
      return "a string";
    case JsonValue::Kind::kArray:
      return "an array";
    case JsonValue::Kind::kObject:
      return "an object";
  }
  return "?";
}

// Offset of the first byte that is not part of well-formed UTF-8 (no overlong forms, no
// surrogates, nothing above U+10FFFF), or npos.
size_t FindInvalidUtf8(const std::string& s) {
  size_t i = 0;
  const size_t n = s.size();
  while (i < n) {
    const uint8_t c = uint8_t(s[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    int len;
    uint32_t cp;
    if ((c & 0xe0) == 0xc0) {
      len = 2;
      cp = c & 0x1f;
    } else if ((c & 0xf0) == 0xe0) {
      len = 3;
      cp = c & 0x0f;
    } else if ((c & 0xf8) == 0xf0) {
      len = 4;
      cp = c & 0x07;
    } else {
      return i;
    }
    if (i + len > n) return i;
    for (int k = 1; k < len; ++k) {
      const uint8_t cc = uint8_t(s[i + k]);
      if ((cc & 0xc0) != 0x80) return i;
      cp = (cp << 6) | (cc & 0x3f);
    }
    static constexpr uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMin[len] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return i;
    i += len;
  }
  return std::string::npos;
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(char(cp));
  } else if (cp < 0x800) {
    out->push_back(char(0xc0 | (cp >> 6)));
    out->push_back(char(0x80 | (cp & 0x3f)));
  } else if (cp < 0x10000) {
    out->push_back(char(0xe0 | (cp >> 12)));
    out->push_back(char(0x80 | ((cp >> 6) & 0x3f)));
    out->push_back(char(0x80 | (cp & 0x3f)));
  } else {
    out->push_back(char(0xf0 | (cp >> 18)));
    out->push_back(char(0x80 | ((cp >> 12) & 0x3f)));
    out->push_back(char(0x80 | ((cp >> 6) & 0x3f)));
    out->push_back(char(0x80 | (cp & 0x3f)));
  }
}

// RFC 8259 JSON, strictly: no comments, no trailing commas, no NaN, no duplicate object keys.
// The input must already be valid UTF-8.
class JsonParser {
 public:
  explicit JsonParser(const std::string& s) : s_(s) {}

  absl::StatusOr<JsonValue> ParseDocument() {
    JsonValue v;
    SkipSpace();
    BRAID_RETURN_IF_ERROR(Value(&v, 0));
    SkipSpace();
    if (pos_ != s_.size()) return Error("the end of the header after the JSON object");
    return v;
  }

 private:
  bool AtEnd() const { return pos_ >= s_.size(); }
  char Peek() const { return AtEnd() ? '\0' : s_[pos_]; }
  static bool IsDigit(char c) { return c >= '0' && c <= '9'; }

  void SkipSpace() {
    while (!AtEnd() &&
           (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) {
      ++pos_;
    }
  }

  absl::Status Error(const std::string& expected) const {
    std::string found;
    if (AtEnd()) {
      found = "the end of the header";
    } else if (uint8_t(s_[pos_]) < 0x20 || uint8_t(s_[pos_]) > 0x7e) {
      found = absl::StrCat("byte 0x", absl::Hex(uint8_t(s_[pos_]), absl::kZeroPad2));
    } else {
      found = absl::StrCat("'", s_.substr(pos_, 1), "'");
    }
    return absl::InvalidArgumentError(
        absl::StrCat("at byte ", pos_, " of the header: expected ", expected, ", found ", found));
  }

  absl::Status Value(JsonValue* v, int depth) {
    if (depth > kMaxJsonDepth) return Error("less deeply nested JSON");
    const char c = Peek();
    if (c == '{') return Object(v, depth);
    if (c == '[') return Array(v, depth);
    if (c == '"') {
      v->kind = JsonValue::Kind::kString;
      return String(&v->text);
    }
    if (c == '-' || IsDigit(c)) return Number(v);
    for (const char* word : {"true", "false", "null"}) {
      const size_t len = std::strlen(word);
      if (s_.compare(pos_, len, word) == 0) {
        pos_ += len;
        v->kind = word[0] == 'n' ? JsonValue::Kind::kNull : JsonValue::Kind::kBool;
        v->boolean = word[0] == 't';
        return absl::OkStatus();
      }
    }
    return Error("a JSON value");
  }

  absl::Status Object(JsonValue* v, int depth) {
    v->kind = JsonValue::Kind::kObject;
    ++pos_;  // '{'
    SkipSpace();
    if (Peek() == '}') {
      ++pos_;
      return absl::OkStatus();
    }
    std::set<std::string> keys;
    while (true) {
      if (Peek() != '"') return Error("'\"' starting an object key");
      const size_t key_pos = pos_;
      std::string key;
      BRAID_RETURN_IF_ERROR(String(&key));
      if (!keys.insert(key).second) {
        pos_ = key_pos;
        return Error(absl::StrCat("a key other than \"", key, "\", which appears twice"));
      }
      SkipSpace();
      if (Peek() != ':') return Error("':' after an object key");
      ++pos_;
      SkipSpace();
      v->members.emplace_back(std::move(key), JsonValue());
      BRAID_RETURN_IF_ERROR(Value(&v->members.back().second, depth + 1));
      SkipSpace();
      if (Peek() == ',') {
        ++pos_;
        SkipSpace();
        continue;
      }
      if (Peek() == '}') {
        ++pos_;
        return absl::OkStatus();
      }
      return Error("',' or '}' in an object");
    }
  }

  absl::Status Array(JsonValue* v, int depth) {
    v->kind = JsonValue::Kind::kArray;
    ++pos_;  // '['
    SkipSpace();
    if (Peek() == ']') {
      ++pos_;
      return absl::OkStatus();
    }
    while (true) {
      v->items.emplace_back();
      BRAID_RETURN_IF_ERROR(Value(&v->items.back(), depth + 1));
      SkipSpace();
      if (Peek() == ',') {
        ++pos_;
        SkipSpace();
        continue;
      }
      if (Peek() == ']') {
        ++pos_;
        return absl::OkStatus();
      }
      return Error("',' or ']' in an array");
    }
  }

  absl::Status Hex4(uint32_t* out) {
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) {
      const char c = Peek();
      int d;
      if (c >= '0' && c <= '9') {
        d = c - '0';
      } else if (c >= 'a' && c <= 'f') {
        d = c - 'a' + 10;
      } else if (c >= 'A' && c <= 'F') {
        d = c - 'A' + 10;
      } else {
        return Error("a hex digit in a \\u escape");
      }
      v = v * 16 + uint32_t(d);
      ++pos_;
    }
    *out = v;
    return absl::OkStatus();
  }

  absl::Status String(std::string* out) {
    ++pos_;  // '"'
    while (true) {
      if (AtEnd()) return Error("'\"' closing a string");
      const char c = s_[pos_];
      if (c == '"') {
        ++pos_;
        return absl::OkStatus();
      }
      if (uint8_t(c) < 0x20) return Error("no raw control character in a string");
      if (c != '\\') {
        out->push_back(c);
        ++pos_;
        continue;
      }
      ++pos_;
      const char e = Peek();
      static constexpr char kFrom[] = "\"\\/bfnrt";
      static constexpr char kTo[] = "\"\\/\b\f\n\r\t";
      const char* hit = e == '\0' ? nullptr : std::strchr(kFrom, e);
      if (hit != nullptr) {
        out->push_back(kTo[hit - kFrom]);
        ++pos_;
        continue;
      }
      if (e != 'u') return Error("an escape (\\\" \\\\ \\/ \\b \\f \\n \\r \\t \\uXXXX)");
      ++pos_;
      uint32_t cp = 0;
      BRAID_RETURN_IF_ERROR(Hex4(&cp));
      if (cp >= 0xdc00 && cp <= 0xdfff) return Error("a high surrogate before a low one");
      if (cp >= 0xd800 && cp <= 0xdbff) {
        if (s_.compare(pos_, 2, "\\u") != 0) return Error("'\\u' and a low surrogate");
        pos_ += 2;
        uint32_t lo = 0;
        BRAID_RETURN_IF_ERROR(Hex4(&lo));
        if (lo < 0xdc00 || lo > 0xdfff) return Error("a low surrogate (\\udc00-\\udfff)");
        cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
      }
      AppendUtf8(cp, out);
    }
  }

  // -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?, kept as text: only its users know whether
  // they want an integer.
  absl::Status Number(JsonValue* v) {
    const size_t start = pos_;
    if (Peek() == '-') ++pos_;
    if (Peek() == '0') {
      ++pos_;
    } else if (IsDigit(Peek())) {
      while (IsDigit(Peek())) ++pos_;
    } else {
      return Error("a digit");
    }
    if (Peek() == '.') {
      ++pos_;
      if (!IsDigit(Peek())) return Error("a digit after '.'");
      while (IsDigit(Peek())) ++pos_;
    }
    if (Peek() == 'e' || Peek() == 'E') {
      ++pos_;
      if (Peek() == '+' || Peek() == '-') ++pos_;
      if (!IsDigit(Peek())) return Error("a digit in an exponent");
      while (IsDigit(Peek())) ++pos_;
    }
    v->kind = JsonValue::Kind::kNumber;
    v->text = s_.substr(start, pos_ - start);
    return absl::OkStatus();
  }

  const std::string& s_;
  size_t pos_ = 0;
};

// A JSON number that is a non-negative integer below 2^63 (what offsets and dimensions are).
bool ToIndex(const JsonValue& v, uint64_t* out) {
  if (v.kind != JsonValue::Kind::kNumber || v.text.empty() || v.text.size() > 19) return false;
  uint64_t x = 0;
  for (char c : v.text) {
    if (c < '0' || c > '9') return false;
    x = x * 10 + uint64_t(c - '0');
  }
  if (x > uint64_t(INT64_MAX)) return false;
  *out = x;
  return true;
}

void AppendJsonString(const std::string& s, std::string* out) {
  out->push_back('"');
  for (char c : s) {
    switch (c) {
      case '"':
        *out += "\\\"";
        break;
      case '\\':
        *out += "\\\\";
        break;
      case '\n':
        *out += "\\n";
        break;
      case '\r':
        *out += "\\r";
        break;
      case '\t':
        *out += "\\t";
        break;
      default:
        if (uint8_t(c) < 0x20) {
          absl::StrAppend(out, "\\u00", absl::Hex(uint8_t(c), absl::kZeroPad2));
        } else {
          out->push_back(c);
        }
    }
  }
  out->push_back('"');
}

// ----------------------------------------------------------------------------------------------
// File I/O.

std::string ErrnoText(int e) { return std::strerror(e); }

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  // Closes now, reporting the error close() can give (delayed write errors on some filesystems).
  int Close() {
    int r = ::close(fd_);
    fd_ = -1;
    return r;
  }

 private:
  int fd_;
};

bool WriteAll(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= size_t(w);
  }
  return true;
}

// Reads exactly n bytes at `offset`; false with errno set (0 for a short file).
bool ReadAllAt(int fd, void* data, size_t n, uint64_t offset) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    ssize_t r = ::pread(fd, p, n, off_t(offset));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      if (r == 0) errno = 0;
      return false;
    }
    p += r;
    n -= size_t(r);
    offset += uint64_t(r);
  }
  return true;
}

std::string DirName(const std::string& path) {
  size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

}  // namespace

absl::Status SaveSafetensors(const std::string& path, const std::map<std::string, Tensor>& tensors,
                             const std::map<std::string, std::string>& metadata) {
  auto error = [&](const std::string& msg) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot save safetensors file '", path, "': ", msg));
  };
  struct Entry {
    const std::string* name;
    Tensor host;
    uint64_t begin = 0, end = 0;
  };
  std::vector<Entry> entries;  // in name order (the map's)
  for (const auto& [name, t] : tensors) {
    if (name.empty() || name == "__metadata__") {
      return error(absl::StrCat("'", name, "' cannot be a tensor name"));
    }
    if (FindInvalidUtf8(name) != std::string::npos) {
      return error(absl::StrCat("tensor name '", name, "' is not valid UTF-8"));
    }
    if (!t.defined()) return error(absl::StrCat("tensor '", name, "' is undefined"));
    entries.push_back({&name, t.device().type == DeviceType::kCPU ? t : t.To(Device::CPU())});
    FormatName(entries.back().host.dtype());  // every Braid dtype has a name; checked here
  }
  for (const auto& [k, v] : metadata) {
    if (FindInvalidUtf8(k) != std::string::npos || FindInvalidUtf8(v) != std::string::npos) {
      return error(absl::StrCat("metadata entry '", k, "' is not valid UTF-8"));
    }
  }

  // Data layout: largest elements first, then by name; with the header padded to 8 bytes this
  // aligns every tensor to its element size.
  std::vector<Entry*> layout;
  for (Entry& e : entries) layout.push_back(&e);
  std::stable_sort(layout.begin(), layout.end(), [](const Entry* a, const Entry* b) {
    return SizeOf(a->host.dtype()) > SizeOf(b->host.dtype());
  });
  uint64_t offset = 0;
  for (Entry* e : layout) {
    e->begin = offset;
    offset += e->host.nbytes();
    e->end = offset;
  }

  std::string header = "{";
  bool first = true;
  if (!metadata.empty()) {
    header += "\"__metadata__\":{";
    for (const auto& [k, v] : metadata) {
      if (!first) header += ",";
      first = false;
      AppendJsonString(k, &header);
      header += ":";
      AppendJsonString(v, &header);
    }
    header += "}";
    first = false;
  }
  for (const Entry& e : entries) {
    if (!first) header += ",";
    first = false;
    AppendJsonString(*e.name, &header);
    absl::StrAppend(&header, ":{\"dtype\":\"", FormatName(e.host.dtype()), "\",\"shape\":[");
    for (size_t i = 0; i < e.host.shape().size(); ++i) {
      absl::StrAppend(&header, i ? "," : "", e.host.shape()[i]);
    }
    absl::StrAppend(&header, "],\"data_offsets\":[", e.begin, ",", e.end, "]}");
  }
  header += "}";
  header.append((8 - header.size() % 8) % 8, ' ');
  if (header.size() > kMaxHeaderBytes) {
    return error(absl::StrCat("the header would be ", header.size(), " bytes, more than the ",
                              kMaxHeaderBytes, " readers accept; save fewer tensors per file"));
  }

  // The pid keeps concurrent writers in different processes (e.g. ranks) off each other's file.
  const std::string tmp = absl::StrCat(path, ".tmp.", ::getpid());
  auto io_error = [&](const char* what, int e) {
    ::unlink(tmp.c_str());
    return absl::InternalError(absl::StrCat("cannot save safetensors file '", path, "': ", what,
                                            " '", tmp, "' failed: ", ErrnoText(e)));
  };
  Fd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (fd.get() < 0) {
    const int e = errno;
    if (e == ENOENT) {
      return absl::NotFoundError(
          absl::StrCat("cannot save safetensors file '", path, "': its folder does not exist"));
    }
    return io_error("creating", e);
  }
  uint8_t len[8];
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) len[i] = uint8_t(n >> (8 * i));
  bool ok = WriteAll(fd.get(), len, 8) && WriteAll(fd.get(), header.data(), header.size());
  for (size_t i = 0; ok && i < layout.size(); ++i) {
    ok = WriteAll(fd.get(), layout[i]->host.raw_data(), layout[i]->host.nbytes());
  }
  if (!ok) return io_error("writing", errno);
  if (::fsync(fd.get()) != 0) return io_error("flushing", errno);
  if (fd.Close() != 0) return io_error("closing", errno);
  if (::rename(tmp.c_str(), path.c_str()) != 0) return io_error("renaming", errno);
  // Makes the rename itself durable. Best effort: some filesystems cannot sync a folder, and the
  // file is complete either way.
  const int dir = ::open(DirName(path).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir >= 0) {
    ::fsync(dir);
    ::close(dir);
  }
  return absl::OkStatus();
}

absl::StatusOr<SafetensorsContents> ReadSafetensors(const std::string& path) {
  auto error = [&](const std::string& msg) {
    return absl::InvalidArgumentError(absl::StrCat("safetensors file '", path, "': ", msg));
  };
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) {
    const int e = errno;
    std::string msg = absl::StrCat("cannot open safetensors file '", path, "': ", ErrnoText(e));
    return e == ENOENT ? absl::NotFoundError(msg) : absl::InternalError(msg);
  }
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return error(absl::StrCat("cannot stat: ", ErrnoText(errno)));
  const uint64_t file_size = uint64_t(st.st_size);
  if (file_size < 8) {
    return error(absl::StrCat("the file has ", file_size,
                              " bytes; a safetensors file starts with an 8-byte header length"));
  }
  uint8_t len[8];
  if (!ReadAllAt(fd.get(), len, 8, 0)) return error("cannot read the header length");
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | len[i];
  if (header_len > file_size - 8) {
    return error(absl::StrCat("the header length is ", header_len, " bytes but only ",
                              file_size - 8,
                              " follow it: the file is truncated or not a safetensors file"));
  }
  if (header_len > kMaxHeaderBytes) {
    return error(absl::StrCat("the header length ", header_len, " exceeds the limit of ",
                              kMaxHeaderBytes, " bytes"));
  }
  if (header_len < 2) {
    return error(absl::StrCat("the header length ", header_len, " is too small for a JSON object"));
  }
  std::string header(header_len, '\0');
  if (!ReadAllAt(fd.get(), header.data(), header_len, 8)) {
    return error(absl::StrCat("cannot read the header: ", ErrnoText(errno)));
  }
  if (header[0] != '{') return error("the header does not start with '{'");
  if (size_t bad = FindInvalidUtf8(header); bad != std::string::npos) {
    return error(absl::StrCat("the header is not valid UTF-8 (byte ", bad, ")"));
  }
  absl::StatusOr<JsonValue> root = JsonParser(header).ParseDocument();
  if (!root.ok()) return error(absl::StrCat("invalid JSON header: ", root.status().message()));

  const uint64_t data_size = file_size - 8 - header_len;
  const uint64_t data_start = 8 + header_len;
  struct Span {
    uint64_t begin, end;
    const std::string* name;
    DType dtype;
    Shape shape;
  };
  std::vector<Span> spans;
  SafetensorsContents out;
  for (const auto& [name, value] : root->members) {
    if (name == "__metadata__") {
      if (value.kind != JsonValue::Kind::kObject) {
        return error(absl::StrCat("\"__metadata__\" is ", KindName(value.kind),
                                  ", not an object of strings"));
      }
      for (const auto& [k, v] : value.members) {
        if (v.kind != JsonValue::Kind::kString) {
          return error(absl::StrCat("metadata entry '", k, "' is ", KindName(v.kind),
                                    "; metadata values must be strings"));
        }
        out.metadata[k] = v.text;
      }
      continue;
    }
    auto terror = [&](const std::string& msg) {
      return error(absl::StrCat("tensor '", name, "': ", msg));
    };
    if (value.kind != JsonValue::Kind::kObject) {
      return terror(absl::StrCat("entry is ", KindName(value.kind), ", not an object"));
    }
    const JsonValue* dtype = nullptr;
    const JsonValue* shape = nullptr;
    const JsonValue* offsets = nullptr;
    for (const auto& [field, fv] : value.members) {
      if (field == "dtype") {
        dtype = &fv;
      } else if (field == "shape") {
        shape = &fv;
      } else if (field == "data_offsets") {
        offsets = &fv;
      } else {
        // Strict on purpose: a misspelt field should not be silently ignored.
        return terror(
            absl::StrCat("unknown field \"", field, "\" (expected dtype, shape, data_offsets)"));
      }
    }
    if (dtype == nullptr || shape == nullptr || offsets == nullptr) {
      return terror(absl::StrCat("missing field \"",
                                 dtype == nullptr   ? "dtype"
                                 : shape == nullptr ? "shape"
                                                    : "data_offsets",
                                 "\""));
    }
    if (dtype->kind != JsonValue::Kind::kString) {
      return terror(absl::StrCat("dtype is ", KindName(dtype->kind), ", not a string"));
    }
    Span span{0, 0, &name, DType::kF32, {}};
    bool known = false;
    for (const DTypeEntry& e : kDTypes) {
      if (dtype->text == e.name) {
        span.dtype = e.dtype;
        known = true;
      }
    }
    if (!known) {
      for (const char* other : kOtherFormatDTypes) {
        if (dtype->text == other) {
          return terror(absl::StrCat("dtype ", other,
                                     " is valid safetensors but Braid has no such tensor type "
                                     "(it has F32 BF16 F16 I32 I64 U8 I8); convert it first"));
        }
      }
      return terror(
          absl::StrCat("unknown dtype \"", dtype->text, "\" (known: F32 BF16 F16 I32 I64 U8 I8)"));
    }
    if (shape->kind != JsonValue::Kind::kArray) {
      return terror(absl::StrCat("shape is ", KindName(shape->kind), ", not an array"));
    }
    uint64_t numel = 1;
    for (const JsonValue& d : shape->items) {
      uint64_t dim;
      if (!ToIndex(d, &dim)) {
        return terror(absl::StrCat("shape entry ",
                                   d.kind == JsonValue::Kind::kNumber ? d.text : KindName(d.kind),
                                   " is not a non-negative integer"));
      }
      if (__builtin_mul_overflow(numel, dim, &numel) || numel > uint64_t(INT64_MAX)) {
        return terror("the shape's element count overflows 64 bits");
      }
      span.shape.push_back(int64_t(dim));
    }
    if (offsets->kind != JsonValue::Kind::kArray || offsets->items.size() != 2 ||
        !ToIndex(offsets->items[0], &span.begin) || !ToIndex(offsets->items[1], &span.end)) {
      return terror("data_offsets must be [begin, end], two non-negative integers");
    }
    if (span.begin > span.end) {
      return terror(
          absl::StrCat("data_offsets [", span.begin, ", ", span.end, "] end before they begin"));
    }
    if (span.end > data_size) {
      return terror(absl::StrCat("data_offsets [", span.begin, ", ", span.end,
                                 "] run past the end of the data (", data_size,
                                 " bytes): the file is truncated or corrupt"));
    }
    uint64_t bytes;
    if (__builtin_mul_overflow(numel, uint64_t(SizeOf(span.dtype)), &bytes) ||
        bytes != span.end - span.begin) {
      return terror(absl::StrCat("shape ", ShapeToString(span.shape), " of ", dtype->text,
                                 " needs ", numel, " x ", SizeOf(span.dtype),
                                 " bytes but data_offsets [", span.begin, ", ", span.end, "] hold ",
                                 span.end - span.begin));
    }
    spans.push_back(std::move(span));
  }

  // The data must be covered exactly: sorted by position, each tensor starts where the previous
  // one ended (empty tensors may share a position).
  std::vector<const Span*> sorted;
  for (const Span& s : spans) sorted.push_back(&s);
  std::sort(sorted.begin(), sorted.end(), [](const Span* a, const Span* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  uint64_t covered = 0;
  const Span* prev = nullptr;
  for (const Span* s : sorted) {
    if (s->begin < covered) {
      return error(absl::StrCat("tensors '", *prev->name, "' [", prev->begin, ", ", prev->end,
                                ") and '", *s->name, "' [", s->begin, ", ", s->end, ") overlap"));
    }
    if (s->begin > covered) {
      return error(absl::StrCat("data bytes [", covered, ", ", s->begin,
                                ") belong to no tensor (a hole before tensor '", *s->name, "')"));
    }
    covered = s->end;
    if (s->end > s->begin || prev == nullptr) prev = s;
  }
  if (covered != data_size) {
    return error(absl::StrCat("the last ", data_size - covered, " of the ", data_size,
                              " data bytes belong to no tensor"));
  }

  for (const Span& s : spans) {
    Tensor t = Tensor::Empty(s.shape, s.dtype);
    if (s.end > s.begin &&
        !ReadAllAt(fd.get(), t.raw_data(), s.end - s.begin, data_start + s.begin)) {
      return error(absl::StrCat("tensor '", *s.name, "': cannot read its data: ",
                                errno == 0 ? "the file is shorter than it was" : ErrnoText(errno)));
    }
    t.set_name(*s.name);
    out.tensors.emplace(*s.name, std::move(t));
  }
  return out;
}

absl::StatusOr<std::map<std::string, Tensor>> LoadSafetensors(const std::string& path) {
  BRAID_ASSIGN_OR_RETURN(SafetensorsContents c, ReadSafetensors(path));
  return std::move(c.tensors);
}

}  // namespace braid
