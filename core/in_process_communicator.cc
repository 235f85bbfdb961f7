#include "core/in_process_communicator.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <set>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"

namespace braid {

namespace {

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

// ---- Reductions -------------------------------------------------------------------------------

template <typename Acc>
Acc LoadAs(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::kF32:
      return Acc(static_cast<const float*>(p)[i]);
    case DType::kBF16:
      return Acc(BF16ToFloat(static_cast<const uint16_t*>(p)[i]));
    case DType::kF16:
      return Acc(F16ToFloat(static_cast<const uint16_t*>(p)[i]));
    case DType::kI32:
      return Acc(static_cast<const int32_t*>(p)[i]);
    case DType::kI64:
      return Acc(static_cast<const int64_t*>(p)[i]);
    case DType::kU8:
      return Acc(static_cast<const uint8_t*>(p)[i]);
    case DType::kI8:
      return Acc(static_cast<const int8_t*>(p)[i]);
  }
  BRAID_CHECK(false) << "in-process reduction of " << DTypeName(t);
  return Acc();
}

template <typename Acc>
void StoreFrom(void* p, DType t, int64_t i, Acc v) {
  switch (t) {
    case DType::kF32:
      static_cast<float*>(p)[i] = float(v);
      return;
    case DType::kBF16:
      static_cast<uint16_t*>(p)[i] = FloatToBF16(float(v));
      return;
    case DType::kF16:
      static_cast<uint16_t*>(p)[i] = FloatToF16(float(v));
      return;
    case DType::kI32:
      static_cast<int32_t*>(p)[i] = int32_t(v);
      return;
    case DType::kI64:
      static_cast<int64_t*>(p)[i] = int64_t(v);
      return;
    // Narrow integers wrap (the sum is kept in int64 and truncated), as a loop in the dtype
    // itself would and as the Gloo communicator does.
    case DType::kU8:
      static_cast<uint8_t*>(p)[i] = uint8_t(v);
      return;
    case DType::kI8:
      static_cast<int8_t*>(p)[i] = int8_t(v);
      return;
  }
  BRAID_CHECK(false) << "in-process reduction of " << DTypeName(t);
}

// dst[0, n) = op over srcs (in rank order, as a serial loop would) of src[0, n); dst is a buffer
// of the same dtype that aliases no source.
template <typename Acc>
void ReduceTyped(DType t, ReduceOp op, const std::vector<const void*>& srcs, int64_t n, void* dst) {
  std::vector<Acc> acc(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) acc[i] = LoadAs<Acc>(srcs[0], t, i);
  for (size_t r = 1; r < srcs.size(); ++r) {
    for (int64_t i = 0; i < n; ++i) {
      Acc v = LoadAs<Acc>(srcs[r], t, i);
      switch (op) {
        case ReduceOp::kSum:
        case ReduceOp::kAvg:
          acc[i] += v;
          break;
        case ReduceOp::kMax:
          acc[i] = std::max(acc[i], v);
          break;
        case ReduceOp::kMin:
          acc[i] = std::min(acc[i], v);
          break;
      }
    }
  }
  if (op == ReduceOp::kAvg) {
    for (int64_t i = 0; i < n; ++i) acc[i] /= Acc(srcs.size());
  }
  for (int64_t i = 0; i < n; ++i) StoreFrom<Acc>(dst, t, i, acc[i]);
}

void Reduce(DType t, ReduceOp op, const std::vector<const void*>& srcs, int64_t n, void* dst) {
  if (IsFloating(t)) {
    ReduceTyped<float>(t, op, srcs, n, dst);
  } else {
    ReduceTyped<int64_t>(t, op, srcs, n, dst);
  }
}

char* Bytes(const Tensor& t) { return static_cast<char*>(t.raw_data()); }

// Runs a collective every rank has arrived at (outside the group's lock: no one else touches
// these tensors until the slot is marked done).
void Execute(Group& g, Slot& s) {
  const Signature& sig = s.sig;
  const int n = g.size;
  const size_t elem = SizeOf(sig.dtype);
  // Results go through a scratch buffer first so that outputs may alias inputs in any way.
  std::vector<char> scratch(size_t(sig.numel) * elem);
  std::vector<int64_t> offsets(n + 1, 0);
  for (int r = 0; r < int(sig.counts.size()); ++r) offsets[r + 1] = offsets[r] + sig.counts[r];
  auto sources = [&](const std::vector<Tensor>& ts) {
    std::vector<const void*> p;
    for (const Tensor& t : ts) p.push_back(t.raw_data());
    return p;
  };
  switch (sig.kind) {
    case OpKind::kAllReduce: {
      Reduce(sig.dtype, sig.op, sources(s.in), sig.numel, scratch.data());
      for (int r = 0; r < n; ++r) std::memcpy(Bytes(s.in[r]), scratch.data(), scratch.size());
      break;
    }
    case OpKind::kReduce: {
      Reduce(sig.dtype, sig.op, sources(s.in), sig.numel, scratch.data());
      std::memcpy(Bytes(s.in[sig.root]), scratch.data(), scratch.size());
      break;
    }
    case OpKind::kReduceScatter: {
      Reduce(sig.dtype, sig.op, sources(s.in), sig.numel, scratch.data());
      for (int r = 0; r < n; ++r) {
        std::memcpy(Bytes(s.out[r]), scratch.data() + offsets[r] * elem, sig.counts[r] * elem);
      }
      break;
    }
    case OpKind::kAllGather: {
      for (int r = 0; r < n; ++r) {
        std::memcpy(scratch.data() + offsets[r] * elem, Bytes(s.in[r]), sig.counts[r] * elem);
      }
      for (int r = 0; r < n; ++r) std::memcpy(Bytes(s.out[r]), scratch.data(), scratch.size());
      break;
    }
    case OpKind::kBroadcast: {
      std::memcpy(scratch.data(), Bytes(s.in[sig.root]), scratch.size());
      for (int r = 0; r < n; ++r) {
        if (r != sig.root) std::memcpy(Bytes(s.in[r]), scratch.data(), scratch.size());
      }
      break;
    }
    case OpKind::kBarrier:
      break;
    case OpKind::kNewGroup: {
      int id;
      {
        absl::MutexLock lock(&g.mu);
        id = g.num_children++;
      }
      s.child = std::make_shared<Group>(
          absl::StrCat(g.name, "/sub", id, "[", absl::StrJoin(sig.ranks, ","), "]"),
          int(sig.ranks.size()));
      break;
    }
  }
}

class InProcessWork final : public Work {
 public:
  // `describe_timeout` runs under the group's lock when Wait times out.
  InProcessWork(std::shared_ptr<Group> group, std::shared_ptr<Pending> pending,
                absl::Duration timeout, std::function<std::string(absl::Duration)> describe_timeout)
      : group_(std::move(group)),
        pending_(std::move(pending)),
        timeout_(timeout),
        describe_timeout_(std::move(describe_timeout)) {}

  absl::Status Wait() override {
    absl::MutexLock lock(&group_->mu);
    if (!group_->mu.AwaitWithTimeout(absl::Condition(&pending_->done), timeout_)) {
      return absl::DeadlineExceededError(describe_timeout_(timeout_));
    }
    return pending_->status;
  }

  bool IsCompleted() override {
    absl::MutexLock lock(&group_->mu);
    return pending_->done;
  }

 private:
  std::shared_ptr<Group> group_;
  std::shared_ptr<Pending> pending_;
  absl::Duration timeout_;
  std::function<std::string(absl::Duration)> describe_timeout_;
};

absl::Status CheckTensor(const Tensor& t, const char* role) {
  if (!t.defined()) return absl::InvalidArgumentError(absl::StrCat(role, " tensor is undefined"));
  if (t.device().type != DeviceType::kCPU) {
    return absl::InvalidArgumentError(absl::StrCat(
        role, " tensor ", t.DescribeForError(),
        " is not on a CPU device; the in-process communicator moves host memory only"));
  }
  return absl::OkStatus();
}

class InProcessCommunicator final : public Communicator {
 public:
  InProcessCommunicator(std::shared_ptr<Group> group, int rank, absl::Duration timeout)
      : group_(std::move(group)), rank_(rank) {
    set_timeout(timeout);
  }

  int rank() const override { return rank_; }
  int size() const override { return group_->size; }
  std::string name() const override { return "inprocess"; }

  std::shared_ptr<Work> AllReduce(Tensor& t, ReduceOp op) override {
    Signature sig{OpKind::kAllReduce};
    absl::Status st = CheckTensor(t, "AllReduce");
    if (st.ok()) {
      sig.dtype = t.dtype();
      sig.numel = t.numel();
      sig.op = op;
      st = CheckReducible(sig);
    }
    return Arrive(sig, st, t, Tensor(), st.ok() ? t.nbytes() : 0).first;
  }

  std::shared_ptr<Work> ReduceScatter(const Tensor& input, Tensor& output, ReduceOp op,
                                      const std::vector<int64_t>& counts) override {
    Signature sig{OpKind::kReduceScatter};
    sig.op = op;
    absl::Status st = CheckTensor(input, "ReduceScatter input");
    if (st.ok()) st = CheckTensor(output, "ReduceScatter output");
    if (st.ok()) {
      sig.dtype = input.dtype();
      sig.numel = input.numel();
      st = CheckReducible(sig);
    }
    if (st.ok()) st = Blocks("ReduceScatter", input.numel(), counts, &sig.counts);
    if (st.ok()) st = CheckBlock("ReduceScatter output", output, input.dtype(), sig.counts);
    return Arrive(sig, st, input, output, st.ok() ? input.nbytes() : 0).first;
  }

  std::shared_ptr<Work> AllGather(const Tensor& input, Tensor& output,
                                  const std::vector<int64_t>& counts) override {
    Signature sig{OpKind::kAllGather};
    absl::Status st = CheckTensor(input, "AllGather input");
    if (st.ok()) st = CheckTensor(output, "AllGather output");
    if (st.ok()) {
      sig.dtype = output.dtype();
      sig.numel = output.numel();
      st = Blocks("AllGather", output.numel(), counts, &sig.counts);
    }
    if (st.ok()) st = CheckBlock("AllGather input", input, output.dtype(), sig.counts);
    return Arrive(sig, st, input, output, st.ok() ? output.nbytes() : 0).first;
  }

  std::shared_ptr<Work> Broadcast(Tensor& t, int root) override {
    Signature sig{OpKind::kBroadcast};
    sig.root = root;
    absl::Status st = CheckTensor(t, "Broadcast");
    if (st.ok()) {
      sig.dtype = t.dtype();
      sig.numel = t.numel();
      st = CheckRoot("Broadcast", root);
    }
    return Arrive(sig, st, t, Tensor(), st.ok() ? t.nbytes() : 0).first;
  }

  std::shared_ptr<Work> Reduce(Tensor& t, int root, ReduceOp op) override {
    Signature sig{OpKind::kReduce};
    sig.root = root;
    sig.op = op;
    absl::Status st = CheckTensor(t, "Reduce");
    if (st.ok()) {
      sig.dtype = t.dtype();
      sig.numel = t.numel();
      st = CheckReducible(sig);
    }
    if (st.ok()) st = CheckRoot("Reduce", root);
    return Arrive(sig, st, t, Tensor(), st.ok() ? t.nbytes() : 0).first;
  }

  std::shared_ptr<Work> Barrier() override {
    return Arrive(Signature{OpKind::kBarrier}, absl::OkStatus(), Tensor(), Tensor(), 0).first;
  }

  absl::StatusOr<std::unique_ptr<Communicator>> NewGroup(const std::vector<int>& ranks) override {
    Signature sig{OpKind::kNewGroup};
    sig.ranks = ranks;
    absl::Status st;
    std::set<int> seen;
    for (int r : ranks) {
      if (r < 0 || r >= size() || !seen.insert(r).second) {
        st = absl::InvalidArgumentError(
            absl::StrCat("NewGroup(", absl::StrJoin(ranks, ","), ") on rank ", rank_, " of ",
                         group_->Describe(), ": rank ", r, " is out of range or listed twice"));
        break;
      }
    }
    if (st.ok() && ranks.empty()) {
      st = absl::InvalidArgumentError(
          absl::StrCat("NewGroup on rank ", rank_, " of ", group_->Describe(), ": no ranks given"));
    }
    auto [work, slot] = Arrive(sig, st, Tensor(), Tensor(), 0);
    BRAID_RETURN_IF_ERROR(work->Wait());
    auto it = std::find(ranks.begin(), ranks.end(), rank_);
    if (it == ranks.end()) return std::unique_ptr<Communicator>();
    std::shared_ptr<Group> child;
    {
      absl::MutexLock lock(&group_->mu);
      child = slot->child;
    }
    return std::unique_ptr<Communicator>(
        new InProcessCommunicator(child, int(it - ranks.begin()), timeout()));
  }

  std::shared_ptr<Work> Send(const Tensor& t, int dst, int tag) override {
    return PointToPoint(/*send=*/true, t, dst, tag);
  }
  std::shared_ptr<Work> Recv(Tensor& t, int src, int tag) override {
    return PointToPoint(/*send=*/false, t, src, tag);
  }

 private:
  // The rule every communicator shares (core/communicator.h).
  absl::Status CheckReducible(const Signature& sig) const {
    return CheckReduction(sig.op, sig.dtype,
                          absl::StrCat(sig.Describe(), " on rank ", rank_, " of ",
                                       group_->Describe()));
  }

  absl::Status CheckRoot(const char* op, int root) const {
    if (root >= 0 && root < size()) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(
        op, " on rank ", rank_, " of ", group_->Describe(), ": root ", root, " is out of range"));
  }

  // Normalises `counts` (empty: equal blocks) for a buffer of `total` elements.
  absl::Status Blocks(const char* op, int64_t total, const std::vector<int64_t>& counts,
                      std::vector<int64_t>* out) const {
    BRAID_ASSIGN_OR_RETURN(*out,
                           BlockCounts(absl::StrCat(op, " on rank ", rank_), total, size(), counts));
    return absl::OkStatus();
  }

  absl::Status CheckBlock(const char* role, const Tensor& t, DType dtype,
                          const std::vector<int64_t>& counts) const {
    if (t.numel() != counts[rank_] || t.dtype() != dtype) {
      return absl::InvalidArgumentError(
          absl::StrCat(role, " on rank ", rank_, " is ", t.DescribeForError(),
                       " but must hold this rank's "
                       "block: ",
                       counts[rank_], " elements of ", DTypeName(dtype)));
    }
    return absl::OkStatus();
  }

  // Joins collective number next_seq[rank] of the group; the last rank to arrive runs it.
  std::pair<std::shared_ptr<Work>, std::shared_ptr<Slot>> Arrive(const Signature& sig,
                                                                 const absl::Status& local_error,
                                                                 const Tensor& in,
                                                                 const Tensor& out, size_t bytes) {
    Group& g = *group_;
    std::shared_ptr<Slot> slot;
    bool run = false;
    {
      absl::MutexLock lock(&g.mu);
      int64_t seq = g.next_seq[rank_]++;
      g.Log(rank_, absl::StrCat("#", seq, " ", sig.Describe(), " ", bytes, " B"));
      std::shared_ptr<Slot>& entry = g.slots[seq];
      if (entry == nullptr) {
        entry = std::make_shared<Slot>();
        entry->seq = seq;
        entry->sig = sig;
        entry->first_rank = rank_;
        entry->arrived.assign(g.size, false);
        entry->in.resize(g.size);
        entry->out.resize(g.size);
      }
      slot = entry;
      if (!slot->done) {
        if (!local_error.ok()) {
          slot->status = local_error;
          slot->done = true;
        } else if (!(sig == slot->sig)) {
          slot->status = absl::InvalidArgumentError(absl::StrCat(
              "collective mismatch at #", seq, " in ", g.Describe(), ": rank ", slot->first_rank,
              " called ", slot->sig.Describe(), " but rank ", rank_, " called ", sig.Describe(),
              "; every rank must issue the same collectives in the same order"));
          slot->done = true;
        }
      }
      slot->arrived[rank_] = true;
      slot->in[rank_] = in;
      slot->out[rank_] = out;
      if (++slot->num_arrived == g.size) {
        g.slots.erase(seq);
        run = !slot->done;
      }
    }
    if (run) {
      Execute(g, *slot);
      absl::MutexLock lock(&g.mu);
      // Drop the handles: the tensors belong to their ranks again.
      slot->in.assign(g.size, Tensor());
      slot->out.assign(g.size, Tensor());
      slot->done = true;
    }
    std::shared_ptr<Group> group = group_;
    int rank = rank_;
    auto describe = [group, slot, rank](absl::Duration timeout) {
      std::vector<int> missing, present;
      for (int r = 0; r < group->size; ++r) (slot->arrived[r] ? present : missing).push_back(r);
      std::vector<std::string> logs = {group->RecentOps(rank)};
      for (int r : missing) logs.push_back(group->RecentOps(r));
      std::string who =
          missing.empty()
              ? std::string("every rank arrived but it is still running")
              : absl::StrCat("rank(s) ", absl::StrJoin(missing, ","),
                             " did not arrive (arrived: ", absl::StrJoin(present, ","), ")");
      return absl::StrCat("in-process ", slot->sig.Describe(), " #", slot->seq, " in ",
                          group->Describe(), " timed out after ", absl::FormatDuration(timeout),
                          " on rank ", rank, ": ", who,
                          ". Recent operations, newest last: ", absl::StrJoin(logs, "; "));
    };
    return {std::make_shared<InProcessWork>(group_, slot, timeout(), describe), slot};
  }

  std::shared_ptr<Work> PointToPoint(bool send, const Tensor& t, int peer, int tag) {
    const char* op = send ? "Send" : "Recv";
    absl::Status st = CheckTensor(t, op);
    if (st.ok() && (peer < 0 || peer >= size())) {
      st = absl::InvalidArgumentError(absl::StrCat(op, " on rank ", rank_, " of ",
                                                   group_->Describe(), ": peer rank ", peer,
                                                   " is out of range"));
    }
    if (!st.ok()) return CompletedWork(st);
    Group& g = *group_;
    Group::Key key = send ? Group::Key{rank_, peer, tag} : Group::Key{peer, rank_, tag};
    auto mine = std::make_shared<P2p>();
    mine->t = t;
    mine->rank = rank_;
    std::string what = absl::StrCat(op, send ? " to" : " from", " rank ", peer, " (tag ", tag, ", ",
                                    t.DescribeForError(), ")");
    {
      absl::MutexLock lock(&g.mu);
      g.Log(rank_, absl::StrCat(what, " ", t.nbytes(), " B"));
      auto& waiting = send ? g.recvs[key] : g.sends[key];
      if (waiting.empty()) {
        (send ? g.sends[key] : g.recvs[key]).push_back(mine);
      } else {
        std::shared_ptr<P2p> other = waiting.front();
        waiting.pop_front();
        const Tensor& src = send ? t : other->t;
        const Tensor& dst = send ? other->t : t;
        if (src.numel() != dst.numel() || src.dtype() != dst.dtype()) {
          mine->status = other->status = absl::InvalidArgumentError(
              absl::StrCat("in ", g.Describe(), ": Send of ", src.DescribeForError(), " from rank ",
                           std::get<0>(key), " does not match Recv into ", dst.DescribeForError(),
                           " on rank ", std::get<1>(key), " (tag ", tag, ")"));
        } else {
          std::memcpy(dst.raw_data(), src.raw_data(), src.nbytes());
        }
        other->t = Tensor();
        mine->t = Tensor();
        mine->done = other->done = true;
      }
    }
    std::shared_ptr<Group> group = group_;
    int rank = rank_;
    auto describe = [group, rank, what, peer, send](absl::Duration timeout) {
      return absl::StrCat("in-process ", what, " in ", group->Describe(), " timed out after ",
                          absl::FormatDuration(timeout), " on rank ", rank, ": rank ", peer,
                          " has not posted the matching ", send ? "Recv" : "Send",
                          ". Recent operations, newest last: ", group->RecentOps(rank), "; ",
                          group->RecentOps(peer));
    };
    return std::make_shared<InProcessWork>(group_, mine, timeout(), describe);
  }

  std::shared_ptr<Group> group_;
  int rank_;
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> MakeInProcessGroup(int n,
                                                              const std::string& group_name) {
  BRAID_CHECK(n >= 1) << "an in-process group needs at least one rank, got " << n;
  auto group = std::make_shared<Group>(group_name, n);
  std::vector<std::unique_ptr<Communicator>> comms;
  for (int r = 0; r < n; ++r) {
    comms.push_back(std::make_unique<InProcessCommunicator>(group, r, absl::Minutes(5)));
  }
  return comms;
}

}  // namespace braid
