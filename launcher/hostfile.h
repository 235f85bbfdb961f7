// DeepSpeed's hostfile and its --include/--exclude filters: which hosts a job runs on and which
// slots (local device indices) of each it uses. Pure functions, unit-tested in
// hostfile_test.cc; starting the nodes over ssh is hostfile_launch.h's business.
//
// A hostfile lists one host per line, `HOST slots=N`; blank lines and `#` comments (whole lines
// or after an entry) are ignored. A filter is DeepSpeed's: hosts separated by '@', each
// optionally followed by ':' and a comma-separated list of slots, e.g.
//   --include="worker-0@worker-1:0,2"    --exclude="worker-1:0"
#ifndef BRAID_LAUNCHER_HOSTFILE_H_
#define BRAID_LAUNCHER_HOSTFILE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace braid::launcher {

struct HostSlots {
  std::string host;
  std::vector<int> slots;  // ascending; `slots=N` in the hostfile gives 0..N-1
};

// Parses a hostfile's text; `path` names it in errors, which carry the line: "hosts:3: ...".
absl::StatusOr<std::vector<HostSlots>> ParseHostfile(absl::string_view text,
                                                     const std::string& path);

// Reads and parses the file at `path`.
absl::StatusOr<std::vector<HostSlots>> ReadHostfile(const std::string& path);

// Applies DeepSpeed's --include (only these hosts, or these slots of a host) or --exclude (all
// but these); at most one of them may be non-empty. Hosts keep the hostfile's order (the node
// ranks follow it) and a host left with no slot is dropped. Unknown hosts and slots are errors.
absl::StatusOr<std::vector<HostSlots>> FilterHosts(const std::vector<HostSlots>& hosts,
                                                   const std::string& include,
                                                   const std::string& exclude);

// The nodes of the job: the first `max_nodes` hosts (0 = all; DeepSpeed's --num_nodes) and of
// each the first `nproc_per_node` slots (0 = all; DeepSpeed's --num_gpus). Braid starts the
// same number of workers on every node, so the slot counts must then be equal.
struct HostfileNodes {
  std::vector<HostSlots> nodes;  // node rank = index
  int nproc_per_node = 0;
};
absl::StatusOr<HostfileNodes> SelectNodes(std::vector<HostSlots> hosts, int max_nodes,
                                          int nproc_per_node);

}  // namespace braid::launcher

#endif  // BRAID_LAUNCHER_HOSTFILE_H_
