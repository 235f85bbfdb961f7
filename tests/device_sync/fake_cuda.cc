#include "tests/device_sync/fake_cuda.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "backends/cuda/install.h"
#include "backends/cuda/runtime.h"
#include "backends/in_process/in_process_communicator.h"
#include "core/check.h"
#include "core/kernels.h"
#include "core/ops.h"

namespace braid::testing {
namespace {

// The CPU backend's f32 kernel of `slot` serves kCUDA too.
template <typename Fn>
void Mirror(kernels::KernelSlot<Fn>& slot) {
  if (Fn* f = slot.Find(DeviceType::kCPU, DType::kF32)) slot.Register(DeviceType::kCUDA, DType::kF32, f);
}

std::vector<float> Wave(int64_t n, float scale, int salt) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = scale * std::sin(0.37f * float(i + salt));
  return v;
}

class Block : public Module {
 public:
  explicit Block(int salt) : Module("Block") {
    constexpr int64_t w = BlockLm::kWidth;
    set_block(true);
    ln_w_ = RegisterParameter("ln.weight", Tensor::Full({w}, 1.0f));
    ln_b_ = RegisterParameter("ln.bias", Tensor::Full({w}, 0.0f));
    fc_w_ = RegisterParameter("fc.weight", Tensor::FromVector(Wave(w * w, 0.4f, salt), {w, w}));
    fc_b_ = RegisterParameter("fc.bias", Tensor::Full({w}, 0.01f));
  }
  Tensor Forward(const Tensor& x) override {
    return ops::Add(x, ops::GeluTanh(ops::Linear(ops::LayerNorm(x, ln_w_, ln_b_), fc_w_, fc_b_)));
  }

 private:
  Tensor ln_w_, ln_b_, fc_w_, fc_b_;
};

// A device tensor's bytes, as NCCL would read them on the device: a plain copy of the fake's
// memory (host memory), invisible to the fake. Host tensors (where not refused) are used as
// they are.
Tensor Stage(const Tensor& t) {
  if (t.device().type == DeviceType::kCPU) return t;
  Tensor host = Tensor::Empty(t.shape(), t.dtype(), Device::CPU());
  std::memcpy(host.raw_data(), t.raw_data(), t.nbytes());
  return host;
}

class DeviceWork final : public Work {
 public:
  DeviceWork(std::shared_ptr<Work> inner, Tensor input, Tensor host, Tensor device,
             CollectiveWaits* waits)
      : inner_(std::move(inner)), input_(std::move(input)), host_(std::move(host)),
        device_(std::move(device)), waits_(waits) {}
  absl::Status Wait() override {
    if (waits_ != nullptr) ++waits_->host;
    absl::Status st = inner_->Wait();
    if (st.ok()) WriteBack();
    return st;
  }
  // NCCL's WaitOnDevice makes the compute stream wait for the collective's event. The eager
  // fake runs each kernel as it is enqueued, so the kernels after this wait can only see the
  // result if it is in device memory now: the rendezvous with the other ranks (threads) is
  // made here, which on a GPU is the network's and the device's business, never the host's.
  absl::Status WaitOnDevice() override {
    if (waits_ != nullptr) ++waits_->device;
    absl::Status st = inner_->Wait();
    if (st.ok()) WriteBack();
    return st;
  }
  // A strategy may see its collective done by polling (DDP's buckets) and never Wait for it.
  bool IsCompleted() override {
    if (!inner_->IsCompleted()) return false;
    if (inner_->Wait().ok()) WriteBack();  // done: returns at once
    return true;
  }

 private:
  // The output written into device memory once the collective is done, as NCCL leaves it
  // there (a Work dropped unpolled and unwaited never writes it: strategies look at every
  // result they use).
  void WriteBack() {
    if (written_ || !device_.defined() || device_.device().type == DeviceType::kCPU) return;
    std::memcpy(device_.raw_data(), host_.raw_data(), device_.nbytes());
    written_ = true;
  }

  std::shared_ptr<Work> inner_;
  Tensor input_;  // the staged input, alive until the Work is
  Tensor host_, device_;
  CollectiveWaits* waits_;
  bool written_ = false;
};

// NCCL's refusal of a tensor that is not in device memory (backends/nccl/collectives.cc,
// CheckTensor): an error the caller gets from Wait, never a transfer. Once RefuseHostTensors
// was called, a collective that still passes a host tensor while the model is on the device
// fails the test as it would fail a GPU run under NCCL. Said on stderr too: a caller that
// dropped the status still leaves the reason in the log.
class RefusedWork final : public Work {
 public:
  explicit RefusedWork(absl::Status st) : st_(std::move(st)) {}
  absl::Status Wait() override { return st_; }
  bool IsCompleted() override { return true; }

 private:
  absl::Status st_;
};

absl::Status CheckOnDevice(const char* op, const Tensor& t, const HostTensorFilter& still_host) {
  if (!t.defined() || t.device().type == DeviceType::kCUDA) return absl::OkStatus();
  if (still_host && still_host(op, t)) return absl::OkStatus();
  absl::Status st = absl::InvalidArgumentError(
      absl::StrCat("fake-device ", op, ": tensor ", t.DescribeForError(),
                   " is not on a CUDA device; NCCL moves CUDA device memory only"));
  std::fprintf(stderr, "REFUSED (as NCCL would): %s\n", std::string(st.message()).c_str());
  return st;
}

// Whether a rank's communicators refuse host tensors yet, and which they still take. Only the
// rank's own thread sets and reads it.
struct Refusal {
  bool on = false;
  HostTensorFilter still_host;
};

class DeviceMemoryCommunicator final : public Communicator {
 public:
  DeviceMemoryCommunicator(std::unique_ptr<Communicator> inner, CollectiveWaits* waits,
                           std::shared_ptr<Refusal> refusal)
      : inner_(std::move(inner)), waits_(waits), refusal_(std::move(refusal)) {
    set_timeout(inner_->timeout());
  }
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string name() const override { return "fake-device(" + inner_->name() + ")"; }

  std::shared_ptr<Work> AllReduce(Tensor& t, ReduceOp op) override {
    if (auto r = Refuse("all-reduce", t)) return r;
    Tensor h = Stage(t);
    return Wrap(inner_->AllReduce(h, op), h, t);
  }
  std::shared_ptr<Work> ReduceScatter(const Tensor& input, Tensor& output, ReduceOp op,
                                      const std::vector<int64_t>& counts) override {
    if (auto r = Refuse("reduce-scatter", input, output)) return r;
    Tensor in = Stage(input), out = Stage(output);
    return Wrap(inner_->ReduceScatter(in, out, op, counts), out, output, in);
  }
  std::shared_ptr<Work> AllGather(const Tensor& input, Tensor& output,
                                  const std::vector<int64_t>& counts) override {
    if (auto r = Refuse("all-gather", input, output)) return r;
    Tensor in = Stage(input), out = Stage(output);
    return Wrap(inner_->AllGather(in, out, counts), out, output, in);
  }
  std::shared_ptr<Work> Broadcast(Tensor& t, int root) override {
    if (auto r = Refuse("broadcast", t)) return r;
    Tensor h = Stage(t);
    return Wrap(inner_->Broadcast(h, root), h, t);
  }
  std::shared_ptr<Work> Reduce(Tensor& t, int root, ReduceOp op) override {
    if (auto r = Refuse("reduce", t)) return r;
    Tensor h = Stage(t);
    return Wrap(inner_->Reduce(h, root, op), h, t);
  }
  std::shared_ptr<Work> Send(const Tensor& t, int dst, int tag) override {
    if (auto r = Refuse("send", t)) return r;
    Tensor in = Stage(t);
    return Wrap(inner_->Send(in, dst, tag), Tensor(), Tensor(), in);
  }
  std::shared_ptr<Work> Recv(Tensor& t, int src, int tag) override {
    if (auto r = Refuse("recv", t)) return r;
    Tensor h = Stage(t);
    return Wrap(inner_->Recv(h, src, tag), h, t);
  }
  std::shared_ptr<Work> Barrier() override { return Wrap(inner_->Barrier(), Tensor(), Tensor()); }
  absl::StatusOr<std::unique_ptr<Communicator>> NewGroup(const std::vector<int>& ranks) override {
    absl::StatusOr<std::unique_ptr<Communicator>> sub = inner_->NewGroup(ranks);
    if (!sub.ok() || *sub == nullptr) return sub;
    return std::unique_ptr<Communicator>(new DeviceMemoryCommunicator(std::move(*sub), waits_, refusal_));
  }

  void RefuseHostTensors(HostTensorFilter still_host) {
    refusal_->still_host = std::move(still_host);
    refusal_->on = true;
  }

 private:
  std::shared_ptr<Work> Refuse(const char* op, const Tensor& a, const Tensor& b = Tensor()) {
    if (!refusal_->on) return nullptr;
    absl::Status st = CheckOnDevice(op, a, refusal_->still_host);
    if (st.ok()) st = CheckOnDevice(op, b, refusal_->still_host);
    if (st.ok()) return nullptr;
    return std::make_shared<RefusedWork>(std::move(st));
  }
  std::shared_ptr<Work> Wrap(std::shared_ptr<Work> w, Tensor host, Tensor device,
                             Tensor input = Tensor()) {
    return std::make_shared<DeviceWork>(std::move(w), std::move(input), std::move(host),
                                        std::move(device), waits_);
  }
  std::unique_ptr<Communicator> inner_;
  CollectiveWaits* waits_;
  std::shared_ptr<Refusal> refusal_;  // shared by this rank's groups
};

}  // namespace

void InstallFakeCuda() {
  cuda::InstallCudaBackend([](int index) -> absl::StatusOr<std::unique_ptr<cuda::DeviceApi>> {
    cuda::FakeDeviceApi::Options o;
    o.device_index = index;
    o.eager = true;
    return std::make_unique<cuda::FakeDeviceApi>(o);
  });
  Mirror(kernels::fill);
  Mirror(kernels::binary);
  Mirror(kernels::unary);
  Mirror(kernels::unary_backward);
  Mirror(kernels::axpby);
  Mirror(kernels::sum_all);
  Mirror(kernels::sum_rows);
  Mirror(kernels::matmul);
  Mirror(kernels::layernorm_forward);
  Mirror(kernels::layernorm_backward);
  Mirror(kernels::softmax_forward);
  Mirror(kernels::softmax_backward);
  Mirror(kernels::cross_entropy_forward);
  Mirror(kernels::cross_entropy_backward);
  Mirror(kernels::inverse_count_nonnegative);
  Mirror(kernels::embedding_forward);
  Mirror(kernels::embedding_backward);
  Mirror(kernels::adamw);
  Mirror(kernels::sgd);
  kernels::RegisterHalfFallbacks(DeviceType::kCUDA);
}

cuda::FakeDeviceApi& Fake(int index) {
  return static_cast<cuda::FakeDeviceApi&>(cuda::RuntimeOf(Device::CUDA(index)).api());
}

BlockLm::BlockLm(int blocks) : Module("BlockLm") {
  wte_ = RegisterParameter("wte", Tensor::FromVector(Wave(kVocab * kWidth, 0.5f, 1), {kVocab, kWidth}));
  for (int b = 0; b < blocks; ++b) {
    blocks_.push_back(RegisterModule("h." + std::to_string(b), std::make_unique<Block>(2 + b)));
  }
  head_ = RegisterParameter("head.weight", Tensor::FromVector(Wave(kVocab * kWidth, 0.4f, 7), {kVocab, kWidth}));
  head_b_ = RegisterParameter("head.bias", Tensor::Full({kVocab}, 0.0f));
}

Tensor BlockLm::Forward(const Tensor& ids) {
  Tensor x = ops::Embedding(wte_, ids);
  for (Module* b : blocks_) x = (*b)(x);
  return ops::Linear(x, head_, head_b_);
}

std::vector<PipelineLayer> BlockLm::PipelineLayers() {
  std::vector<PipelineLayer> layers;
  layers.push_back({"embedding", [this](const Tensor& ids) { return ops::Embedding(wte_, ids); }, {"wte"}});
  for (size_t b = 0; b < blocks_.size(); ++b) {
    const std::string name = "h." + std::to_string(b);
    Module* m = blocks_[b];
    layers.push_back({name, [m](const Tensor& x) { return (*m)(x); },
                      {name + ".ln.weight", name + ".ln.bias", name + ".fc.weight", name + ".fc.bias"}});
  }
  layers.push_back({"head", [this](const Tensor& x) { return ops::Linear(x, head_, head_b_); },
                    {"head.weight", "head.bias"}});
  return layers;
}

Batch MakeLmBatch(int step, int replica, int i, Device device) {
  constexpr int64_t v = BlockLm::kVocab;
  std::vector<int32_t> ids, targets;
  for (int r = 0; r < BlockLm::kRows; ++r) {
    ids.push_back(int32_t((step * 7 + replica * 13 + i * 5 + r * 3) % v));
    targets.push_back(r == 2 ? -1 : int32_t((step * 3 + replica * 9 + i * 11 + r * 5 + 1) % v));
  }
  return Batch{Tensor::FromVector(ids, {BlockLm::kRows}).To(device),
               Tensor::FromVector(targets, {BlockLm::kRows}).To(device)};
}

void RunRanksOnFakeDevices(int n, const std::function<void(int rank, Communicator* comm)>& body,
                           std::vector<CollectiveWaits>* collective_waits) {
  std::vector<std::unique_ptr<Communicator>> inner = MakeInProcessGroup(n);
  if (collective_waits != nullptr) collective_waits->assign(size_t(n), CollectiveWaits{});
  std::vector<std::unique_ptr<Communicator>> group;
  for (int r = 0; r < n; ++r) {
    inner[size_t(r)]->set_timeout(absl::Seconds(60));
    group.push_back(std::make_unique<DeviceMemoryCommunicator>(
        std::move(inner[size_t(r)]), collective_waits ? &(*collective_waits)[size_t(r)] : nullptr,
        std::make_shared<Refusal>()));
  }
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back([&, r] { body(r, group[size_t(r)].get()); });
  for (auto& t : threads) t.join();
}

void RefuseHostTensors(Communicator* comm, HostTensorFilter still_host) {
  auto* device_comm = dynamic_cast<DeviceMemoryCommunicator*>(comm);
  BRAID_CHECK(device_comm != nullptr) << "RefuseHostTensors: " << comm->name()
                                      << " was not made by RunRanksOnFakeDevices";
  device_comm->RefuseHostTensors(std::move(still_host));
}

}  // namespace braid::testing
