#include "core/tensor.h"

#include <cstdint>
#include <vector>

#include "core/allocator.h"
#include "core/autograd.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace braid {
namespace {

using ::testing::HasSubstr;

std::vector<float> Iota(int64_t n, float start = 0) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = start + float(i);
  return v;
}

TEST(TensorTest, Creation) {
  Tensor e = Tensor::Empty({2, 3, 4}, DType::kBF16);
  EXPECT_EQ(e.shape(), (Shape{2, 3, 4}));
  EXPECT_EQ(e.ndim(), 3);
  EXPECT_EQ(e.numel(), 24);
  EXPECT_EQ(e.nbytes(), 48u);
  EXPECT_EQ(e.size(-1), 4);
  EXPECT_EQ(e.size(0), 2);
  EXPECT_EQ(e.dtype(), DType::kBF16);
  EXPECT_EQ(e.device(), Device::CPU());
  EXPECT_FALSE(e.requires_grad());
  EXPECT_TRUE(e.is_leaf());

  EXPECT_EQ(Tensor::Zeros({3}).ToFloatVector(), (std::vector<float>{0, 0, 0}));
  EXPECT_EQ(Tensor::Full({2}, 2.5f).ToFloatVector(), (std::vector<float>{2.5f, 2.5f}));
  EXPECT_EQ(Tensor::Full({2}, 7.0f, DType::kI32).ToVector<int32_t>(),
            (std::vector<int32_t>{7, 7}));
  EXPECT_EQ(Tensor::Full({2}, 1.5f, DType::kF16).ToFloatVector(),
            (std::vector<float>{1.5f, 1.5f}));
  Tensor s = Tensor::Scalar(4.0f);
  EXPECT_EQ(s.ndim(), 0);
  EXPECT_EQ(s.numel(), 1);
  EXPECT_EQ(s.item(), 4.0f);
  Tensor ids = Tensor::FromVector<int32_t>({3, 1, 4, 1}, {2, 2});
  EXPECT_EQ(ids.dtype(), DType::kI32);
  EXPECT_EQ(ids.ToVector<int32_t>(), (std::vector<int32_t>{3, 1, 4, 1}));
  Tensor z = Tensor::Zeros({0, 5});
  EXPECT_EQ(z.numel(), 0);
  EXPECT_TRUE(z.ToFloatVector().empty());
  EXPECT_FALSE(Tensor().defined());
}

TEST(TensorTest, ReshapeInfersAndSharesStorage) {
  Tensor t = Tensor::FromVector(Iota(12), {3, 4});
  Tensor r = t.Reshape({2, -1, 3});
  EXPECT_EQ(r.shape(), (Shape{2, 2, 3}));
  EXPECT_EQ(r.storage(), t.storage());
  EXPECT_EQ(r.raw_data(), t.raw_data());
  r.data<float>()[5] = 100.0f;
  EXPECT_EQ(t.ToFloatVector()[5], 100.0f);
  EXPECT_EQ(t.Reshape({-1}).shape(), (Shape{12}));
  EXPECT_EQ(t.Reshape({12, -1}).shape(), (Shape{12, 1}));
  EXPECT_EQ(Tensor::Scalar(1).Reshape({1, 1}).shape(), (Shape{1, 1}));
}

TEST(TensorTest, SliceAndFlatRangeAreViews) {
  Tensor t = Tensor::FromVector(Iota(12), {4, 3});
  Tensor s = t.Slice(1, 3);
  EXPECT_EQ(s.shape(), (Shape{2, 3}));
  EXPECT_EQ(s.storage_offset(), 3);
  EXPECT_EQ(s.ToFloatVector(), (std::vector<float>{3, 4, 5, 6, 7, 8}));
  s.Fill(-1.0f);
  EXPECT_EQ(t.ToFloatVector(), (std::vector<float>{0, 1, 2, -1, -1, -1, -1, -1, -1, 9, 10, 11}));
  EXPECT_EQ(t.Slice(4, 4).numel(), 0);

  // A slice of a slice and a flat range of that: offsets compose.
  Tensor f = t.Reshape({12}).FlatRange(2, 8).Slice(1, 7).FlatRange(2, 4, {2, 2});
  EXPECT_EQ(f.shape(), (Shape{2, 2}));
  EXPECT_EQ(f.storage_offset(), 5);
  EXPECT_EQ(f.storage(), t.storage());
  f.CopyFrom(Tensor::FromVector<float>({50, 60, 70, 80}, {4}));
  EXPECT_EQ(t.ToFloatVector(),
            (std::vector<float>{0, 1, 2, -1, -1, 50, 60, 70, 80, 9, 10, 11}));
}

TEST(TensorTest, DetachSharesDataButNotHistory) {
  Tensor w = Tensor::FromVector<float>({1, 2}, {2}).set_name("w");
  w.set_requires_grad(true);
  Tensor d = w.Detach();
  EXPECT_FALSE(d.requires_grad());
  EXPECT_FALSE(d.SameAs(w));
  EXPECT_EQ(d.raw_data(), w.raw_data());
  EXPECT_EQ(d.name(), "w");
  d.data<float>()[0] = 5;
  EXPECT_EQ(w.ToFloatVector()[0], 5.0f);
  Tensor view = w.Reshape({1, 2});
  EXPECT_TRUE(view.requires_grad());
  EXPECT_FALSE(view.is_leaf());
  EXPECT_EQ(view.grad_fn()->name(), "Reshape");
  EXPECT_TRUE(view.Detach().is_leaf());
}

TEST(TensorTest, CloneCopiesAndToConverts) {
  Tensor t = Tensor::FromVector<float>({1.0f, 1.00390625f, -3.0f, 65536.0f}, {2, 2});
  Tensor c = t.Clone();
  EXPECT_NE(c.storage(), t.storage());
  EXPECT_EQ(c.ToFloatVector(), t.ToFloatVector());
  c.Fill(0.0f);
  EXPECT_EQ(t.ToFloatVector()[0], 1.0f);

  EXPECT_TRUE(t.To(DType::kF32).SameAs(t));  // no copy when nothing changes
  Tensor b = t.To(DType::kBF16);
  EXPECT_EQ(b.dtype(), DType::kBF16);
  EXPECT_EQ(b.shape(), t.shape());
  const uint16_t* raw = static_cast<const uint16_t*>(b.raw_data());
  std::vector<float> tv = t.ToFloatVector();
  for (int i = 0; i < 4; ++i) EXPECT_EQ(raw[i], FloatToBF16(tv[size_t(i)])) << i;
  // 1 + 2^-8 is a bf16 tie that rounds to even (1.0).
  EXPECT_EQ(b.ToFloatVector(), (std::vector<float>{1.0f, 1.0f, -3.0f, 65536.0f}));
  Tensor h = t.To(DType::kF16);
  EXPECT_EQ(h.ToFloatVector()[1], 1.00390625f);  // exact in f16
  EXPECT_TRUE(std::isinf(h.ToFloatVector()[3]));  // past f16's range
  Tensor back = b.To(DType::kF32);
  EXPECT_EQ(back.ToFloatVector(), b.ToFloatVector());
  Tensor ints = Tensor::FromVector<float>({3.0f, -2.0f}, {2}).To(DType::kI32);
  EXPECT_EQ(ints.ToVector<int32_t>(), (std::vector<int32_t>{3, -2}));
}

TEST(TensorTest, AllocatorAccountsPerDevice) {
  const Device cpu1 = Device::CPU(1);
  MemoryStats before0 = GetMemoryStats(Device::CPU(0));
  MemoryStats before1 = GetMemoryStats(cpu1);
  GetAllocator(cpu1)->ResetPeak();
  before1 = GetMemoryStats(cpu1);
  {
    Tensor a = Tensor::Empty({10, 10}, DType::kF32, cpu1);  // 400 bytes
    EXPECT_EQ(a.device(), cpu1);
    MemoryStats s = GetMemoryStats(cpu1);
    EXPECT_EQ(s.current_bytes, before1.current_bytes + 400);
    EXPECT_EQ(s.num_allocs, before1.num_allocs + 1);
    {
      Tensor b = Tensor::Empty({50}, DType::kBF16, cpu1);  // 100 bytes
      Tensor view = b.Reshape({5, 10});                  // views allocate nothing
      EXPECT_EQ(GetMemoryStats(cpu1).current_bytes, before1.current_bytes + 500);
      EXPECT_EQ(GetMemoryStats(cpu1).num_allocs, before1.num_allocs + 2);
    }
    s = GetMemoryStats(cpu1);
    EXPECT_EQ(s.current_bytes, before1.current_bytes + 400);
    EXPECT_EQ(s.peak_bytes, before1.current_bytes + 500);
  }
  MemoryStats after1 = GetMemoryStats(cpu1);
  EXPECT_EQ(after1.current_bytes, before1.current_bytes);
  EXPECT_EQ(after1.peak_bytes, before1.current_bytes + 500);
  // Nothing of that touched cpu:0.
  EXPECT_EQ(GetMemoryStats(Device::CPU(0)).current_bytes, before0.current_bytes);
  EXPECT_EQ(GetMemoryStats(Device::CPU(0)).num_allocs, before0.num_allocs);
  GetAllocator(cpu1)->ResetPeak();
  EXPECT_EQ(GetMemoryStats(cpu1).peak_bytes, after1.current_bytes);
}

TEST(TensorTest, CopyAcrossCpuDevices) {
  const Device cpu1 = Device::CPU(1);
  Tensor a = Tensor::FromVector<float>({1, 2, 3}, {3});
  Tensor b = a.To(cpu1);
  EXPECT_EQ(b.device(), cpu1);
  EXPECT_NE(b.storage(), a.storage());
  EXPECT_EQ(b.ToFloatVector(), a.ToFloatVector());
  Tensor c = Tensor::FromVector<float>({4, 5}, {2}, cpu1);
  EXPECT_EQ(c.device(), cpu1);
  EXPECT_EQ(c.ToFloatVector(), (std::vector<float>{4, 5}));
  EXPECT_EQ(Device::Parse("cpu:1").value(), cpu1);
  EXPECT_EQ(cpu1.ToString(), "cpu:1");
  EXPECT_FALSE(Device::Parse("tpu:0").ok());
}

TEST(TensorTest, DescribesItselfForErrors) {
  Tensor t = Tensor::Zeros({2, 3});
  EXPECT_EQ(t.DescribeForError(), "f32[2,3] on cpu:0");
  t.set_name("h.0.attn.c_attn.weight");
  EXPECT_EQ(t.DescribeForError(), "'h.0.attn.c_attn.weight' f32[2,3] on cpu:0");
  EXPECT_THAT(t.ToString(), HasSubstr("0, 0, 0"));
  EXPECT_EQ(Tensor().DescribeForError(), "<undefined tensor>");
}

using TensorDeathTest = ::testing::Test;

TEST(TensorDeathTest, BadReshapesNameTheTensorAndShape) {
  Tensor t = Tensor::Zeros({2, 3}).set_name("x");
  EXPECT_DEATH(t.Reshape({4, 2}), HasSubstr("cannot reshape 'x' f32[2,3] on cpu:0 to [4,2]"));
  EXPECT_DEATH(t.Reshape({4, -1}), HasSubstr("cannot reshape 'x' f32[2,3] on cpu:0 to [4,-1]"));
  EXPECT_DEATH(t.Reshape({-1, -1}), HasSubstr("only one -1 allowed"));
  EXPECT_DEATH(t.Reshape({4, 2}), HasSubstr("core/tensor.cc:"));  // checks name file:line
}

TEST(TensorDeathTest, BadViewsAndAccessDie) {
  Tensor t = Tensor::Zeros({4, 3});
  EXPECT_DEATH(t.Slice(2, 5), HasSubstr("slice [2, 5) out of range for f32[4,3] on cpu:0"));
  EXPECT_DEATH(t.FlatRange(10, 3), HasSubstr("flat range [10, 13) out of range"));
  EXPECT_DEATH(t.FlatRange(0, 4, {3}), HasSubstr("flat range of 4 elements viewed as [3]"));
  EXPECT_DEATH(t.item(), HasSubstr("needs exactly one element"));
  EXPECT_DEATH(t.data<int32_t>(), HasSubstr("accessed as i32"));
  EXPECT_DEATH(t.size(2), HasSubstr("dimension 2 out of range"));
  Tensor ids = Tensor::Zeros({2}, DType::kI32);
  EXPECT_DEATH(ids.set_requires_grad(true), HasSubstr("only floating tensors can require grad"));
  EXPECT_DEATH(t.CopyFrom(Tensor::Zeros({5})), HasSubstr("element counts differ"));
}

}  // namespace
}  // namespace braid
