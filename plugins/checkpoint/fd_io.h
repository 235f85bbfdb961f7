// Whole reads and writes on a file descriptor, and the descriptor's owner: what the safetensors
// reader/writer (safetensors.cc) and the checkpoint shards (shard_io.cc) both need from POSIX
// I/O, which may transfer less than asked or be interrupted by a signal. Header-only.
#ifndef BRAID_PLUGINS_CHECKPOINT_FD_IO_H_
#define BRAID_PLUGINS_CHECKPOINT_FD_IO_H_

#include <errno.h>
#include <sys/types.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>

namespace braid::fd_io {

// Owns a file descriptor (negative: none) and closes it when destroyed.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() { Close(); }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  // Closes now, reporting the error close() can give (delayed write errors on some filesystems).
  int Close() {
    const int rc = fd_ >= 0 ? ::close(fd_) : 0;
    fd_ = -1;
    return rc;
  }

 private:
  int fd_;
};

// Writes all n bytes, retrying short and interrupted writes; false with errno set (EIO when the
// file takes no more).
inline bool WriteAll(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      if (w == 0) errno = EIO;
      return false;
    }
    p += w;
    n -= size_t(w);
  }
  return true;
}

// Reads exactly n bytes, at the file's position or, with offset >= 0, at `offset` (pread: the
// position is left alone); false with errno set, 0 when the file ends first.
inline bool ReadAll(int fd, void* data, size_t n, int64_t offset = -1) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t r = offset >= 0 ? ::pread(fd, p, n, off_t(offset)) : ::read(fd, p, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      if (r == 0) errno = 0;
      return false;
    }
    p += r;
    n -= size_t(r);
    if (offset >= 0) offset += r;
  }
  return true;
}

}  // namespace braid::fd_io

#endif  // BRAID_PLUGINS_CHECKPOINT_FD_IO_H_
