// A one-way byte stream from one process to another on the same host: a ring buffer in POSIX
// shared memory with one writer and one reader. It carries the Gloo communicator's Sends and
// Recvs between ranks of one host (shm_link.h).
//
// Why not Gloo's TCP transport there: over loopback each message takes three socket writes, and
// each wakes the peer's transport thread, which copies the data on the peer's behalf. On a host
// whose cores all compute (a pipeline's stages), that thread takes its CPU from a computing rank
// and the message waits for it (issue 11). Through the ring, the sender copies the data in on
// its own thread and the receiver copies it out on the thread that waits for it; a wake-up (a
// futex) is paid only when the other side is asleep waiting.
#ifndef BRAID_BACKENDS_GLOO_SHM_RING_H_
#define BRAID_BACKENDS_GLOO_SHM_RING_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace braid::gloo_backend::internal {

struct ShmRingHeader;

class ShmRing {
 public:
  // The reader makes the ring: a new segment under a random name (returned in *name), its
  // `capacity` bytes reserved at once, so that a full /dev/shm is an error here and never a
  // SIGBUS in the middle of a copy.
  static absl::StatusOr<std::unique_ptr<ShmRing>> Create(size_t capacity, std::string* name);

  // The writer maps it by name and removes the name: from then on only the two mappings hold
  // the memory, and the kernel frees it when both processes are gone, however they end.
  static absl::StatusOr<std::unique_ptr<ShmRing>> Open(const std::string& name);

  // Unmaps; the creator also removes the name if the writer never came to take it.
  ~ShmRing();

  ShmRing(const ShmRing&) = delete;
  ShmRing& operator=(const ShmRing&) = delete;

  size_t capacity() const { return capacity_; }

  // Writer: copies as much of `data` as there is room for and publishes it; returns the bytes
  // taken (0 when the ring is full).
  size_t Write(const void* data, size_t n);

  // Reader: the bytes published and not yet read.
  size_t Readable() const;
  // Reader: copies up to `n` readable bytes to `out` (nullptr: skips them) and frees their room.
  size_t Read(void* out, size_t n);

  // Sleep until the other side publishes (data for the reader, room for the writer), closes its
  // end, `*done` turns true (an operation another thread of this side finished, which then
  // calls WakeReaders / WakeWriters) or `slice` passes; return at once if one holds already.
  // Spurious returns are allowed. The reader may first poll for up to `spin`: waking a thread
  // from a futex costs tens of microseconds when its core has gone idle (more on a VM), once
  // per message a pipeline stage waits for.
  void WaitReadable(absl::Duration slice, absl::Duration spin = absl::ZeroDuration(),
                    const std::atomic<bool>* done = nullptr);
  // Before the writer sleeps for room, it rings the reader's doorbell (below).
  void WaitWritable(absl::Duration slice, const std::atomic<bool>* done = nullptr);
  // Wake this side's sleepers in WaitReadable / WaitWritable (cheap when none sleeps).
  void WakeReaders();
  void WakeWriters();

  // Reader: the doorbell a writer rings when it finds the ring full. A reader that is not
  // waiting for this ring's messages (its thread waits for another peer's, or computes) still
  // has to make room, or two ranks sending each other more than a ring holds would wait for
  // each other forever; a thread of the reader's sleeps here for that (ShmLink). Returns the
  // number of rings so far, after it changed from `seen` or `slice` passed.
  uint32_t WaitDoorbell(uint32_t seen, absl::Duration slice);
  // Wakes every WaitDoorbell now (to stop the thread that sleeps there).
  void RingDoorbell();

  // This side is done with the ring (its communicator is gone): the other side's waits end.
  void Close();
  // The other side called Close.
  bool PeerClosed() const;

 private:
  ShmRing(void* base, size_t mapped, std::string unlink_on_close, bool reader);

  ShmRingHeader* header_;
  unsigned char* data_;
  size_t capacity_;
  size_t mapped_;
  std::string unlink_on_close_;  // the creator's name, until the writer takes it
  bool reader_;                  // the creator reads, the one that opens writes
};

// What makes two processes able to share a ring: the same kernel boot, the same /dev/shm mount
// and the same pid namespace (so a peer's pid can be checked). Empty if /dev/shm is missing.
std::string ShmHostIdentity();

// The default poll before a Recv sleeps: 2 ms while this host has a CPU for each of its ranks
// (the CPUs this process may use against $LOCAL_WORLD_SIZE, which the launcher sets), so that a
// polling rank takes no CPU another rank needs; none when that is unknown or not so.
absl::Duration ShmSpinAuto();

}  // namespace braid::gloo_backend::internal

#endif  // BRAID_BACKENDS_GLOO_SHM_RING_H_
