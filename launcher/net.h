// Small networking helpers for programs that join a multi-process job.
#ifndef BRAID_LAUNCHER_NET_H_
#define BRAID_LAUNCHER_NET_H_

#include <string>

namespace braid::launcher {

// The local IPv4 address peers can reach this process at: the one the kernel routes toward
// `peer` (connecting a UDP socket sends nothing). Falls back to 127.0.0.1.
std::string LocalAddressToward(const std::string& peer);

}  // namespace braid::launcher

#endif  // BRAID_LAUNCHER_NET_H_
