// Activation checkpointing (launcher/activation_checkpointing/activation_checkpointing.h) at work inside backward, on the small
// GPT-shaped model of activation_checkpointing_test_util.h and on modules defined here, on the
// reference kernels: hooks and recomputation counts; a parameter-sharding pattern like ZeRO-3's;
// random ops replayed; misuse refused or fatal. Policies, bitwise gradients and memory are in
// activation_checkpointing_test.cc.
#include "launcher/activation_checkpointing/activation_checkpointing.h"

#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/autograd.h"
#include "core/ops.h"
#include "core/testing/test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "launcher/activation_checkpointing/activation_checkpointing_test_util.h"

namespace braid {
namespace {

using ::testing::HasSubstr;
using Kind = CheckpointPolicy::Kind;
using checkpointing_test::All;
using checkpointing_test::Batch;
using checkpointing_test::Bitwise;
using checkpointing_test::Block;
using checkpointing_test::ExpectIdentical;
using checkpointing_test::Linear;
using checkpointing_test::MakeBatch;
using checkpointing_test::Policy;
using checkpointing_test::Shape4;
using checkpointing_test::Step;
using checkpointing_test::StepResult;
using checkpointing_test::TinyGpt;

// ---- Hooks and recomputation ---------------------------------------------------------------

TEST(ActivationCheckpointing, SubmoduleHooksFireAgainInRecomputeOncePerBackward) {
  Shape4 s;
  s.n_layer = 3;
  const Batch batch = MakeBatch(s, 2);
  TinyGpt model(s);
  ASSERT_TRUE(EnableActivationCheckpointing(model, All(Kind::kSqrt)).ok());  // segments {0,1}, {2}
  std::map<std::string, int> calls;
  for (auto& [name, m] : model.NamedModules()) {
    if (name.empty()) continue;
    std::string n = name;
    m->AddForwardPreHook([&calls, n](Module&) { ++calls[n]; });
  }
  ResetActivationCheckpointStats();
  Step(model, batch);
  EXPECT_EQ(GetActivationCheckpointStats().recomputes, 2);
  // Inside every block, submodules ran twice: in the forward and in its recompute.
  for (int b = 0; b < 3; ++b) {
    for (const char* sub : {"ln_1", "attn", "attn.c_attn", "attn.c_proj", "ln_2", "mlp", "mlp.c_fc"}) {
      EXPECT_EQ(calls[absl::StrCat("h.", b, ".", sub)], 2) << "h." << b << "." << sub;
    }
  }
  // A segment's blocks before its last are re-run through their own hooks (ZeRO-3 must gather
  // them); the last one's (and a lone block's) own forward hooks do not fire again, since
  // backward is already inside it (its pre-backward hook ran).
  EXPECT_EQ(calls["h.0"], 2);
  EXPECT_EQ(calls["h.1"], 1);
  EXPECT_EQ(calls["h.2"], 1);
  EXPECT_EQ(calls["ln_f"], 1);
  EXPECT_EQ(calls["head"], 1);
}

// Evaluation (no grad): nothing to keep, nothing recomputed, the same output.
TEST(ActivationCheckpointing, UnderNoGradTheForwardIsUnchanged) {
  Shape4 s;
  const Batch batch = MakeBatch(s, 2);
  TinyGpt plain(s), model(s);
  ASSERT_TRUE(EnableActivationCheckpointing(model, Policy(Kind::kEveryBlock)).ok());
  autograd::NoGradGuard no_grad;
  ResetActivationCheckpointStats();
  EXPECT_TRUE(Bitwise(plain(batch.ids).ToFloatVector(), model(batch.ids).ToFloatVector()));
  EXPECT_EQ(GetActivationCheckpointStats().forwards, 0);
}

// backward twice through a retained graph recomputes each time (what was handed out is gone).
TEST(ActivationCheckpointing, RetainedGraphRecomputesForEachBackward) {
  Shape4 s;
  const Batch batch = MakeBatch(s, 2);
  TinyGpt plain(s), model(s);
  ASSERT_TRUE(EnableActivationCheckpointing(model, All(Kind::kEveryBlock)).ok());
  const StepResult want = Step(plain, batch, 2);
  ResetActivationCheckpointStats();
  ExpectIdentical(want, Step(model, batch, 2), "two backwards");
  EXPECT_EQ(GetActivationCheckpointStats().recomputes, 2 * 4);
}

// One block called twice in one forward (shared weights): two runs, each recomputed once; and a
// segment whose modules are not fed each other's output splits by itself.
class Reused : public Module {
 public:
  explicit Reused(bool scale_between) : Module("Reused"), scale_between_(scale_between) {
    std::mt19937 rng(11);
    in = RegisterModule("in", std::make_unique<Linear>(6, 16, rng));
    a = RegisterModule("a", std::make_unique<Block>(16, 2, rng));
    b = RegisterModule("b", std::make_unique<Block>(16, 2, rng));
    out = RegisterModule("out", std::make_unique<Linear>(16, 32, rng));
  }
  Tensor Forward(const Tensor& x) override {
    Tensor h = (*a)((*a)((*in)(x)));
    if (scale_between_) h = ops::Scale(h, 0.5f);
    return (*out)((*b)(h));
  }
  Linear *in, *out;
  Block *a, *b;

 private:
  bool scale_between_;
};

TEST(ActivationCheckpointing, ABlockUsedTwiceAndSegmentsThatDoNotChain) {
  std::mt19937 rng(5);
  Tensor x = test::RandomTensor({2, 8, 6}, rng);
  std::vector<int32_t> t(16);
  for (size_t i = 0; i < t.size(); ++i) t[i] = int32_t(i % 32);
  const Batch batch{x, Tensor::FromVector(t, {2, 8})};
  for (bool scale : {false, true}) {
    Reused plain(scale), model(scale);
    // a and b as one segment. a is its first module, so each call of a starts a run; b joins
    // the second run only when fed a's output directly, and starts its own otherwise.
    ASSERT_TRUE(CheckpointSegment({{"a", model.a}, {"b", model.b}}).ok());
    const StepResult want = Step(plain, batch);
    ResetActivationCheckpointStats();
    ExpectIdentical(want, Step(model, batch), scale ? "scaled between" : "chained");
    EXPECT_EQ(GetActivationCheckpointStats().forwards, scale ? 3 : 2);
    EXPECT_EQ(GetActivationCheckpointStats().recomputes, scale ? 3 : 2);
  }
}

// ---- Parameters released between uses (ZeRO-3's pattern) -----------------------------------

// Each block's parameters have memory only while gathered: forward pre-hook to forward hook, and
// pre-backward to post-backward, with a nesting count, as plugins/zero does. A recompute must
// find what it reads gathered, and leave it gathered for the block's backward nodes.
class FakeStage3 {
 public:
  explicit FakeStage3(Module& model) {
    for (auto& [name, block] : model.NamedBlocks()) {
      Unit& u = units_.emplace_back();
      for (auto& [pn, p] : block->NamedParameters()) {
        u.params.push_back(p);
        u.master.push_back(p.Detach().Clone());
        p.storage()->Release();
      }
    }
    size_t i = 0;
    for (auto& [name, block] : model.NamedBlocks()) {
      Unit* u = &units_[i++];
      block->AddForwardPreHook([u](Module&) { Gather(*u); });
      block->AddForwardHook([u](Module&) { Release(*u); });
      block->AddBackwardPreHook([u](Module&) { Gather(*u); });
      block->AddBackwardHook([u](Module&) { Release(*u); });
    }
  }
  int gathers() const {
    int n = 0;
    for (const Unit& u : units_) n += u.gathers;
    return n;
  }

 private:
  struct Unit {
    std::vector<Tensor> params, master;
    int gathered = 0, gathers = 0;
  };
  static void Gather(Unit& u) {
    if (u.gathered++ > 0) return;
    ++u.gathers;
    for (size_t i = 0; i < u.params.size(); ++i) {
      u.params[i].storage()->Reallocate();
      u.params[i].Detach().CopyFrom(u.master[i]);
    }
  }
  static void Release(Unit& u) {
    if (--u.gathered > 0) return;
    for (Tensor& p : u.params) p.storage()->Release();
  }
  std::vector<Unit> units_;
};

TEST(ActivationCheckpointing, WorksWhenBlocksReleaseTheirParametersBetweenUses) {
  Shape4 s;
  s.n_layer = 4;
  const Batch batch = MakeBatch(s, 2);
  TinyGpt plain(s);
  FakeStage3 plain_shards(plain);
  const StepResult want = Step(plain, batch);
  EXPECT_EQ(plain_shards.gathers(), 2 * 4);  // forward and backward, per block
  for (CheckpointPolicy policy : {Policy(Kind::kEveryBlock), Policy(Kind::kSqrt), Policy(Kind::kAttention)}) {
    TinyGpt model(s);
    FakeStage3 shards(model);  // installed first, as a strategy's Setup does before checkpointing
    ASSERT_TRUE(EnableActivationCheckpointing(model, policy).ok());
    ExpectIdentical(want, Step(model, batch), policy.ToString());
    // sqrt (segments {0,1}, {2,3}, the last left plain): recomputing a segment gathers its first
    // block once more.
    EXPECT_EQ(shards.gathers(), 2 * 4 + (policy.kind == Kind::kSqrt ? 1 : 0)) << policy.ToString();
  }
}

// ---- Random ops ----------------------------------------------------------------------------

thread_local std::mt19937 g_noise(1);

// Multiplies by fresh noise from g_noise: a stand-in for dropout, which Braid lacks.
class Noisy : public Module {
 public:
  Noisy() : Module("Noisy") {
    set_block(true);
    std::mt19937 rng(9);
    fc = RegisterModule("fc", std::make_unique<Linear>(8, 8, rng));
  }
  Tensor Forward(const Tensor& x) override {
    Tensor h = (*fc)(x);
    std::uniform_real_distribution<float> u(0.5f, 1.5f);
    std::vector<float> noise(size_t(h.numel()));
    for (float& v : noise) v = u(g_noise);
    return ops::Tanh(ops::Mul(h, Tensor::FromVector(noise, h.shape())));
  }
  Linear* fc;
};

TEST(ActivationCheckpointing, RandomOpsReplayTheirDrawsThroughTheRngHook) {
  std::mt19937 rng(2);
  Tensor x = test::RandomTensor({3, 8}, rng);
  x.set_requires_grad(true);
  auto grad_of = [&](Noisy& m) {
    g_noise.seed(1);
    m.ZeroGrad();
    ops::Sum(m(x)).Backward();
    return m.fc->weight.grad().ToFloatVector();
  };
  Noisy plain, model;
  const std::vector<float> want = grad_of(plain);
  ASSERT_TRUE(EnableActivationCheckpointing(model, All(Kind::kEveryBlock)).ok());
  // Without the hook the recompute draws new noise: the gradient is wrong.
  EXPECT_FALSE(Bitwise(want, grad_of(model)));
  SetCheckpointRngState({[] { return std::shared_ptr<void>(std::make_shared<std::mt19937>(g_noise)); },
                         [](const std::shared_ptr<void>& s) { g_noise = *static_cast<std::mt19937*>(s.get()); }});
  EXPECT_TRUE(Bitwise(want, grad_of(model)));
  SetCheckpointRngState({});
}

// ---- Errors --------------------------------------------------------------------------------

// Calls its one child (by default a 4x4 Linear named fc): the trees the error cases need.
class Shell : public Module {
 public:
  Shell(const char* type, bool block, const char* name = "fc", std::unique_ptr<Module> child = nullptr)
      : Module(type) {
    set_block(block);
    std::mt19937 rng(1);
    if (child == nullptr) child = std::make_unique<Linear>(4, 4, rng);
    this->child = RegisterModule(name, std::move(child));
  }
  Tensor Forward(const Tensor& x) override { return (*child)(x); }
  Module* child;
};

std::unique_ptr<Module> DenseBlock() { return std::make_unique<Shell>("DenseBlock", true); }

TEST(ActivationCheckpointing, ErrorsSayWhatIsWrongAndWhatToDo) {
  Shell mlp("Mlp", false);
  auto st = EnableActivationCheckpointing(mlp, Policy(Kind::kSqrt)).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(st.message(), HasSubstr("the model (Mlp) has no blocks"));
  EXPECT_THAT(st.message(), HasSubstr("remove the activation_checkpointing section"));

  Shell holder("Holder", false, "blk", DenseBlock());
  EXPECT_THAT(EnableActivationCheckpointing(holder, Policy(Kind::kAttention)).status().message(),
              HasSubstr("block 'blk' (DenseBlock) has none (its children: fc); use policy "
                        "\"every_block\""));
  auto done = EnableActivationCheckpointing(holder, All(Kind::kEveryBlock));
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->ToString(), "1 of 1 blocks in 1 segment (policy every_block)");
  EXPECT_TRUE(IsActivationCheckpointed(*holder.child));
  EXPECT_THAT(EnableActivationCheckpointing(holder, All(Kind::kEveryBlock)).status().message(),
              HasSubstr("'blk' is already (activation checkpointing was enabled twice?)"));
  EXPECT_THAT(CheckpointSegment({{"blk", holder.child}}).message(), HasSubstr("already checkpointed"));

  // Restored: the block computes plainly again and can be checkpointed anew.
  EXPECT_EQ(DisableActivationCheckpointing(holder), 1);
  EXPECT_FALSE(holder.child->forward_replaced());
  EXPECT_TRUE(EnableActivationCheckpointing(holder, All(Kind::kEveryBlock)).ok());

  // A block inside a block: checkpointing both would nest.
  Shell two("TwoLevels", false, "outer", std::make_unique<Shell>("Nested", true, "inner", DenseBlock()));
  EXPECT_THAT(EnableActivationCheckpointing(two, All(Kind::kEveryBlock)).status().message(),
              HasSubstr("block 'outer.inner' lies inside block 'outer', and checkpoints cannot nest"));
  EXPECT_FALSE(IsActivationCheckpointed(*two.child));  // refused before changing anything

  // Nesting set up by hand (a checkpointed module inside a checkpointed one) fails when run.
  Shell nested("Holder", false, "blk", DenseBlock());
  Module* fc = nested.child->NamedChildren()[0].second;
  ASSERT_TRUE(CheckpointSegment({{"blk.fc", fc}}).ok());
  ASSERT_TRUE(CheckpointSegment({{"blk", nested.child}}).ok());
  Tensor x = Tensor::Full({2, 4}, 0.5f);
  EXPECT_DEATH(ops::Sum(nested(x)).Backward(), HasSubstr("checkpoints cannot nest"));
}

// A forward that saves something else when run again cannot be recomputed: fatal, naming it.
class Fickle : public Module {
 public:
  Fickle() : Module("Fickle") {
    set_block(true);
    w = RegisterParameter("w", Tensor::Full({4}, 0.5f));
  }
  Tensor Forward(const Tensor& x) override {
    ++calls;
    return calls == 1 ? ops::Mul(x, ops::Add(x, w)) : ops::Add(x, w);
  }
  Tensor w;
  int calls = 0;
};

TEST(ActivationCheckpointing, ARecomputeThatSavesOtherTensorsIsFatal) {
  Fickle f;
  ASSERT_TRUE(EnableActivationCheckpointing(f, All(Kind::kEveryBlock)).ok());
  Tensor x = Tensor::Full({2, 4}, 0.5f);
  x.set_requires_grad(true);
  EXPECT_DEATH(ops::Sum(f(x)).Backward(),
               HasSubstr("recomputing '' saved 0 tensors for backward where its forward saved 2"));
}

}  // namespace
}  // namespace braid
