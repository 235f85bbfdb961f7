// The Gloo communicator itself: argument checks, the queue of collectives (issue order,
// sequence numbers, failure reporting), posting Sends and Recvs, sub-groups, and the factory.
// What runs on the worker thread, the shared state and the Work handles live beside it
// (collectives.h, core_state.h, work.h).
#include "backends/gloo/gloo_communicator.h"

#include <gloo/barrier.h>
#include <gloo/context.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/attr.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>
#include <netdb.h>
#include <signal.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "backends/gloo/collectives.h"
#include "backends/gloo/core_state.h"
#include "backends/gloo/settings.h"
#include "backends/gloo/shm_link.h"
#include "backends/gloo/slots.h"
#include "backends/gloo/store_adapter.h"
#include "backends/gloo/threads.h"
#include "backends/gloo/work.h"
#include "core/check.h"
#include "core/store.h"

namespace braid::gloo_backend {
namespace {

using internal::Collectives;
using internal::Core;
using internal::Flight;
using internal::GlooWork;
using internal::GroupInfo;
using internal::kP2pSlotPrefix;
using internal::Ms;
using internal::P2pOp;
using internal::P2pWork;
using internal::ParseSettings;
using internal::SerialThread;
using internal::Settings;
using internal::ShmLink;

std::string Elements(const Tensor& t) {
  return absl::StrCat(DTypeName(t.dtype()), ", ", t.numel(), " elements");
}

// Per-process count of communicators made per store prefix (see store_prefix in the header).
std::string InstancePrefix(const std::string& prefix) {
  static std::mutex mu;
  static std::map<std::string, int>* counts = new std::map<std::string, int>();
  std::lock_guard<std::mutex> lock(mu);
  int n = (*counts)[prefix]++;
  return n == 0 ? prefix : absl::StrCat(prefix, ".", n);
}

// ---- The communicator ------------------------------------------------------------------------

class GlooCommunicator final : public Communicator {
 public:
  // Joins the group `g` over `store` and connects every pair (blocking, up to `timeout`).
  static absl::StatusOr<std::unique_ptr<GlooCommunicator>> Connect(
      GroupInfo g, Settings settings, braid::Store* store,
      std::shared_ptr<::gloo::transport::Device> device, absl::Duration timeout,
      const std::string& join_value) {
    BRAID_RETURN_IF_ERROR(internal::JoinGroup(g, store, timeout, join_value));
    // Read by a peer at its first Send or Recv with this rank, after the barrier below.
    BRAID_RETURN_IF_ERROR(ShmLink::Publish(store, g, settings.shm));
    auto context = std::make_shared<::gloo::rendezvous::Context>(g.rank, g.size);
    context->setTimeout(Ms(timeout));
    try {
      GlooStoreAdapter adapter(store, g.prefix + "/mesh", timeout);
      context->connectFullMesh(adapter, device);
      // connectFullMesh returns once this rank's side of every pair is up; a rank that went on
      // and closed its communicator at once could still break a peer's half-made pair. A barrier
      // makes construction end together. (Its tag is never a collective's sequence number.)
      if (g.size > 1) {
        ::gloo::BarrierOptions o(context);
        o.setTag(0xffffffffu);
        o.setTimeout(Ms(timeout));
        ::gloo::barrier(o);
      }
    } catch (const std::exception& e) {
      return absl::UnavailableError(
          absl::StrCat("gloo communicator ", g.Rank(g.rank), " of ", g.Describe(),
                       ": connecting to the other ranks failed: ", Core::FirstLine(e.what())));
    }
    auto core = std::make_shared<Core>();
    core->group = std::move(g);
    core->settings = std::move(settings);
    core->store = store;
    core->device = std::move(device);
    core->context = std::move(context);
    return std::unique_ptr<GlooCommunicator>(new GlooCommunicator(std::move(core), timeout));
  }

  ~GlooCommunicator() override {
    worker_.reset();  // drains the queued collectives
    {
      absl::MutexLock lock(&p2p_mu_);
      // Each ends by its timeout at the latest; the connections close only after.
      for (auto& w : p2p_ops_) {
        if (auto op = w.lock()) op->Drain();
      }
      p2p_ops_.clear();
    }
    core_->p2p_threads.JoinAll();
    {
      // A Work the caller still holds keeps its link alive; the peer must see the rings close
      // now, not when that Work goes.
      absl::MutexLock lock(&links_mu_);
      for (auto& [peer, link] : links_) {
        if (link != nullptr) link->Shutdown();
      }
    }
    core_->StopHeartbeat();
    heartbeat_.join();
    {
      absl::MutexLock lock(&core_->mu);
      core_->final_note = absl::StrCat("it destroyed its communicator after #", core_->finished);
    }
    core_->PublishProgress();
    core_->context.reset();  // closes this rank's connections
    core_->device.reset();   // Works may outlive this, holding core_
  }

  int rank() const override { return core_->group.rank; }
  int size() const override { return core_->group.size; }
  std::string name() const override { return "gloo"; }

  std::shared_ptr<Work> AllReduce(Tensor& t, ReduceOp op) override {
    std::string what = "AllReduce";
    absl::Status st = CheckTensor(t, "AllReduce");
    if (st.ok()) {
      what = absl::StrCat("AllReduce(", ReduceOpName(op), ", ", Elements(t), ")");
      st = CheckReducible(what, t.dtype(), op);
    }
    Tensor tensor = t;
    return Enqueue(what, st.ok() ? t.nbytes() : 0, st,
                   [this, tensor, op](int64_t seq) { collectives_.RunAllReduce(tensor, op, seq); });
  }

  std::shared_ptr<Work> ReduceScatter(const Tensor& input, Tensor& output, ReduceOp op,
                                      const std::vector<int64_t>& counts) override {
    std::string what = "ReduceScatter";
    std::vector<int64_t> blocks;
    absl::Status st = CheckTensor(input, "ReduceScatter input");
    if (st.ok()) st = CheckTensor(output, "ReduceScatter output");
    if (st.ok()) {
      what = absl::StrCat(
          "ReduceScatter(", ReduceOpName(op), ", ", Elements(input),
          counts.empty() ? "" : absl::StrCat(" in blocks ", absl::StrJoin(counts, ",")), ")");
      st = CheckReducible(what, input.dtype(), op);
    }
    if (st.ok()) st = Blocks(what, input.numel(), counts, &blocks);
    if (st.ok()) st = CheckBlock(what, "output", output, input.dtype(), blocks);
    Tensor in = input, out = output;
    return Enqueue(what, st.ok() ? input.nbytes() : 0, st,
                   [this, in, out, op, blocks](int64_t seq) {
                     collectives_.RunReduceScatter(in, out, op, blocks, seq);
                   });
  }

  std::shared_ptr<Work> AllGather(const Tensor& input, Tensor& output,
                                  const std::vector<int64_t>& counts) override {
    std::string what = "AllGather";
    std::vector<int64_t> blocks;
    absl::Status st = CheckTensor(input, "AllGather input");
    if (st.ok()) st = CheckTensor(output, "AllGather output");
    if (st.ok()) {
      what = absl::StrCat(
          "AllGather(", Elements(output),
          counts.empty() ? "" : absl::StrCat(" in blocks ", absl::StrJoin(counts, ",")), ")");
      st = Blocks(what, output.numel(), counts, &blocks);
    }
    if (st.ok()) st = CheckBlock(what, "input", input, output.dtype(), blocks);
    Tensor in = input, out = output;
    bool equal = counts.empty() || std::all_of(blocks.begin(), blocks.end(),
                                               [&](int64_t c) { return c == blocks[0]; });
    return Enqueue(what, st.ok() ? output.nbytes() : 0, st,
                   [this, in, out, blocks, equal](int64_t seq) {
                     collectives_.RunAllGather(in, out, blocks, equal, seq);
                   });
  }

  std::shared_ptr<Work> Broadcast(Tensor& t, int root) override {
    std::string what = "Broadcast";
    absl::Status st = CheckTensor(t, "Broadcast");
    if (st.ok()) {
      what = absl::StrCat("Broadcast(root ", root, ", ", Elements(t), ")");
      st = CheckRoot(what, root);
    }
    Tensor tensor = t;
    return Enqueue(what, st.ok() ? t.nbytes() : 0, st, [this, tensor, root](int64_t seq) {
      collectives_.RunBroadcast(tensor, root, seq);
    });
  }

  std::shared_ptr<Work> Reduce(Tensor& t, int root, ReduceOp op) override {
    std::string what = "Reduce";
    absl::Status st = CheckTensor(t, "Reduce");
    if (st.ok()) {
      what = absl::StrCat("Reduce(root ", root, ", ", ReduceOpName(op), ", ", Elements(t), ")");
      st = CheckReducible(what, t.dtype(), op);
    }
    if (st.ok()) st = CheckRoot(what, root);
    Tensor tensor = t;
    return Enqueue(what, st.ok() ? t.nbytes() : 0, st, [this, tensor, root, op](int64_t seq) {
      collectives_.RunReduce(tensor, root, op, seq);
    });
  }

  std::shared_ptr<Work> Barrier() override {
    return Enqueue("Barrier()", 0, absl::OkStatus(),
                   [this](int64_t seq) { collectives_.RunBarrier(seq); });
  }

  std::shared_ptr<Work> Send(const Tensor& t, int dst, int tag) override {
    return PointToPoint(/*send=*/true, t, dst, tag);
  }
  std::shared_ptr<Work> Recv(Tensor& t, int src, int tag) override {
    return PointToPoint(/*send=*/false, t, src, tag);
  }

  absl::StatusOr<std::unique_ptr<Communicator>> NewGroup(const std::vector<int>& ranks) override {
    const GroupInfo& g = core_->group;
    std::string what = absl::StrCat("NewGroup(ranks ", absl::StrJoin(ranks, ","), ")");
    std::set<int> seen;
    for (int r : ranks) {
      if (r < 0 || r >= size() || !seen.insert(r).second) {
        return absl::InvalidArgumentError(absl::StrCat(what, " on ", g.Rank(rank()), " of ",
                                                       g.Describe(), ": rank ", r,
                                                       " is out of range or listed twice"));
      }
    }
    if (ranks.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("NewGroup on ", g.Rank(rank()), " of ", g.Describe(), ": no ranks given"));
    }
    auto it = std::find(ranks.begin(), ranks.end(), rank());
    const bool member = it != ranks.end();
    const int child_rank = int(it - ranks.begin());
    auto result = std::make_shared<std::unique_ptr<GlooCommunicator>>();
    absl::Duration timeout = this->timeout();
    std::shared_ptr<GlooWork> work =
        Enqueue(what, 0, absl::OkStatus(),
                [this, member, child_rank, ranks, result, timeout](int64_t seq) -> absl::Status {
                  if (!member) return absl::OkStatus();
                  const GroupInfo& parent = core_->group;
                  GroupInfo child;
                  child.name = absl::StrCat(parent.name, "/g", seq);
                  child.prefix = absl::StrCat(parent.prefix, "/g", seq);
                  child.rank = child_rank;
                  child.size = int(ranks.size());
                  for (int r : ranks) child.world_ranks.push_back(parent.world_ranks[r]);
                  absl::StatusOr<std::unique_ptr<GlooCommunicator>> c =
                      Connect(std::move(child), core_->settings, core_->store, core_->device,
                              timeout, absl::StrCat("ranks=", absl::StrJoin(ranks, ",")));
                  if (!c.ok()) return c.status();
                  *result = std::move(*c);
                  return absl::OkStatus();
                });
    // Joining waits up to the timeout for the members and again for the connections.
    BRAID_RETURN_IF_ERROR(work->WaitFor(2 * timeout + WaitGrace()));
    if (!member) return std::unique_ptr<Communicator>();
    return std::unique_ptr<Communicator>(std::move(*result));
  }

 private:
  GlooCommunicator(std::shared_ptr<Core> core, absl::Duration timeout)
      : core_(std::move(core)), collectives_(core_) {
    set_timeout(timeout);
    worker_ = std::make_unique<SerialThread>();
    core_->PublishProgress();
    heartbeat_ = std::thread([core = core_] { core->HeartbeatLoop(); });
  }

  absl::Duration WaitGrace() const {
    return std::min(core_->settings.heartbeat + absl::Milliseconds(250), absl::Seconds(3)) +
           absl::Seconds(5);
  }

  // Queues collective `what` (its sequence number is assigned here, in issue order). `run`
  // throws on transport errors; a non-OK `local_error` fails the Work without running it.
  template <typename Run>
  std::shared_ptr<GlooWork> Enqueue(const std::string& what, size_t bytes, absl::Status local_error,
                                    Run run) {
    int64_t seq;
    {
      absl::MutexLock lock(&issue_mu_);
      seq = next_seq_++;
    }
    std::string full = absl::StrCat("#", seq, " ", what);
    uint64_t id = core_->journal.Add(absl::StrCat(full, " ", bytes, " B"));
    absl::Duration timeout = this->timeout();
    auto work = std::make_shared<GlooWork>(core_, full, timeout + WaitGrace());
    worker_->Post([this, work, seq, full, id, timeout, local_error, run]() mutable {
      core_->journal.Start(id);
      absl::Time t0 = absl::Now();
      absl::Status st;
      std::string broken = core_->Broken();
      if (!local_error.ok()) {
        // Our peers will wait for us in this collective: the group cannot go on. This rank
        // counts as not having arrived (it never started it), with the reason published.
        st = local_error;
        core_->Break(
            absl::StrCat(full, " was called with invalid arguments: ", local_error.message()));
        core_->PublishProgress();
        core_->journal.Finish(id, false);
        work->Finish(std::move(st));
        return;
      }
      if (!broken.empty()) {
        st = core_->BrokenError(full);  // not started: peers must not count this rank as arrived
      } else {
        core_->Started(seq, full);
        collectives_.set_op_timeout(timeout);
        try {
          st = Invoke(run, seq);
        } catch (const std::exception& e) {
          st = core_->CollectiveFailed(seq, full, e.what(), absl::Now() - t0, timeout);
        }
        core_->Finished(seq);
      }
      core_->journal.Finish(id, st.ok());
      work->Finish(std::move(st));
    });
    return work;
  }

  template <typename Run>
  static absl::Status Invoke(Run& run, int64_t seq) {
    if constexpr (std::is_same_v<decltype(run(seq)), void>) {
      run(seq);
      return absl::OkStatus();
    } else {
      return run(seq);
    }
  }

  // ---- Point to point ------------------------------------------------------------------

  std::shared_ptr<Work> PointToPoint(bool send, const Tensor& t, int peer, int tag) {
    const GroupInfo& g = core_->group;
    const char* op = send ? "Send" : "Recv";
    absl::Status st = CheckTensor(t, op);
    if (st.ok() && (peer < 0 || peer >= size() || peer == rank())) {
      st = absl::InvalidArgumentError(
          absl::StrCat(op, " on ", g.Rank(rank()), " of ", g.Describe(), ": peer rank ", peer,
                       peer == rank() ? " is this rank" : " is out of range"));
    }
    if (!st.ok()) return CompletedWork(st);
    int64_t n;
    {
      absl::MutexLock lock(&issue_mu_);
      n = (send ? sends_ : recvs_)[peer]++;
    }
    std::string what = absl::StrCat(op, " #", n, send ? " to " : " from ", g.Rank(peer), " (tag ",
                                    tag, ", ", t.DescribeForError(), ")");
    uint64_t id = core_->journal.Add(absl::StrCat(what, " ", t.nbytes(), " B"));
    core_->journal.Start(id);
    absl::Duration timeout = this->timeout();
    auto work = std::make_shared<GlooWork>(core_, what, timeout + WaitGrace());
    std::string broken = core_->Broken();
    if (!broken.empty()) {
      core_->journal.Finish(id, false);
      work->Finish(core_->BrokenError(what));
      return work;
    }
    if (t.nbytes() == 0) {
      core_->journal.Finish(id, true);
      work->Finish(absl::OkStatus());
      return work;
    }
    // Posting never blocks (the transport queues it), which is why it happens right here: a
    // Send and a Recv issued by both sides in any order always meet. The wait is the caller's
    // (P2pOp), so Works may be waited in any order: a pipeline's stages exchange in both
    // directions and wait for what they need next.
    absl::StatusOr<std::shared_ptr<ShmLink>> link = LinkTo(peer);
    if (!link.ok()) {
      core_->journal.Finish(id, false);
      work->Finish(link.status());
      return work;
    }
    if (*link != nullptr) {
      return Track((*link)->Post(send, t, tag, what, id, timeout), timeout);
    }
    std::unique_ptr<::gloo::transport::UnboundBuffer> buf;
    absl::Time posted = absl::Now();
    try {
      buf = core_->context->createUnboundBuffer(t.raw_data(), t.nbytes());
      const uint64_t slot = ::gloo::Slot::build(kP2pSlotPrefix, uint32_t(tag));
      if (send) {
        buf->send(peer, slot);
      } else {
        buf->recv(peer, slot);
      }
    } catch (const std::exception& e) {
      core_->journal.Finish(id, false);
      work->Finish(core_->P2pFailed(what, peer, absl::StrCat("Gloo: ", e.what()),
                                    absl::Now() - posted, timeout));
      return work;
    }
    return Track(std::make_shared<P2pOp>(core_, std::move(buf), t, send, peer, what, id, timeout),
                 timeout);
  }

  // Remembered so that the destructor can wait for it.
  std::shared_ptr<Work> Track(std::shared_ptr<Flight> flight, absl::Duration timeout) {
    absl::MutexLock lock(&p2p_mu_);
    p2p_ops_.erase(std::remove_if(p2p_ops_.begin(), p2p_ops_.end(),
                                  [](const std::weak_ptr<Flight>& w) { return w.expired(); }),
                   p2p_ops_.end());
    p2p_ops_.push_back(flight);
    return std::make_shared<P2pWork>(std::move(flight), timeout + WaitGrace());
  }

  // The shared-memory link to `peer`, or nullptr for TCP: decided at the first Send or Recv
  // with the peer, and kept.
  absl::StatusOr<std::shared_ptr<ShmLink>> LinkTo(int peer) {
    absl::MutexLock lock(&links_mu_);
    auto it = links_.find(peer);
    if (it != links_.end()) return it->second;
    BRAID_ASSIGN_OR_RETURN(std::shared_ptr<ShmLink> link, ShmLink::ForPeer(core_, peer, timeout()));
    links_[peer] = link;
    return link;
  }

  // ---- Argument checks (same rules as the in-process communicator) ------------------------

  absl::Status CheckTensor(const Tensor& t, const char* role) const {
    if (!t.defined()) return absl::InvalidArgumentError(absl::StrCat(role, " tensor is undefined"));
    if (t.device().type != DeviceType::kCPU) {
      return absl::InvalidArgumentError(
          absl::StrCat(role, " tensor ", t.DescribeForError(),
                       " is not on a CPU device; the gloo communicator moves host memory only"));
    }
    return absl::OkStatus();
  }

  // The rule every communicator shares (core/communicator.h).
  absl::Status CheckReducible(const std::string& what, DType t, ReduceOp op) const {
    return CheckReduction(op, t, absl::StrCat(what, " on ", core_->group.Rank(rank())));
  }

  absl::Status CheckRoot(const std::string& what, int root) const {
    if (root >= 0 && root < size()) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(what, " on ", core_->group.Rank(rank()), " of ",
                                                   core_->group.Describe(), ": root ", root,
                                                   " is out of range"));
  }

  absl::Status Blocks(const std::string& what, int64_t total, const std::vector<int64_t>& counts,
                      std::vector<int64_t>* out) const {
    BRAID_ASSIGN_OR_RETURN(
        *out, BlockCounts(absl::StrCat(what, " on ", core_->group.Rank(rank())), total, size(),
                          counts));
    return absl::OkStatus();
  }

  absl::Status CheckBlock(const std::string& what, const char* role, const Tensor& t, DType dtype,
                          const std::vector<int64_t>& counts) const {
    if (t.numel() != counts[rank()] || t.dtype() != dtype) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, " on ", core_->group.Rank(rank()), ": ", role, " is ", t.DescribeForError(),
          " but must hold this rank's block: ", counts[rank()], " elements of ", DTypeName(dtype)));
    }
    return absl::OkStatus();
  }

  std::shared_ptr<Core> core_;

  absl::Mutex issue_mu_;
  int64_t next_seq_ = 0;          // GUARDED_BY(issue_mu_): collectives issued
  std::map<int, int64_t> sends_;  // GUARDED_BY(issue_mu_): per peer
  std::map<int, int64_t> recvs_;  // GUARDED_BY(issue_mu_)

  // Worker-thread state.
  Collectives collectives_;

  std::unique_ptr<SerialThread> worker_;
  absl::Mutex p2p_mu_;
  // GUARDED_BY(p2p_mu_): the Sends and Recvs posted whose Works may still be alive.
  std::vector<std::weak_ptr<Flight>> p2p_ops_;
  absl::Mutex links_mu_;
  // GUARDED_BY(links_mu_): per peer, its shared-memory link or nullptr (TCP), once decided.
  std::map<int, std::shared_ptr<ShmLink>> links_;

  std::thread heartbeat_;
};

// Gloo writes to its peers' sockets without MSG_NOSIGNAL, so a peer that died would kill this
// rank with SIGPIPE before any error could name the dead rank (the launcher gives workers the
// default disposition). A process that left SIGPIPE at its default gets it ignored: the write
// then fails with EPIPE, which becomes an error naming the collective and the ranks. A process
// that chose a disposition of its own keeps it.
void IgnoreSigpipeIfDefault() {
  struct sigaction old;
  if (::sigaction(SIGPIPE, nullptr, &old) != 0) return;
  if ((old.sa_flags & SA_SIGINFO) == 0 && old.sa_handler == SIG_DFL) ::signal(SIGPIPE, SIG_IGN);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> MakeGlooCommunicator(
    const CommunicatorOptions& options) {
  if (options.store == nullptr) {
    return absl::InvalidArgumentError("gloo communicator: no rendezvous store given");
  }
  if (options.size < 1 || options.rank < 0 || options.rank >= options.size) {
    return absl::InvalidArgumentError(absl::StrCat("gloo communicator: rank ", options.rank,
                                                   " is out of range for world size ",
                                                   options.size));
  }
  if (options.device.type != DeviceType::kCPU) {
    return absl::InvalidArgumentError(
        absl::StrCat("gloo communicator: device ", options.device.ToString(),
                     " is not a CPU device (use the nccl communicator for CUDA)"));
  }
  if (options.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("gloo communicator: the timeout must be positive");
  }
  BRAID_ASSIGN_OR_RETURN(Settings settings, ParseSettings(options.options));
  IgnoreSigpipeIfDefault();
  if (settings.iface.empty()) {
    // Gloo's own lookup misreads getaddrinfo's errors and crashes on a name that does not
    // resolve, so resolve it here first.
    struct addrinfo hints;
    std::memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    struct addrinfo* found = nullptr;
    int rv = ::getaddrinfo(settings.hostname.c_str(), nullptr, &hints, &found);
    if (rv != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "gloo communicator rank ", options.rank, ": cannot use hostname '", settings.hostname,
          "' for the TCP transport: ", ::gai_strerror(rv),
          " (give this host's address as peers reach it in option hostname, or an interface "
          "in option iface)"));
    }
    ::freeaddrinfo(found);
  }
  std::shared_ptr<::gloo::transport::Device> device;
  try {
    ::gloo::transport::tcp::attr attr;
    if (!settings.iface.empty()) {
      attr.iface = settings.iface;
    } else {
      attr.hostname = settings.hostname;
    }
    device = ::gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("gloo communicator rank ", options.rank, ": cannot use ",
                     settings.iface.empty() ? absl::StrCat("hostname '", settings.hostname, "'")
                                            : absl::StrCat("interface '", settings.iface, "'"),
                     " for the TCP transport: ", e.what()));
  }
  GroupInfo g;
  g.name = settings.group_name;
  g.prefix = InstancePrefix(settings.store_prefix);
  g.rank = options.rank;
  g.size = options.size;
  for (int r = 0; r < options.size; ++r) g.world_ranks.push_back(r);
  std::string join_value = absl::StrCat("size=", options.size);
  BRAID_ASSIGN_OR_RETURN(std::unique_ptr<GlooCommunicator> comm,
                         GlooCommunicator::Connect(std::move(g), std::move(settings), options.store,
                                                   std::move(device), options.timeout, join_value));
  return std::unique_ptr<Communicator>(std::move(comm));
}

}  // namespace braid::gloo_backend
