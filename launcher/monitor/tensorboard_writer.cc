#include "launcher/monitor/tensorboard_writer.h"

#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "launcher/monitor/tfevents.pb.h"

namespace braid::tensorboard {

namespace {

std::array<uint32_t, 256> MakeTable() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    t[i] = c;
  }
  return t;
}

void PutLittleEndian(uint64_t v, int bytes, char* out) {
  for (int i = 0; i < bytes; ++i) out[i] = char((v >> (8 * i)) & 0xff);
}

}  // namespace

uint32_t Crc32c(const void* data, size_t n) {
  static const std::array<uint32_t, 256> table = MakeTable();
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) c = table[(c ^ p[i]) & 0xff] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

uint32_t MaskedCrc32c(const void* data, size_t n) {
  const uint32_t c = Crc32c(data, n);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

absl::StatusOr<std::unique_ptr<TensorBoardWriter>> TensorBoardWriter::Create(const std::string& dir,
                                                                             absl::Time now) {
  char host[256] = "localhost";
  gethostname(host, sizeof(host) - 1);
  const std::string path = absl::StrCat(dir, "/events.out.tfevents.", absl::ToUnixSeconds(now), ".",
                                        host, ".", getpid());
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) {
    return absl::PermissionDeniedError(absl::StrCat("cannot write ", path, ": ", std::strerror(errno)));
  }
  std::unique_ptr<TensorBoardWriter> w(new TensorBoardWriter(path, f));
  Event first;
  first.set_wall_time(absl::ToUnixMillis(now) / 1e3);
  first.set_file_version("brain.Event:2");
  if (absl::Status st = w->WriteRecord(first.SerializeAsString()); !st.ok()) return st;
  return w;
}

TensorBoardWriter::~TensorBoardWriter() { std::fclose(f_); }

absl::Status TensorBoardWriter::AddScalars(int64_t step, absl::Time wall_time,
                                           const std::vector<std::pair<std::string, float>>& values) {
  Event e;
  e.set_wall_time(absl::ToUnixMillis(wall_time) / 1e3);
  e.set_step(step);
  for (const auto& [tag, v] : values) {
    Summary::Value* sv = e.mutable_summary()->add_value();
    sv->set_tag(tag);
    sv->set_simple_value(v);
  }
  return WriteRecord(e.SerializeAsString());
}

absl::Status TensorBoardWriter::WriteRecord(const std::string& data) {
  char header[12];
  PutLittleEndian(data.size(), 8, header);
  PutLittleEndian(MaskedCrc32c(header, 8), 4, header + 8);
  char footer[4];
  PutLittleEndian(MaskedCrc32c(data.data(), data.size()), 4, footer);
  if (std::fwrite(header, 1, sizeof(header), f_) != sizeof(header) ||
      std::fwrite(data.data(), 1, data.size(), f_) != data.size() ||
      std::fwrite(footer, 1, sizeof(footer), f_) != sizeof(footer) || std::fflush(f_) != 0) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot write ", path_, " (disk full?)"));
  }
  return absl::OkStatus();
}

}  // namespace braid::tensorboard
