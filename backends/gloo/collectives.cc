// The collectives' bodies: which algorithm each takes, the bf16/f16 up-casts around the
// reductions, and the calls into Gloo.
#include "backends/gloo/collectives.h"

#include <gloo/allgather.h>
#include <gloo/allgatherv.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/context.h>
#include <gloo/reduce.h>
#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>

#include <algorithm>
#include <cstring>

#include "backends/gloo/ring.h"
#include "backends/gloo/slots.h"
#include "core/check.h"

namespace braid::gloo_backend::internal {
namespace {

// An element of N bytes: Gloo's templated setters only look at sizeof(T).
template <size_t N>
struct Elem {
  char b[N];
};

template <typename F>
void WithElemSize(size_t size, F&& f) {
  switch (size) {
    case 1:
      return f(Elem<1>{});
    case 2:
      return f(Elem<2>{});
    case 4:
      return f(Elem<4>{});
    case 8:
      return f(Elem<8>{});
  }
  BRAID_CHECK(false) << "gloo communicator: element size " << size;
}

char* Bytes(const Tensor& t) { return static_cast<char*>(t.raw_data()); }

}  // namespace

ReduceFn Collectives::Fn(DType t, ReduceOp op) {
  ReduceFn fn = NativeReduceFn(t, op);
  BRAID_CHECK(fn != nullptr) << "no native reduction for " << DTypeName(t);
  return fn;
}

// In place on `data` (n elements of native dtype t).
void Collectives::AllReduceNative(void* data, size_t n, DType t, ReduceOp op, int64_t seq) {
  if (n == 0 || size() == 1) return;
  const size_t bytes = n * SizeOf(t);
  const Settings& s = core_->settings;
  AllreduceAlgorithm algo = s.allreduce;
  if (algo == AllreduceAlgorithm::kAuto) {
    algo = bytes * size_t(size() - 1) <= s.direct_max_bytes ? AllreduceAlgorithm::kDirect
           : bytes <= s.bcube_max_bytes                     ? AllreduceAlgorithm::kBcube
                                                            : AllreduceAlgorithm::kRing;
  }
  if (algo == AllreduceAlgorithm::kDirect) {
    DirectAllReduce(static_cast<char*>(data), bytes, SizeOf(t), Fn(t, op), seq);
    return;
  }
  ::gloo::AllreduceOptions o(core_->context);
  WithElemSize(SizeOf(t), [&](auto e) {
    using E = decltype(e);
    o.setOutput<E>(static_cast<E*>(data), n);
  });
  o.setReduceFunction(Fn(t, op));
  o.setTag(uint32_t(seq));
  o.setTimeout(Ms(op_timeout_));
  o.setMaxSegmentSize(s.segment_bytes);
  o.setAlgorithm(algo == AllreduceAlgorithm::kBcube ? ::gloo::AllreduceOptions::Algorithm::BCUBE
                                                    : ::gloo::AllreduceOptions::Algorithm::RING);
  ::gloo::allreduce(o);
}

// Small buffers: every rank sends its whole buffer to every other rank, then reduces all of
// them in rank order (so every rank computes bit-identical results). One message latency
// instead of the ring's 2(n-1) or more; (n-1) times the buffer in traffic, hence small only.
void Collectives::DirectAllReduce(char* data, size_t bytes, size_t elem, ReduceFn fn, int64_t seq) {
  const int n = size(), me = rank();
  const uint64_t slot = ::gloo::Slot::build(kDirectAllreduceSlotPrefix, uint32_t(seq));
  const std::chrono::milliseconds timeout = Ms(op_timeout_);
  char* all = ring_.Get<char>(bytes * size_t(n));  // rank q's buffer at q * bytes
  auto mine = core_->context->createUnboundBuffer(data, bytes);
  auto others = core_->context->createUnboundBuffer(all, bytes * size_t(n));
  for (int q = 0; q < n; ++q) {
    if (q == me) continue;
    others->recv(q, slot, size_t(q) * bytes, bytes);
    mine->send(q, slot);
  }
  std::memcpy(all + size_t(me) * bytes, data, bytes);
  for (int q = 0; q < n - 1; ++q) others->waitRecv(timeout);
  for (int q = 0; q < n - 1; ++q) mine->waitSend(timeout);
  fn(data, all, all + bytes, bytes / elem);
  for (int q = 2; q < n; ++q) fn(data, data, all + size_t(q) * bytes, bytes / elem);
}

void Collectives::RunAllReduce(const Tensor& t, ReduceOp op, int64_t seq) {
  const size_t n = size_t(t.numel());
  if (n == 0) return;
  const DType dt = t.dtype();
  if (NativeReduceFn(dt, op) != nullptr) {
    AllReduceNative(t.raw_data(), n, dt, op, seq);
    if (op == ReduceOp::kAvg) DivideInPlace(static_cast<float*>(t.raw_data()), n, float(size()));
    return;
  }
  float* f = upcast_in_.Get<float>(n);
  UpcastToF32(dt, t.raw_data(), f, n);
  AllReduceNative(f, n, DType::kF32, op, seq);
  if (op == ReduceOp::kAvg) DivideInPlace(f, n, float(size()));
  DowncastFromF32(dt, f, t.raw_data(), n);
}

void Collectives::RunReduceScatter(const Tensor& in, const Tensor& out, ReduceOp op,
                                   const std::vector<int64_t>& counts, int64_t seq) {
  const DType dt = in.dtype();
  const size_t mine = size_t(counts[rank()]);
  const uint64_t slot = ::gloo::Slot::build(kReduceScatterSlotPrefix, uint32_t(seq));
  if (NativeReduceFn(dt, op) != nullptr) {
    RingReduceScatter(*core_->context, Bytes(in), Bytes(out), counts, SizeOf(dt), Fn(dt, op), slot,
                      Ms(op_timeout_), core_->settings.segment_bytes, ring_);
    if (op == ReduceOp::kAvg)
      DivideInPlace(static_cast<float*>(out.raw_data()), mine, float(size()));
    return;
  }
  const size_t n = size_t(in.numel());
  float* fin = upcast_in_.Get<float>(n);
  float* fout = upcast_out_.Get<float>(std::max<size_t>(mine, 1));
  UpcastToF32(dt, in.raw_data(), fin, n);
  RingReduceScatter(*core_->context, reinterpret_cast<const char*>(fin),
                    reinterpret_cast<char*>(fout), counts, sizeof(float), Fn(DType::kF32, op), slot,
                    Ms(op_timeout_), core_->settings.segment_bytes, ring_);
  if (op == ReduceOp::kAvg) DivideInPlace(fout, mine, float(size()));
  DowncastFromF32(dt, fout, out.raw_data(), mine);
}

void Collectives::RunAllGather(const Tensor& in, const Tensor& out,
                               const std::vector<int64_t>& counts, bool equal, int64_t seq) {
  const size_t elem = SizeOf(out.dtype());
  size_t my_offset = 0;
  for (int q = 0; q < rank(); ++q) my_offset += size_t(counts[q]) * elem;
  char* my_block = Bytes(out) + my_offset;
  const size_t my_bytes = size_t(counts[rank()]) * elem;
  // An input that is this rank's block of the output (ZeRO's layout) needs no copy.
  const bool in_place = Bytes(in) == my_block;
  if (out.nbytes() == 0) return;
  if (size() == 1) {
    if (!in_place) std::memmove(my_block, Bytes(in), my_bytes);
    return;
  }
  if (equal) {
    ::gloo::AllgatherOptions o(core_->context);
    if (!in_place) o.setInput<Elem<1>>(reinterpret_cast<Elem<1>*>(Bytes(in)), my_bytes);
    o.setOutput<Elem<1>>(reinterpret_cast<Elem<1>*>(Bytes(out)), out.nbytes());
    o.setTag(uint32_t(seq));
    o.setTimeout(Ms(op_timeout_));
    ::gloo::allgather(o);
    return;
  }
  if (!in_place) std::memcpy(my_block, Bytes(in), my_bytes);
  ::gloo::AllgathervOptions o(core_->context);
  std::vector<size_t> elements;
  for (int64_t c : counts) elements.push_back(size_t(c) * elem);
  o.setOutput<Elem<1>>(reinterpret_cast<Elem<1>*>(Bytes(out)), elements);
  o.setTag(uint32_t(seq));
  o.setTimeout(Ms(op_timeout_));
  ::gloo::allgatherv(o);
}

void Collectives::RunReduce(const Tensor& t, int root, ReduceOp op, int64_t seq) {
  const size_t n = size_t(t.numel());
  if (n == 0) return;
  const DType dt = t.dtype();
  const bool native = NativeReduceFn(dt, op) != nullptr;
  void* data = t.raw_data();
  float* f = nullptr;
  if (!native) {
    f = upcast_in_.Get<float>(n);
    UpcastToF32(dt, data, f, n);
    data = f;
  }
  if (size() > 1) {
    ::gloo::ReduceOptions o(core_->context);
    const DType rt = native ? dt : DType::kF32;
    WithElemSize(SizeOf(rt), [&](auto e) {
      using E = decltype(e);
      o.setOutput<E>(static_cast<E*>(data), n);
    });
    o.setRoot(root);
    o.setReduceFunction(Fn(rt, op));
    o.setTag(uint32_t(seq));
    o.setTimeout(Ms(op_timeout_));
    o.setMaxSegmentSize(core_->settings.segment_bytes);
    ::gloo::reduce(o);
  }
  if (rank() != root) return;
  if (op == ReduceOp::kAvg) DivideInPlace(static_cast<float*>(data), n, float(size()));
  if (!native) DowncastFromF32(dt, f, t.raw_data(), n);
}

void Collectives::RunBroadcast(const Tensor& tensor, int root, int64_t seq) {
  if (tensor.numel() == 0 || size() == 1) return;
  ::gloo::BroadcastOptions o(core_->context);
  o.setOutput<Elem<1>>(reinterpret_cast<Elem<1>*>(Bytes(tensor)), tensor.nbytes());
  o.setRoot(root);
  o.setTag(uint32_t(seq));
  o.setTimeout(Ms(op_timeout_));
  ::gloo::broadcast(o);
}

void Collectives::RunBarrier(int64_t seq) {
  if (size() == 1) return;
  ::gloo::BarrierOptions o(core_->context);
  o.setTag(uint32_t(seq));
  o.setTimeout(Ms(op_timeout_));
  ::gloo::barrier(o);
}

}  // namespace braid::gloo_backend::internal
