// Running a collective once every rank of the group has arrived: the reductions over the ranks'
// buffers, in each dtype, and the copies each kind of collective makes. Apart from
// in_process_communicator.cc, which checks the calls and brings the ranks together, because this
// is the arithmetic and data movement alone, done outside the group's lock.
#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "backends/in_process/in_process_communicator_internal.h"
#include "core/check.h"

namespace braid::in_process_internal {

namespace {

// ---- Reductions -------------------------------------------------------------------------------

template <typename Acc>
Acc LoadAs(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::kF32:
      return Acc(static_cast<const float*>(p)[i]);
    case DType::kBF16:
      return Acc(BF16ToFloat(static_cast<const uint16_t*>(p)[i]));
    case DType::kF16:
      return Acc(F16ToFloat(static_cast<const uint16_t*>(p)[i]));
    case DType::kI32:
      return Acc(static_cast<const int32_t*>(p)[i]);
    case DType::kI64:
      return Acc(static_cast<const int64_t*>(p)[i]);
    case DType::kU8:
      return Acc(static_cast<const uint8_t*>(p)[i]);
    case DType::kI8:
      return Acc(static_cast<const int8_t*>(p)[i]);
  }
  BRAID_CHECK(false) << "in-process reduction of " << DTypeName(t);
  return Acc();
}

template <typename Acc>
void StoreFrom(void* p, DType t, int64_t i, Acc v) {
  switch (t) {
    case DType::kF32:
      static_cast<float*>(p)[i] = float(v);
      return;
    case DType::kBF16:
      static_cast<uint16_t*>(p)[i] = FloatToBF16(float(v));
      return;
    case DType::kF16:
      static_cast<uint16_t*>(p)[i] = FloatToF16(float(v));
      return;
    case DType::kI32:
      static_cast<int32_t*>(p)[i] = int32_t(v);
      return;
    case DType::kI64:
      static_cast<int64_t*>(p)[i] = int64_t(v);
      return;
    // Narrow integers wrap (the sum is kept in int64 and truncated), as a loop in the dtype
    // itself would and as the Gloo communicator does.
    case DType::kU8:
      static_cast<uint8_t*>(p)[i] = uint8_t(v);
      return;
    case DType::kI8:
      static_cast<int8_t*>(p)[i] = int8_t(v);
      return;
  }
  BRAID_CHECK(false) << "in-process reduction of " << DTypeName(t);
}

// dst[0, n) = op over srcs (in rank order, as a serial loop would) of src[0, n); dst is a buffer
// of the same dtype that aliases no source.
template <typename Acc>
void ReduceTyped(DType t, ReduceOp op, const std::vector<const void*>& srcs, int64_t n, void* dst) {
  std::vector<Acc> acc(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) acc[i] = LoadAs<Acc>(srcs[0], t, i);
  for (size_t r = 1; r < srcs.size(); ++r) {
    for (int64_t i = 0; i < n; ++i) {
      Acc v = LoadAs<Acc>(srcs[r], t, i);
      switch (op) {
        case ReduceOp::kSum:
        case ReduceOp::kAvg:
          acc[i] += v;
          break;
        case ReduceOp::kMax:
          acc[i] = std::max(acc[i], v);
          break;
        case ReduceOp::kMin:
          acc[i] = std::min(acc[i], v);
          break;
      }
    }
  }
  if (op == ReduceOp::kAvg) {
    for (int64_t i = 0; i < n; ++i) acc[i] /= Acc(srcs.size());
  }
  for (int64_t i = 0; i < n; ++i) StoreFrom<Acc>(dst, t, i, acc[i]);
}

void Reduce(DType t, ReduceOp op, const std::vector<const void*>& srcs, int64_t n, void* dst) {
  if (IsFloating(t)) {
    ReduceTyped<float>(t, op, srcs, n, dst);
  } else {
    ReduceTyped<int64_t>(t, op, srcs, n, dst);
  }
}

char* Bytes(const Tensor& t) { return static_cast<char*>(t.raw_data()); }

}  // namespace

void Execute(Group& g, Slot& s) {
  const Signature& sig = s.sig;
  const int n = g.size;
  const size_t elem = SizeOf(sig.dtype);
  // Results go through a scratch buffer first so that outputs may alias inputs in any way.
  std::vector<char> scratch(size_t(sig.numel) * elem);
  std::vector<int64_t> offsets(n + 1, 0);
  for (int r = 0; r < int(sig.counts.size()); ++r) offsets[r + 1] = offsets[r] + sig.counts[r];
  auto sources = [&](const std::vector<Tensor>& ts) {
    std::vector<const void*> p;
    for (const Tensor& t : ts) p.push_back(t.raw_data());
    return p;
  };
  switch (sig.kind) {
    case OpKind::kAllReduce: {
      Reduce(sig.dtype, sig.op, sources(s.in), sig.numel, scratch.data());
      for (int r = 0; r < n; ++r) std::memcpy(Bytes(s.in[r]), scratch.data(), scratch.size());
      break;
    }
    case OpKind::kReduce: {
      Reduce(sig.dtype, sig.op, sources(s.in), sig.numel, scratch.data());
      std::memcpy(Bytes(s.in[sig.root]), scratch.data(), scratch.size());
      break;
    }
    case OpKind::kReduceScatter: {
      Reduce(sig.dtype, sig.op, sources(s.in), sig.numel, scratch.data());
      for (int r = 0; r < n; ++r) {
        std::memcpy(Bytes(s.out[r]), scratch.data() + offsets[r] * elem, sig.counts[r] * elem);
      }
      break;
    }
    case OpKind::kAllGather: {
      for (int r = 0; r < n; ++r) {
        std::memcpy(scratch.data() + offsets[r] * elem, Bytes(s.in[r]), sig.counts[r] * elem);
      }
      for (int r = 0; r < n; ++r) std::memcpy(Bytes(s.out[r]), scratch.data(), scratch.size());
      break;
    }
    case OpKind::kBroadcast: {
      std::memcpy(scratch.data(), Bytes(s.in[sig.root]), scratch.size());
      for (int r = 0; r < n; ++r) {
        if (r != sig.root) std::memcpy(Bytes(s.in[r]), scratch.data(), scratch.size());
      }
      break;
    }
    case OpKind::kBarrier:
      break;
    case OpKind::kNewGroup: {
      int id;
      {
        absl::MutexLock lock(&g.mu);
        id = g.num_children++;
      }
      s.child = std::make_shared<Group>(
          absl::StrCat(g.name, "/sub", id, "[", absl::StrJoin(sig.ranks, ","), "]"),
          int(sig.ranks.size()));
      break;
    }
  }
}

}  // namespace braid::in_process_internal
