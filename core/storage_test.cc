// The sanctioned ways a strategy re-homes, releases and refills a parameter's storage, and
// deferred initialisation (core/tensor.h, core/deferred_init.h).
#include <cstdint>
#include <vector>

#include "core/allocator.h"
#include "core/autograd.h"
#include "core/deferred_init.h"
#include "core/ops.h"
#include "core/tensor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace braid {
namespace {

std::vector<float> Iota(int64_t n, float start = 0) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = start + float(i);
  return v;
}

// A parameter moved into a flat buffer keeps its identity: the model's handle, the optimizer's
// and the name all see the new home; the old gradient is dropped.
TEST(RebindTo, EveryHandleFollowsTheNewHome) {
  Tensor p = Tensor::FromVector(Iota(6), {2, 3});
  p.set_name("w").set_requires_grad(true);
  Tensor handle = p;  // e.g. the model's
  p.set_grad(Tensor::Full({2, 3}, 1.0f));
  Tensor flat = Tensor::FromVector(Iota(10, 100), {10});
  p.RebindTo(flat.FlatRange(4, 6, {2, 3}));
  EXPECT_EQ(handle.ToFloatVector(), (std::vector<float>{104, 105, 106, 107, 108, 109}));
  EXPECT_EQ(handle.storage(), flat.storage());
  EXPECT_EQ(handle.storage_offset(), 4);
  EXPECT_EQ(handle.name(), "w");
  EXPECT_FALSE(handle.grad().defined());
  // Writes through the flat buffer show in the parameter.
  flat.FlatRange(4, 1).Fill(-1.0f);
  EXPECT_EQ(p.ToFloatVector()[0], -1.0f);
}

TEST(RebindTo, ShapeOrDTypeMismatchIsFatal) {
  Tensor p = Tensor::Zeros({2, 3});
  Tensor q = Tensor::Zeros({6});
  EXPECT_DEATH(p.RebindTo(q), "cannot become a view of");
  EXPECT_DEATH(p.RebindTo(Tensor::Zeros({2, 3}, DType::kI32)), "shape and dtype must match");
}

TEST(MoveTo, MovesValuesAndKeepsIdentity) {
  Tensor p = Tensor::FromVector(Iota(4), {4});
  Tensor handle = p;
  p.MoveTo(Device::CPU(1));
  EXPECT_EQ(handle.device(), Device::CPU(1));
  EXPECT_EQ(handle.ToFloatVector(), Iota(4));
}

// Released memory goes back to the allocator; every view (a saved tensor of the autograd graph
// included) sees the values written after the refill.
TEST(StorageRelease, ViewsSeeRefilledValuesAndMemoryIsReturned) {
  const Device dev = Device::CPU(7);
  Tensor flat = Tensor::FromVector(Iota(1024), {1024}, dev);
  Tensor view = flat.FlatRange(10, 4);
  Tensor saved = view.Detach();  // what an op saves for backward
  const int64_t before = GetMemoryStats(dev).current_bytes;
  flat.storage()->Release();
  EXPECT_FALSE(flat.has_data());
  EXPECT_FALSE(saved.has_data());
  EXPECT_EQ(GetMemoryStats(dev).current_bytes, before - 4096);
  flat.storage()->Release();  // idempotent
  EXPECT_EQ(GetMemoryStats(dev).current_bytes, before - 4096);
  flat.storage()->Reallocate();
  EXPECT_EQ(GetMemoryStats(dev).current_bytes, before);
  flat.CopyFrom(Tensor::FromVector(Iota(1024, 5000), {1024}));
  EXPECT_EQ(saved.ToFloatVector(), (std::vector<float>{5010, 5011, 5012, 5013}));
}

TEST(StorageRelease, ReadingReleasedMemoryIsFatalAndNamesTheTensor) {
  Tensor p = Tensor::Zeros({3});
  p.set_name("h.0.mlp.c_fc.weight");
  p.storage()->Release();
  EXPECT_DEATH(p.ToFloatVector(), "'h.0.mlp.c_fc.weight' f32\\[3\\].*storage is released");
}

TEST(StorageRelease, UnallocatedTensorHasShapeButNoMemory) {
  const Device dev = Device::CPU(8);
  const int64_t before = GetMemoryStats(dev).current_bytes;
  Tensor t = Tensor::Unallocated({1000, 1000}, DType::kF32, dev);
  EXPECT_EQ(t.numel(), 1000000);
  EXPECT_FALSE(t.has_data());
  EXPECT_EQ(GetMemoryStats(dev).current_bytes, before);
}

// An initializer that depends on the whole prefix (as a random stream does).
Initializer Prefix(float seed) {
  return [seed](float* out, int64_t begin, int64_t end) {
    float acc = seed;
    for (int64_t i = 0; i < end; ++i) {
      acc = acc * 0.5f + float(i);
      if (i >= begin) out[i - begin] = acc;
    }
  };
}

TEST(DeferredInit, OutsideAScopeParametersAreFilledAtOnce) {
  EXPECT_FALSE(InDeferredInit());
  Tensor p = MakeParameter({2, 2}, Prefix(1.0f), Device::CPU());
  EXPECT_TRUE(p.has_data());
  EXPECT_FALSE(IsDeferred(p));
  std::vector<float> want(4);
  Prefix(1.0f)(want.data(), 0, 4);
  EXPECT_EQ(p.ToFloatVector(), want);
  EXPECT_EQ(MakeConstantParameter({3}, 2.5f, Device::CPU()).ToFloatVector(),
            (std::vector<float>{2.5f, 2.5f, 2.5f}));
}

TEST(DeferredInit, AnyRangeEqualsTheFullInitialisation) {
  const Device dev = Device::CPU(9);
  const int64_t before = GetMemoryStats(dev).current_bytes;
  Tensor p, c;
  {
    DeferredInitScope scope;
    EXPECT_TRUE(InDeferredInit());
    p = MakeParameter({5, 7}, Prefix(3.0f), dev);
    c = MakeConstantParameter({4}, 1.0f, dev);
  }
  EXPECT_FALSE(InDeferredInit());
  EXPECT_TRUE(IsDeferred(p));
  EXPECT_TRUE(IsDeferred(c));
  EXPECT_EQ(GetMemoryStats(dev).current_bytes, before);  // nothing allocated yet
  std::vector<float> full(35);
  Prefix(3.0f)(full.data(), 0, 35);
  for (auto [b, e] : {std::pair<int64_t, int64_t>{0, 35}, {0, 1}, {12, 20}, {34, 35}, {7, 7}}) {
    std::vector<float> part(size_t(e - b), -1.0f);
    InitialValues(p, b, e, part.data());
    EXPECT_EQ(part, std::vector<float>(full.begin() + b, full.begin() + e)) << b << ".." << e;
  }
  Materialize(p);
  Materialize(c);
  EXPECT_FALSE(IsDeferred(p));
  EXPECT_EQ(p.ToFloatVector(), full);
  EXPECT_EQ(c.ToFloatVector(), (std::vector<float>{1, 1, 1, 1}));
  Materialize(p);  // no-op
  EXPECT_EQ(p.ToFloatVector(), full);
}

TEST(DeferredInit, ScopesNestAndRestore) {
  {
    DeferredInitScope a;
    {
      DeferredInitScope b;
      EXPECT_TRUE(InDeferredInit());
    }
    EXPECT_TRUE(InDeferredInit());
  }
  EXPECT_FALSE(InDeferredInit());
}

TEST(WeightDecayAttribute, DefaultsOnAndIsKeptPerTensor) {
  Tensor w = Tensor::Zeros({2, 2});
  EXPECT_TRUE(w.weight_decay());
  Tensor b = Tensor::Zeros({2});
  b.set_weight_decay(false);
  Tensor handle = b;
  EXPECT_FALSE(handle.weight_decay());
}

}  // namespace
}  // namespace braid
