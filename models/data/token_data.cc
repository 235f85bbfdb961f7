#include "models/data/token_data.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/check.h"

namespace braid::data {
namespace {

// Makes a CPU tensor, moved to `device` when that is not the host.
Tensor OnDevice(const Tensor& host, Device device) {
  return device == Device::CPU() ? host : host.To(device);
}

// Maps `path` read-only; its size must be a whole, non-zero number of tokens.
absl::StatusOr<std::pair<void*, size_t>> MapTokens(const std::string& path, TokenType type) {
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
  const size_t width = size_t(TokenWidth(type));
  if (bytes == 0 || bytes % width != 0) {
    ::close(fd);
    return absl::InvalidArgumentError(
        absl::StrCat("token file '", path, "' has ", bytes, " bytes, which is ",
                     bytes == 0 ? "empty" : absl::StrCat("not a whole number of ",
                                                         TokenTypeName(type), " tokens"),
                     "; check the file and the token type (", TokenTypeName(type), ")"));
  }
  void* m = ::mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  int e = errno;
  ::close(fd);  // the mapping keeps the file alive
  if (m == MAP_FAILED) {
    return absl::InternalError(absl::StrCat("cannot mmap '", path, "': ", std::strerror(e)));
  }
  return std::make_pair(m, bytes);
}

}  // namespace

const char* TokenTypeName(TokenType t) {
  switch (t) {
    case TokenType::kU8: return "u8";
    case TokenType::kU16: return "u16";
    case TokenType::kU32: return "u32";
  }
  return "?";
}

int TokenWidth(TokenType t) {
  switch (t) {
    case TokenType::kU8: return 1;
    case TokenType::kU16: return 2;
    case TokenType::kU32: return 4;
  }
  return 1;
}

absl::StatusOr<TokenFile> TokenFile::Open(const std::string& path, TokenType type) {
  return OpenConcatenated({path}, type, path);
}

absl::StatusOr<TokenFile> TokenFile::OpenConcatenated(const std::vector<std::string>& paths,
                                                      TokenType type, const std::string& label) {
  if (paths.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("token data '", label, "' has no files"));
  }
  TokenFile f;
  f.path_ = label;
  f.type_ = type;
  for (const std::string& path : paths) {
    BRAID_ASSIGN_OR_RETURN(auto mapping, MapTokens(path, type));  // f unmaps the others
    f.mappings_.push_back(mapping);
    Segment s;
    s.begin = f.size_;
    s.size = int64_t(mapping.second) / TokenWidth(type);
    s.bytes = static_cast<const uint8_t*>(mapping.first);
    s.path = path;
    f.size_ += s.size;
    f.segments_.push_back(std::move(s));
  }
  return f;
}

TokenFile TokenFile::FromTokens(const std::vector<int32_t>& tokens, TokenType type) {
  TokenFile f;
  f.path_ = "<memory>";
  f.type_ = type;
  const int64_t max = type == TokenType::kU8 ? 0xff : type == TokenType::kU16 ? 0xffff : INT32_MAX;
  for (int32_t t : tokens) {
    BRAID_CHECK(t >= 0 && t <= max) << "token " << t << " does not fit " << TokenTypeName(type);
    for (int k = 0; k < TokenWidth(type); ++k) f.owned_.push_back(uint8_t(uint32_t(t) >> (8 * k)));
  }
  f.size_ = int64_t(tokens.size());
  Segment s;
  s.size = f.size_;
  s.bytes = f.owned_.data();
  s.path = f.path_;
  f.segments_.push_back(std::move(s));
  return f;
}

TokenFile::TokenFile(TokenFile&& o) noexcept { *this = std::move(o); }

TokenFile& TokenFile::operator=(TokenFile&& o) noexcept {
  if (this == &o) return *this;
  Release();
  path_ = std::move(o.path_);
  type_ = o.type_;
  size_ = o.size_;
  // Moved vectors keep their buffers, so the segments' pointers into owned_ stay valid.
  segments_ = std::move(o.segments_);
  mappings_ = std::move(o.mappings_);
  owned_ = std::move(o.owned_);
  o.segments_.clear();
  o.mappings_.clear();
  o.size_ = 0;
  return *this;
}

TokenFile::~TokenFile() { Release(); }

void TokenFile::Release() {
  for (auto& [m, bytes] : mappings_) ::munmap(m, bytes);
  mappings_.clear();
  segments_.clear();
  size_ = 0;
}

const TokenFile::Segment& TokenFile::SegmentOf(int64_t i) const {
  if (segments_.size() == 1) return segments_[0];
  auto it = std::upper_bound(segments_.begin(), segments_.end(), i,
                             [](int64_t v, const Segment& s) { return v < s.begin; });
  return *(it - 1);
}

std::pair<std::string, int64_t> TokenFile::Locate(int64_t i) const {
  BRAID_CHECK(i >= 0 && i < size_) << "token " << i << " out of range for " << path_;
  const Segment& s = SegmentOf(i);
  return {s.path, i - s.begin};
}

void TokenFile::Copy(int64_t begin, int64_t n, int32_t* out) const {
  BRAID_CHECK(begin >= 0 && n >= 0 && begin + n <= size_)
      << "tokens [" << begin << ", " << begin + n << ") out of range for " << path_ << " (" << size_
      << " tokens)";
  while (n > 0) {
    const Segment& s = SegmentOf(begin);
    const int64_t from = begin - s.begin;
    const int64_t take = std::min(n, s.size - from);
    if (type_ == TokenType::kU8) {
      const uint8_t* p = s.bytes + from;
      for (int64_t i = 0; i < take; ++i) out[i] = p[i];
    } else {
      for (int64_t i = 0; i < take; ++i) out[i] = At(s.bytes, from + i);
    }
    out += take;
    begin += take;
    n -= take;
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
