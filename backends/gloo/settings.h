// The Gloo communicator's settings: its options (CommunicatorOptions::options, documented in
// gloo_communicator.h) parsed and checked. Separate from the communicator because every part of
// the plugin (shared state, work handles, algorithms) reads them.
#ifndef BRAID_BACKENDS_GLOO_SETTINGS_H_
#define BRAID_BACKENDS_GLOO_SETTINGS_H_

#include <chrono>
#include <cstddef>
#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace braid::gloo_backend::internal {

enum class AllreduceAlgorithm { kAuto, kRing, kBcube, kDirect };

struct Settings {
  std::string hostname = "127.0.0.1";
  std::string iface;
  std::string group_name = "world";
  std::string store_prefix = "gloo";
  absl::Duration heartbeat = absl::Seconds(1);
  AllreduceAlgorithm allreduce = AllreduceAlgorithm::kAuto;
  // Direct exchange (one message to every peer) while (size - 1) * bytes stays under this.
  size_t direct_max_bytes = 256 << 10;
  // Then Gloo's bcube (recursive halving/doubling: few, large messages) up to this size, and
  // its ring (many segments, which pipelines the reduction with the transfer) above it.
  size_t bcube_max_bytes = 4 << 20;
  size_t segment_bytes = 4 << 20;
  // Send/Recv between ranks of one host through shared-memory rings (shm_link.h), each ring
  // (one per direction of a pair that exchanges messages) this large.
  bool shm = true;
  size_t shm_ring_bytes = 4 << 20;
  // How long a Recv's wait polls the ring before it sleeps; -1: ShmSpinAuto.
  int64_t shm_spin_us = -1;
};

// Unknown keys and malformed values are InvalidArgument.
absl::StatusOr<Settings> ParseSettings(const std::map<std::string, std::string>& options);

// `d` as Gloo's timeouts take it (at least 1 ms).
std::chrono::milliseconds Ms(absl::Duration d);

}  // namespace braid::gloo_backend::internal

#endif  // BRAID_BACKENDS_GLOO_SETTINGS_H_
