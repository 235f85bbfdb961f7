// Reading and writing the safetensors format (huggingface/safetensors): an 8-byte little-endian
// header length, a JSON header {"name": {"dtype", "shape", "data_offsets"}, ..., "__metadata__":
// {string: string}} and one flat byte buffer that the tensors cover without holes or overlaps.
// Checkpoints and weight exchange with PyTorch go through this format.
#ifndef BRAID_PLUGINS_CHECKPOINT_SAFETENSORS_H_
#define BRAID_PLUGINS_CHECKPOINT_SAFETENSORS_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/tensor.h"

namespace braid {

// Writes `tensors` (any device; copied to the host) and optional string metadata to `path`.
// Header keys are written "__metadata__" first, then tensors in name order; the header is padded
// with spaces to a multiple of 8 bytes and the data is laid out largest element size first, so
// every tensor's data is aligned to its element size (readers can map it in place).
// Atomic: the file is written to "<path>.tmp.<pid>", flushed to disk and renamed over `path`, so
// a crash leaves either the old file or the new one, never a partial file.
// The bytes SaveSafetensors writes, for writers that stream a file themselves (a checkpoint
// shard that checksums while it writes): `prefix` (the 8-byte header length and the padded
// header) and then each tensor of `data` (host copies) in order, nothing else. Refuses what
// SaveSafetensors refuses (bad names, metadata, an oversized header), without a path.
struct SafetensorsLayout {
  std::string prefix;
  std::vector<Tensor> data;
};
absl::StatusOr<SafetensorsLayout> LayOutSafetensors(
    const std::map<std::string, Tensor>& tensors, const std::map<std::string, std::string>& metadata);

absl::Status SaveSafetensors(const std::string& path, const std::map<std::string, Tensor>& tensors,
                             const std::map<std::string, std::string>& metadata = {});

struct SafetensorsContents {
  std::map<std::string, Tensor> tensors;  // on the CPU; each tensor's name() is its key
  std::map<std::string, std::string> metadata;
};

// Reads and fully validates a safetensors file: header length within the file (and at most
// 100 MB), a strictly well-formed UTF-8 JSON header without duplicate keys, dtypes Braid has
// (F32 BF16 F16 I32 I64 U8 I8), shapes whose size matches their byte range, byte ranges in the
// buffer that cover it exactly without overlaps. Errors name the file and the tensor.
absl::StatusOr<SafetensorsContents> ReadSafetensors(const std::string& path);

// ReadSafetensors without the metadata.
absl::StatusOr<std::map<std::string, Tensor>> LoadSafetensors(const std::string& path);

}  // namespace braid

#endif  // BRAID_PLUGINS_CHECKPOINT_SAFETENSORS_H_
