// The NCCL communicator, loaded as a plugin like the training program loads it.
//
// Without a GPU (the build machine) the option and error-path cases run and every GPU case skips
// with CUDA's reason. With one GPU, world-size-1 communicators run every operation (NCCL allows
// one rank per GPU, so one GPU cannot host more ranks). With two or more GPUs, one thread per
// GPU runs every collective against a serial computation of the expected result.
#include "backends/nccl/nccl_communicator.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "backends/in_process/in_process_communicator.h"
#include "backends/nccl/test_util.h"
#include "core/registry.h"
#include "core/store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace braid::nccl {
namespace {

using testing::DownloadValues;
using testing::FillBytes;
using ::testing::HasSubstr;
using testing::MakeNccl;
using testing::UploadValues;

const DType kAllDtypes[] = {DType::kF32, DType::kBF16, DType::kF16, DType::kI32,
                            DType::kI64, DType::kU8,   DType::kI8};
const ReduceOp kAllOps[] = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin};

std::string Message(const absl::Status& s) { return std::string(s.message()); }

// Small integers (halves too, for floating dtypes): exact in every dtype, and so are the sums
// of a few of them, whatever order NCCL adds them in.
std::vector<double> Values(DType t, int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<double> v(static_cast<size_t>(n));
  for (double& x : v) {
    if (t == DType::kU8) {
      x = double(rng() % 8);
    } else if (IsFloating(t)) {
      x = double(int(rng() % 33) - 16) / 2;
    } else {
      x = double(int(rng() % 17) - 8);
    }
  }
  return v;
}

Tensor DeviceTensor(int64_t n, DType t, int device = 0) {
  testing::UseCudaMallocAllocator();
  return Tensor::Empty({n}, t, Device::CUDA(device));
}

Tensor DeviceTensorWith(const std::vector<double>& values, DType t, int device = 0) {
  Tensor x = DeviceTensor(int64_t(values.size()), t, device);
  UploadValues(x, values);
  return x;
}

bool AllowedOp(DType t, ReduceOp op) { return op != ReduceOp::kAvg || IsFloating(t); }

std::string Case(DType t, ReduceOp op) { return absl::StrCat(DTypeName(t), " ", ReduceOpName(op)); }

// ---- Without a GPU ------------------------------------------------------------------------------

TEST(NcclPluginTest, RegistersTheNcclCommunicator) {
  ASSERT_TRUE(testing::LoadNcclPlugin().ok()) << testing::LoadNcclPlugin();
  EXPECT_TRUE(Registry::Get().HasCommunicator("nccl"));
}

TEST(NcclOptionsTest, ACpuDeviceIsRefusedBeforeTouchingCuda) {
  ASSERT_TRUE(testing::LoadNcclPlugin().ok());
  CommunicatorOptions o;
  o.device = Device::CPU();
  auto comm = Registry::Get().MakeCommunicator("nccl", o);
  ASSERT_FALSE(comm.ok());
  EXPECT_EQ(comm.status().code(), absl::StatusCode::kInvalidArgument) << comm.status();
  EXPECT_THAT(Message(comm.status()), HasSubstr("cpu:0 is not a CUDA device"));
  EXPECT_THAT(Message(comm.status()), HasSubstr("gloo"));
}

TEST(NcclOptionsTest, BadRanksAMissingStoreAndABadTimeoutAreRefused) {
  InMemoryStore store;
  auto out_of_range = MakeNccl(2, 2, &store, 0);
  EXPECT_EQ(out_of_range.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(out_of_range.status()), HasSubstr("rank 2 is out of range for world size 2"));

  auto no_store = MakeNccl(1, 2, nullptr, 0);
  EXPECT_EQ(no_store.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(no_store.status()), HasSubstr("no rendezvous store"));

  auto no_time = MakeNccl(0, 1, &store, 0, absl::ZeroDuration());
  EXPECT_EQ(no_time.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(no_time.status()), HasSubstr("timeout 0 is not positive"));
}

TEST(NcclOptionsTest, UnknownOrMalformedOptionsAreRefused) {
  InMemoryStore store;
  auto typo = MakeNccl(0, 1, &store, 0, absl::Seconds(60), {{"group_nmae", "tp"}});
  EXPECT_EQ(typo.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(typo.status()), HasSubstr("unknown option 'group_nmae' (known: group_name"));
  auto hostname = MakeNccl(0, 1, &store, 0, absl::Seconds(60), {{"hostname", "10.0.0.1"}});
  EXPECT_THAT(Message(hostname.status()), HasSubstr("pass iface"));
  auto flag = MakeNccl(0, 1, &store, 0, absl::Seconds(60), {{"nccl_blocking", "yes"}});
  EXPECT_THAT(Message(flag.status()), HasSubstr("nccl_blocking must be 0 or 1, not 'yes'"));
  // LoadNcclPlugin (test_util.cc) set NCCL_SOCKET_IFNAME (to lo, unless the environment had
  // one): another interface contradicts it.
  const char* env = std::getenv("NCCL_SOCKET_IFNAME");
  ASSERT_NE(env, nullptr);
  const std::string other = std::string(env) == "eth7" ? "eth8" : "eth7";
  auto iface = MakeNccl(0, 1, &store, 0, absl::Seconds(60), {{"iface", other}});
  EXPECT_THAT(Message(iface.status()),
              HasSubstr(absl::StrCat("iface=", other, " contradicts NCCL_SOCKET_IFNAME=", env)));
}

// Runs in nccl_communicator_test_no_gpu, which Bazel skips on a machine with a GPU.
TEST(NcclNoGpuTest, CreationFailsWithCudasReason) {
  absl::StatusOr<int> count = testing::GpuCount();
  if (count.ok()) {
    const std::string why = absl::StrCat("This machine has ", *count, " CUDA device(s).");
    if (gpu_test::MustFailWithAGpu()) FAIL() << why;
    GTEST_SKIP() << why;
  }
  InMemoryStore store;
  auto comm = MakeNccl(0, 1, &store, 0);
  ASSERT_FALSE(comm.ok());
  EXPECT_EQ(comm.status().code(), absl::StatusCode::kUnavailable) << comm.status();
  EXPECT_THAT(Message(comm.status()), HasSubstr("cudaGetDeviceCount"));
  EXPECT_THAT(Message(comm.status()), HasSubstr("(cudaError"));
}

TEST(NcclFromTest, OnlyNcclCommunicatorsConvert) {
  auto group = MakeInProcessGroup(1);
  EXPECT_EQ(NcclCommunicator::From(group[0].get()), nullptr);
  EXPECT_EQ(NcclCommunicator::From(nullptr), nullptr);
}

// ---- One GPU, world size 1 ----------------------------------------------------------------------

class SingleGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    BRAID_REQUIRE_GPUS(1, gpus_);
    auto comm = MakeNccl(0, 1, &store_, 0);
    ASSERT_TRUE(comm.ok()) << comm.status();
    comm_ = std::move(*comm);
  }

  absl::StatusOr<std::unique_ptr<Communicator>> MakeGroupedBlocks() {
    return MakeNccl(0, 1, &store_, 0, absl::Seconds(60), {{"nccl_grouped_blocks", "1"}});
  }

  int gpus_ = 0;
  InMemoryStore store_;
  std::unique_ptr<Communicator> comm_;
};

TEST_F(SingleGpuTest, DescribesItself) {
  EXPECT_EQ(comm_->name(), "nccl");
  EXPECT_EQ(comm_->rank(), 0);
  EXPECT_EQ(comm_->size(), 1);
  NcclCommunicator* nccl = NcclCommunicator::From(comm_.get());
  ASSERT_NE(nccl, nullptr);
  EXPECT_EQ(nccl->device(), Device::CUDA(0));
  EXPECT_FALSE(nccl->aborted());
  EXPECT_EQ(nccl->next_sequence_number(), 0);
}

TEST_F(SingleGpuTest, AllReduceOfOneRankIsTheIdentityForEveryDtypeAndOp) {
  uint32_t seed = 1;
  for (DType t : kAllDtypes) {
    for (ReduceOp op : kAllOps) {
      if (!AllowedOp(t, op)) continue;
      std::vector<double> v = Values(t, 1000, seed++);
      Tensor x = DeviceTensorWith(v, t);
      absl::Status st = comm_->AllReduce(x, op)->Wait();
      ASSERT_TRUE(st.ok()) << Case(t, op) << ": " << st;
      EXPECT_EQ(DownloadValues(x), v) << Case(t, op);
    }
  }
}

TEST_F(SingleGpuTest, AvgOfIntegersIsRefusedAndStillNumbered) {
  NcclCommunicator* nccl = NcclCommunicator::From(comm_.get());
  Tensor x = DeviceTensorWith({1, 2, 3}, DType::kI32);
  absl::Status st = comm_->AllReduce(x, ReduceOp::kAvg)->Wait();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(st), HasSubstr("avg needs a floating dtype, got i32"));
  // Every rank refuses the same call, so it keeps its number: later collectives stay aligned.
  EXPECT_EQ(nccl->next_sequence_number(), 1);
  ASSERT_TRUE(comm_->AllReduce(x, ReduceOp::kSum)->Wait().ok());
  EXPECT_EQ(nccl->next_sequence_number(), 2);
}

// Output is set to a sentinel first: a gather that wrote nothing would fail.
void ExpectAllGatherCopies(Communicator& comm, const std::string& path) {
  uint32_t seed = 100;
  for (DType t : kAllDtypes) {
    for (int64_t n : {0, 1, 7, 4096}) {
      std::vector<double> v = Values(t, n, seed++);
      Tensor in = DeviceTensorWith(v, t);
      Tensor out = DeviceTensor(n, t);
      FillBytes(out, 0x7f);
      for (const std::vector<int64_t>& counts : {std::vector<int64_t>{}, std::vector<int64_t>{n}}) {
        absl::Status st = comm.AllGather(in, out, counts)->Wait();
        ASSERT_TRUE(st.ok()) << path << " " << DTypeName(t) << " n=" << n << ": " << st;
        EXPECT_EQ(DownloadValues(out), v) << path << " " << DTypeName(t) << " n=" << n;
      }
    }
  }
}

TEST_F(SingleGpuTest, AllGatherCopiesTheInput) { ExpectAllGatherCopies(*comm_, "equal blocks"); }

TEST_F(SingleGpuTest, AllGatherCopiesTheInputOnTheGroupedBlockPath) {
  auto comm = MakeGroupedBlocks();
  ASSERT_TRUE(comm.ok()) << comm.status();
  ExpectAllGatherCopies(**comm, "grouped broadcasts");
}

void ExpectReduceScatterCopies(Communicator& comm, const std::string& path) {
  uint32_t seed = 200;
  for (DType t : kAllDtypes) {
    for (ReduceOp op : kAllOps) {
      if (!AllowedOp(t, op)) continue;
      std::vector<double> v = Values(t, 513, seed++);
      Tensor in = DeviceTensorWith(v, t);
      Tensor out = DeviceTensor(513, t);
      FillBytes(out, 0x7f);
      absl::Status st = comm.ReduceScatter(in, out, op, {513})->Wait();
      ASSERT_TRUE(st.ok()) << path << " " << Case(t, op) << ": " << st;
      EXPECT_EQ(DownloadValues(out), v) << path << " " << Case(t, op);
      EXPECT_EQ(DownloadValues(in), v) << path << ": the input must be left alone";
    }
  }
}

TEST_F(SingleGpuTest, ReduceScatterCopiesTheInput) {
  ExpectReduceScatterCopies(*comm_, "equal blocks");
}

TEST_F(SingleGpuTest, ReduceScatterCopiesTheInputOnTheGroupedBlockPath) {
  auto comm = MakeGroupedBlocks();
  ASSERT_TRUE(comm.ok()) << comm.status();
  ExpectReduceScatterCopies(**comm, "grouped reduces");
}

TEST_F(SingleGpuTest, BroadcastAndReduceKeepTheValuesAndCheckTheRoot) {
  std::vector<double> v = Values(DType::kBF16, 300, 7);
  Tensor x = DeviceTensorWith(v, DType::kBF16);
  ASSERT_TRUE(comm_->Broadcast(x, 0)->Wait().ok());
  EXPECT_EQ(DownloadValues(x), v);
  ASSERT_TRUE(comm_->Reduce(x, 0, ReduceOp::kMax)->Wait().ok());
  EXPECT_EQ(DownloadValues(x), v);

  absl::Status st = comm_->Broadcast(x, 1)->Wait();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(st), HasSubstr("root 1 is out of range"));
  st = comm_->Reduce(x, -1, ReduceOp::kSum)->Wait();
  EXPECT_THAT(Message(st), HasSubstr("root -1 is out of range"));
}

TEST_F(SingleGpuTest, BarrierCompletes) {
  for (int i = 0; i < 3; ++i) {
    std::shared_ptr<Work> w = comm_->Barrier();
    ASSERT_TRUE(w->Wait().ok());
    EXPECT_TRUE(w->IsCompleted());
  }
  EXPECT_EQ(NcclCommunicator::From(comm_.get())->next_sequence_number(), 3);
}

// The collective must wait for what the caller queued before it on the (legacy default)
// stream: here a copy held back 300 ms behind a sleeping host function. A communicator stream
// that did not wait would gather the sentinel.
void SleepMs(void* ms) { std::this_thread::sleep_for(std::chrono::milliseconds(*(int*)ms)); }

TEST_F(SingleGpuTest, OperationsRunAfterWhatTheCallerQueuedBefore) {
  const int64_t n = 1 << 16;
  std::vector<double> v = Values(DType::kF32, n, 11);
  std::vector<float> host(v.begin(), v.end());
  Tensor in = DeviceTensor(n, DType::kF32);
  Tensor out = DeviceTensor(n, DType::kF32);
  FillBytes(in, 0x7f);
  FillBytes(out, 0x7f);
  static int delay_ms = 300;
  ASSERT_EQ(cudaLaunchHostFunc(cudaStreamLegacy, SleepMs, &delay_ms), cudaSuccess);
  // Pageable memory: the copy is staged, but still ordered on the legacy stream.
  ASSERT_EQ(cudaMemcpyAsync(in.raw_data(), host.data(), n * sizeof(float), cudaMemcpyHostToDevice,
                            cudaStreamLegacy),
            cudaSuccess);
  std::shared_ptr<Work> w = comm_->AllGather(in, out);
  ASSERT_TRUE(w->Wait().ok());
  EXPECT_EQ(DownloadValues(out), v);
}

// WaitOnDevice returns without waiting for the GPU and orders the legacy default stream (so
// every blocking stream, like Braid's compute stream) after the collective: a copy enqueued on
// a blocking stream of the test's own, then synchronised, reads the gathered values. (One GPU
// cannot make the collective itself slow on demand, so this checks the result and the
// completion, not that a stream that did not wait would have read too early.)
TEST_F(SingleGpuTest, WaitOnDeviceOrdersABlockingStreamAfterTheCollective) {
  const int64_t n = 1 << 16;
  std::vector<double> v = Values(DType::kF32, n, 12);
  Tensor in = DeviceTensorWith(v, DType::kF32);
  Tensor out = DeviceTensor(n, DType::kF32);
  Tensor copy = DeviceTensor(n, DType::kF32);
  FillBytes(out, 0x7f);
  FillBytes(copy, 0x7f);
  std::shared_ptr<Work> w = comm_->AllGather(in, out);
  ASSERT_TRUE(w->WaitOnDevice().ok());
  cudaStream_t blocking = nullptr;
  ASSERT_EQ(cudaStreamCreate(&blocking), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(copy.raw_data(), out.raw_data(), n * sizeof(float),
                            cudaMemcpyDeviceToDevice, blocking),
            cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(blocking), cudaSuccess);
  ASSERT_EQ(cudaStreamDestroy(blocking), cudaSuccess);
  EXPECT_EQ(DownloadValues(copy), v);
  EXPECT_TRUE(w->Wait().ok());
}

TEST_F(SingleGpuTest, GroupedCallsLaunchAtTheEndOfTheGroup) {
  NcclCommunicator* nccl = NcclCommunicator::From(comm_.get());
  std::vector<double> a = Values(DType::kF32, 64, 1), b = Values(DType::kI64, 33, 2);
  Tensor xa = DeviceTensorWith(a, DType::kF32), ya = DeviceTensor(64, DType::kF32);
  Tensor xb = DeviceTensorWith(b, DType::kI64), yb = DeviceTensor(33, DType::kI64);
  FillBytes(ya, 0x7f);
  FillBytes(yb, 0x7f);
  std::shared_ptr<Work> wa, wb, wc;
  {
    GroupGuard group(*nccl);
    wa = comm_->AllGather(xa, ya);
    wb = comm_->AllGather(xb, yb);
    wc = comm_->AllReduce(xa, ReduceOp::kSum);
    absl::Status early = wa->Wait();
    EXPECT_EQ(early.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(Message(early), HasSubstr("inside an open GroupGuard"));
    EXPECT_FALSE(wa->IsCompleted());
  }
  ASSERT_TRUE(wa->Wait().ok());
  ASSERT_TRUE(wb->Wait().ok());
  ASSERT_TRUE(wc->Wait().ok());
  EXPECT_EQ(DownloadValues(ya), a);
  EXPECT_EQ(DownloadValues(yb), b);
  EXPECT_EQ(nccl->next_sequence_number(), 3);
}

TEST_F(SingleGpuTest, SendToSelfAndReceiveInOneGroup) {
  NcclCommunicator* nccl = NcclCommunicator::From(comm_.get());
  std::vector<double> v = Values(DType::kF16, 1000, 5);
  Tensor x = DeviceTensorWith(v, DType::kF16), y = DeviceTensor(1000, DType::kF16);
  FillBytes(y, 0);
  std::shared_ptr<Work> s, r;
  {
    GroupGuard group(*nccl);
    s = comm_->Send(x, 0, /*tag=*/3);
    r = comm_->Recv(y, 0, /*tag=*/3);
    ASSERT_TRUE(group.End().ok());
    EXPECT_TRUE(group.End().ok());  // idempotent
  }
  ASSERT_TRUE(s->Wait().ok());
  ASSERT_TRUE(r->Wait().ok());
  EXPECT_EQ(DownloadValues(y), v);
  // Point-to-point operations are not numbered: they are not collectives.
  EXPECT_EQ(nccl->next_sequence_number(), 0);
  absl::Status st = comm_->Send(x, 1, 0)->Wait();
  EXPECT_THAT(Message(st), HasSubstr("peer rank 1 is out of range"));
}

TEST_F(SingleGpuTest, GroupEndWithoutStartIsAnError) {
  absl::Status st = NcclCommunicator::From(comm_.get())->GroupEnd();
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(Message(st), HasSubstr("without a matching GroupStart"));
}

TEST_F(SingleGpuTest, NewGroupOfTheOnlyRankWorksAndBadListsAreRefused) {
  auto child = comm_->NewGroup({0});
  ASSERT_TRUE(child.ok()) << child.status();
  ASSERT_NE(*child, nullptr);
  EXPECT_EQ((*child)->rank(), 0);
  EXPECT_EQ((*child)->size(), 1);
  std::vector<double> v = Values(DType::kF32, 10, 3);
  Tensor x = DeviceTensorWith(v, DType::kF32), y = DeviceTensor(10, DType::kF32);
  FillBytes(y, 0x7f);
  ASSERT_TRUE((*child)->AllGather(x, y)->Wait().ok());
  EXPECT_EQ(DownloadValues(y), v);
  // The parent goes on working next to its group.
  ASSERT_TRUE(comm_->Barrier()->Wait().ok());
  child->reset();

  auto bad = comm_->NewGroup({1});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(bad.status()), HasSubstr("rank 1 is out of range or listed twice"));
  EXPECT_EQ(comm_->NewGroup({0, 0}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(comm_->NewGroup({}).status()), HasSubstr("no ranks given"));
}

TEST_F(SingleGpuTest, TensorsOnTheWrongDeviceAreRefused) {
  Tensor cpu = Tensor::FromVector<float>({1, 2, 3}, {3});
  absl::Status st = comm_->AllReduce(cpu, ReduceOp::kSum)->Wait();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(st), HasSubstr("is not on a CUDA device"));
  EXPECT_THAT(Message(st), HasSubstr("cpu:0"));

  Tensor dev = DeviceTensor(3, DType::kF32);
  EXPECT_THAT(Message(comm_->AllGather(cpu, dev)->Wait()), HasSubstr("is not on a CUDA device"));
  EXPECT_THAT(Message(comm_->Send(cpu, 0, 0)->Wait()), HasSubstr("is not on a CUDA device"));
  Tensor undefined;
  EXPECT_THAT(Message(comm_->Broadcast(undefined, 0)->Wait()), HasSubstr("undefined"));

  // Block sizes must match the tensors.
  Tensor big = DeviceTensor(4, DType::kF32);
  st = comm_->AllGather(dev, big)->Wait();
  EXPECT_THAT(Message(st), HasSubstr("must hold this rank's block: 4 elements of f32"));
  st = comm_->ReduceScatter(big, dev, ReduceOp::kSum, {3, 1})->Wait();
  EXPECT_THAT(Message(st), HasSubstr("one non-negative count per rank (1)"));

  if (gpus_ >= 2) {
    Tensor other = DeviceTensor(3, DType::kF32, /*device=*/1);
    st = comm_->AllReduce(other, ReduceOp::kSum)->Wait();
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(Message(st), HasSubstr("is on another GPU than the communicator's cuda:0"));
  }
}

TEST_F(SingleGpuTest, SuccessiveCommunicatorsOnOneStoreDoNotMix) {
  for (int i = 0; i < 3; ++i) {
    auto comm = MakeNccl(0, 1, &store_, 0);
    ASSERT_TRUE(comm.ok()) << comm.status();
    ASSERT_TRUE((*comm)->Barrier()->Wait().ok());
  }
  // One generation per communicator made on this store by rank 0: the fixture's and three.
  auto generation = store_.Add("nccl/instances/rank0", 0);
  ASSERT_TRUE(generation.ok());
  EXPECT_EQ(*generation, 4);
}

TEST_F(SingleGpuTest, DroppedWorksKeepTheirTensorsAliveUntilDone) {
  // Issue many operations without waiting, drop the Works and the tensors: the communicator
  // holds them until the stream is past them (a use-after-free here would fault the GPU).
  for (int i = 0; i < 50; ++i) {
    Tensor in = DeviceTensorWith(Values(DType::kF32, 4096, i), DType::kF32);
    Tensor out = DeviceTensor(4096, DType::kF32);
    comm_->AllGather(in, out);
  }
  ASSERT_TRUE(comm_->Barrier()->Wait().ok());
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

// ---- Two or more GPUs: one rank per GPU, one thread per rank ------------------------------------

double Serial(ReduceOp op, const std::vector<double>& xs) {
  double acc = xs[0];
  for (size_t i = 1; i < xs.size(); ++i) {
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg:
        acc += xs[i];
        break;
      case ReduceOp::kMax:
        acc = std::max(acc, xs[i]);
        break;
      case ReduceOp::kMin:
        acc = std::min(acc, xs[i]);
        break;
    }
  }
  return op == ReduceOp::kAvg ? acc / double(xs.size()) : acc;
}

// What every rank holds for one collective, and the element-wise serial reduction of it.
struct RankData {
  std::vector<std::vector<double>> per_rank;
  std::vector<double> Reduced(ReduceOp op) const {
    std::vector<double> out(per_rank[0].size());
    for (size_t i = 0; i < out.size(); ++i) {
      std::vector<double> xs;
      for (const auto& v : per_rank) xs.push_back(v[i]);
      out[i] = Serial(op, xs);
    }
    return out;
  }
};

RankData MakeRankData(DType t, int n, int64_t numel, uint32_t seed) {
  RankData d;
  for (int r = 0; r < n; ++r) d.per_rank.push_back(Values(t, numel, seed * 131 + r));
  return d;
}

// Exact, except for an average that the dtype has to round.
void ExpectValues(const std::vector<double>& got, const std::vector<double>& want, DType t,
                  ReduceOp op, const std::string& where) {
  ASSERT_EQ(got.size(), want.size()) << where;
  const double tol = op != ReduceOp::kAvg ? 0
                     : t == DType::kF32   ? 1e-6
                     : t == DType::kF16   ? 2e-3
                                          : 1e-2;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], tol * (1 + std::fabs(want[i]))) << where << " i=" << i;
  }
}

class MultiGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    BRAID_REQUIRE_GPUS(2, gpus_);
    n_ = std::min(gpus_, 4);
  }

  // Runs fn(rank, comm) on one thread per rank, each with its communicator on cuda:rank.
  void RunWorld(const std::function<void(int, Communicator&)>& fn,
                std::map<std::string, std::string> options = {}) {
    InMemoryStore store;
    testing::RunRanks(n_, [&](int rank) {
      auto comm = MakeNccl(rank, n_, &store, rank, absl::Seconds(120), options);
      ASSERT_TRUE(comm.ok()) << "rank " << rank << ": " << comm.status();
      fn(rank, **comm);
    });
  }

  int gpus_ = 0;
  int n_ = 0;
};

TEST_F(MultiGpuTest, AllReduceMatchesTheSerialReduction) {
  RunWorld([&](int rank, Communicator& comm) {
    uint32_t seed = 1;
    for (DType t : kAllDtypes) {
      for (ReduceOp op : kAllOps) {
        if (!AllowedOp(t, op)) continue;
        RankData d = MakeRankData(t, n_, 1031, seed++);
        Tensor x = DeviceTensorWith(d.per_rank[rank], t, rank);
        ASSERT_TRUE(comm.AllReduce(x, op)->Wait().ok()) << Case(t, op);
        ExpectValues(DownloadValues(x), d.Reduced(op), t, op,
                     absl::StrCat("rank ", rank, " ", Case(t, op)));
      }
    }
  });
}

// Equal blocks, uneven blocks (with an empty one), and equal blocks forced down the grouped path.
std::vector<std::vector<int64_t>> BlockLayouts(int n) {
  std::vector<int64_t> uneven;
  for (int r = 0; r < n; ++r) uneven.push_back(r == 1 ? 0 : 3 + 5 * r);
  return {{}, uneven};
}

void CheckReduceScatterAndAllGather(int n, int rank, Communicator& comm) {
  uint32_t seed = 50;
  for (DType t : {DType::kF32, DType::kBF16, DType::kI64, DType::kU8}) {
    for (const std::vector<int64_t>& counts : BlockLayouts(n)) {
      std::vector<int64_t> blocks = counts.empty() ? std::vector<int64_t>(n, 6) : counts;
      std::vector<int64_t> offsets(n + 1, 0);
      for (int r = 0; r < n; ++r) offsets[r + 1] = offsets[r] + blocks[r];
      const int64_t total = offsets[n];
      const std::string layout =
          absl::StrCat(DTypeName(t), " blocks [", absl::StrJoin(blocks, ","), "]");

      for (ReduceOp op : kAllOps) {
        if (!AllowedOp(t, op)) continue;
        RankData d = MakeRankData(t, n, total, seed++);
        Tensor in = DeviceTensorWith(d.per_rank[rank], t, rank);
        Tensor out = DeviceTensor(blocks[rank], t, rank);
        FillBytes(out, 0x7f);
        absl::Status st = comm.ReduceScatter(in, out, op, counts)->Wait();
        ASSERT_TRUE(st.ok()) << layout << " " << ReduceOpName(op) << ": " << st;
        std::vector<double> full = d.Reduced(op);
        std::vector<double> mine(full.begin() + offsets[rank], full.begin() + offsets[rank + 1]);
        ExpectValues(DownloadValues(out), mine, t, op,
                     absl::StrCat("ReduceScatter rank ", rank, " ", layout, " ", ReduceOpName(op)));
      }

      std::vector<double> everything;
      std::vector<std::vector<double>> parts;
      for (int r = 0; r < n; ++r) {
        parts.push_back(Values(t, blocks[r], seed * 7 + r));
        everything.insert(everything.end(), parts[r].begin(), parts[r].end());
      }
      ++seed;
      Tensor in = DeviceTensorWith(parts[rank], t, rank);
      Tensor out = DeviceTensor(total, t, rank);
      FillBytes(out, 0x7f);
      absl::Status st = comm.AllGather(in, out, counts)->Wait();
      ASSERT_TRUE(st.ok()) << layout << ": " << st;
      EXPECT_EQ(DownloadValues(out), everything) << "AllGather rank " << rank << " " << layout;
    }
  }
}

TEST_F(MultiGpuTest, ReduceScatterAndAllGatherMatchTheSerialResult) {
  RunWorld([&](int rank, Communicator& comm) { CheckReduceScatterAndAllGather(n_, rank, comm); });
}

TEST_F(MultiGpuTest, ReduceScatterAndAllGatherOnTheGroupedBlockPath) {
  RunWorld([&](int rank, Communicator& comm) { CheckReduceScatterAndAllGather(n_, rank, comm); },
           {{"nccl_grouped_blocks", "1"}});
}

TEST_F(MultiGpuTest, BroadcastAndReduceFromEveryRoot) {
  RunWorld([&](int rank, Communicator& comm) {
    for (int root = 0; root < n_; ++root) {
      RankData d = MakeRankData(DType::kF16, n_, 777, 300 + root);
      Tensor x = DeviceTensorWith(d.per_rank[rank], DType::kF16, rank);
      ASSERT_TRUE(comm.Broadcast(x, root)->Wait().ok());
      EXPECT_EQ(DownloadValues(x), d.per_rank[root]) << "broadcast from " << root;

      Tensor y = DeviceTensorWith(d.per_rank[rank], DType::kF16, rank);
      ASSERT_TRUE(comm.Reduce(y, root, ReduceOp::kSum)->Wait().ok());
      if (rank == root) {
        ExpectValues(DownloadValues(y), d.Reduced(ReduceOp::kSum), DType::kF16, ReduceOp::kSum,
                     absl::StrCat("reduce to ", root));
      }
    }
    ASSERT_TRUE(comm.Barrier()->Wait().ok());
  });
}

TEST_F(MultiGpuTest, SendAndRecvAroundARingInOneGroup) {
  RunWorld([&](int rank, Communicator& comm) {
    const int next = (rank + 1) % n_, prev = (rank + n_ - 1) % n_;
    std::vector<double> mine = Values(DType::kI32, 999, 40 + rank);
    Tensor x = DeviceTensorWith(mine, DType::kI32, rank);
    Tensor y = DeviceTensor(999, DType::kI32, rank);
    FillBytes(y, 0x7f);
    std::shared_ptr<Work> s, r;
    {
      GroupGuard group(*NcclCommunicator::From(&comm));
      s = comm.Send(x, next, 0);
      r = comm.Recv(y, prev, 0);
    }
    ASSERT_TRUE(s->Wait().ok());
    ASSERT_TRUE(r->Wait().ok());
    EXPECT_EQ(DownloadValues(y), Values(DType::kI32, 999, 40 + prev)) << "rank " << rank;
  });
}

TEST_F(MultiGpuTest, NewGroupsFollowTheListOrderAndLeaveOthersOut) {
  RunWorld([&](int rank, Communicator& comm) {
    // Reversed order: the last rank becomes rank 0 of the group.
    std::vector<int> members = {n_ - 1, 0};
    auto child = comm.NewGroup(members);
    ASSERT_TRUE(child.ok()) << child.status();
    auto it = std::find(members.begin(), members.end(), rank);
    if (it == members.end()) {
      EXPECT_EQ(*child, nullptr) << "rank " << rank << " is not a member";
    } else {
      ASSERT_NE(*child, nullptr);
      EXPECT_EQ((*child)->rank(), int(it - members.begin()));
      EXPECT_EQ((*child)->size(), 2);
      Tensor x = DeviceTensorWith({double(rank)}, DType::kF32, rank);
      ASSERT_TRUE((*child)->AllReduce(x, ReduceOp::kSum)->Wait().ok());
      EXPECT_EQ(DownloadValues(x), std::vector<double>{double(n_ - 1)});
      Tensor g = DeviceTensor(2, DType::kF32, rank);
      Tensor me = DeviceTensorWith({double(rank)}, DType::kF32, rank);
      ASSERT_TRUE((*child)->AllGather(me, g)->Wait().ok());
      EXPECT_EQ(DownloadValues(g), (std::vector<double>{double(n_ - 1), 0}));
    }
    // The parent still works for everyone.
    ASSERT_TRUE(comm.Barrier()->Wait().ok());
  });
}

}  // namespace
}  // namespace braid::nccl
