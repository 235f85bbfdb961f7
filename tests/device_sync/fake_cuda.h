// What the step-synchronisation tests share (docs/GPU.md, "Synchronisation points"): the CUDA
// backend's runtime over one fake device per index (backends/cuda/fake_device_api.h), kernels
// that run there, a small model with blocks and pipeline layers, its micro-batches, and a
// communicator for ranks-as-threads whose tensors live on those fake devices.
#ifndef BRAID_TESTS_DEVICE_SYNC_FAKE_CUDA_H_
#define BRAID_TESTS_DEVICE_SYNC_FAKE_CUDA_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backends/cuda/fake_device_api.h"
#include "core/batch.h"
#include "core/communicator.h"
#include "core/module.h"
#include "core/tensor.h"

namespace braid::testing {

// Installs the CUDA backend over eager fake devices (an infinitely fast GPU: results are there
// when the host looks), one per index, and fills the kernel table's CUDA slots with the CPU
// backend's f32 kernels plus the half fallbacks, as the CUDA backend registers them. The fake's
// device memory is host memory, so the CPU kernels run on it; on a GPU they are kernel launches,
// which never block the host. Every slot but copy, which is the CUDA runtime's. Call once.
void InstallFakeCuda();

// The fake behind cuda:<index>; syncs() lists every time the host waited for it.
cuda::FakeDeviceApi& Fake(int index);

// Embedding -> blocks (LayerNorm -> Linear -> GELU, with a residual) -> Linear head: a GPT's
// step without attention, cut into units (ZeRO) and layers (the pipeline) like a GPT.
class BlockLm : public Module {
 public:
  static constexpr int64_t kVocab = 16, kWidth = 8, kRows = 6;
  explicit BlockLm(int blocks = 2);
  Tensor Forward(const Tensor& ids) override;
  std::vector<PipelineLayer> PipelineLayers() override;

 private:
  Tensor wte_, head_, head_b_;
  std::vector<Module*> blocks_;
};

// Micro-batch i of step s, for data-parallel rank `replica`, on `device`. One target is -1
// (ignored by the loss), so the count of targets runs on the device too.
Batch MakeLmBatch(int step, int replica, int i, Device device);

// Runs body(rank, comm) on n threads over an in-process group whose ranks may hand it tensors on
// the fake CUDA devices. It moves them as NCCL does, without the host waiting for the device: a
// collective reads its inputs' device memory when it is issued (the eager fake has run every
// operation enqueued before it) and writes its outputs' device memory when it completes, by
// plain memory copies the fake does not see (its device memory is host memory), never through
// the device API. So the fake's syncs() count only the waits the strategy itself makes. It
// takes host tensors too until RefuseHostTensors. Its Works keep NCCL's two kinds of wait
// apart: on a GPU, Wait polls the operation's completion event, so the host blocks until the
// device has run the collective (a host wait the fakes' syncs() do not see), while WaitOnDevice
// only makes the compute stream wait for that event. `collective_waits`, when given, counts
// each rank's waits of each kind (index: rank), reset by the caller whenever it likes.
struct CollectiveWaits {
  int host = 0;    // Work::Wait: on a GPU under NCCL, the host waits for the device
  int device = 0;  // Work::WaitOnDevice: the compute stream waits, the host goes on
};
void RunRanksOnFakeDevices(int n, const std::function<void(int rank, Communicator* comm)>& body,
                           std::vector<CollectiveWaits>* collective_waits = nullptr);

// From now on `comm` (a communicator RunRanksOnFakeDevices handed a rank) and every group made
// from it, before or after, refuse host tensors as NCCL does (backends/nccl/collectives.cc):
// the Work's Wait returns the error, also printed on stderr. Called before Setup, so that every
// collective and point-to-point message of Setup and of every training step must pass device
// tensors, except one `still_host` accepts (op: "all-reduce", "broadcast", "send", "recv", ...):
// a known host-tensor collective a test names, so that any other one still fails.
using HostTensorFilter = std::function<bool(const std::string& op, const Tensor& t)>;
void RefuseHostTensors(Communicator* comm, HostTensorFilter still_host = nullptr);

}  // namespace braid::testing

#endif  // BRAID_TESTS_DEVICE_SYNC_FAKE_CUDA_H_
