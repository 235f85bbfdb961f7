#include "core/autograd.h"

#include <cmath>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/allocator.h"
#include "core/ops.h"
#include "core/testing/test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace braid::autograd {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using test::AllClose;
using test::ToDoubles;

Tensor Leaf(const std::vector<float>& v) {
  Tensor t = Tensor::FromVector(v, {int64_t(v.size())});
  t.set_requires_grad(true);
  return t;
}

Tensor Ones(const Tensor& like) { return Tensor::Full(like.shape(), 1.0f); }

// y = x^3 as a user-defined function: the forward runs without recording, the backward is ours.
Tensor Cube(const Tensor& x, int* backward_calls = nullptr) {
  std::shared_ptr<Tensor> saved = std::make_shared<Tensor>();
  std::vector<Tensor> out = ApplyFunction(
      "Cube", {x},
      [saved](const std::vector<Tensor>& in) {
        EXPECT_FALSE(GradEnabled());
        EXPECT_FALSE(in[0].requires_grad());
        *saved = in[0];
        return std::vector<Tensor>{ops::Mul(ops::Mul(in[0], in[0]), in[0])};
      },
      [saved, backward_calls](const std::vector<Tensor>& g) {
        if (backward_calls) ++*backward_calls;
        Tensor three_x2 = ops::Scale(ops::Mul(*saved, *saved), 3.0f);
        return std::vector<Tensor>{ops::Mul(g[0], three_x2)};
      });
  return out[0];
}

TEST(AutogradTest, DiamondGraphAddsBothPaths) {
  Tensor x = Leaf({0.3f, -0.7f, 1.1f});
  // a feeds y along two paths: y = exp(a) + 3a with a = tanh(x).
  Tensor a = ops::Tanh(x);
  Tensor y = ops::Add(ops::Exp(a), ops::Scale(a, 3.0f));
  y.Backward(Ones(y));
  std::vector<double> want;
  for (double v : ToDoubles(x)) {
    double t = std::tanh(v);
    want.push_back((std::exp(t) + 3.0) * (1.0 - t * t));
  }
  EXPECT_TRUE(AllClose(x.grad(), want, 1e-5, 1e-6));
}

TEST(AutogradTest, GradientsAccumulateUntilZeroGrad) {
  Tensor x = Leaf({1.0f, 2.0f});
  ops::Sum(ops::Scale(x, 2.0f)).Backward();
  ops::Sum(ops::Scale(x, 2.0f)).Backward();
  EXPECT_EQ(x.grad().ToFloatVector(), (std::vector<float>{4, 4}));
  ops::Sum(ops::Scale(x, 0.5f)).Backward();
  EXPECT_EQ(x.grad().ToFloatVector(), (std::vector<float>{4.5f, 4.5f}));
  x.ZeroGrad();
  EXPECT_FALSE(x.grad().defined());
  ops::Sum(ops::Scale(x, 2.0f)).Backward();
  EXPECT_EQ(x.grad().ToFloatVector(), (std::vector<float>{2, 2}));
}

TEST(AutogradTest, AccumulatedGradDoesNotAliasTheIncomingGradient) {
  // Backward of Sum hands the seed to x's accumulator; .grad must be x's own buffer, or the
  // next accumulation would write into the caller's seed tensor.
  Tensor x = Leaf({1.0f, 2.0f});
  Tensor seed = Tensor::FromVector<float>({1, 1}, {2});
  ops::Add(x, Tensor::Zeros({2})).Backward(seed);
  ops::Add(x, Tensor::Zeros({2})).Backward(seed);
  EXPECT_EQ(seed.ToFloatVector(), (std::vector<float>{1, 1}));
  EXPECT_EQ(x.grad().ToFloatVector(), (std::vector<float>{2, 2}));
}

// A function of x whose backward hands back `make()`'s tensor as x's gradient (forward: x).
Tensor GradFrom(const Tensor& x, std::function<Tensor()> make) {
  return ApplyFunction(
      "GradFrom", {x}, [](const std::vector<Tensor>& in) { return std::vector<Tensor>{in[0].Clone()}; },
      [make](const std::vector<Tensor>&) { return std::vector<Tensor>{make()}; })[0];
}

// The first gradient a leaf gets is kept as it is, without a copy, when the backward made it
// for the leaf alone; a gradient someone else still holds (the seed, a tensor a backward kept,
// a view into a larger buffer) is copied, so that .grad never shares memory a caller may write.
TEST(AutogradTest, FirstGradientIsKeptWithoutACopyOnlyWhenNothingElseHoldsIt) {
  {  // made for x alone: kept
    Tensor x = Leaf({1.0f, 2.0f, 3.0f});
    auto made = std::make_shared<const void*>(nullptr);
    GradFrom(x, [made] {
      Tensor g = Tensor::Full({3}, 2.0f);
      *made = g.raw_data();
      return g;
    }).Backward(Ones(x));
    EXPECT_EQ(x.grad().raw_data(), *made);
    EXPECT_EQ(x.grad().ToFloatVector(), (std::vector<float>{2, 2, 2}));
    EXPECT_FALSE(x.grad().requires_grad());
  }
  {  // also held by the test: copied, and later writes to either leave the other alone
    Tensor x = Leaf({1.0f, 2.0f, 3.0f});
    Tensor kept = Tensor::Full({3}, 2.0f);
    GradFrom(x, [kept] { return kept; }).Backward(Ones(x));
    EXPECT_NE(x.grad().raw_data(), kept.raw_data());
    GradFrom(x, [kept] { return kept; }).Backward(Ones(x));  // accumulates into .grad only
    EXPECT_EQ(kept.ToFloatVector(), (std::vector<float>{2, 2, 2}));
    EXPECT_EQ(x.grad().ToFloatVector(), (std::vector<float>{4, 4, 4}));
  }
  {  // a view of a larger buffer nobody else holds: copied, so .grad holds only its own bytes
    Tensor x = Leaf({1.0f, 2.0f, 3.0f});
    GradFrom(x, [] { return Tensor::Full({6}, 5.0f).Slice(3, 6); }).Backward(Ones(x));
    EXPECT_EQ(x.grad().storage()->bytes(), x.grad().nbytes());
    EXPECT_EQ(x.grad().storage_offset(), 0);
    EXPECT_EQ(x.grad().ToFloatVector(), (std::vector<float>{5, 5, 5}));
  }
}

// Two gradients for the same tensor are added into the first one's buffer when nothing else
// holds it, and into a copy when something does (here the test keeps one): the kept tensor is
// never written.
TEST(AutogradTest, GradientsOfATensorReadTwiceAddInPlaceOnlyIntoAnUnheldBuffer) {
  Tensor x = Leaf({1.0f, -2.0f});
  auto reached = std::make_shared<const void*>(nullptr);
  auto fresh = std::make_shared<std::vector<const void*>>();
  // a = x, whose backward records which buffer the summed gradient arrived in.
  auto observe = [reached](const Tensor& x) {
    return ApplyFunction(
        "Observe", {x},
        [](const std::vector<Tensor>& in) { return std::vector<Tensor>{in[0].Clone()}; },
        [reached](const std::vector<Tensor>& g) {
          *reached = g[0].raw_data();
          return std::vector<Tensor>{g[0].Clone()};
        })[0];
  };
  Tensor a = observe(x);
  auto make = [fresh](float v) {
    return [fresh, v] {
      Tensor g = Tensor::Full({2}, v);
      fresh->push_back(g.raw_data());
      return g;
    };
  };
  ops::Add(GradFrom(a, make(1.0f)), GradFrom(a, make(10.0f))).Backward(Tensor::Full({2}, 1.0f));
  ASSERT_EQ(fresh->size(), 2u);
  EXPECT_TRUE(*reached == (*fresh)[0] || *reached == (*fresh)[1]) << "the sum was copied";
  EXPECT_EQ(x.grad().ToFloatVector(), (std::vector<float>{11, 11}));

  Tensor kept = Tensor::Full({2}, 3.0f);
  x.ZeroGrad();
  // Whichever of the two runs first, the sum must not be written into `kept`.
  a = observe(x);
  ops::Add(GradFrom(a, [kept] { return kept; }), GradFrom(a, make(10.0f)))
      .Backward(Tensor::Full({2}, 1.0f));
  a = observe(x);
  ops::Add(GradFrom(a, make(10.0f)), GradFrom(a, [kept] { return kept; }))
      .Backward(Tensor::Full({2}, 1.0f));
  EXPECT_EQ(kept.ToFloatVector(), (std::vector<float>{3, 3}));
  EXPECT_NE(*reached, kept.raw_data());
  EXPECT_EQ(x.grad().ToFloatVector(), (std::vector<float>{26, 26}));
}

TEST(AutogradTest, NoGradRecordsNothing) {
  Tensor x = Leaf({1.0f, 2.0f});
  EXPECT_TRUE(GradEnabled());
  {
    NoGradGuard ng;
    EXPECT_FALSE(GradEnabled());
    Tensor y = ops::Mul(ops::Tanh(x), x);
    EXPECT_FALSE(y.requires_grad());
    EXPECT_EQ(y.grad_fn(), nullptr);
    Tensor v = x.Reshape({2, 1});
    EXPECT_FALSE(v.requires_grad());
    {
      NoGradGuard nested;
      EXPECT_FALSE(GradEnabled());
    }
    EXPECT_FALSE(GradEnabled());
  }
  EXPECT_TRUE(GradEnabled());
  EXPECT_TRUE(ops::Tanh(x).requires_grad());
  // Inputs that do not require grad record nothing either.
  Tensor c = Tensor::FromVector<float>({1, 2}, {2});
  EXPECT_FALSE(ops::Mul(c, c).requires_grad());
}

// Each node's saved tensors are freed as soon as it has run, not at the end of the pass: the
// activations shrink while the weights' gradients grow. A chain of K linear layers of N x N
// weights on [N, N] activations saves one N x N input per layer; were the saved inputs kept to
// the end, the peak would be what the forward holds plus all K weight gradients (K x N x N
// floats more); freed as they are used, it stays within what the forward holds plus two
// gradients (the weight gradient being made and the activation gradient flowing).
TEST(AutogradTest, SavedTensorsAreFreedAsBackwardProceeds) {
  const int64_t k = 6, n = 64, g = n * n * int64_t(sizeof(float));
  std::mt19937 rng(3);
  std::vector<Tensor> weights;
  for (int64_t i = 0; i < k; ++i) {
    weights.push_back(test::RandomTensor({n, n}, rng, -0.1f, 0.1f));
    weights.back().set_requires_grad(true);
  }
  Tensor bias = Tensor::Zeros({n});
  Allocator* a = GetAllocator(Device::CPU());
  const int64_t base = a->stats().current_bytes;
  int64_t held = 0;
  {
    Tensor x = test::RandomTensor({n, n}, rng);
    for (const Tensor& w : weights) x = ops::Relu(ops::Linear(x, w, bias));
    Tensor loss = ops::Sum(x);
    x = Tensor();
    a->ResetPeak();
    held = a->stats().current_bytes - base;
    loss.Backward();
  }
  const int64_t peak = a->stats().peak_bytes - base;
  EXPECT_LE(peak, held + 2 * g + 4 * n * int64_t(sizeof(float)))
      << "peak " << peak << " with " << held << " held after the forward; all saved tensors kept "
      << "to the end would reach about " << held + k * g;
  for (const Tensor& w : weights) EXPECT_TRUE(w.grad().defined());
}

using AutogradDeathTest = ::testing::Test;

TEST(AutogradDeathTest, BackwardTwiceWithoutRetainGraphDies) {
  Tensor x = Leaf({1.0f, 2.0f});
  Tensor y = ops::Sum(ops::Mul(x, x));
  y.Backward();
  EXPECT_DEATH(y.Backward(), HasSubstr("backward through 'Sum' a second time: its saved "
                                       "tensors were freed (use retain_graph=true)"));
}

TEST(AutogradDeathTest, MisuseDiesWithAMessage) {
  Tensor x = Leaf({1.0f, 2.0f});
  EXPECT_DEATH(ops::Mul(x, x).Backward(), HasSubstr("needs an explicit gradient"));
  Tensor c = Tensor::FromVector<float>({1}, {1});
  EXPECT_DEATH(c.Backward(), HasSubstr("which does not require grad"));
  EXPECT_DEATH(QueueEndOfBackwardCallback([] {}), HasSubstr("outside a backward pass"));
  EXPECT_DEATH(ops::Tanh(x).set_requires_grad(false), HasSubstr("only be set on a leaf"));
}

TEST(AutogradTest, RetainGraphAllowsASecondBackward) {
  Tensor x = Leaf({1.0f, -2.0f});
  Tensor y = ops::Sum(ops::Mul(x, x));
  y.Backward(Tensor(), /*retain_graph=*/true);
  y.Backward(Tensor(), /*retain_graph=*/true);
  EXPECT_EQ(x.grad().ToFloatVector(), (std::vector<float>{4, -8}));
  y.Backward();  // the last one may free it
  EXPECT_EQ(x.grad().ToFloatVector(), (std::vector<float>{6, -12}));
}

TEST(AutogradTest, UserDefinedFunction) {
  Tensor x = Leaf({0.5f, -1.5f, 2.0f});
  int calls = 0;
  Tensor y = Cube(x, &calls);
  ASSERT_NE(y.grad_fn(), nullptr);
  EXPECT_EQ(y.grad_fn()->name(), "Cube");
  EXPECT_TRUE(AllClose(y, {0.125, -3.375, 8.0}, 1e-6, 0));
  y.Backward(Tensor::FromVector<float>({1, 2, 3}, {3}));
  EXPECT_EQ(calls, 1);
  EXPECT_TRUE(AllClose(x.grad(), {3 * 0.25 * 1, 3 * 2.25 * 2, 3 * 4.0 * 3}, 1e-6, 0));
  // Composed with built-in ops, against finite differences.
  EXPECT_TRUE(test::GradCheck(
      [](const std::vector<Tensor>& in) { return ops::Tanh(Cube(ops::Scale(in[0], 0.7f))); },
      {x}));
}

TEST(AutogradTest, UserFunctionWithTwoOutputsGetsZerosForTheUnusedOne) {
  Tensor x = Leaf({1.0f, 2.0f});
  std::vector<Tensor> seen;
  std::vector<Tensor> outs = ApplyFunction(
      "Split", {x},
      [](const std::vector<Tensor>& in) {
        return std::vector<Tensor>{ops::Scale(in[0], 2.0f), ops::Scale(in[0], 3.0f)};
      },
      [&seen](const std::vector<Tensor>& g) {
        seen = g;
        return std::vector<Tensor>{ops::Add(ops::Scale(g[0], 2.0f), ops::Scale(g[1], 3.0f))};
      });
  ASSERT_EQ(outs.size(), 2u);
  EXPECT_EQ(outs[0].grad_fn(), outs[1].grad_fn());
  EXPECT_EQ(outs[1].output_nr(), 1);
  ops::Sum(outs[1]).Backward();
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0].ToFloatVector(), (std::vector<float>{0, 0}));
  EXPECT_EQ(seen[1].ToFloatVector(), (std::vector<float>{1, 1}));
  EXPECT_EQ(x.grad().ToFloatVector(), (std::vector<float>{3, 3}));
}

TEST(AutogradTest, SavedTensorHooksPackAndUnpack) {
  Tensor x = Leaf({1.0f, 2.0f, 3.0f});
  Tensor w = Leaf({-1.0f, 0.5f, 2.0f});
  int packs = 0, unpacks = 0;
  SavedTensorHooks to_host_copy;
  to_host_copy.pack = [&packs](const Tensor& t) -> std::shared_ptr<void> {
    ++packs;
    EXPECT_FALSE(t.requires_grad());  // saved tensors are always detached
    return std::make_shared<Tensor>(t.Clone());
  };
  to_host_copy.unpack = [&unpacks](const std::shared_ptr<void>& p) {
    ++unpacks;
    return *std::static_pointer_cast<Tensor>(p);
  };
  Tensor y;
  {
    SavedTensorHooksScope scope(to_host_copy);
    y = ops::Tanh(ops::Mul(x, w));  // Mul saves x and w, Tanh saves its input
  }
  EXPECT_EQ(packs, 3);
  EXPECT_EQ(unpacks, 0);
  Tensor z = ops::Tanh(x);  // outside the scope: nothing packed
  EXPECT_EQ(packs, 3);
  y.Backward(Ones(y));
  EXPECT_EQ(unpacks, 3);
  std::vector<double> X = ToDoubles(x), W = ToDoubles(w), gx, gw;
  for (size_t i = 0; i < 3; ++i) {
    double d = 1 - std::pow(std::tanh(X[i] * W[i]), 2);
    gx.push_back(d * W[i]);
    gw.push_back(d * X[i]);
  }
  EXPECT_TRUE(AllClose(x.grad(), gx, 1e-5, 1e-6));
  EXPECT_TRUE(AllClose(w.grad(), gw, 1e-5, 1e-6));
}

TEST(AutogradTest, UnpackedTensorIsWhatBackwardUses) {
  // The innermost scope wins, and backward computes with whatever unpack returns: here the
  // saved w is replaced by ones, so d(x*w)/dx comes out as 1.
  Tensor x = Leaf({1.0f, 2.0f});
  Tensor w = Leaf({5.0f, 7.0f});
  int outer_packs = 0;
  SavedTensorHooks outer{[&outer_packs](const Tensor& t) -> std::shared_ptr<void> {
                           ++outer_packs;
                           return std::make_shared<Tensor>(t);
                         },
                         [](const std::shared_ptr<void>& p) {
                           return *std::static_pointer_cast<Tensor>(p);
                         }};
  SavedTensorHooks replace_by_ones{
      [](const Tensor& t) -> std::shared_ptr<void> { return std::make_shared<Shape>(t.shape()); },
      [](const std::shared_ptr<void>& p) {
        return Tensor::Full(*std::static_pointer_cast<Shape>(p), 1.0f);
      }};
  Tensor y;
  {
    SavedTensorHooksScope a(outer);
    SavedTensorHooksScope b(replace_by_ones);
    y = ops::Mul(x, w);
  }
  EXPECT_EQ(outer_packs, 0);
  y.Backward(Ones(y));
  EXPECT_EQ(x.grad().ToFloatVector(), (std::vector<float>{1, 1}));
  EXPECT_EQ(w.grad().ToFloatVector(), (std::vector<float>{1, 1}));
}

TEST(AutogradTest, EndOfBackwardHooksAndQueuedCallbacks) {
  std::vector<std::string> events;
  Tensor x = Leaf({1.0f, 2.0f});
  uint64_t h1 = AddEndOfBackwardHook([&] {
    EXPECT_TRUE(InBackward());
    events.push_back("end1");
  });
  uint64_t h2 = AddEndOfBackwardHook([&] { events.push_back("end2"); });
  uint64_t acc = x.RegisterPostAccumulateGradHook([&](Tensor&) {
    events.push_back("acc");
    EXPECT_TRUE(InBackward());
    QueueEndOfBackwardCallback([&] {
      events.push_back("queued");
      // A callback may queue another one for the same pass.
      QueueEndOfBackwardCallback([&] { events.push_back("queued2"); });
    });
  });
  EXPECT_FALSE(InBackward());
  ops::Sum(x).Backward();
  EXPECT_FALSE(InBackward());
  EXPECT_THAT(events, ElementsAre("acc", "end1", "end2", "queued", "queued2"));

  // Queued callbacks were for that pass only; a removed hook stops firing.
  events.clear();
  x.RemoveHook(acc);
  RemoveEndOfBackwardHook(h1);
  ops::Sum(x).Backward();
  EXPECT_THAT(events, ElementsAre("end2"));
  RemoveEndOfBackwardHook(h2);
  events.clear();
  ops::Sum(x).Backward();
  EXPECT_TRUE(events.empty());
}

TEST(AutogradTest, EndOfBackwardHooksArePerThread) {
  int here = 0;
  uint64_t id = AddEndOfBackwardHook([&] { ++here; });
  int there = 0;
  std::thread other([&] {
    Tensor y = Leaf({1.0f});
    ops::Sum(y).Backward();
    there = 1;
  });
  other.join();
  EXPECT_EQ(there, 1);
  EXPECT_EQ(here, 0);
  ops::Sum(Leaf({1.0f})).Backward();
  EXPECT_EQ(here, 1);
  RemoveEndOfBackwardHook(id);
}

TEST(AutogradTest, PostAccumulateHookFiresOncePerPassWithTheFullSum) {
  Tensor w = Leaf({2.0f, 3.0f});
  Tensor x = Tensor::FromVector<float>({1.0f, -1.0f}, {2});
  int fired = 0;
  std::vector<float> grad_in_hook;
  uint64_t id = w.RegisterPostAccumulateGradHook([&](Tensor& p) {
    ++fired;
    EXPECT_TRUE(p.SameAs(w));
    grad_in_hook = p.grad().ToFloatVector();
  });
  // w is used three times: y = sum(w * x + w * w + w).
  Tensor y = ops::Sum(ops::Add(ops::Add(ops::Mul(w, x), ops::Mul(w, w)), w));
  y.Backward();
  EXPECT_EQ(fired, 1);
  // dy/dw = x + 2w + 1.
  EXPECT_EQ(grad_in_hook, (std::vector<float>{6.0f, 6.0f}));
  ops::Sum(ops::Mul(w, w)).Backward();
  EXPECT_EQ(fired, 2);
  EXPECT_EQ(grad_in_hook, (std::vector<float>{10.0f, 12.0f}));  // accumulated: 6 + 2w
  w.RemoveHook(id);
  ops::Sum(w).Backward();
  EXPECT_EQ(fired, 2);
}

// A gradient transform sees each pass's whole incoming gradient once (w used three times: the
// engine sums the uses first), before accumulation, and the hooks after it see the transformed sum.
TEST(AutogradTest, GradTransformMapsTheIncomingGradientBeforeAccumulation) {
  Tensor w = Leaf({2.0f, 3.0f});
  Tensor x = Tensor::FromVector<float>({1.0f, -1.0f}, {2});
  int transformed = 0;
  std::vector<float> seen, in_hook;
  uint64_t id = w.RegisterGradTransform([&](const Tensor& g) {
    ++transformed;
    seen = g.ToFloatVector();
    return ops::Scale(g, 10.0f);
  });
  w.RegisterPostAccumulateGradHook([&](Tensor& p) { in_hook = p.grad().ToFloatVector(); });
  ops::Sum(ops::Add(ops::Add(ops::Mul(w, x), ops::Mul(w, w)), w)).Backward();
  EXPECT_EQ(transformed, 1);
  EXPECT_EQ(seen, (std::vector<float>{6.0f, 6.0f}));  // x + 2w + 1
  EXPECT_EQ(in_hook, (std::vector<float>{60.0f, 60.0f}));
  ops::Sum(w).Backward();  // accumulated: 60 + 10 * 1
  EXPECT_EQ(w.grad().ToFloatVector(), (std::vector<float>{70.0f, 70.0f}));
  w.RemoveHook(id);
  ops::Sum(w).Backward();
  EXPECT_EQ(transformed, 2);
  EXPECT_EQ(w.grad().ToFloatVector(), (std::vector<float>{71.0f, 71.0f}));
}

// A pass-through user function that records when its backward runs.
Tensor Tap(const Tensor& x, const std::string& name, std::vector<std::string>* events) {
  return ApplyFunction(
      name, {x}, [](const std::vector<Tensor>& in) { return std::vector<Tensor>{in[0].Clone()}; },
      [name, events](const std::vector<Tensor>& g) {
        events->push_back(name);
        return std::vector<Tensor>{g[0]};
      })[0];
}

TEST(AutogradTest, LaterNodesRunFirst) {
  std::vector<std::string> events;
  Tensor x = Leaf({1.0f, 2.0f});
  // Two independent branches, both ready once the Add's backward ran: the later one goes first.
  Tensor first = Tap(x, "first", &events);
  Tensor second = Tap(x, "second", &events);
  Tensor third = Tap(ops::Tanh(x), "third", &events);
  ops::Sum(ops::Add(ops::Add(first, third), second)).Backward();
  EXPECT_THAT(events, ElementsAre("third", "second", "first"));
}

TEST(AutogradTest, AccumulatorsRunAsSoonAsTheirGradientIsReady) {
  // Two "layers": h = w1 * x, y = sum(w2 * h). w2's gradient is final once layer 2's backward
  // ran, so its post-accumulate hook must fire before layer 1's backward, on every iteration
  // (that is when data parallelism starts reducing it). The parameters' accumulators are
  // created in the first iteration, so a plain creation-order priority would run them last
  // from the second iteration on.
  Tensor w1 = Leaf({1.0f, 2.0f}), w2 = Leaf({3.0f, 4.0f});
  Tensor x = Tensor::FromVector<float>({0.5f, 0.25f}, {2});
  std::vector<std::string> events;
  w1.RegisterPostAccumulateGradHook([&](Tensor&) { events.push_back("w1"); });
  w2.RegisterPostAccumulateGradHook([&](Tensor&) { events.push_back("w2"); });
  for (int iter = 0; iter < 3; ++iter) {
    SCOPED_TRACE(iter);
    events.clear();
    Tensor h = Tap(ops::Mul(w1, x), "layer1", &events);
    Tensor y = ops::Sum(Tap(ops::Mul(w2, h), "layer2", &events));
    y.Backward();
    EXPECT_THAT(events, ElementsAre("layer2", "w2", "layer1", "w1"));
  }
}

// Put-off weight gradients (WeightGradQueue) are the ones Backward computes: a two-layer net's
// input gradient is complete after Backward, its Linear weights and biases get nothing until
// Run, then exactly the reference's gradients, with their hooks. A Linear whose weight is not a
// leaf (here w3 * 1) is not put off: its graph behind the weight would be needed.
TEST(WeightGradQueueTest, LinearWeightGradientsWaitForRunAndMatchBackward) {
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  auto leaf = [&](Shape shape) {
    std::vector<float> v(size_t(NumElements(shape)));
    for (auto& e : v) e = nd(rng);
    Tensor t = Tensor::FromVector(v, shape);
    t.set_requires_grad(true);
    return t;
  };
  Tensor x = leaf({3, 4}), w1 = leaf({5, 4}), b1 = leaf({5}), w2 = leaf({2, 5}), b2 = leaf({2});
  Tensor w3 = leaf({2, 2});
  auto loss = [&] {
    Tensor h = ops::Tanh(ops::Linear(x, w1, b1));
    Tensor y = ops::Linear(ops::Linear(h, w2, b2), ops::Scale(w3, 1.0f), Tensor());
    return ops::Sum(ops::Mul(y, y));
  };
  std::vector<Tensor> all = {x, w1, b1, w2, b2, w3};
  loss().Backward();
  std::vector<std::vector<float>> want;
  for (auto& t : all) want.push_back(t.grad().ToFloatVector());
  for (auto& t : all) t.set_grad(Tensor());

  int hooked = 0;
  uint64_t id = w1.RegisterPostAccumulateGradHook([&](Tensor&) { ++hooked; });
  WeightGradQueue q;
  {
    WeightGradQueue::ActiveScope active(&q);
    loss().Backward();
  }
  EXPECT_EQ(x.grad().ToFloatVector(), want[0]);
  EXPECT_EQ(w3.grad().ToFloatVector(), want[5]);  // not a leaf weight: not put off
  for (int i : {1, 2, 3, 4}) EXPECT_FALSE(all[size_t(i)].grad().defined()) << "input " << i;
  EXPECT_EQ(hooked, 0);
  EXPECT_EQ(q.size(), 2u);  // the two Linears on leaf weights, each its weight and bias together
  q.Run();
  EXPECT_TRUE(q.empty());
  EXPECT_EQ(q.size(), 0u);
  EXPECT_EQ(hooked, 1);
  for (int i : {1, 2, 3, 4}) {
    EXPECT_EQ(all[size_t(i)].grad().ToFloatVector(), want[size_t(i)]) << "input " << i;
  }
  w1.RemoveHook(id);
}

TEST(WeightGradQueueDeathTest, AQueueDroppedWithWorkLeftDies) {
  EXPECT_DEATH(
      {
        Tensor x = Leaf({1.0f, 2.0f});
        Tensor w = Tensor::FromVector<float>({1.0f, 1.0f}, {1, 2});
        w.set_requires_grad(true);
        WeightGradQueue q;
        WeightGradQueue::ActiveScope active(&q);
        ops::Sum(ops::Linear(x, w, Tensor())).Backward();
      },
      HasSubstr("put off and never computed"));
}

}  // namespace
}  // namespace braid::autograd
