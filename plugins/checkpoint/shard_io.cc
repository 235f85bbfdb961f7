#include "plugins/checkpoint/shard_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "plugins/checkpoint/fd_io.h"
#include "plugins/checkpoint/safetensors.h"

namespace braid::checkpoint {
namespace {

using fd_io::Fd;
using fd_io::ReadAll;
using fd_io::WriteAll;

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors is little-endian");

// Each piece is checksummed and then written (or read and then checksummed) while it is still in
// the cache, so the CRC costs no second trip through memory.
constexpr size_t kPiece = size_t(4) << 20;
// Written data is handed to the disk every this many bytes (sync_file_range), so the device
// writes while the next pieces are checksummed, and the final fsync has little left to wait for.
constexpr int64_t kWriteBehind = int64_t(64) << 20;
constexpr uint64_t kMaxHeaderBytes = uint64_t(100) << 20;  // as safetensors.h accepts

const char* SafetensorsDType(DType t) {
  switch (t) {
    case DType::kF32: return "F32";
    case DType::kBF16: return "BF16";
    case DType::kF16: return "F16";
    case DType::kI32: return "I32";
    case DType::kI64: return "I64";
    case DType::kU8: return "U8";
    case DType::kI8: return "I8";
  }
  return nullptr;
}

std::optional<DType> FromSafetensorsDType(const std::string& s) {
  for (int i = 0; i < kNumDTypes; ++i) {
    if (s == SafetensorsDType(DType(i))) return DType(i);
  }
  return std::nullopt;
}

uint32_t Crc(uint32_t crc, const void* p, size_t n) {  // n <= kPiece fits zlib's uInt
  return uint32_t(crc32(uLong(crc), static_cast<const Bytef*>(p), uInt(n)));
}


absl::Status Damaged(const std::string& path, const std::string& what) {
  return absl::DataLossError(absl::StrCat(path, " is damaged: ", what));
}

}  // namespace

absl::StatusOr<ShardWritten> WriteShard(const std::string& path,
                                        const std::map<std::string, Tensor>& tensors,
                                        const std::map<std::string, std::string>& metadata) {
  // The same bytes core's SaveSafetensors writes (so any safetensors reader reads a shard).
  absl::StatusOr<SafetensorsLayout> laid = LayOutSafetensors(tensors, metadata);
  if (!laid.ok()) {
    return absl::Status(laid.status().code(), absl::StrCat("writing '", path, "': ", laid.status().message()));
  }

  Fd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  auto fail = [&](const char* what) -> absl::Status {
    const int e = errno;
    fd.Close();
    ::unlink(path.c_str());  // a partial file only takes space (a full disk needs it back)
    const std::string msg = absl::StrCat(what, " '", path, "' failed: ", std::strerror(e));
    if (e == ENOSPC || e == EDQUOT) {
      return absl::ResourceExhaustedError(absl::StrCat(
          msg, ": the disk holding the checkpoint is full (free space there, or lower "
               "checkpoint.keep_last); the partial file was removed"));
    }
    return absl::DataLossError(msg);
  };
  if (fd.get() < 0) return fail("creating");
  uint32_t crc = Crc(uint32_t(crc32(0L, Z_NULL, 0)), laid->prefix.data(), laid->prefix.size());
  if (!WriteAll(fd.get(), laid->prefix.data(), laid->prefix.size())) return fail("writing");
  int64_t written = int64_t(laid->prefix.size()), handed = 0;
  for (const Tensor& host : laid->data) {
    const char* p = static_cast<const char*>(host.nbytes() > 0 ? host.raw_data() : nullptr);
    for (size_t left = host.nbytes(); left > 0;) {
      const size_t k = std::min(left, kPiece);
      crc = Crc(crc, p, k);
      if (!WriteAll(fd.get(), p, k)) return fail("writing");
      p += k;
      left -= k;
      written += int64_t(k);
      if (written - handed >= kWriteBehind) {
        // Start writing back what is done, without waiting (errors surface at fsync).
        ::sync_file_range(fd.get(), handed, written - handed, SYNC_FILE_RANGE_WRITE);
        handed = written;
      }
    }
  }
  if (::fsync(fd.get()) != 0) return fail("flushing");
  if (fd.Close() != 0) return fail("closing");
  return ShardWritten{crc, written};
}

absl::StatusOr<std::map<std::string, Tensor>> ReadShard(const std::string& path, int64_t bytes,
                                                        uint32_t want_crc) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) {
    return absl::DataLossError(absl::StrCat(path, " cannot be read: ", std::strerror(errno)));
  }
  struct stat st;
  if (::fstat(fd.get(), &st) != 0 || int64_t(st.st_size) != bytes) {
    return Damaged(path, absl::StrCat("it has ", int64_t(st.st_size), " bytes where the index says ",
                                      bytes));
  }
  ::posix_fadvise(fd.get(), 0, 0, POSIX_FADV_SEQUENTIAL);
  auto short_read = [&](const char* what) {
    return errno == 0 ? Damaged(path, absl::StrCat("it ends inside its ", what))
                      : absl::DataLossError(absl::StrCat("reading ", path, " failed: ",
                                                         std::strerror(errno)));
  };
  char len[8];
  if (!ReadAll(fd.get(), len, 8)) return short_read("header length");
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | uint8_t(len[i]);
  if (bytes < 8 || header_len > uint64_t(bytes - 8) || header_len > kMaxHeaderBytes) {
    return Damaged(path, absl::StrCat("its header length (", header_len, ") does not fit the file"));
  }
  std::string header(header_len, '\0');
  if (!ReadAll(fd.get(), header.data(), header.size())) return short_read("header");
  uint32_t crc = Crc(Crc(uint32_t(crc32(0L, Z_NULL, 0)), len, 8), header.data(), header.size());

  // The header is read before the checksum can be known: it is only trusted as far as it
  // describes tensors that tile the data exactly (so a damaged one cannot make us read or
  // allocate beyond the file); the CRC at the end decides.
  const nlohmann::json h = nlohmann::json::parse(header, nullptr, /*allow_exceptions=*/false);
  if (h.is_discarded() || !h.is_object()) return Damaged(path, "its header is not a JSON object");
  struct Entry {
    std::string key;
    DType dtype;
    Shape shape;
    uint64_t begin, end;
  };
  const uint64_t data_bytes = uint64_t(bytes) - 8 - header_len;
  std::vector<Entry> entries;
  for (auto& [key, v] : h.items()) {
    if (key == "__metadata__") continue;
    auto bad = [&] { return Damaged(path, absl::StrCat("its header's entry '", key, "' is invalid")); };
    if (!v.is_object() || !v.contains("dtype") || !v["dtype"].is_string() || !v.contains("shape") ||
        !v["shape"].is_array() || !v.contains("data_offsets") || !v["data_offsets"].is_array() ||
        v["data_offsets"].size() != 2 || !v["data_offsets"][0].is_number_unsigned() ||
        !v["data_offsets"][1].is_number_unsigned()) {
      return bad();
    }
    std::optional<DType> dt = FromSafetensorsDType(v["dtype"].get<std::string>());
    if (!dt) return bad();
    Entry e{key, *dt, {}, v["data_offsets"][0].get<uint64_t>(), v["data_offsets"][1].get<uint64_t>()};
    uint64_t numel = 1;
    for (const auto& d : v["shape"]) {
      if (!d.is_number_unsigned() || d.get<uint64_t>() > data_bytes) return bad();
      numel *= d.get<uint64_t>();
      if (numel > data_bytes) return bad();
      e.shape.push_back(int64_t(d.get<uint64_t>()));
    }
    if (e.begin > e.end || e.end > data_bytes || e.end - e.begin != numel * SizeOf(*dt)) return bad();
    entries.push_back(std::move(e));
  }
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t at = 0;
  for (const Entry& e : entries) {
    if (e.begin != at) return Damaged(path, "its header's tensors do not tile its data");
    at = e.end;
  }
  if (at != data_bytes) return Damaged(path, "its header's tensors do not tile its data");

  // The data, in file order: one sequential pass, each piece checksummed as it arrives.
  std::map<std::string, Tensor> out;
  for (const Entry& e : entries) {
    Tensor t = Tensor::Empty(e.shape, e.dtype);
    char* p = static_cast<char*>(t.nbytes() > 0 ? t.raw_data() : nullptr);
    for (size_t left = t.nbytes(); left > 0;) {
      const size_t k = std::min(left, kPiece);
      if (!ReadAll(fd.get(), p, k)) return short_read("data");
      crc = Crc(crc, p, k);
      p += k;
      left -= k;
    }
    out.emplace(e.key, std::move(t));
  }
  if (crc != want_crc) {
    return Damaged(path, absl::StrCat("its CRC-32 is ", crc, " where the index recorded ", want_crc));
  }
  return out;
}

}  // namespace braid::checkpoint
