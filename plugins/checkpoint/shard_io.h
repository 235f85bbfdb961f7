// One rank's checkpoint file (a safetensors file, readable by any safetensors reader), written and
// read in one pass each: the CRC-32 of the whole file is computed while it is written and checked
// while it is read, so neither a save nor a load goes over the data a second time.
//
// Why not safetensors.h: its writer renames a temporary file into place (the checkpoint's
// folder is already the atomic unit) and cannot report a checksum; its reader validates the
// header before reading any data, so verifying the bytes would be a second read of the file.
#ifndef BRAID_PLUGINS_CHECKPOINT_SHARD_IO_H_
#define BRAID_PLUGINS_CHECKPOINT_SHARD_IO_H_

#include <cstdint>
#include <map>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/tensor.h"

namespace braid::checkpoint {

struct ShardWritten {
  uint32_t crc32 = 0;  // zlib's CRC-32 of every byte of the file
  int64_t bytes = 0;   // the file's size
};

// Writes `tensors` (host tensors, by key) as a safetensors file at `path` with `metadata`, then
// flushes it to disk (fsync). Errors name the file; a full disk (ENOSPC, EDQUOT) says so and
// removes the partial file. Data is laid out largest element size first, as safetensors.h
// does, so every tensor is aligned to its element size.
absl::StatusOr<ShardWritten> WriteShard(const std::string& path,
                                        const std::map<std::string, Tensor>& tensors,
                                        const std::map<std::string, std::string>& metadata);

// Reads the file at `path` and checks it against what the index recorded: its size, a header
// that describes tensors covering the data exactly, and the CRC-32 of all its bytes, computed as
// they are read. Any mismatch is kDataLoss "<path> is damaged: <what>". Tensors are on the CPU,
// keyed as written.
absl::StatusOr<std::map<std::string, Tensor>> ReadShard(const std::string& path, int64_t bytes,
                                                        uint32_t crc32);

}  // namespace braid::checkpoint

#endif  // BRAID_PLUGINS_CHECKPOINT_SHARD_IO_H_
