#include "plugins/checkpoint/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/check.h"
#include "plugins/checkpoint/fd_io.h"
#include "plugins/checkpoint/safetensors_internal.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "safetensors data is little-endian and is copied as is: Braid needs a "
              "little-endian host");

namespace braid {
namespace {

using fd_io::Fd;
using fd_io::ReadAll;
using fd_io::WriteAll;

using safetensors_internal::Describe;
using safetensors_internal::FindInvalidUtf8;
using safetensors_internal::Json;
using safetensors_internal::KindName;
using safetensors_internal::ParseJson;
using safetensors_internal::ToIndex;

// The reference implementation refuses larger headers too; it bounds what a hostile file can
// make us allocate before anything is validated.
constexpr uint64_t kMaxHeaderBytes = uint64_t(100) << 20;

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
// File I/O.

std::string ErrnoText(int e) { return std::strerror(e); }

std::string DirName(const std::string& path) {
  size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

}  // namespace

absl::StatusOr<SafetensorsLayout> LayOutSafetensors(
    const std::map<std::string, Tensor>& tensors, const std::map<std::string, std::string>& metadata) {
  auto error = [](const std::string& msg) { return absl::InvalidArgumentError(msg); };
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

  // "__metadata__" first, then the tensors by name, each with its fields in the order dtype,
  // shape, data_offsets (an ordered_json keeps them so). The top level is joined here: an
  // ordered_json object finds keys by a linear search, quadratic in the number of tensors.
  std::string header = "{";
  try {
    if (!metadata.empty()) absl::StrAppend(&header, "\"__metadata__\":", Json(metadata).dump());
    for (const Entry& e : entries) {
      const nlohmann::ordered_json fields = {{"dtype", FormatName(e.host.dtype())},
                                             {"shape", e.host.shape()},
                                             {"data_offsets", {e.begin, e.end}}};
      absl::StrAppend(&header, header.size() > 1 ? "," : "", Json(*e.name).dump(), ":",
                      fields.dump());
    }
  } catch (const Json::exception& e) {  // not expected: names and metadata were checked above
    return error(absl::StrCat("cannot write the header: ", e.what()));
  }
  header += "}";
  header.append((8 - header.size() % 8) % 8, ' ');
  if (header.size() > kMaxHeaderBytes) {
    return error(absl::StrCat("the header would be ", header.size(), " bytes, more than the ",
                              kMaxHeaderBytes, " readers accept; save fewer tensors per file"));
  }
  SafetensorsLayout out;
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out.prefix.push_back(char(uint8_t(n >> (8 * i))));
  out.prefix += header;
  for (const Entry* e : layout) out.data.push_back(e->host);
  return out;
}

absl::Status SaveSafetensors(const std::string& path, const std::map<std::string, Tensor>& tensors,
                             const std::map<std::string, std::string>& metadata) {
  absl::StatusOr<SafetensorsLayout> laid = LayOutSafetensors(tensors, metadata);
  if (!laid.ok()) {
    return absl::Status(laid.status().code(), absl::StrCat("cannot save safetensors file '", path,
                                                           "': ", laid.status().message()));
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
  bool ok = WriteAll(fd.get(), laid->prefix.data(), laid->prefix.size());
  for (size_t i = 0; ok && i < laid->data.size(); ++i) {
    ok = WriteAll(fd.get(), laid->data[i].raw_data(), laid->data[i].nbytes());
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
  if (!ReadAll(fd.get(), len, 8, 0)) return error("cannot read the header length");
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
  if (!ReadAll(fd.get(), header.data(), header_len, 8)) {
    return error(absl::StrCat("cannot read the header: ", ErrnoText(errno)));
  }
  if (header[0] != '{') return error("the header does not start with '{'");
  if (size_t bad = FindInvalidUtf8(header); bad != std::string::npos) {
    return error(absl::StrCat("the header is not valid UTF-8 (byte ", bad, ")"));
  }
  absl::StatusOr<Json> root = ParseJson(header);  // an object: the header starts with '{'
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
  for (const auto& [name, value] : root->get_ref<const Json::object_t&>()) {
    if (name == "__metadata__") {
      if (!value.is_object()) {
        return error(absl::StrCat("\"__metadata__\" is ", KindName(value),
                                  ", not an object of strings"));
      }
      for (const auto& [k, v] : value.get_ref<const Json::object_t&>()) {
        if (!v.is_string()) {
          return error(absl::StrCat("metadata entry '", k, "' is ", KindName(v),
                                    "; metadata values must be strings"));
        }
        out.metadata[k] = v.get_ref<const std::string&>();
      }
      continue;
    }
    // The writer refuses "" (a name nothing can be loaded into), so the reader does too: whatever
    // reads can be written again (the fuzzer's round trip found a file that could not).
    if (name.empty()) {
      return error("a tensor has an empty name (\"\"); every tensor needs one: the file is damaged, "
                   "or was not written by a safetensors writer");
    }
    // An ordinary reference for the lambda: C++17 lambdas cannot capture a structured binding
    // (g++ allows it, clang refuses).
    const std::string& tensor_name = name;
    auto terror = [&](const std::string& msg) {
      return error(absl::StrCat("tensor '", tensor_name, "': ", msg));
    };
    if (!value.is_object()) {
      return terror(absl::StrCat("entry is ", KindName(value), ", not an object"));
    }
    const Json* dtype = nullptr;
    const Json* shape = nullptr;
    const Json* offsets = nullptr;
    for (const auto& [field, fv] : value.get_ref<const Json::object_t&>()) {
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
    if (!dtype->is_string()) {
      return terror(absl::StrCat("dtype is ", KindName(*dtype), ", not a string"));
    }
    const std::string& dtype_name = dtype->get_ref<const std::string&>();
    Span span{0, 0, &name, DType::kF32, {}};
    bool known = false;
    for (const DTypeEntry& e : kDTypes) {
      if (dtype_name == e.name) {
        span.dtype = e.dtype;
        known = true;
      }
    }
    if (!known) {
      for (const char* other : kOtherFormatDTypes) {
        if (dtype_name == other) {
          return terror(absl::StrCat("dtype ", other,
                                     " is valid safetensors but Braid has no such tensor type "
                                     "(it has F32 BF16 F16 I32 I64 U8 I8); convert it first"));
        }
      }
      return terror(
          absl::StrCat("unknown dtype \"", dtype_name, "\" (known: F32 BF16 F16 I32 I64 U8 I8)"));
    }
    if (!shape->is_array()) {
      return terror(absl::StrCat("shape is ", KindName(*shape), ", not an array"));
    }
    uint64_t numel = 1;
    for (const Json& d : *shape) {
      uint64_t dim;
      if (!ToIndex(d, &dim)) {
        return terror(absl::StrCat("shape entry ", Describe(d), " is not a non-negative integer"));
      }
      if (__builtin_mul_overflow(numel, dim, &numel) || numel > uint64_t(INT64_MAX)) {
        return terror("the shape's element count overflows 64 bits");
      }
      span.shape.push_back(int64_t(dim));
    }
    if (!offsets->is_array() || offsets->size() != 2 || !ToIndex((*offsets)[0], &span.begin) ||
        !ToIndex((*offsets)[1], &span.end)) {
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
      return terror(absl::StrCat("shape ", ShapeToString(span.shape), " of ", dtype_name,
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
        !ReadAll(fd.get(), t.raw_data(), s.end - s.begin, int64_t(data_start + s.begin))) {
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
