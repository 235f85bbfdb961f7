#include "core/module.h"

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/ops.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace braid {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

Tensor Filled(const Shape& shape, float start) {
  std::vector<float> v(static_cast<size_t>(NumElements(shape)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = start + 0.1f * float(i);
  return Tensor::FromVector(v, shape);
}

// y = x @ weightᵀ + bias, as two ops so the two parameters' gradients arrive at different nodes
// (bias first: its node is the later one).
class Dense : public Module {
 public:
  Dense(int64_t in, int64_t out, float start = 0.1f) : Module("Dense") {
    weight = RegisterParameter("weight", Filled({out, in}, start));
    bias = RegisterParameter("bias", Filled({out}, -start));
  }
  Tensor Forward(const Tensor& x) override {
    return ops::Add(ops::MatMul(x, weight, false, true), bias);
  }
  Tensor weight, bias;
};

// A transformer-layer stand-in: the unit strategies bucket and shard.
class Block : public Module {
 public:
  explicit Block(int64_t c) : Module("Block") {
    fc = RegisterModule("fc", std::make_unique<Dense>(c, c, 0.2f));
    shift = RegisterParameter("shift", Filled({c}, 0.05f));
    running = RegisterBuffer("running", Tensor::Zeros({c}));
    set_block(true);
  }
  Tensor Forward(const Tensor& x) override { return ops::Add((*fc)(x), shift); }
  Dense* fc;
  Tensor shift, running;
};

class Net : public Module {
 public:
  Net() : Module("Net") {
    fc1 = RegisterModule("fc1", std::make_unique<Dense>(4, 3));
    block = RegisterModule("block", std::make_unique<Block>(3));
    head = RegisterModule("head", std::make_unique<Dense>(3, 2, -0.3f));
  }
  Tensor Forward(const Tensor& x) override { return (*head)((*block)((*fc1)(x))); }
  Dense* fc1;
  Block* block;
  Dense* head;
};

std::vector<std::string> Names(const Module::NamedTensors& named) {
  std::vector<std::string> out;
  for (auto& [n, t] : named) out.push_back(n);
  return out;
}

TEST(ModuleTest, DottedNamesBuffersAndStateDict) {
  Net net;
  EXPECT_THAT(Names(net.NamedParameters()),
              ElementsAre("fc1.weight", "fc1.bias", "block.shift", "block.fc.weight",
                          "block.fc.bias", "head.weight", "head.bias"));
  EXPECT_THAT(Names(net.NamedBuffers()), ElementsAre("block.running"));
  EXPECT_EQ(net.NumParameters(), 12 + 3 + 3 + 9 + 3 + 6 + 2);
  EXPECT_EQ(net.Parameters().size(), 7u);
  EXPECT_TRUE(net.Parameters()[0].SameAs(net.fc1->weight));
  for (auto& [n, t] : net.NamedParameters()) {
    EXPECT_TRUE(t.requires_grad()) << n;
    EXPECT_TRUE(t.is_leaf()) << n;
  }
  // A parameter is named by its local name (module-relative).
  EXPECT_EQ(net.block->fc->weight.name(), "weight");
  // Names are relative to the module asked.
  EXPECT_THAT(Names(net.block->NamedParameters()), ElementsAre("shift", "fc.weight", "fc.bias"));

  std::map<std::string, Tensor> sd = net.StateDict();
  std::vector<std::string> keys;
  for (auto& [k, v] : sd) keys.push_back(k);
  EXPECT_THAT(keys, ElementsAre("block.fc.bias", "block.fc.weight", "block.running", "block.shift",
                                "fc1.bias", "fc1.weight", "head.bias", "head.weight"));
  // Entries alias the parameters' storage without their autograd state.
  EXPECT_EQ(sd["head.weight"].raw_data(), net.head->weight.raw_data());
  EXPECT_FALSE(sd["head.weight"].requires_grad());

  std::vector<std::string> modules;
  for (auto& [n, m] : net.NamedModules()) modules.push_back(n + ":" + m->type_name());
  EXPECT_THAT(modules, ElementsAre(":Net", "fc1:Dense", "block:Block", "block.fc:Dense",
                                   "head:Dense"));
  std::vector<std::string> children;
  for (auto& [n, m] : net.NamedChildren()) children.push_back(n);
  EXPECT_THAT(children, ElementsAre("fc1", "block", "head"));
  auto blocks = net.NamedBlocks();
  ASSERT_EQ(blocks.size(), 1u);
  EXPECT_EQ(blocks[0].first, "block");
  EXPECT_EQ(blocks[0].second, net.block);
}

TEST(ModuleTest, LoadStateDictCopiesInPlace) {
  Net a, b;
  std::map<std::string, Tensor> sd = a.StateDict();
  for (auto& [k, v] : sd) sd[k] = Tensor::Full(v.shape(), k == "head.bias" ? 7.0f : 1.0f);
  void* before = b.head->bias.raw_data();
  ASSERT_TRUE(b.LoadStateDict(sd).ok());
  EXPECT_EQ(b.head->bias.raw_data(), before);  // handles stay valid
  EXPECT_EQ(b.head->bias.ToFloatVector(), (std::vector<float>{7, 7}));
  EXPECT_EQ(b.block->running.ToFloatVector(), (std::vector<float>{1, 1, 1}));
  // Other dtypes are converted.
  sd["head.bias"] = Tensor::Full({2}, 2.5f, DType::kBF16);
  ASSERT_TRUE(b.LoadStateDict(sd).ok());
  EXPECT_EQ(b.head->bias.ToFloatVector(), (std::vector<float>{2.5f, 2.5f}));
  EXPECT_EQ(b.head->bias.dtype(), DType::kF32);
}

TEST(ModuleTest, LoadStateDictStrictErrorsNameEveryKey) {
  Net net;
  std::vector<float> before = net.fc1->weight.ToFloatVector();
  std::map<std::string, Tensor> sd = net.StateDict();
  sd.erase("block.fc.bias");
  sd.erase("head.weight");
  sd["head.extra"] = Tensor::Zeros({1});
  sd["fc1.weight"] = Tensor::Zeros({4, 3});  // transposed
  absl::Status st = net.LoadStateDict(sd);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  std::string msg(st.message());
  EXPECT_THAT(msg, HasSubstr("Net"));
  EXPECT_THAT(msg, HasSubstr("missing keys: block.fc.bias, head.weight"));
  EXPECT_THAT(msg, HasSubstr("unexpected keys: head.extra"));
  EXPECT_THAT(msg, HasSubstr("shape mismatches: fc1.weight (model [3,4], given [4,3])"));
  EXPECT_EQ(net.fc1->weight.ToFloatVector(), before);  // nothing loaded on error

  // Not strict: missing and unexpected keys are fine, a shape mismatch is still an error.
  absl::Status loose = net.LoadStateDict(sd, /*strict=*/false);
  EXPECT_FALSE(loose.ok());
  EXPECT_THAT(std::string(loose.message()), HasSubstr("fc1.weight (model [3,4], given [4,3])"));
  sd.erase("fc1.weight");
  EXPECT_TRUE(net.LoadStateDict(sd, /*strict=*/false).ok());
}

// The output projection reuses the input layer's weight (GPT-2's tied wte / lm_head).
class TiedDense : public Module {
 public:
  TiedDense(Tensor shared, int64_t out) : Module("TiedDense") {
    weight = RegisterParameter("weight", shared);
    bias = RegisterParameter("bias", Tensor::Zeros({out}));
  }
  Tensor Forward(const Tensor& x) override {
    return ops::Add(ops::MatMul(x, weight, false, true), bias);
  }
  Tensor weight, bias;
};

class TiedNet : public Module {
 public:
  TiedNet() : Module("TiedNet") {
    embed = RegisterModule("embed", std::make_unique<Dense>(3, 3));
    head = RegisterModule("head", std::make_unique<TiedDense>(embed->weight, 3));
  }
  Tensor Forward(const Tensor& x) override { return (*head)((*embed)(x)); }
  Dense* embed;
  TiedDense* head;
};

TEST(ModuleTest, TiedParametersAreListedOnce) {
  TiedNet net;
  EXPECT_THAT(Names(net.NamedParameters()), ElementsAre("embed.weight", "embed.bias", "head.bias"));
  EXPECT_EQ(net.NumParameters(), 9 + 3 + 3);
  std::vector<std::string> keys;
  for (auto& [k, v] : net.StateDict()) keys.push_back(k);
  EXPECT_THAT(keys, ElementsAre("embed.bias", "embed.weight", "head.bias"));
  // The shared weight collects both uses' gradients, and its hook fires once.
  int fired = 0;
  net.embed->weight.RegisterPostAccumulateGradHook([&](Tensor&) { ++fired; });
  ops::Sum(net(Filled({2, 3}, 0.5f))).Backward();
  EXPECT_EQ(fired, 1);
}

TEST(ModuleTest, TrainEvalPropagates) {
  Net net;
  EXPECT_TRUE(net.is_training());
  net.Eval();
  for (auto& [n, m] : net.NamedModules()) EXPECT_FALSE(m->is_training()) << n;
  net.block->Train();
  EXPECT_FALSE(net.is_training());
  EXPECT_TRUE(net.block->fc->is_training());
  EXPECT_FALSE(net.head->is_training());
  net.Train();
  for (auto& [n, m] : net.NamedModules()) EXPECT_TRUE(m->is_training()) << n;
}

TEST(ModuleTest, ZeroGradClearsEveryParameter) {
  Net net;
  ops::Sum(net(Filled({2, 4}, 0.0f))).Backward();
  for (auto& [n, p] : net.NamedParameters()) EXPECT_TRUE(p.grad().defined()) << n;
  net.ZeroGrad();
  for (auto& [n, p] : net.NamedParameters()) EXPECT_FALSE(p.grad().defined()) << n;
}

// Records every hook event of a Net in order.
struct Recorder {
  std::vector<std::string> events;
  std::vector<std::pair<Module*, uint64_t>> module_hooks;
  std::vector<std::pair<Tensor, uint64_t>> param_hooks;
  std::vector<uint64_t> end_hooks;

  void Attach(Module& root) {
    // Parameter hooks first, so on each parameter they fire before the modules' tracking.
    for (auto& [name, p] : root.NamedParameters()) {
      std::string n = name;
      param_hooks.emplace_back(p, Tensor(p).RegisterPostAccumulateGradHook([this, n](Tensor& t) {
        EXPECT_TRUE(t.grad().defined()) << n;
        events.push_back("acc " + n);
      }));
    }
    // Modules bottom-up (children before parents), so when a module's last parameter completes
    // a child and its parent at once, the child's post-backward comes first.
    auto modules = root.NamedModules();
    for (auto it = modules.rbegin(); it != modules.rend(); ++it) {
      std::string n = it->first.empty() ? "root" : it->first;
      Module* m = it->second;
      module_hooks.emplace_back(m, m->AddForwardPreHook([this, n](Module&) {
        events.push_back("fwd_pre " + n);
      }));
      module_hooks.emplace_back(m, m->AddForwardHook([this, n](Module&) {
        events.push_back("fwd " + n);
      }));
      module_hooks.emplace_back(m, m->AddBackwardPreHook([this, n](Module&) {
        EXPECT_TRUE(autograd::InBackward());
        events.push_back("bwd_pre " + n);
      }));
      module_hooks.emplace_back(m, m->AddBackwardHook([this, n](Module&) {
        events.push_back("bwd_post " + n);
        if (n == "root") {
          autograd::QueueEndOfBackwardCallback([this] { events.push_back("queued callback"); });
        }
      }));
    }
    end_hooks.push_back(autograd::AddEndOfBackwardHook([this] { events.push_back("end 1"); }));
    end_hooks.push_back(autograd::AddEndOfBackwardHook([this] { events.push_back("end 2"); }));
  }

  ~Recorder() {
    for (auto& [m, id] : module_hooks) m->RemoveHook(id);
    for (auto& [p, id] : param_hooks) p.RemoveHook(id);
    for (uint64_t id : end_hooks) autograd::RemoveEndOfBackwardHook(id);
  }
};

TEST(ModuleTest, HookOrderOfATrainingStep) {
  Net net;
  Recorder rec;
  rec.Attach(net);
  // Forward: pre-hook, then the children's hooks inside Forward, then the forward hook.
  const std::vector<std::string> forward = {
      "fwd_pre root",
      "fwd_pre fc1", "fwd fc1",
      "fwd_pre block", "fwd_pre block.fc", "fwd block.fc", "fwd block",
      "fwd_pre head", "fwd head",
      "fwd root"};
  // Backward: a module's pre-backward when its output's gradient arrives; each parameter's
  // hook as soon as its gradient is complete (the later-used bias before the weight); a
  // module's post-backward right after its last parameter's; then end-of-backward hooks in
  // registration order, then callbacks queued during the pass.
  const std::vector<std::string> backward = {
      "bwd_pre root",
      "bwd_pre head", "acc head.bias", "acc head.weight", "bwd_post head",
      "bwd_pre block", "acc block.shift",
      "bwd_pre block.fc", "acc block.fc.bias", "acc block.fc.weight", "bwd_post block.fc",
      "bwd_post block",
      "bwd_pre fc1", "acc fc1.bias", "acc fc1.weight", "bwd_post fc1",
      "bwd_post root",
      "end 1", "end 2", "queued callback"};
  // The same order on every step (parameters' gradient accumulators outlive the first step).
  for (int step = 0; step < 3; ++step) {
    SCOPED_TRACE(step);
    rec.events.clear();
    Tensor y = net(Filled({2, 4}, -0.2f));
    EXPECT_THAT(rec.events, ElementsAreArray(forward));
    rec.events.clear();
    ops::Sum(y).Backward();
    EXPECT_THAT(rec.events, ElementsAreArray(backward));
    net.ZeroGrad();
  }
}

TEST(ModuleTest, NoBackwardHooksWithoutGrad) {
  Net net;
  Recorder rec;
  rec.Attach(net);
  autograd::NoGradGuard ng;
  Tensor y = net(Filled({1, 4}, 0.0f));
  EXPECT_FALSE(y.requires_grad());
  EXPECT_EQ(rec.events.size(), 10u);  // forward hooks only
  EXPECT_EQ(rec.events.front(), "fwd_pre root");
}

TEST(ModuleTest, RemovedHooksStopFiring) {
  Net net;
  int pre = 0, post = 0, bwd = 0;
  uint64_t a = net.head->AddForwardPreHook([&](Module&) { ++pre; });
  uint64_t b = net.head->AddForwardHook([&](Module&) { ++post; });
  uint64_t c = net.head->AddBackwardHook([&](Module&) { ++bwd; });
  ops::Sum(net(Filled({1, 4}, 0.0f))).Backward();
  EXPECT_EQ(pre + post + bwd, 3);
  for (uint64_t id : {a, b, c}) net.head->RemoveHook(id);
  ops::Sum(net(Filled({1, 4}, 0.0f))).Backward();
  EXPECT_EQ(pre + post + bwd, 3);
}

// One parameter takes part in the forward, the other never does.
class HalfUsed : public Module {
 public:
  HalfUsed() : Module("HalfUsed") {
    used = RegisterParameter("used", Filled({3}, 1.0f));
    unused = RegisterParameter("unused", Filled({3}, 2.0f));
  }
  Tensor Forward(const Tensor& x) override { return ops::Add(x, used); }
  Tensor used, unused;
};

TEST(ModuleTest, UnusedParameterDoesNotBlockPostBackward) {
  HalfUsed m;
  std::vector<std::string> events;
  m.used.RegisterPostAccumulateGradHook([&](Tensor&) { events.push_back("acc used"); });
  m.unused.RegisterPostAccumulateGradHook([&](Tensor&) { events.push_back("acc unused"); });
  m.AddBackwardPreHook([&](Module&) { events.push_back("bwd_pre"); });
  m.AddBackwardHook([&](Module&) { events.push_back("bwd_post"); });
  uint64_t end = autograd::AddEndOfBackwardHook([&] { events.push_back("end"); });
  for (int step = 0; step < 2; ++step) {
    SCOPED_TRACE(step);
    events.clear();
    ops::Sum(m(Filled({3}, 0.5f))).Backward();
    // Post-backward waits for the end of the pass, but still comes before end-of-backward
    // callbacks (where strategies wait for the reductions post-backward started).
    EXPECT_THAT(events, ElementsAre("bwd_pre", "acc used", "bwd_post", "end"));
    EXPECT_FALSE(m.unused.grad().defined());
  }
  autograd::RemoveEndOfBackwardHook(end);
}

// A HalfUsed child after a Dense, so both modules wait for the end of the pass.
class Outer : public Module {
 public:
  Outer() : Module("Outer") {
    dense = RegisterModule("dense", std::make_unique<Dense>(3, 3));
    half = RegisterModule("half", std::make_unique<HalfUsed>());
  }
  Tensor Forward(const Tensor& x) override { return (*half)((*dense)(x)); }
  Dense* dense;
  HalfUsed* half;
};

TEST(ModuleTest, PostBackwardsOwedAtTheEndRunChildrenFirst) {
  Outer m;
  std::vector<std::string> events;
  m.AddBackwardHook([&](Module&) { events.push_back("bwd_post outer"); });
  m.half->AddBackwardHook([&](Module&) { events.push_back("bwd_post half"); });
  m.dense->AddBackwardHook([&](Module&) { events.push_back("bwd_post dense"); });
  uint64_t end = autograd::AddEndOfBackwardHook([&] { events.push_back("end"); });
  ops::Sum(m(Filled({2, 3}, 0.5f))).Backward();
  // dense completes during the pass; half and outer each miss half.unused.
  EXPECT_THAT(events, ElementsAre("bwd_post dense", "bwd_post half", "bwd_post outer", "end"));
  autograd::RemoveEndOfBackwardHook(end);
}

TEST(ModuleTest, ParameterUsedTwiceCompletesItsModuleOnce) {
  // x * used * used: one accumulation per pass, one post-backward.
  class Square : public Module {
   public:
    Square() : Module("Square") { w = RegisterParameter("w", Filled({2}, 1.0f)); }
    Tensor Forward(const Tensor& x) override { return ops::Mul(ops::Mul(x, w), w); }
    Tensor w;
  } m;
  int acc = 0, post = 0;
  m.w.RegisterPostAccumulateGradHook([&](Tensor&) { ++acc; });
  m.AddBackwardHook([&](Module&) { ++post; });
  ops::Sum(m(Filled({2}, 1.0f))).Backward();
  EXPECT_EQ(acc, 1);
  EXPECT_EQ(post, 1);
  // d/dw of sum(x w^2) = 2 x w.
  EXPECT_THAT(m.w.grad().ToFloatVector(),
              ::testing::Pointwise(::testing::FloatNear(1e-6f),
                                   std::vector<float>{2.0f * 1.0f * 1.0f, 2.0f * 1.1f * 1.1f}));
}

}  // namespace
}  // namespace braid
