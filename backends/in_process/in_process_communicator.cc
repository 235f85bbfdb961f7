#include "backends/in_process/in_process_communicator.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <set>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "backends/in_process/in_process_communicator_internal.h"

namespace braid {

namespace {

using in_process_internal::Execute;
using in_process_internal::Group;
using in_process_internal::OpKind;
using in_process_internal::P2p;
using in_process_internal::Pending;
using in_process_internal::Signature;
using in_process_internal::Slot;

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
