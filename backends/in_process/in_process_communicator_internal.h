// The rendezvous state that the in-process communicator's ranks share (core/
// in_process_communicator.h): a group's pending collectives, its unmatched sends and receives, and
// each rank's recent operations. Internal to //core: in_process_communicator.cc makes ranks
// arrive and match, in_process_communicator_execute.cc moves and reduces the data once they have.
#ifndef BRAID_BACKENDS_IN_PROCESS_IN_PROCESS_COMMUNICATOR_INTERNAL_H_
#define BRAID_BACKENDS_IN_PROCESS_IN_PROCESS_COMMUNICATOR_INTERNAL_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "core/communicator.h"
#include "core/dtype.h"
#include "core/tensor.h"

namespace braid::in_process_internal {

constexpr size_t kLogLength = 8;

enum class OpKind {
  kAllReduce,
  kReduceScatter,
  kAllGather,
  kBroadcast,
  kReduce,
  kBarrier,
  kNewGroup
};

// What every rank's call of one collective must agree on.
struct Signature {
  OpKind kind = OpKind::kBarrier;
  DType dtype = DType::kF32;
  int64_t numel = 0;  // of the full (reduced, gathered, broadcast) buffer
  ReduceOp op = ReduceOp::kSum;
  int root = 0;
  std::vector<int64_t> counts;  // per-rank blocks (reduce-scatter, all-gather)
  std::vector<int> ranks;       // NewGroup's members

  bool operator==(const Signature& o) const {
    return kind == o.kind && dtype == o.dtype && numel == o.numel && op == o.op && root == o.root &&
           counts == o.counts && ranks == o.ranks;
  }

  std::string Describe() const {
    std::string data = absl::StrCat(DTypeName(dtype), ", ", numel, " elements");
    std::string blocks = absl::StrCat(" in blocks ", absl::StrJoin(counts, ","));
    switch (kind) {
      case OpKind::kAllReduce:
        return absl::StrCat("AllReduce(", ReduceOpName(op), ", ", data, ")");
      case OpKind::kReduceScatter:
        return absl::StrCat("ReduceScatter(", ReduceOpName(op), ", ", data, blocks, ")");
      case OpKind::kAllGather:
        return absl::StrCat("AllGather(", data, blocks, ")");
      case OpKind::kBroadcast:
        return absl::StrCat("Broadcast(root ", root, ", ", data, ")");
      case OpKind::kReduce:
        return absl::StrCat("Reduce(root ", root, ", ", ReduceOpName(op), ", ", data, ")");
      case OpKind::kBarrier:
        return "Barrier()";
      case OpKind::kNewGroup:
        return absl::StrCat("NewGroup(ranks ", absl::StrJoin(ranks, ","), ")");
    }
    return "?";
  }
};

struct Pending {
  bool done = false;  // guarded by Group::mu
  absl::Status status;
};

struct Group;

// One collective: rank r's arrival fills in[r]/out[r].
struct Slot : Pending {
  int64_t seq = 0;
  Signature sig;
  int first_rank = -1;
  std::vector<bool> arrived;
  int num_arrived = 0;
  std::vector<Tensor> in, out;
  std::shared_ptr<Group> child;  // NewGroup's result
};

// One point-to-point message end (a Send or a Recv) waiting for its match.
struct P2p : Pending {
  Tensor t;
  int rank = 0;
};

struct LogEntry {
  std::string what;  // "#3 AllReduce(sum, f32, 16 elements) 64 B"
};

struct Group {
  Group(std::string n, int s) : name(std::move(n)), size(s), next_seq(s, 0), log(s) {}
  const std::string name;
  const int size;

  absl::Mutex mu;
  std::map<int64_t, std::shared_ptr<Slot>> slots;  // collectives some rank is still to reach
  std::vector<int64_t> next_seq;                   // per rank: collectives issued so far
  std::vector<std::deque<LogEntry>> log;           // per rank: recent operations
  using Key = std::tuple<int, int, int>;           // (src, dst, tag)
  std::map<Key, std::deque<std::shared_ptr<P2p>>> sends, recvs;
  int num_children = 0;

  std::string Describe() const { return absl::StrCat("group '", name, "' (", size, " ranks)"); }

  void Log(int rank, std::string what) {
    auto& l = log[rank];
    l.push_back(LogEntry{std::move(what)});
    if (l.size() > kLogLength) l.pop_front();
  }

  std::string RecentOps(int rank) const {
    std::vector<std::string> ops;
    for (const auto& e : log[rank]) ops.push_back(e.what);
    return absl::StrCat("rank ", rank, ": ", ops.empty() ? "(none)" : absl::StrJoin(ops, ", "));
  }
};

// Runs a collective every rank has arrived at (outside the group's lock: no one else touches
// these tensors until the slot is marked done).
void Execute(Group& g, Slot& s);

}  // namespace braid::in_process_internal

#endif  // BRAID_BACKENDS_IN_PROCESS_IN_PROCESS_COMMUNICATOR_INTERNAL_H_
