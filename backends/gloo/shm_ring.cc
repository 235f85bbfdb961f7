// ShmRing: the shared segment's layout, its creation and mapping, the lock-free single-writer,
// single-reader stream over it, and the futex waits.
#include "backends/gloo/shm_ring.h"

#include <fcntl.h>
#include <sched.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"

namespace braid::gloo_backend::internal {

namespace {

constexpr uint64_t kMagic = 0x6272616964726e67ull;  // "braidrng"
constexpr size_t kDataOffset = 4096;                // the header's page

using Counter = std::atomic<uint64_t>;
using Word = std::atomic<uint32_t>;
static_assert(Counter::is_always_lock_free && Word::is_always_lock_free,
              "the ring's counters are shared between processes: they must be lock-free");

}  // namespace

// At the start of the segment. Each side's fields on a cache line of their own, so that the
// writer publishing and the reader consuming do not invalidate each other's line. The counters
// only grow (bytes ever written / read); a position in the ring is the counter modulo capacity.
// A fresh segment is all zeros, which is a valid empty ring.
struct ShmRingHeader {
  uint64_t magic;
  uint64_t capacity;
  alignas(64) Counter written;
  Word data_seq;         // futex word: bumped after every publish
  Word readers_waiting;  // reader threads asleep (or about to be) on data_seq
  alignas(64) Counter read;
  Word room_seq;         // futex word: bumped after every consume
  Word writers_waiting;  // writer threads asleep (or about to be) on room_seq
  alignas(64) Word doorbell;  // futex word: bumped by a writer that found the ring full
  Word taken;                 // the writer has mapped the segment and removed its name
  Word reader_closed;
  Word writer_closed;
};
static_assert(sizeof(ShmRingHeader) <= kDataOffset, "the header must fit its page");

namespace {

// Shared (not FUTEX_PRIVATE): the word lives in memory two processes map.
void FutexWait(Word* word, uint32_t expected, absl::Duration slice) {
  timespec ts = absl::ToTimespec(std::max(slice, absl::Microseconds(1)));
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void FutexWakeAll(Word* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

// Sleeps on `seq` unless `ready` already holds. The sleeper counts itself in `waiting` before
// it checks again, and the other side bumps `seq` before it reads `waiting` (all sequentially
// consistent): either the check sees the new bytes or the other side sees the sleeper and wakes
// it, and a wake that comes before the sleep changes `seq`, so the futex does not sleep.
template <typename Ready, typename BeforeSleep>
void SleepUnless(Word* seq, Word* waiting, absl::Duration slice, absl::Duration spin, Ready ready,
                 BeforeSleep before_sleep) {
  const uint32_t before = seq->load();
  if (ready()) return;
  if (spin > absl::ZeroDuration()) {
    const absl::Time until = absl::Now() + spin;
    do {
      for (int i = 0; i < 8; ++i) __builtin_ia32_pause();
      if (ready()) return;
    } while (absl::Now() < until);
  }
  waiting->fetch_add(1);
  if (!ready()) {
    before_sleep();
    FutexWait(seq, before, slice);
  }
  waiting->fetch_sub(1);
}

std::string Errno(const char* what, const std::string& name) {
  return absl::StrCat(what, " /dev/shm", name, ": ", std::strerror(errno));
}

}  // namespace

ShmRing::ShmRing(void* base, size_t mapped, std::string unlink_on_close, bool reader)
    : header_(static_cast<ShmRingHeader*>(base)),
      data_(static_cast<unsigned char*>(base) + kDataOffset),
      capacity_(header_->capacity),
      mapped_(mapped),
      unlink_on_close_(std::move(unlink_on_close)),
      reader_(reader) {}

absl::StatusOr<std::unique_ptr<ShmRing>> ShmRing::Create(size_t capacity, std::string* name) {
  static std::atomic<uint64_t> made{0};
  std::random_device rd;
  *name = absl::StrFormat("/braid-%d-%d-%08x%08x", getpid(), made.fetch_add(1), rd(), rd());
  int fd = shm_open(name->c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) return absl::UnavailableError(Errno("cannot create", *name));
  const size_t size = kDataOffset + capacity;
  // Reserve every page now (posix_fallocate returns the error; it does not set errno).
  if (int err = posix_fallocate(fd, 0, off_t(size)); err != 0) {
    close(fd);
    shm_unlink(name->c_str());
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot reserve ", size, " bytes in /dev/shm for ", *name, ": ",
                     std::strerror(err),
                     "; give /dev/shm more room (docker: --shm-size), lower the gloo option "
                     "shm_ring_bytes, or turn shared memory off (BRAID_GLOO_SHM=0)"));
  }
  void* base = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (base == MAP_FAILED) {
    std::string error = Errno("cannot map", *name);
    shm_unlink(name->c_str());
    return absl::UnavailableError(error);
  }
  auto* h = static_cast<ShmRingHeader*>(base);
  h->capacity = capacity;
  // The name reaches the writer through the store only after this, so it sees both fields.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  h->magic = kMagic;
  return std::unique_ptr<ShmRing>(new ShmRing(base, size, *name, /*reader=*/true));
}

absl::StatusOr<std::unique_ptr<ShmRing>> ShmRing::Open(const std::string& name) {
  int fd = shm_open(name.c_str(), O_RDWR, 0);
  if (fd < 0) return absl::UnavailableError(Errno("cannot open", name));
  struct stat st;
  if (fstat(fd, &st) != 0 || size_t(st.st_size) <= kDataOffset) {
    close(fd);
    return absl::UnavailableError(absl::StrCat("/dev/shm", name, " is not a ring"));
  }
  void* base = mmap(nullptr, size_t(st.st_size), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (base == MAP_FAILED) return absl::UnavailableError(Errno("cannot map", name));
  auto* h = static_cast<ShmRingHeader*>(base);
  if (h->magic != kMagic || h->capacity + kDataOffset != size_t(st.st_size)) {
    munmap(base, size_t(st.st_size));
    return absl::UnavailableError(absl::StrCat("/dev/shm", name, " is not a ring"));
  }
  shm_unlink(name.c_str());
  h->taken.store(1);
  return std::unique_ptr<ShmRing>(new ShmRing(base, size_t(st.st_size), "", /*reader=*/false));
}

ShmRing::~ShmRing() {
  if (!unlink_on_close_.empty() && header_->taken.load() == 0) {
    shm_unlink(unlink_on_close_.c_str());
  }
  munmap(header_, mapped_);
}

size_t ShmRing::Write(const void* data, size_t n) {
  const uint64_t w = header_->written.load(std::memory_order_relaxed);  // only this side writes it
  const uint64_t r = header_->read.load(std::memory_order_acquire);
  n = std::min<size_t>(n, capacity_ - size_t(w - r));
  if (n == 0) return 0;
  const size_t at = size_t(w % capacity_);
  const size_t first = std::min(n, capacity_ - at);
  std::memcpy(data_ + at, data, first);
  std::memcpy(data_, static_cast<const unsigned char*>(data) + first, n - first);
  header_->written.store(w + n);  // seq_cst: ordered before the read of readers_waiting
  header_->data_seq.fetch_add(1);
  if (header_->readers_waiting.load() != 0) FutexWakeAll(&header_->data_seq);
  return n;
}

size_t ShmRing::Readable() const {
  return size_t(header_->written.load() - header_->read.load(std::memory_order_relaxed));
}

size_t ShmRing::Read(void* out, size_t n) {
  const uint64_t r = header_->read.load(std::memory_order_relaxed);  // only this side writes it
  const uint64_t w = header_->written.load(std::memory_order_acquire);
  n = std::min<size_t>(n, size_t(w - r));
  if (n == 0) return 0;
  if (out != nullptr) {
    const size_t at = size_t(r % capacity_);
    const size_t first = std::min(n, capacity_ - at);
    std::memcpy(out, data_ + at, first);
    std::memcpy(static_cast<unsigned char*>(out) + first, data_, n - first);
  }
  header_->read.store(r + n);
  header_->room_seq.fetch_add(1);
  if (header_->writers_waiting.load() != 0) FutexWakeAll(&header_->room_seq);
  return n;
}

void ShmRing::WaitReadable(absl::Duration slice, absl::Duration spin,
                           const std::atomic<bool>* done) {
  SleepUnless(
      &header_->data_seq, &header_->readers_waiting, slice, std::min(spin, slice),
      [this, done] { return Readable() > 0 || PeerClosed() || (done != nullptr && done->load()); },
      [] {});
}

void ShmRing::WakeReaders() {
  if (header_->readers_waiting.load() == 0) return;
  header_->data_seq.fetch_add(1);
  FutexWakeAll(&header_->data_seq);
}

void ShmRing::WakeWriters() {
  if (header_->writers_waiting.load() == 0) return;
  header_->room_seq.fetch_add(1);
  FutexWakeAll(&header_->room_seq);
}

void ShmRing::WaitWritable(absl::Duration slice, const std::atomic<bool>* done) {
  SleepUnless(
      &header_->room_seq, &header_->writers_waiting, slice, absl::ZeroDuration(),
      [this, done] {
        return header_->written.load() - header_->read.load() < capacity_ || PeerClosed() ||
               (done != nullptr && done->load());
      },
      [this] { RingDoorbell(); });
}

uint32_t ShmRing::WaitDoorbell(uint32_t seen, absl::Duration slice) {
  FutexWait(&header_->doorbell, seen, slice);
  return header_->doorbell.load();
}

void ShmRing::Close() {
  (reader_ ? header_->reader_closed : header_->writer_closed).store(1);
  header_->data_seq.fetch_add(1);
  header_->room_seq.fetch_add(1);
  FutexWakeAll(&header_->data_seq);
  FutexWakeAll(&header_->room_seq);
}

bool ShmRing::PeerClosed() const {
  return (reader_ ? header_->writer_closed : header_->reader_closed).load() != 0;
}

void ShmRing::RingDoorbell() {
  header_->doorbell.fetch_add(1);
  FutexWakeAll(&header_->doorbell);
}

absl::Duration ShmSpinAuto() {
  const char* ranks = std::getenv("LOCAL_WORLD_SIZE");
  cpu_set_t cpus;
  if (ranks == nullptr || sched_getaffinity(0, sizeof(cpus), &cpus) != 0) {
    return absl::ZeroDuration();
  }
  const int local = std::atoi(ranks);
  return local > 0 && CPU_COUNT(&cpus) >= local ? absl::Milliseconds(2) : absl::ZeroDuration();
}

std::string ShmHostIdentity() {
  struct stat shm;
  if (stat("/dev/shm", &shm) != 0) return "";
  std::string boot;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot;
  char pidns[128] = {0};
  ssize_t len = readlink("/proc/self/ns/pid", pidns, sizeof(pidns) - 1);
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  return absl::StrCat(host, " boot ", boot, " shm ", uint64_t(shm.st_dev), ":",
                      uint64_t(shm.st_ino), " ", len > 0 ? pidns : "pid:?");
}

}  // namespace braid::gloo_backend::internal
