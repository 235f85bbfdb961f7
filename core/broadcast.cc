#include "core/broadcast.h"

#include <map>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/autograd.h"

namespace braid {

absl::Status BroadcastTensors(const std::vector<Tensor>& tensors, Communicator& comm, int root,
                              int64_t cap_bytes) {
  if (comm.size() == 1) return absl::OkStatus();
  // One flat buffer holds one dtype on one device; the groups keep the callers' order within.
  std::map<std::pair<int, std::string>, std::vector<Tensor>> groups;
  for (const Tensor& t : tensors) groups[{int(t.dtype()), t.device().ToString()}].push_back(t);
  autograd::NoGradGuard no_grad;
  for (auto& [key, members] : groups) {
    size_t begin = 0;
    while (begin < members.size()) {
      size_t end = begin;
      int64_t numel = 0;
      while (end < members.size() &&
             (end == begin ||
              (numel + members[end].numel()) * int64_t(SizeOf(members[end].dtype())) <= cap_bytes)) {
        numel += members[end].numel();
        ++end;
      }
      Tensor flat = Tensor::Empty({numel}, members[begin].dtype(), members[begin].device());
      int64_t off = 0;
      for (size_t i = begin; i < end; ++i) {
        flat.FlatRange(off, members[i].numel()).CopyFrom(members[i]);
        off += members[i].numel();
      }
      absl::Status s = comm.Broadcast(flat, root)->Wait();
      if (!s.ok()) {
        return absl::Status(s.code(), absl::StrCat("broadcasting rank ", root, "'s ", end - begin,
                                                   " tensor(s): ", s.message()));
      }
      off = 0;
      for (size_t i = begin; i < end; ++i) {
        Tensor dst = members[i];
        dst.CopyFrom(flat.FlatRange(off, members[i].numel()));
        off += members[i].numel();
      }
      begin = end;
    }
  }
  return absl::OkStatus();
}

absl::Status BroadcastModuleState(const Module& model, Communicator& comm, int root,
                                  int64_t cap_bytes) {
  std::vector<Tensor> state;
  for (const auto& [n, p] : model.NamedParameters()) state.push_back(p);
  for (const auto& [n, b] : model.NamedBuffers()) state.push_back(b);
  return BroadcastTensors(state, comm, root, cap_bytes);
}

}  // namespace braid
