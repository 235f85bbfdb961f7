#include "models/data/token_data.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace braid::data {
namespace {

const char* TypeName(TokenType t) { return t == TokenType::kU8 ? "u8" : "u16"; }

// Makes a CPU tensor, moved to `device` when that is not the host.
Tensor OnDevice(const Tensor& host, Device device) {
  return device == Device::CPU() ? host : host.To(device);
}

}  // namespace

absl::StatusOr<TokenFile> TokenFile::Open(const std::string& path, TokenType type) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::NotFoundError(
        absl::StrCat("cannot open token file '", path, "': ", std::strerror(errno)));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    return absl::InternalError(absl::StrCat("cannot stat '", path, "': ", std::strerror(e)));
  }
  const size_t bytes = size_t(st.st_size);
  const size_t width = type == TokenType::kU8 ? 1 : 2;
  if (bytes == 0 || bytes % width != 0) {
    ::close(fd);
    return absl::InvalidArgumentError(
        absl::StrCat("token file '", path, "' has ", bytes, " bytes, which is ",
                     bytes == 0 ? "empty" : "not a whole number of u16 tokens",
                     "; check the file and the token type (", TypeName(type), ")"));
  }
  void* m = ::mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  int e = errno;
  ::close(fd);  // the mapping keeps the file alive
  if (m == MAP_FAILED) {
    return absl::InternalError(absl::StrCat("cannot mmap '", path, "': ", std::strerror(e)));
  }
  TokenFile f;
  f.path_ = path;
  f.type_ = type;
  f.mapping_ = m;
  f.mapping_bytes_ = bytes;
  f.bytes_ = static_cast<const uint8_t*>(m);
  f.size_ = int64_t(bytes / width);
  return f;
}

TokenFile TokenFile::FromTokens(const std::vector<int32_t>& tokens, TokenType type) {
  TokenFile f;
  f.path_ = "<memory>";
  f.type_ = type;
  const int32_t max = type == TokenType::kU8 ? 0xff : 0xffff;
  for (int32_t t : tokens) {
    BRAID_CHECK(t >= 0 && t <= max) << "token " << t << " does not fit " << TypeName(type);
    f.owned_.push_back(uint8_t(t & 0xff));
    if (type == TokenType::kU16) f.owned_.push_back(uint8_t(t >> 8));
  }
  f.bytes_ = f.owned_.data();
  f.size_ = int64_t(tokens.size());
  return f;
}

TokenFile::TokenFile(TokenFile&& o) noexcept { *this = std::move(o); }

TokenFile& TokenFile::operator=(TokenFile&& o) noexcept {
  if (this == &o) return *this;
  Release();
  path_ = std::move(o.path_);
  type_ = o.type_;
  size_ = o.size_;
  mapping_ = o.mapping_;
  mapping_bytes_ = o.mapping_bytes_;
  owned_ = std::move(o.owned_);
  // A moved vector keeps its buffer, so the pointer stays valid either way; re-derive it anyway.
  bytes_ = mapping_ != nullptr ? static_cast<const uint8_t*>(mapping_) : owned_.data();
  o.mapping_ = nullptr;
  o.mapping_bytes_ = 0;
  o.bytes_ = nullptr;
  o.size_ = 0;
  return *this;
}

TokenFile::~TokenFile() { Release(); }

void TokenFile::Release() {
  if (mapping_ != nullptr) ::munmap(mapping_, mapping_bytes_);
  mapping_ = nullptr;
  mapping_bytes_ = 0;
  bytes_ = nullptr;
  size_ = 0;
}

void TokenFile::Copy(int64_t begin, int64_t n, int32_t* out) const {
  BRAID_CHECK(begin >= 0 && n >= 0 && begin + n <= size_)
      << "tokens [" << begin << ", " << begin + n << ") out of range for " << path_ << " (" << size_
      << " tokens)";
  if (type_ == TokenType::kU8) {
    const uint8_t* p = bytes_ + begin;
    for (int64_t i = 0; i < n; ++i) out[i] = p[i];
  } else {
    for (int64_t i = 0; i < n; ++i) out[i] = At(begin + i);
  }
}

absl::StatusOr<RandomWindowSampler> RandomWindowSampler::Create(
    std::shared_ptr<const TokenFile> data, int64_t batch, int64_t context, uint64_t base_seed,
    int rank, Device device) {
  if (data == nullptr) return absl::InvalidArgumentError("RandomWindowSampler: no token data");
  if (batch < 1 || context < 1 || rank < 0) {
    return absl::InvalidArgumentError(absl::StrCat("RandomWindowSampler: batch (", batch,
                                                   ") and context (", context,
                                                   ") must be >= 1 and rank (", rank, ") >= 0"));
  }
  if (data->size() <= context) {
    return absl::InvalidArgumentError(
        absl::StrCat("RandomWindowSampler: token file '", data->path(), "' has ", data->size(),
                     " tokens; a window of context ", context,
                     " plus its shifted target needs at least ", context + 1));
  }
  // Unsigned wrap-around is what "base_seed + rank" means for a 64-bit seed.
  return RandomWindowSampler(std::move(data), batch, context, base_seed + uint64_t(rank), device);
}

std::vector<int64_t> RandomWindowSampler::NextStarts() {
  const uint64_t range = uint64_t(data_->size() - context_);
  std::vector<int64_t> starts(batch_);
  for (int64_t b = 0; b < batch_; ++b) starts[b] = int64_t(rng_.Next() % range);
  return starts;
}

Batch RandomWindowSampler::Next() {
  std::vector<int64_t> starts = NextStarts();
  Tensor x = Tensor::Empty({batch_, context_}, DType::kI32);
  Tensor y = Tensor::Empty({batch_, context_}, DType::kI32);
  int32_t* xp = x.data<int32_t>();
  int32_t* yp = y.data<int32_t>();
  for (int64_t b = 0; b < batch_; ++b) {
    data_->Copy(starts[b], context_, xp + b * context_);
    data_->Copy(starts[b] + 1, context_, yp + b * context_);
  }
  return Batch{OnDevice(x, device_), OnDevice(y, device_)};
}

SequentialLoader::SequentialLoader(std::shared_ptr<const TokenFile> data, int64_t batch,
                                   int64_t context, int rank, int world, Device device)
    : data_(std::move(data)),
      batch_(batch),
      context_(context),
      rank_(rank),
      world_(world),
      device_(device) {
  batches_per_pass_ = (data_->size() - 1) / (int64_t(world_) * batch_ * context_);
}

absl::StatusOr<SequentialLoader> SequentialLoader::Create(std::shared_ptr<const TokenFile> data,
                                                          int64_t batch, int64_t context, int rank,
                                                          int world_size, Device device) {
  if (data == nullptr) return absl::InvalidArgumentError("SequentialLoader: no token data");
  if (batch < 1 || context < 1 || world_size < 1 || rank < 0 || rank >= world_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "SequentialLoader: need batch >= 1, context >= 1 and 0 <= rank < world_size; got batch ",
        batch, ", context ", context, ", rank ", rank, ", world_size ", world_size));
  }
  const int64_t need = int64_t(world_size) * batch * context + 1;
  if (data->size() < need) {
    return absl::InvalidArgumentError(
        absl::StrCat("SequentialLoader: token file '", data->path(), "' has ", data->size(),
                     " tokens; one batch on each of ", world_size, " ranks (B=", batch,
                     ", T=", context, ") needs ", need, ". Use a smaller batch or context."));
  }
  return SequentialLoader(std::move(data), batch, context, rank, world_size, device);
}

Batch SequentialLoader::Next() {
  const int64_t n = batch_ * context_;
  std::vector<int32_t> buf(n + 1);
  data_->Copy(position(), n + 1, buf.data());
  Tensor x = Tensor::Empty({batch_, context_}, DType::kI32);
  Tensor y = Tensor::Empty({batch_, context_}, DType::kI32);
  std::memcpy(x.data<int32_t>(), buf.data(), n * sizeof(int32_t));
  std::memcpy(y.data<int32_t>(), buf.data() + 1, n * sizeof(int32_t));
  step_ = (step_ + 1) % batches_per_pass_;
  return Batch{OnDevice(x, device_), OnDevice(y, device_)};
}

}  // namespace braid::data
