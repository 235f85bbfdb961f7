// The NCCL communicator's lifecycle: the factory (options, the unique id over the store, NCCL's
// initialisation), sub-groups (NewGroup), and destruction. The operations are in collectives.cc
// and launch.cc, Works in work.cc, the shared state in state.cc.
#include "backends/nccl/nccl_communicator.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "backends/nccl/communicator_impl.h"
#include "backends/nccl/errors.h"
#include "backends/nccl/progress.h"
#include "backends/nccl/state.h"
#include "core/check.h"
#include "core/store.h"

namespace braid::nccl {
namespace internal {
namespace {

// ---- Unique id over the store -------------------------------------------------------------------

// Hex, so that the id survives any store, whatever it does with non-text bytes.
std::string ToHex(const ncclUniqueId& id) {
  static const char kDigits[] = "0123456789abcdef";
  std::string s;
  s.reserve(2 * sizeof(id.internal));
  for (char c : id.internal) {
    auto b = static_cast<unsigned char>(c);
    s.push_back(kDigits[b >> 4]);
    s.push_back(kDigits[b & 15]);
  }
  return s;
}

bool FromHex(const std::string& s, ncclUniqueId* id) {
  if (s.size() != 2 * sizeof(id->internal)) return false;
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  for (size_t i = 0; i < sizeof(id->internal); ++i) {
    int hi = nibble(s[2 * i]), lo = nibble(s[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    id->internal[i] = static_cast<char>(hi * 16 + lo);
  }
  return true;
}

// Rank `index` of `list`, or -1.
int IndexOf(const std::vector<int>& list, int r) {
  auto it = std::find(list.begin(), list.end(), r);
  return it == list.end() ? -1 : int(it - list.begin());
}

// Creates the CUDA resources of a communicator whose NCCL handle is `comm` (or, when `comm` is
// null, initialises one from `id`), and the communicator object.
absl::StatusOr<std::unique_ptr<Communicator>> Create(std::shared_ptr<State> s, ncclConfig_t config,
                                                     absl::Duration timeout, ncclUniqueId* id,
                                                     ncclComm_t comm);

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> NcclCommunicatorImpl::NewGroup(
    const std::vector<int>& ranks) {
  State& s = *state_;
  std::string what = absl::StrCat("NewGroup(ranks ", absl::StrJoin(ranks, ","), ")");
  std::set<int> seen;
  absl::Status st;
  for (int r : ranks) {
    if (r < 0 || r >= size() || !seen.insert(r).second) {
      st = absl::InvalidArgumentError(absl::StrCat("NCCL ", what, " on ", s.Where(), ": rank ", r,
                                                   " is out of range or listed twice"));
      break;
    }
  }
  if (st.ok() && ranks.empty()) {
    st = absl::InvalidArgumentError(
        absl::StrCat("NCCL NewGroup on ", s.Where(), ": no ranks given"));
  }
  if (!st.ok()) {
    Reject(what, st);
    return st;
  }

  auto child = std::make_shared<State>();
  ncclComm_t newcomm = nullptr;
  {
    absl::MutexLock lock(&s.mu);
    const int64_t seq = s.next_seq++;
    s.Log(absl::StrCat("#", seq, " ", what));
    if (s.aborted) return s.AbortedError(what);
    if (s.group_depth > 0) {
      return absl::FailedPreconditionError(absl::StrCat("NCCL ", what, " on ", s.Where(),
                                                        " inside an open GroupGuard: make "
                                                        "groups outside of grouped calls"));
    }
    if (s.publisher != nullptr) s.publisher->Publish(absl::StrCat(seq, " ", what));
    const int index = IndexOf(ranks, s.rank);
    const int child_id = s.num_children++;
    child->group_name =
        absl::StrCat(s.group_name, "/sub", child_id, "[", absl::StrJoin(ranks, ","), "]");
    child->rank = index;
    child->size = int(ranks.size());
    child->device_index = s.device_index;
    child->blocking = s.blocking;
    child->grouped_blocks = s.grouped_blocks;
    child->store = s.store;
    child->prefix = absl::StrCat(s.prefix, "sub", child_id, "/");

    ScopedDevice device;
    BRAID_RETURN_IF_ERROR(device.Enter(s.device_index));
    ncclConfig_t child_config = config_;
    child_config.commName = child->group_name.c_str();
    const absl::Time deadline = absl::Now() + timeout();
    ncclResult_t r = ncclCommSplit(s.comm, index >= 0 ? 0 : NCCL_SPLIT_NOCOLOR, std::max(index, 0),
                                   &newcomm, &child_config);
    // The split is a collective of the parent: it settles on the parent, then the child
    // finishes its own initialisation.
    r = s.SettleLocked(r, s.comm, deadline);
    if (r == ncclSuccess && newcomm != nullptr)
      r = s.SettleLocked(ncclInProgress, newcomm, deadline);
    if (r != ncclSuccess) {
      if (newcomm != nullptr) ncclCommAbort(newcomm);
      std::string msg = r == ncclInProgress
                            ? absl::StrCat("NCCL ", what, " #", seq, " on ", s.Where(),
                                           " timed out after ", absl::FormatDuration(timeout()),
                                           ": not every rank of the group called it")
                            : absl::StrCat("NCCL ", what, " #", seq, " on ", s.Where(), ": ",
                                           NcclMessage(r, s.comm));
      s.AbortLocked(absl::StrCat("failed ", what, " #", seq));
      return r == ncclInProgress ? absl::DeadlineExceededError(absl::StrCat(
                                       msg, "; the communicator has been aborted. ", s.RecentOps()))
                                 : absl::UnavailableError(msg);
    }
  }
  if (newcomm == nullptr) {
    if (IndexOf(ranks, s.rank) >= 0) {
      return absl::InternalError(absl::StrCat("NCCL ", what, " on ", s.Where(),
                                              ": ncclCommSplit returned no communicator for a "
                                              "member rank"));
    }
    return std::unique_ptr<Communicator>();
  }
  return Create(std::move(child), config_, timeout(), nullptr, newcomm);
}

NcclCommunicatorImpl::~NcclCommunicatorImpl() {
  State& s = *state_;
  // First the watchdog: its timeouts read the store. The wait below bounds what it watched.
  s.StopWatchdog();
  // Stop publishing first: the store may go away right after the communicator.
  std::unique_ptr<ProgressPublisher> publisher;
  {
    absl::MutexLock lock(&s.mu);
    publisher = std::move(s.publisher);
  }
  publisher.reset();

  absl::MutexLock lock(&s.mu);
  s.store = nullptr;
  ScopedDevice device;
  device.Enter(s.device_index).IgnoreError();
  // A group left open (GroupStart without GroupEnd) is closed, which launches its calls: they
  // must settle before any other NCCL call.
  while (s.group_depth > 0) {
    ncclResult_t r = ncclGroupEnd();
    if (--s.group_depth == 0 && s.comm != nullptr) {
      r = s.SettleLocked(r, s.comm, absl::Now() + timeout());
      if (r != ncclSuccess) s.AbortLocked("a group left open at destruction failed to launch");
    }
  }
  if (s.aborted) s.AbortCommLocked();
  for (auto& op : s.unlaunched) {
    s.FailLocked(*op,
                 absl::CancelledError(absl::StrCat(
                     "NCCL ", op->what, ": the communicator was destroyed inside an open group")));
  }
  s.unlaunched.clear();

  bool idle = false;
  if (!s.aborted && s.comm != nullptr) {
    // Let issued operations finish (bounded by the timeout), then release NCCL's resources.
    const absl::Time deadline = absl::Now() + timeout();
    while (true) {
      cudaError_t q = cudaStreamQuery(s.stream);
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(s.comm, &async);
      if (q == cudaSuccess) {
        idle = true;
        break;
      }
      if (q != cudaErrorNotReady || IsFatal(async) || absl::Now() >= deadline) break;
      absl::SleepFor(absl::Microseconds(200));
    }
    ncclResult_t r = ncclInternalError;
    if (idle) r = s.SettleLocked(ncclCommFinalize(s.comm), s.comm, absl::Now() + timeout());
    if (r == ncclSuccess) {
      ncclCommDestroy(s.comm);
      s.comm = nullptr;
    } else {
      s.AbortLocked(idle ? "finalize failed at destruction"
                         : "operations still running at destruction");
    }
  }
  // After an abort, NCCL's kernels exit once they see it; give them a little while.
  s.JoinAborter();
  if (!idle) idle = s.StreamIdleLocked(absl::Seconds(10));
  s.ReapLocked();
  if (idle) {
    s.zombies.clear();
    if (barrier_buffer_ != nullptr) cudaFree(barrier_buffer_);
  } else {
    // A kernel may still use these buffers: leaking them is safer than freeing them under it.
    std::fprintf(stderr,
                 "braid nccl: %s destroyed with operations that did not stop; leaking "
                 "their buffers\n",
                 s.Where().c_str());
    auto* leaked = new std::vector<Tensor>(std::move(s.zombies));
    for (auto& op : s.in_flight) {
      for (Tensor& t : op->keep_alive) leaked->push_back(std::move(t));
      op->keep_alive.clear();
      if (!op->completed) {
        op->completed = true;
        op->status = absl::CancelledError(absl::StrCat("NCCL ", op->what, " on ", s.Where(),
                                                       ": the communicator was destroyed before it "
                                                       "ended"));
      }
    }
    s.in_flight.clear();
  }
}

namespace {

absl::StatusOr<std::unique_ptr<Communicator>> Create(std::shared_ptr<State> s, ncclConfig_t config,
                                                     absl::Duration timeout, ncclUniqueId* id,
                                                     ncclComm_t comm) {
  ScopedDevice device;
  BRAID_RETURN_IF_ERROR(device.Enter(s->device_index));
  void* barrier = nullptr;
  auto cleanup = [&](absl::Status st) {
    if (comm != nullptr) ncclCommAbort(comm);
    if (barrier != nullptr) cudaFree(barrier);
    return st;
  };
  absl::Status st = CudaStatus(cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking),
                               "cudaStreamCreateWithFlags");
  if (st.ok())
    st = CudaStatus(cudaEventCreateWithFlags(&s->ready, cudaEventDisableTiming),
                    "cudaEventCreateWithFlags");
  if (st.ok()) st = CudaStatus(cudaMalloc(&barrier, sizeof(float)), "cudaMalloc (barrier)");
  if (st.ok()) st = CudaStatus(cudaMemset(barrier, 0, sizeof(float)), "cudaMemset (barrier)");
  if (!st.ok()) return cleanup(st);

  if (s->store != nullptr) {
    // Present before anything can time out, so that a missing key means "never got here".
    st = s->store->Set(ProgressKey(s->prefix, s->rank), "-1 (joined, no collective yet)");
    if (!st.ok()) {
      return cleanup(absl::UnavailableError(
          absl::StrCat("NCCL communicator for ", s->Where(),
                       ": cannot write its progress key to the store: ", st.message())));
    }
  }

  if (comm == nullptr) {
    config.commName = s->group_name.c_str();
    const absl::Time deadline = absl::Now() + timeout;
    ncclResult_t r = ncclCommInitRankConfig(&comm, s->size, *id, s->rank, &config);
    if (comm != nullptr) r = s->SettleLocked(r, comm, deadline);
    if (r == ncclInProgress) {
      std::string who = "NCCL cannot tell which ranks are missing";
      if (s->store != nullptr) {
        std::vector<int> absent;
        std::vector<PeerProgress> progress = ReadProgress(s->store, s->prefix, s->size, s->rank);
        for (int r2 = 0; r2 < s->size; ++r2) {
          if (r2 != s->rank && !progress[r2].known) absent.push_back(r2);
        }
        who = absent.empty()
                  ? "every rank reached ncclCommInitRank (per the store), so NCCL could not "
                    "connect them: check NCCL_SOCKET_IFNAME and the network between ranks"
                  : absl::StrCat("rank(s) ", absl::StrJoin(absent, ","),
                                 " have not joined, per the rendezvous store");
      }
      return cleanup(absl::DeadlineExceededError(
          absl::StrCat("NCCL communicator for ", s->Where(), " was not ready after ",
                       absl::FormatDuration(timeout), ": ", who, ".")));
    }
    if (r != ncclSuccess) {
      return cleanup(absl::UnavailableError(
          absl::StrCat("ncclCommInitRankConfig for ", s->Where(), ": ", NcclMessage(r, comm))));
    }
  }
  s->comm = comm;
  comm = nullptr;  // owned by the state now
  if (s->store != nullptr) {
    s->publisher = std::make_unique<ProgressPublisher>(s->store, ProgressKey(s->prefix, s->rank));
  }
  config.commName = nullptr;  // it pointed into a string the communicator does not own
  auto impl = std::make_unique<NcclCommunicatorImpl>(std::move(s), config, timeout);
  impl->set_barrier_buffer(barrier);
  return std::unique_ptr<Communicator>(std::move(impl));
}

absl::StatusOr<int> DeviceCount() {
  int count = 0;
  BRAID_RETURN_IF_ERROR(CudaStatus(cudaGetDeviceCount(&count), "cudaGetDeviceCount"));
  if (count == 0) return absl::UnavailableError("cudaGetDeviceCount found no CUDA device");
  return count;
}

}  // namespace
}  // namespace internal

using internal::Create;
using internal::DeviceCount;
using internal::FromHex;
using internal::NcclMessage;
using internal::State;
using internal::ToHex;

absl::StatusOr<std::unique_ptr<Communicator>> MakeNcclCommunicator(
    const CommunicatorOptions& options) {
  auto opt = [&](const char* key) {
    auto it = options.options.find(key);
    return it == options.options.end() ? std::string() : it->second;
  };
  auto s = std::make_shared<State>();
  s->rank = options.rank;
  s->size = options.size;
  s->group_name = opt("group_name").empty() ? "world" : opt("group_name");
  s->device_index = options.device.index;
  s->blocking = opt("nccl_blocking") == "1";
  s->grouped_blocks = opt("nccl_grouped_blocks") == "1";
  s->store = options.store;
  const std::string where = absl::StrCat("rank ", options.rank, " of ", s->Describe());

  // Option errors first: they need no GPU.
  static const char* const kKnown[] = {"group_name", "iface", "nccl_blocking",
                                       "nccl_grouped_blocks"};
  for (const auto& [key, value] : options.options) {
    if (std::find_if(std::begin(kKnown), std::end(kKnown),
                     [&](const char* k) { return key == k; }) == std::end(kKnown)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "NCCL communicator for ", where, ": unknown option '", key,
          "' (known: ", absl::StrJoin(kKnown, ", "), ")",
          key == "hostname" ? "; NCCL picks its address by network interface: pass iface" : ""));
    }
  }
  for (const char* flag : {"nccl_blocking", "nccl_grouped_blocks"}) {
    if (!opt(flag).empty() && opt(flag) != "0" && opt(flag) != "1") {
      return absl::InvalidArgumentError(absl::StrCat("NCCL communicator for ", where, ": option ",
                                                     flag, " must be 0 or 1, not '", opt(flag),
                                                     "'"));
    }
  }
  if (!opt("iface").empty()) {
    // NCCL reads its interface from the environment, once per process.
    const char* current = std::getenv("NCCL_SOCKET_IFNAME");
    if (current != nullptr && opt("iface") != current) {
      return absl::InvalidArgumentError(
          absl::StrCat("NCCL communicator for ", where, ": option iface=", opt("iface"),
                       " contradicts NCCL_SOCKET_IFNAME=", current,
                       " in the environment (NCCL takes one interface per process)"));
    }
    setenv("NCCL_SOCKET_IFNAME", opt("iface").c_str(), /*overwrite=*/0);
  }
  if (options.device.type != DeviceType::kCUDA) {
    return absl::InvalidArgumentError(absl::StrCat(
        "NCCL communicator for ", where, ": device ", options.device.ToString(),
        " is not a CUDA device; NCCL needs cuda:N (usually cuda:LOCAL_RANK). Use the gloo "
        "communicator for CPU tensors"));
  }
  if (options.size < 1 || options.rank < 0 || options.rank >= options.size) {
    return absl::InvalidArgumentError(absl::StrCat("NCCL communicator: rank ", options.rank,
                                                   " is out of range for world size ",
                                                   options.size));
  }
  if (options.store == nullptr && options.size > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("NCCL communicator for ", where,
                     ": no rendezvous store; ranks exchange NCCL's unique id through it"));
  }
  if (options.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("NCCL communicator for ", where, ": timeout ",
                                                   absl::FormatDuration(options.timeout),
                                                   " is not positive"));
  }
  BRAID_ASSIGN_OR_RETURN(int count, DeviceCount());
  if (options.device.index < 0 || options.device.index >= count) {
    return absl::InvalidArgumentError(absl::StrCat(
        "NCCL communicator for ", where, ": device ", options.device.ToString(),
        " is out of range: this process sees ", count, " CUDA device(s) (CUDA_VISIBLE_DEVICES?)"));
  }

  // The k-th NCCL communicator a rank makes on this store is the k-th of every other rank:
  // numbering them keeps the keys of successive communicators apart.
  ncclUniqueId id;
  if (options.store != nullptr) {
    absl::StatusOr<int64_t> generation =
        options.store->Add(absl::StrCat("nccl/instances/rank", options.rank), 1);
    if (!generation.ok()) {
      return absl::UnavailableError(
          absl::StrCat("NCCL communicator for ", where,
                       ": the rendezvous store failed: ", generation.status().message()));
    }
    s->prefix = absl::StrCat("nccl/", *generation, "/");
  }
  const std::string id_key = s->prefix + "unique_id";
  if (options.rank == 0) {
    ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) {
      return absl::UnavailableError(absl::StrCat("ncclGetUniqueId on ", where, ": ",
                                                 NcclMessage(r, nullptr),
                                                 " (NCCL_SOCKET_IFNAME picks its interface)"));
    }
    if (options.store != nullptr && options.size > 1) {
      absl::Status st = options.store->Set(id_key, ToHex(id));
      if (!st.ok()) {
        return absl::UnavailableError(absl::StrCat(
            "NCCL communicator for ", where, ": cannot publish the unique id: ", st.message()));
      }
    }
  } else {
    absl::StatusOr<std::string> hex = options.store->Get(id_key, options.timeout);
    if (!hex.ok()) {
      return absl::Status(
          hex.status().code(),
          absl::StrCat("NCCL communicator for ", where,
                       ": no unique id from rank 0 under store "
                       "key '",
                       id_key, "' within ", absl::FormatDuration(options.timeout),
                       " (is rank 0 running, on the same store?): ", hex.status().message()));
    }
    if (!FromHex(*hex, &id)) {
      return absl::InvalidArgumentError(absl::StrCat("NCCL communicator for ", where,
                                                     ": store key '", id_key,
                                                     "' does not hold an NCCL unique id"));
    }
  }

  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  // Non-blocking: creation and every call return at once, so that a rank that never comes is a
  // timeout instead of a hang.
  config.blocking = s->blocking ? 1 : 0;
  return Create(std::move(s), config, options.timeout, &id, nullptr);
}

}  // namespace braid::nccl
