// The NCCL communicator's operations: each one checks its arguments, describes itself for logs
// and errors, and hands NCCL's call to Issue (launch.cc). Separate from launching because this is
// the per-operation part: adding an operation touches only this file.
#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "backends/nccl/communicator_impl.h"
#include "backends/nccl/dtypes.h"
#include "core/check.h"

namespace braid::nccl::internal {
namespace {

// "f32, 1024 elements", for descriptions (of undefined tensors too: they are refused later).
std::string DataDesc(const Tensor& t) {
  if (!t.defined()) return "undefined tensor";
  int64_t n = t.numel();
  return absl::StrCat(DTypeName(t.dtype()), ", ", n, n == 1 ? " element" : " elements");
}

}  // namespace

std::shared_ptr<Work> NcclCommunicatorImpl::AllReduce(Tensor& t, ReduceOp op) {
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

std::shared_ptr<Work> NcclCommunicatorImpl::ReduceScatter(const Tensor& input, Tensor& output,
                                                          ReduceOp op,
                                                          const std::vector<int64_t>& counts) {
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

std::shared_ptr<Work> NcclCommunicatorImpl::AllGather(const Tensor& input, Tensor& output,
                                                      const std::vector<int64_t>& counts) {
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

std::shared_ptr<Work> NcclCommunicatorImpl::Broadcast(Tensor& t, int root) {
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

std::shared_ptr<Work> NcclCommunicatorImpl::Reduce(Tensor& t, int root, ReduceOp op) {
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

std::shared_ptr<Work> NcclCommunicatorImpl::Barrier() {
  void* p = barrier_buffer_;
  return Issue("Barrier()", 0, -1, {}, [=](ncclComm_t c, cudaStream_t s) {
    return ncclAllReduce(p, p, 1, ncclFloat32, ncclSum, c, s);
  });
}

bool NcclCommunicatorImpl::EqualBlocks(const std::vector<int64_t>& blocks) const {
  if (state_->grouped_blocks) return false;
  return std::all_of(blocks.begin(), blocks.end(), [&](int64_t c) { return c == blocks[0]; });
}

absl::Status NcclCommunicatorImpl::CheckTensor(const Tensor& t, const char* role,
                                               ncclDataType_t* type) const {
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

absl::Status NcclCommunicatorImpl::CheckReducible(const char* op_name, DType t, ReduceOp op) const {
  return CheckReduction(op, t, absl::StrCat("NCCL ", op_name, " on ", state_->Where()));
}

absl::Status NcclCommunicatorImpl::CheckRoot(const char* op, int root) const {
  if (root >= 0 && root < size()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("NCCL ", op, " on ", state_->Where(), ": root ", root, " is out of range"));
}

absl::Status NcclCommunicatorImpl::Blocks(const char* op, int64_t total,
                                          const std::vector<int64_t>& counts,
                                          std::vector<int64_t>* out) const {
  BRAID_ASSIGN_OR_RETURN(
      *out, BlockCounts(absl::StrCat("NCCL ", op, " on ", state_->Where()), total, size(), counts));
  return absl::OkStatus();
}

absl::Status NcclCommunicatorImpl::CheckBlock(const char* role, const Tensor& t, DType dtype,
                                              const std::vector<int64_t>& counts) const {
  if (t.numel() == counts[rank()] && t.dtype() == dtype) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "NCCL ", role, " on ", state_->Where(), " is ", t.DescribeForError(),
      " but must hold this rank's block: ", counts[rank()], " elements of ", DTypeName(dtype)));
}

std::shared_ptr<Work> NcclCommunicatorImpl::Reject(const std::string& what,
                                                   const absl::Status& st) {
  absl::MutexLock lock(&state_->mu);
  int64_t seq = state_->next_seq++;
  state_->Log(absl::StrCat("#", seq, " ", what, " (refused)"));
  return CompletedWork(st);
}

std::shared_ptr<Work> NcclCommunicatorImpl::PointToPoint(bool send, const Tensor& t, int peer,
                                                         int tag) {
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

}  // namespace braid::nccl::internal
