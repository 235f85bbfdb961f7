// NcclCommunicatorImpl, the class behind nccl_communicator.h, shared by the files that implement
// it: its operations (collectives.cc), putting them on the stream and NCCL groups (launch.cc),
// and its lifecycle: creation, sub-groups, destruction (nccl_communicator.cc). Internal: callers
// use nccl_communicator.h, which needs no NCCL or CUDA header.
#ifndef BRAID_BACKENDS_NCCL_COMMUNICATOR_IMPL_H_
#define BRAID_BACKENDS_NCCL_COMMUNICATOR_IMPL_H_

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "backends/nccl/nccl_communicator.h"
#include "backends/nccl/state.h"
#include "core/communicator.h"

namespace braid::nccl::internal {

using Launch = std::function<ncclResult_t(ncclComm_t comm, cudaStream_t stream)>;

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

  std::shared_ptr<Work> AllReduce(Tensor& t, ReduceOp op) override;
  std::shared_ptr<Work> ReduceScatter(const Tensor& input, Tensor& output, ReduceOp op,
                                      const std::vector<int64_t>& counts) override;
  std::shared_ptr<Work> AllGather(const Tensor& input, Tensor& output,
                                  const std::vector<int64_t>& counts) override;
  std::shared_ptr<Work> Broadcast(Tensor& t, int root) override;
  std::shared_ptr<Work> Reduce(Tensor& t, int root, ReduceOp op) override;

  std::shared_ptr<Work> Send(const Tensor& t, int dst, int tag) override {
    return PointToPoint(/*send=*/true, t, dst, tag);
  }
  std::shared_ptr<Work> Recv(Tensor& t, int src, int tag) override {
    return PointToPoint(/*send=*/false, t, src, tag);
  }

  std::shared_ptr<Work> Barrier() override;

  absl::StatusOr<std::unique_ptr<Communicator>> NewGroup(const std::vector<int>& ranks) override;

  absl::Status GroupStart() override;
  absl::Status GroupEnd() override;

  void set_barrier_buffer(void* p) { barrier_buffer_ = p; }

 private:
  // Whether `blocks` can take NCCL's equal-block collectives (the nccl_grouped_blocks option
  // sends every call down the per-block path instead, so that one GPU can test it).
  bool EqualBlocks(const std::vector<int64_t>& blocks) const;

  absl::Status CheckTensor(const Tensor& t, const char* role, ncclDataType_t* type) const;

  // The rule every communicator shares (core/communicator.h).
  absl::Status CheckReducible(const char* op_name, DType t, ReduceOp op) const;

  absl::Status CheckRoot(const char* op, int root) const;

  // Normalises `counts` (empty: equal blocks) for a buffer of `total` elements.
  absl::Status Blocks(const char* op, int64_t total, const std::vector<int64_t>& counts,
                      std::vector<int64_t>* out) const;

  absl::Status CheckBlock(const char* role, const Tensor& t, DType dtype,
                          const std::vector<int64_t>& counts) const;

  // A collective refused before reaching NCCL: it still takes its sequence number, so that a
  // rank that refuses one stays numbered like the ranks that ran it.
  std::shared_ptr<Work> Reject(const std::string& what, const absl::Status& st);

  std::shared_ptr<Work> PointToPoint(bool send, const Tensor& t, int peer, int tag);

  // Runs `launch` on the communicator's stream after the caller's stream, and returns a Work
  // that completes with it. `peer` >= 0 marks a point-to-point operation (not numbered).
  std::shared_ptr<Work> Issue(const std::string& what, size_t bytes, int peer,
                              std::vector<Tensor> tensors, const Launch& launch);

  // Records one completion event on the stream for `ops`, just launched.
  absl::Status RecordDoneLocked(const std::vector<std::shared_ptr<Op>>& ops);

  std::shared_ptr<State> state_;
  ncclConfig_t config_;
  void* barrier_buffer_ = nullptr;  // one f32 on the device, owned
};

}  // namespace braid::nccl::internal

#endif  // BRAID_BACKENDS_NCCL_COMMUNICATOR_IMPL_H_
