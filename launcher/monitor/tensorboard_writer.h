// TensorBoard event files (events.out.tfevents.*): scalar summaries in TFRecord framing, what
// DeepSpeed's `tensorboard` monitor writes through PyTorch's SummaryWriter.
//
// A record is: uint64 length (little-endian), uint32 masked CRC-32C of those 8 bytes, the data
// (a serialized braid.tensorboard.Event, tfevents.proto), uint32 masked CRC-32C of the data.
// The mask is TFRecord's: ((crc >> 15) | (crc << 17)) + 0xa282ead8.
#ifndef BRAID_LAUNCHER_MONITOR_TENSORBOARD_WRITER_H_
#define BRAID_LAUNCHER_MONITOR_TENSORBOARD_WRITER_H_

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace braid::tensorboard {

// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), as TFRecord uses. Debian 12 packages
// no C/C++ CRC-32C library (zlib's crc32 is the other polynomial), hence this small table one.
uint32_t Crc32c(const void* data, size_t n);
uint32_t MaskedCrc32c(const void* data, size_t n);

class TensorBoardWriter {
 public:
  // A new event file in `dir` (which must exist), named as PyTorch's SummaryWriter names
  // them (events.out.tfevents.<seconds>.<host>.<pid>), starting with the file-version record.
  static absl::StatusOr<std::unique_ptr<TensorBoardWriter>> Create(const std::string& dir,
                                                                   absl::Time now);
  ~TensorBoardWriter();

  // One Event holding a scalar Summary.Value per (tag, value), flushed at once.
  absl::Status AddScalars(int64_t step, absl::Time wall_time,
                          const std::vector<std::pair<std::string, float>>& values);
  const std::string& path() const { return path_; }

 private:
  TensorBoardWriter(std::string path, std::FILE* f) : path_(std::move(path)), f_(f) {}
  absl::Status WriteRecord(const std::string& data);

  std::string path_;
  std::FILE* f_;
};

}  // namespace braid::tensorboard

#endif  // BRAID_LAUNCHER_MONITOR_TENSORBOARD_WRITER_H_
