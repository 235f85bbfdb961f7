#include "backends/nccl/nccl_communicator.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "core/check.h"
#include "core/store.h"

namespace braid::nccl {
namespace {

// Recent operations kept per communicator for timeout errors.
constexpr size_t kLogLength = 16;
// How long a timed-out rank spends reading the other ranks' progress keys, in all.
constexpr absl::Duration kProgressReadBudget = absl::Seconds(5);

// ---- Errors -----------------------------------------------------------------------------------

absl::Status CudaStatus(cudaError_t err, const std::string& what) {
  if (err == cudaSuccess) return absl::OkStatus();
  std::string msg =
      absl::StrCat(what, " failed: ", cudaGetErrorString(err), " (", cudaGetErrorName(err), ")");
  switch (err) {
    // Nothing Braid can fix: no GPU, no driver, or a driver older than this runtime.
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInitializationError:
    case cudaErrorDevicesUnavailable:
    case cudaErrorStubLibrary:
      return absl::UnavailableError(absl::StrCat(
          msg, ". The NCCL communicator needs an NVIDIA GPU with a driver for CUDA 13."));
    default:
      return absl::InternalError(msg);
  }
}

// NCCL's own words: the result's name, and the last error message NCCL logged for `comm`.
std::string NcclMessage(ncclResult_t r, ncclComm_t comm) {
  const char* last = ncclGetLastError(comm);
  std::string detail = last != nullptr && last[0] != '\0' ? absl::StrCat(" (", last, ")") : "";
  return absl::StrCat(ncclGetErrorString(r), detail);
}

// Errors after which the communicator cannot be trusted: a peer or the network failed, or
// device state is gone. Argument and usage errors are caught before anything is enqueued.
bool IsFatal(ncclResult_t r) {
  return r != ncclSuccess && r != ncclInProgress && r != ncclInvalidArgument &&
         r != ncclInvalidUsage;
}

// Makes `index` the thread's current device and restores the previous one, so that the
// communicator never changes what the caller's later CUDA calls run on.
class ScopedDevice {
 public:
  absl::Status Enter(int index) {
    BRAID_RETURN_IF_ERROR(CudaStatus(cudaGetDevice(&previous_), "cudaGetDevice"));
    entered_ = true;
    if (previous_ == index) return absl::OkStatus();
    return CudaStatus(cudaSetDevice(index), absl::StrCat("cudaSetDevice(", index, ")"));
  }
  ~ScopedDevice() {
    if (entered_) cudaSetDevice(previous_);
  }

 private:
  int previous_ = 0;
  bool entered_ = false;
};

// ---- Types ------------------------------------------------------------------------------------

bool ToNcclType(DType t, ncclDataType_t* out) {
  switch (t) {
    case DType::kF32:
      *out = ncclFloat32;
      return true;
    case DType::kBF16:
      *out = ncclBfloat16;
      return true;
    case DType::kF16:
      *out = ncclFloat16;
      return true;
    case DType::kI32:
      *out = ncclInt32;
      return true;
    case DType::kI64:
      *out = ncclInt64;
      return true;
    case DType::kU8:
      *out = ncclUint8;
      return true;
    case DType::kI8:
      *out = ncclInt8;
      return true;
  }
  return false;
}

ncclRedOp_t ToNcclOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kAvg:
      return ncclAvg;
    case ReduceOp::kMax:
      return ncclMax;
    case ReduceOp::kMin:
      return ncclMin;
  }
  return ncclSum;
}

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

// ---- Progress keys ------------------------------------------------------------------------------

// Key `prefix + "progress/" + rank` holds "<seq> <description>": the last collective this rank
// started (-1 before the first). Written by a background thread, latest value wins, so that a
// collective never waits for a store round trip.
class ProgressPublisher {
 public:
  ProgressPublisher(Store* store, std::string key) : store_(store), key_(std::move(key)) {
    thread_ = std::thread([this] { Run(); });
  }
  ~ProgressPublisher() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_one();
    thread_.join();
  }
  void Publish(std::string value) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      pending_ = std::move(value);
    }
    cv_.notify_one();
  }

 private:
  void Run() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      cv_.wait(lock, [this] { return stop_ || pending_.has_value(); });
      if (!pending_.has_value()) return;  // stopping, nothing left to write
      std::string value = std::move(*pending_);
      pending_.reset();
      lock.unlock();
      // A failed write only makes a later timeout message less precise.
      store_->Set(key_, value).IgnoreError();
      lock.lock();
    }
  }

  Store* store_;
  std::string key_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::optional<std::string> pending_;
  bool stop_ = false;
  std::thread thread_;
};

std::string ProgressKey(const std::string& prefix, int rank) {
  return absl::StrCat(prefix, "progress/", rank);
}

struct PeerProgress {
  bool known = false;
  int64_t seq = -1;
  std::string what;   // the collective it last started
  std::string error;  // why it is unknown
};

// Reads every other rank's progress key, within kProgressReadBudget in all.
std::vector<PeerProgress> ReadProgress(Store* store, const std::string& prefix, int size,
                                       int self) {
  std::vector<PeerProgress> out(size);
  const absl::Time deadline = absl::Now() + kProgressReadBudget;
  for (int r = 0; r < size; ++r) {
    if (r == self) continue;
    absl::Duration left = std::max(deadline - absl::Now(), absl::Milliseconds(10));
    absl::StatusOr<std::string> v =
        store->Get(ProgressKey(prefix, r), std::min(left, absl::Seconds(1)));
    if (!v.ok()) {
      out[r].error = std::string(v.status().message());
      continue;
    }
    std::string value = *v;
    size_t space = value.find(' ');
    std::string num = value.substr(0, space);
    if (!absl::SimpleAtoi(num, &out[r].seq)) {
      out[r].error = absl::StrCat("unreadable value '", value, "'");
      continue;
    }
    out[r].known = true;
    out[r].what = space == std::string::npos ? "" : value.substr(space + 1);
  }
  return out;
}

// ---- Shared state -------------------------------------------------------------------------------

// A CUDA event, shared by the operations of one group launch.
struct Event {
  cudaEvent_t event = nullptr;
  int device = 0;
  ~Event() {
    if (event == nullptr) return;
    ScopedDevice d;
    d.Enter(device).IgnoreError();
    cudaEventDestroy(event);
  }
};

// One operation as its Work and the communicator see it.
struct Op {
  int64_t seq = -1;             // collectives only
  std::string what;             // "AllReduce(sum, f32, 1024 elements)"
  int peer = -1;                // point-to-point only
  std::shared_ptr<Event> done;  // recorded on the communicator's stream at launch
  bool launched = false;        // false while its group is still open
  bool completed = false;
  absl::Status status;             // of a completed operation
  std::vector<Tensor> keep_alive;  // the operation's tensors, until it completes
};

// What a communicator and its Works share. Works hold it, so a Work may outlive its
// communicator (it then reports what happened before the communicator went away).
struct State {
  absl::Mutex mu;
  ncclComm_t comm = nullptr;  // null once aborted or destroyed
  int device_index = 0;
  int rank = 0;
  int size = 1;
  std::string group_name;
  bool blocking = false;
  bool grouped_blocks = false;  // always take the uneven-block path (tests)
  cudaStream_t stream = nullptr;
  cudaEvent_t ready = nullptr;  // recorded on the caller's stream before each operation
  Store* store = nullptr;       // null for a store-less world of one, or once destroyed
  std::string prefix;           // of this group's store keys
  std::unique_ptr<ProgressPublisher> publisher;

  int64_t next_seq = 0;
  int num_children = 0;
  int group_depth = 0;
  bool aborted = false;
  std::string abort_reason;
  std::deque<std::string> log;
  std::deque<std::shared_ptr<Op>> in_flight;    // launched, in stream order
  std::vector<std::shared_ptr<Op>> unlaunched;  // issued inside the open group
  // Tensors of operations that failed after NCCL may have queued work on the stream: held
  // until the communicator is destroyed with an idle stream.
  std::vector<Tensor> zombies;
  std::thread aborter;  // runs ncclCommAbort

  ~State() {
    JoinAborter();
    ScopedDevice d;
    d.Enter(device_index).IgnoreError();
    if (ready != nullptr) cudaEventDestroy(ready);
    if (stream != nullptr) cudaStreamDestroy(stream);
  }

  void JoinAborter() {
    if (aborter.joinable()) aborter.join();
  }

  std::string Describe() const {
    return absl::StrCat("group '", group_name, "' (", size, size == 1 ? " rank" : " ranks", ")");
  }

  std::string Where() const {
    return absl::StrCat("rank ", rank, " of ", Describe(), " on cuda:", device_index);
  }

  void Log(std::string entry) {
    log.push_back(std::move(entry));
    if (log.size() > kLogLength) log.pop_front();
  }

  std::string RecentOps() const {
    return absl::StrCat("recent operations on rank ", rank,
                        ", newest last: ", log.empty() ? "(none)" : absl::StrJoin(log, ", "));
  }

  absl::Status AbortedError(const std::string& what) const {
    return absl::FailedPreconditionError(
        absl::StrCat("NCCL ", what, " on ", Where(), ": the communicator was aborted (",
                     abort_reason, "); create a new communicator"));
  }

  // Fails `op` with `status`. Its tensors stay alive until the stream is known to be idle,
  // because NCCL may have queued work on them before the failure.
  void FailLocked(Op& op, const absl::Status& status) {
    op.completed = true;
    op.status = status;
    for (Tensor& t : op.keep_alive) zombies.push_back(std::move(t));
    op.keep_alive.clear();
  }

  // Releases the tensors of the operations at the front of the stream's queue that the stream
  // has passed (they complete in stream order). Only the stream's progress frees tensors: an
  // aborted operation's kernel may still run until it sees the abort.
  void ReapLocked() {
    while (!in_flight.empty()) {
      Op& op = *in_flight.front();
      if (cudaEventQuery(op.done->event) != cudaSuccess) break;
      op.completed = true;  // keeps an abort error set earlier
      op.keep_alive.clear();
      in_flight.pop_front();
    }
  }

  // Aborts the NCCL communicator (after a timeout or an NCCL/CUDA error). Operations that had
  // already finished keep their result; every other one fails saying why.
  void AbortLocked(const std::string& reason) {
    if (aborted) return;
    aborted = true;
    abort_reason = reason;
    ScopedDevice device;
    device.Enter(device_index).IgnoreError();
    ReapLocked();
    for (auto& op : in_flight) {
      op->completed = true;
      op->status = AbortedError(op->what);
    }
    // Calls recorded in an open NCCL group still refer to the communicator: GroupEnd launches
    // them and then aborts it.
    if (group_depth == 0) AbortCommLocked();
  }

  // On its own thread: ncclCommAbort may wait for kernels queued behind the caller's work,
  // and a timeout must return when it expires, not when the GPU gets there.
  void AbortCommLocked() {
    if (comm == nullptr) return;
    ncclComm_t c = comm;
    comm = nullptr;
    const int device = device_index;
    aborter = std::thread([c, device] {
      cudaSetDevice(device);
      ncclCommAbort(c);
    });
  }

  // Waits up to `limit` for the stream to run dry.
  bool StreamIdleLocked(absl::Duration limit) {
    const absl::Time deadline = absl::Now() + limit;
    while (true) {
      cudaError_t q = cudaStreamQuery(stream);
      if (q == cudaSuccess) return true;
      if (q != cudaErrorNotReady || absl::Now() >= deadline) return false;
      absl::SleepFor(absl::Microseconds(200));
    }
  }

  // With a non-blocking communicator, a call may return ncclInProgress: NCCL is still working
  // on it in the background and no other call may be made until it settles. Polls until it
  // does, or until `deadline` (then returns ncclInProgress).
  ncclResult_t SettleLocked(ncclResult_t r, ncclComm_t c, absl::Time deadline) {
    absl::Duration nap = absl::Microseconds(1);
    while (r == ncclInProgress) {
      ncclResult_t state = ncclSuccess;
      ncclResult_t q = ncclCommGetAsyncError(c, &state);
      if (q != ncclSuccess) return q;
      if (state != ncclInProgress) return state;
      if (absl::Now() >= deadline) return ncclInProgress;
      absl::SleepFor(nap);
      nap = std::min(nap * 2, absl::Milliseconds(1));
    }
    return r;
  }
};

// ---- Work ---------------------------------------------------------------------------------------

class NcclWork final : public Work {
 public:
  NcclWork(std::shared_ptr<State> state, std::shared_ptr<Op> op, absl::Duration timeout)
      : state_(std::move(state)), op_(std::move(op)), timeout_(timeout) {}

  absl::Status Wait() override {
    const absl::Time start = absl::Now();
    absl::Duration nap = absl::ZeroDuration();
    while (true) {
      {
        absl::MutexLock lock(&state_->mu);
        std::optional<absl::Status> done = PollLocked();
        if (done.has_value()) return *done;
      }
      if (absl::Now() - start >= timeout_) break;
      // Short waits first: most collectives finish in microseconds to milliseconds.
      if (nap == absl::ZeroDuration()) {
        std::this_thread::yield();
        nap = absl::Microseconds(5);
      } else {
        absl::SleepFor(nap);
        nap = std::min(nap * 2, absl::Milliseconds(2));
      }
    }
    return TimedOut();
  }

  bool IsCompleted() override {
    absl::MutexLock lock(&state_->mu);
    if (!op_->launched && !op_->completed) return false;  // its group is still open
    return PollLocked().has_value();
  }

 private:
  // The operation's final status, or nothing while it runs.
  std::optional<absl::Status> PollLocked() {
    State& s = *state_;
    Op& op = *op_;
    if (op.completed) return op.status;
    if (!op.launched) {
      return absl::FailedPreconditionError(absl::StrCat(
          "NCCL ", op.what, " on ", s.Where(),
          " was issued inside an open GroupGuard and is launched when the group ends: End() the "
          "group before waiting for its operations"));
    }
    if (s.aborted) {
      // AbortLocked completes every launched operation; this is only a safety net.
      op.completed = true;
      op.status = s.AbortedError(op.what);
      return op.status;
    }
    cudaError_t q = cudaEventQuery(op.done->event);
    if (q == cudaErrorNotReady && s.comm == nullptr) {
      // Destroyed while this was running: the destructor waited, and gave up.
      op.completed = true;
      op.status = absl::CancelledError(absl::StrCat(
          "NCCL ", Label(), " on ", s.Where(), ": the communicator was destroyed before it ended"));
      return op.status;
    }
    if (q == cudaSuccess) {
      s.ReapLocked();
      op.completed = true;
      return op.status;
    }
    if (q != cudaErrorNotReady) {
      absl::Status st =
          CudaStatus(q, absl::StrCat("waiting for NCCL ", op.what, " on ", s.Where()));
      s.AbortLocked(std::string(st.message()));
      op.completed = true;
      op.status = st;
      return st;
    }
    ncclResult_t async = ncclSuccess;
    ncclResult_t r = ncclCommGetAsyncError(s.comm, &async);
    if (r == ncclSuccess && async != ncclSuccess && async != ncclInProgress) r = async;
    if (r != ncclSuccess) {
      absl::Status st = absl::UnavailableError(absl::StrCat(
          "NCCL ", Label(), " in ", s.Describe(), " failed on rank ", s.rank, ": ",
          NcclMessage(r, s.comm),
          ". NCCL reports an asynchronous error (a peer exited, or the network or a GPU failed); "
          "the communicator has been aborted. ",
          s.RecentOps()));
      s.AbortLocked(std::string(st.message()));
      op.completed = true;
      op.status = st;
      return st;
    }
    return std::nullopt;
  }

  std::string Label() const {
    return op_->seq >= 0 ? absl::StrCat(op_->what, " #", op_->seq) : op_->what;
  }

  absl::Status TimedOut() {
    Store* store;
    std::string prefix;
    int size, rank;
    {
      absl::MutexLock lock(&state_->mu);
      // It may have finished while we slept.
      std::optional<absl::Status> done = PollLocked();
      if (done.has_value()) return *done;
      store = state_->store;
      prefix = state_->prefix;
      size = state_->size;
      rank = state_->rank;
    }
    // Outside the lock: the store may be slow, and the communicator's thread may go on.
    std::string who;
    if (size == 1) {
      who =
          "this is a group of one rank, so the hang is on this GPU (work queued before it on "
          "the caller's stream that does not finish?).";
    } else if (store == nullptr) {
      who = "no store to ask which ranks have started it; NCCL cannot tell which is missing.";
    } else {
      std::vector<PeerProgress> progress = ReadProgress(store, prefix, size, rank);
      std::vector<std::string> unknown, states;
      std::vector<int> behind_ranks;
      for (int r = 0; r < size; ++r) {
        if (r == rank) continue;
        const PeerProgress& p = progress[r];
        if (!p.known) {
          unknown.push_back(absl::StrCat("rank ", r, " (", p.error, ")"));
          continue;
        }
        std::string last =
            p.seq < 0 ? std::string("nothing yet") : absl::StrCat("#", p.seq, " ", p.what);
        states.push_back(absl::StrCat("rank ", r, ": ", last));
        if (op_->seq >= 0 && p.seq < op_->seq) behind_ranks.push_back(r);
      }
      if (op_->seq < 0) {
        who = absl::StrCat("NCCL cannot tell whether rank ", op_->peer,
                           " posted the matching operation. Last collective each rank started, "
                           "per the store's progress keys: ",
                           states.empty() ? "(none readable)" : absl::StrJoin(states, "; "), ".");
      } else if (!behind_ranks.empty()) {
        who = absl::StrCat("rank(s) ", absl::StrJoin(behind_ranks, ","),
                           " have not started it, per the progress keys in the rendezvous store "
                           "(NCCL itself cannot tell which rank is missing). Last collective "
                           "each rank started: ",
                           absl::StrJoin(states, "; "), ".");
      } else if (unknown.empty()) {
        who = absl::StrCat(
            "every rank has started it, per the progress keys in the rendezvous "
            "store, so the hang is inside NCCL: a peer's GPU, or the network "
            "between ranks; NCCL cannot tell which rank. Last collective each "
            "rank started: ",
            absl::StrJoin(states, "; "), ".");
      } else {
        who = "";
      }
      if (!unknown.empty()) {
        who = absl::StrCat(who, who.empty() ? "" : " ",
                           "NCCL cannot tell which rank is missing, and the progress keys of ",
                           absl::StrJoin(unknown, ", "), " could not be read.");
      }
    }
    absl::MutexLock lock(&state_->mu);
    std::optional<absl::Status> done = PollLocked();
    if (done.has_value()) return *done;
    absl::Status st = absl::DeadlineExceededError(
        absl::StrCat("NCCL ", Label(), " in ", state_->Describe(), " timed out after ",
                     absl::FormatDuration(timeout_), " on rank ", rank,
                     " (cuda:", state_->device_index, "): ", who,
                     " The communicator has been aborted (ncclCommAbort); create a new one to go "
                     "on. ",
                     state_->RecentOps()));
    state_->AbortLocked(absl::StrCat("timeout of ", Label()));
    op_->completed = true;
    op_->status = st;
    return st;
  }

  std::shared_ptr<State> state_;
  std::shared_ptr<Op> op_;
  absl::Duration timeout_;
};

// ---- Communicator -------------------------------------------------------------------------------

using Launch = std::function<ncclResult_t(ncclComm_t comm, cudaStream_t stream)>;

// "f32, 1024 elements", for descriptions (of undefined tensors too: they are refused later).
std::string DataDesc(const Tensor& t) {
  if (!t.defined()) return "undefined tensor";
  int64_t n = t.numel();
  return absl::StrCat(DTypeName(t.dtype()), ", ", n, n == 1 ? " element" : " elements");
}

class NcclCommunicatorImpl final : public NcclCommunicator {
 public:
  NcclCommunicatorImpl(std::shared_ptr<State> state, ncclConfig_t config, absl::Duration timeout)
      : state_(std::move(state)), config_(config) {
    set_timeout(timeout);
  }

  ~NcclCommunicatorImpl() override;

  int rank() const override { return state_->rank; }
  int size() const override { return state_->size; }
  std::string name() const override { return "nccl"; }
  Device device() const override { return Device::CUDA(state_->device_index); }
  int64_t next_sequence_number() const override {
    absl::MutexLock lock(&state_->mu);
    return state_->next_seq;
  }
  bool aborted() const override {
    absl::MutexLock lock(&state_->mu);
    return state_->aborted;
  }

  std::shared_ptr<Work> AllReduce(Tensor& t, ReduceOp op) override {
    ncclDataType_t type;
    absl::Status st = CheckTensor(t, "AllReduce", &type);
    if (st.ok()) st = CheckReducible("AllReduce", t.dtype(), op);
    std::string what = absl::StrCat("AllReduce(", ReduceOpName(op), ", ", DataDesc(t), ")");
    if (!st.ok()) return Reject(what, st);
    void* p = t.raw_data();
    size_t n = size_t(t.numel());
    return Issue(what, t.nbytes(), -1, {t}, [=](ncclComm_t c, cudaStream_t s) {
      return ncclAllReduce(p, p, n, type, ToNcclOp(op), c, s);
    });
  }

  std::shared_ptr<Work> ReduceScatter(const Tensor& input, Tensor& output, ReduceOp op,
                                      const std::vector<int64_t>& counts) override {
    ncclDataType_t type;
    std::vector<int64_t> blocks;
    absl::Status st = CheckTensor(input, "ReduceScatter input", &type);
    if (st.ok()) st = CheckTensor(output, "ReduceScatter output", &type);
    if (st.ok()) st = CheckReducible("ReduceScatter", input.dtype(), op);
    if (st.ok()) st = Blocks("ReduceScatter", input.numel(), counts, &blocks);
    if (st.ok()) st = CheckBlock("ReduceScatter output", output, input.dtype(), blocks);
    std::string what =
        absl::StrCat("ReduceScatter(", ReduceOpName(op), ", ", DataDesc(input),
                     counts.empty() ? "" : " in blocks " + absl::StrJoin(counts, ","), ")");
    if (!st.ok()) return Reject(what, st);
    const char* in = static_cast<const char*>(input.raw_data());
    void* out = output.raw_data();
    const size_t elem = SizeOf(input.dtype());
    const int me = rank();
    const ncclRedOp_t nop = ToNcclOp(op);
    if (EqualBlocks(blocks)) {
      size_t n = size_t(blocks[0]);
      return Issue(what, input.nbytes(), -1, {input, output}, [=](ncclComm_t c, cudaStream_t s) {
        return ncclReduceScatter(in, out, n, type, nop, c, s);
      });
    }
    // One reduce per block, rooted at the block's rank, all launched together.
    return Issue(what, input.nbytes(), -1, {input, output}, [=](ncclComm_t c, cudaStream_t s) {
      ncclResult_t r = ncclGroupStart();
      if (r != ncclSuccess) return r;
      size_t offset = 0;
      for (int root = 0; root < int(blocks.size()) && r == ncclSuccess; ++root) {
        r = ncclReduce(in + offset * elem, root == me ? out : nullptr, size_t(blocks[root]), type,
                       nop, root, c, s);
        offset += size_t(blocks[root]);
      }
      ncclResult_t end = ncclGroupEnd();
      return r != ncclSuccess ? r : end;
    });
  }

  std::shared_ptr<Work> AllGather(const Tensor& input, Tensor& output,
                                  const std::vector<int64_t>& counts) override {
    ncclDataType_t type;
    std::vector<int64_t> blocks;
    absl::Status st = CheckTensor(input, "AllGather input", &type);
    if (st.ok()) st = CheckTensor(output, "AllGather output", &type);
    if (st.ok()) st = Blocks("AllGather", output.numel(), counts, &blocks);
    if (st.ok()) st = CheckBlock("AllGather input", input, output.dtype(), blocks);
    std::string what =
        absl::StrCat("AllGather(", DataDesc(output),
                     counts.empty() ? "" : " in blocks " + absl::StrJoin(counts, ","), ")");
    if (!st.ok()) return Reject(what, st);
    const void* in = input.raw_data();
    char* out = static_cast<char*>(output.raw_data());
    const size_t elem = SizeOf(output.dtype());
    const int me = rank();
    if (EqualBlocks(blocks)) {
      size_t n = size_t(blocks[0]);
      return Issue(what, output.nbytes(), -1, {input, output}, [=](ncclComm_t c, cudaStream_t s) {
        return ncclAllGather(in, out, n, type, c, s);
      });
    }
    // One broadcast per block from the block's rank into its place in every output.
    return Issue(what, output.nbytes(), -1, {input, output}, [=](ncclComm_t c, cudaStream_t s) {
      ncclResult_t r = ncclGroupStart();
      if (r != ncclSuccess) return r;
      size_t offset = 0;
      for (int root = 0; root < int(blocks.size()) && r == ncclSuccess; ++root) {
        char* dst = out + offset * elem;
        r = ncclBroadcast(root == me ? in : dst, dst, size_t(blocks[root]), type, root, c, s);
        offset += size_t(blocks[root]);
      }
      ncclResult_t end = ncclGroupEnd();
      return r != ncclSuccess ? r : end;
    });
  }

  std::shared_ptr<Work> Broadcast(Tensor& t, int root) override {
    ncclDataType_t type;
    absl::Status st = CheckTensor(t, "Broadcast", &type);
    if (st.ok()) st = CheckRoot("Broadcast", root);
    std::string what = absl::StrCat("Broadcast(root ", root, ", ", DataDesc(t), ")");
    if (!st.ok()) return Reject(what, st);
    void* p = t.raw_data();
    size_t n = size_t(t.numel());
    return Issue(what, t.nbytes(), -1, {t}, [=](ncclComm_t c, cudaStream_t s) {
      return ncclBroadcast(p, p, n, type, root, c, s);
    });
  }

  std::shared_ptr<Work> Reduce(Tensor& t, int root, ReduceOp op) override {
    ncclDataType_t type;
    absl::Status st = CheckTensor(t, "Reduce", &type);
    if (st.ok()) st = CheckReducible("Reduce", t.dtype(), op);
    if (st.ok()) st = CheckRoot("Reduce", root);
    std::string what =
        absl::StrCat("Reduce(root ", root, ", ", ReduceOpName(op), ", ", DataDesc(t), ")");
    if (!st.ok()) return Reject(what, st);
    void* p = t.raw_data();
    size_t n = size_t(t.numel());
    return Issue(what, t.nbytes(), -1, {t}, [=](ncclComm_t c, cudaStream_t s) {
      return ncclReduce(p, p, n, type, ToNcclOp(op), root, c, s);
    });
  }

  std::shared_ptr<Work> Send(const Tensor& t, int dst, int tag) override {
    return PointToPoint(/*send=*/true, t, dst, tag);
  }
  std::shared_ptr<Work> Recv(Tensor& t, int src, int tag) override {
    return PointToPoint(/*send=*/false, t, src, tag);
  }

  std::shared_ptr<Work> Barrier() override {
    void* p = barrier_buffer_;
    return Issue("Barrier()", 0, -1, {}, [=](ncclComm_t c, cudaStream_t s) {
      return ncclAllReduce(p, p, 1, ncclFloat32, ncclSum, c, s);
    });
  }

  absl::StatusOr<std::unique_ptr<Communicator>> NewGroup(const std::vector<int>& ranks) override;

  absl::Status GroupStart() override {
    absl::MutexLock lock(&state_->mu);
    if (state_->aborted) return state_->AbortedError("GroupStart");
    ncclResult_t r = ncclGroupStart();
    if (r != ncclSuccess) {
      return absl::InternalError(
          absl::StrCat("ncclGroupStart on ", state_->Where(), ": ", NcclMessage(r, state_->comm)));
    }
    ++state_->group_depth;
    return absl::OkStatus();
  }

  absl::Status GroupEnd() override;

  void set_barrier_buffer(void* p) { barrier_buffer_ = p; }

 private:
  // Whether `blocks` can take NCCL's equal-block collectives (the nccl_grouped_blocks option
  // sends every call down the per-block path instead, so that one GPU can test it).
  bool EqualBlocks(const std::vector<int64_t>& blocks) const {
    if (state_->grouped_blocks) return false;
    return std::all_of(blocks.begin(), blocks.end(), [&](int64_t c) { return c == blocks[0]; });
  }

  absl::Status CheckTensor(const Tensor& t, const char* role, ncclDataType_t* type) const {
    if (!t.defined()) {
      return absl::InvalidArgumentError(
          absl::StrCat("NCCL ", role, " on ", state_->Where(), ": the tensor is undefined"));
    }
    if (t.device().type != DeviceType::kCUDA) {
      return absl::InvalidArgumentError(absl::StrCat(
          "NCCL ", role, " on ", state_->Where(), ": tensor ", t.DescribeForError(),
          " is not on a CUDA device; the NCCL communicator moves CUDA device memory only (use "
          "the gloo communicator for CPU tensors, or move the tensor to cuda:",
          state_->device_index, ")"));
    }
    if (t.device().index != state_->device_index) {
      return absl::InvalidArgumentError(
          absl::StrCat("NCCL ", role, " on ", state_->Where(), ": tensor ", t.DescribeForError(),
                       " is on another GPU than the communicator's cuda:", state_->device_index,
                       "; every tensor of a rank must be on that rank's device"));
    }
    if (!ToNcclType(t.dtype(), type)) {
      return absl::InvalidArgumentError(absl::StrCat("NCCL ", role, " on ", state_->Where(),
                                                     ": no NCCL type for ", DTypeName(t.dtype())));
    }
    return absl::OkStatus();
  }

  // The rule every communicator shares (core/communicator.h).
  absl::Status CheckReducible(const char* op_name, DType t, ReduceOp op) const {
    return CheckReduction(op, t, absl::StrCat("NCCL ", op_name, " on ", state_->Where()));
  }

  absl::Status CheckRoot(const char* op, int root) const {
    if (root >= 0 && root < size()) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat("NCCL ", op, " on ", state_->Where(), ": root ", root, " is out of range"));
  }

  // Normalises `counts` (empty: equal blocks) for a buffer of `total` elements.
  absl::Status Blocks(const char* op, int64_t total, const std::vector<int64_t>& counts,
                      std::vector<int64_t>* out) const {
    BRAID_ASSIGN_OR_RETURN(
        *out, BlockCounts(absl::StrCat("NCCL ", op, " on ", state_->Where()), total, size(), counts));
    return absl::OkStatus();
  }

  absl::Status CheckBlock(const char* role, const Tensor& t, DType dtype,
                          const std::vector<int64_t>& counts) const {
    if (t.numel() == counts[rank()] && t.dtype() == dtype) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(
        "NCCL ", role, " on ", state_->Where(), " is ", t.DescribeForError(),
        " but must hold this rank's block: ", counts[rank()], " elements of ", DTypeName(dtype)));
  }

  // A collective refused before reaching NCCL: it still takes its sequence number, so that a
  // rank that refuses one stays numbered like the ranks that ran it.
  std::shared_ptr<Work> Reject(const std::string& what, const absl::Status& st) {
    absl::MutexLock lock(&state_->mu);
    int64_t seq = state_->next_seq++;
    state_->Log(absl::StrCat("#", seq, " ", what, " (refused)"));
    return CompletedWork(st);
  }

  std::shared_ptr<Work> PointToPoint(bool send, const Tensor& t, int peer, int tag) {
    const char* op = send ? "Send" : "Recv";
    ncclDataType_t type;
    absl::Status st = CheckTensor(t, op, &type);
    if (st.ok() && (peer < 0 || peer >= size())) {
      st = absl::InvalidArgumentError(absl::StrCat("NCCL ", op, " on ", state_->Where(),
                                                   ": peer rank ", peer, " is out of range"));
    }
    if (!st.ok()) return CompletedWork(st);
    std::string what = absl::StrCat(op, send ? " to" : " from", " rank ", peer, " (tag ", tag, ", ",
                                    DataDesc(t), ")");
    void* p = t.raw_data();
    size_t n = size_t(t.numel());
    return Issue(what, t.nbytes(), peer, {t}, [=](ncclComm_t c, cudaStream_t s) {
      return send ? ncclSend(p, n, type, peer, c, s) : ncclRecv(p, n, type, peer, c, s);
    });
  }

  // Runs `launch` on the communicator's stream after the caller's stream, and returns a Work
  // that completes with it. `peer` >= 0 marks a point-to-point operation (not numbered).
  std::shared_ptr<Work> Issue(const std::string& what, size_t bytes, int peer,
                              std::vector<Tensor> tensors, const Launch& launch) {
    State& s = *state_;
    absl::MutexLock lock(&s.mu);
    auto op = std::make_shared<Op>();
    op->what = what;
    op->peer = peer;
    if (peer < 0) {
      op->seq = s.next_seq++;
      s.Log(absl::StrCat("#", op->seq, " ", what, " ", bytes, " B"));
    } else {
      s.Log(absl::StrCat(what, " ", bytes, " B"));
    }
    if (s.aborted) return CompletedWork(s.AbortedError(what));
    if (peer < 0 && s.publisher != nullptr) s.publisher->Publish(absl::StrCat(op->seq, " ", what));
    const std::string label = op->seq >= 0 ? absl::StrCat(what, " #", op->seq) : what;

    ScopedDevice device;
    absl::Status st = device.Enter(s.device_index);
    s.ReapLocked();
    // Everything the caller launched before this call (on the legacy default stream, which
    // also waits for every blocking stream) comes first.
    if (st.ok())
      st = CudaStatus(cudaEventRecord(s.ready, cudaStreamLegacy),
                      "cudaEventRecord on the caller's stream");
    if (st.ok())
      st = CudaStatus(cudaStreamWaitEvent(s.stream, s.ready, 0),
                      "cudaStreamWaitEvent on the communicator's stream");
    if (!st.ok()) return CompletedWork(st);

    ncclResult_t r = s.SettleLocked(launch(s.comm, s.stream), s.comm, absl::Now() + timeout());
    if (r == ncclInProgress) {
      std::string msg =
          absl::StrCat("NCCL ", label, " on ", s.Where(), " could not be enqueued within ",
                       absl::FormatDuration(timeout()),
                       " (NCCL was still connecting to its peers); the "
                       "communicator has been aborted. ",
                       s.RecentOps());
      s.AbortLocked(absl::StrCat("enqueue timeout of ", label));
      op->keep_alive = std::move(tensors);
      s.FailLocked(*op, absl::DeadlineExceededError(msg));
      return CompletedWork(op->status);
    }
    if (r != ncclSuccess) {
      absl::Status err = (IsFatal(r) ? absl::UnavailableError : absl::InvalidArgumentError)(
          absl::StrCat("NCCL ", label, " on ", s.Where(), ": ", NcclMessage(r, s.comm),
                       IsFatal(r) ? "; the communicator has been aborted" : ""));
      if (IsFatal(r)) {
        s.AbortLocked(std::string(err.message()));
        op->keep_alive = std::move(tensors);
        s.FailLocked(*op, err);
      }
      return CompletedWork(err);
    }
    op->keep_alive = std::move(tensors);
    if (s.group_depth > 0) {
      s.unlaunched.push_back(op);
    } else {
      st = RecordDoneLocked({op});
      if (!st.ok()) return CompletedWork(st);
    }
    return std::make_shared<NcclWork>(state_, op, timeout());
  }

  // Records one completion event on the stream for `ops`, just launched.
  absl::Status RecordDoneLocked(const std::vector<std::shared_ptr<Op>>& ops) {
    State& s = *state_;
    auto done = std::make_shared<Event>();
    done->device = s.device_index;
    absl::Status st = CudaStatus(cudaEventCreateWithFlags(&done->event, cudaEventDisableTiming),
                                 "cudaEventCreateWithFlags");
    if (st.ok())
      st = CudaStatus(cudaEventRecord(done->event, s.stream),
                      "cudaEventRecord on the communicator's stream");
    if (!st.ok()) {
      // The operations are on the stream but cannot be tracked: treat the device as broken.
      s.AbortLocked(std::string(st.message()));
      for (const auto& op : ops) s.FailLocked(*op, st);
      return st;
    }
    for (const auto& op : ops) {
      op->done = done;
      op->launched = true;
      s.in_flight.push_back(op);
    }
    return absl::OkStatus();
  }

  std::shared_ptr<State> state_;
  ncclConfig_t config_;
  void* barrier_buffer_ = nullptr;  // one f32 on the device, owned
};

absl::Status NcclCommunicatorImpl::GroupEnd() {
  State& s = *state_;
  absl::MutexLock lock(&s.mu);
  if (s.group_depth == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("NCCL GroupEnd on ", s.Where(), " without a matching GroupStart"));
  }
  ScopedDevice device;
  device.Enter(s.device_index).IgnoreError();
  ncclResult_t r = ncclGroupEnd();
  if (--s.group_depth > 0) {
    // An inner group: NCCL launches at the outermost end.
    if (r == ncclSuccess) return absl::OkStatus();
  } else if (!s.aborted) {
    r = s.SettleLocked(r, s.comm, absl::Now() + timeout());
  } else {
    // Aborted while the group was open (AbortLocked deferred it): the group is closed now.
    s.AbortCommLocked();
  }
  std::vector<std::shared_ptr<Op>> ops;
  if (s.group_depth == 0) ops.swap(s.unlaunched);
  std::vector<std::string> names;
  for (const auto& op : ops) {
    names.push_back(op->seq >= 0 ? absl::StrCat(op->what, " #", op->seq) : op->what);
  }
  const std::string group_ops =
      absl::StrCat("group of ", ops.size(), " operation(s) [", absl::StrJoin(names, ", "), "]");
  if (s.aborted) {
    absl::Status err = s.AbortedError(group_ops);
    for (const auto& op : ops) s.FailLocked(*op, err);
    return err;
  }
  if (r != ncclSuccess) {
    absl::Status err;
    if (r == ncclInProgress) {
      err = absl::DeadlineExceededError(absl::StrCat(
          "NCCL ", group_ops, " on ", s.Where(), " could not be launched within ",
          absl::FormatDuration(timeout()), "; the communicator has been aborted. ", s.RecentOps()));
      s.AbortLocked(absl::StrCat("launch timeout of the ", group_ops));
    } else {
      err = (IsFatal(r) ? absl::UnavailableError : absl::InvalidArgumentError)(
          absl::StrCat("NCCL ", group_ops, " on ", s.Where(), ": ", NcclMessage(r, s.comm)));
      if (IsFatal(r)) s.AbortLocked(std::string(err.message()));
    }
    for (const auto& op : ops) s.FailLocked(*op, err);
    return err;
  }
  if (ops.empty()) return absl::OkStatus();
  return RecordDoneLocked(ops);
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
