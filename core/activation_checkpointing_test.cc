// Activation checkpointing (core/activation_checkpointing.h) on a small GPT-shaped model defined
// here (core's tests cannot link models/), on the reference kernels: the same gradients, bit for
// bit, as the plain model under every policy; less memory held for backward; hooks and
// recomputation counts; a parameter-sharding pattern like ZeRO-3's; random ops replayed.
#include "core/activation_checkpointing.h"

#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/allocator.h"
#include "core/autograd.h"
#include "core/config/train_config.pb.h"
#include "core/ops.h"
#include "core/testing/test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace braid {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Kind = CheckpointPolicy::Kind;

// ---- A GPT-shaped model --------------------------------------------------------------------

class Linear : public Module {
 public:
  Linear(int64_t in, int64_t out, std::mt19937& rng) : Module("Linear") {
    weight = RegisterParameter("weight", test::RandomTensor({out, in}, rng, -0.4f, 0.4f));
    bias = RegisterParameter("bias", test::RandomTensor({out}, rng, -0.1f, 0.1f));
  }
  Tensor Forward(const Tensor& x) override { return ops::Linear(x, weight, bias); }
  Tensor weight, bias;
};

class Norm : public Module {
 public:
  Norm(int64_t c, std::mt19937& rng) : Module("LayerNorm") {
    weight = RegisterParameter("weight", test::RandomTensor({c}, rng, 0.8f, 1.2f));
    bias = RegisterParameter("bias", test::RandomTensor({c}, rng, -0.1f, 0.1f));
  }
  Tensor Forward(const Tensor& x) override { return ops::LayerNorm(x, weight, bias); }
  Tensor weight, bias;
};

class Attention : public Module {
 public:
  Attention(int64_t c, int n_head, std::mt19937& rng) : Module("CausalSelfAttention"), n_head_(n_head) {
    c_attn = RegisterModule("c_attn", std::make_unique<Linear>(c, 3 * c, rng));
    c_proj = RegisterModule("c_proj", std::make_unique<Linear>(c, c, rng));
  }
  Tensor Forward(const Tensor& x) override {
    return (*c_proj)(ops::CausalSelfAttention((*c_attn)(x), n_head_));
  }
  Linear *c_attn, *c_proj;

 private:
  int n_head_;
};

class Mlp : public Module {
 public:
  Mlp(int64_t c, std::mt19937& rng) : Module("MLP") {
    c_fc = RegisterModule("c_fc", std::make_unique<Linear>(c, 4 * c, rng));
    c_proj = RegisterModule("c_proj", std::make_unique<Linear>(4 * c, c, rng));
  }
  Tensor Forward(const Tensor& x) override { return (*c_proj)(ops::GeluTanh((*c_fc)(x))); }
  Linear *c_fc, *c_proj;
};

class Block : public Module {
 public:
  Block(int64_t c, int n_head, std::mt19937& rng) : Module("Block") {
    set_block(true);
    ln_1 = RegisterModule("ln_1", std::make_unique<Norm>(c, rng));
    attn = RegisterModule("attn", std::make_unique<Attention>(c, n_head, rng));
    ln_2 = RegisterModule("ln_2", std::make_unique<Norm>(c, rng));
    mlp = RegisterModule("mlp", std::make_unique<Mlp>(c, rng));
  }
  Tensor Forward(const Tensor& x) override {
    Tensor h = ops::Add(x, (*attn)((*ln_1)(x)));
    return ops::Add(h, (*mlp)((*ln_2)(h)));
  }
  Norm *ln_1, *ln_2;
  Attention* attn;
  Mlp* mlp;
};

class List : public Module {
 public:
  List() : Module("ModuleList") {}
  template <typename M>
  M* Add(std::unique_ptr<M> m) {
    return RegisterModule(std::to_string(NamedChildren().size()), std::move(m));
  }
  Tensor Forward(const Tensor&) override {
    BRAID_CHECK(false) << "a list is not called";
    return Tensor();
  }
};

struct Shape4 {  // GPT's n_layer, n_head, n_embd, vocab_size, block_size
  int n_layer = 4, n_head = 2;
  int64_t c = 16, vocab = 32, t = 8;
};

class TinyGpt : public Module {
 public:
  explicit TinyGpt(const Shape4& s, uint32_t seed = 7) : Module("TinyGpt") {
    std::mt19937 rng(seed);
    wte = RegisterParameter("wte", test::RandomTensor({s.vocab, s.c}, rng, -0.5f, 0.5f));
    wpe = RegisterParameter("wpe", test::RandomTensor({s.t, s.c}, rng, -0.5f, 0.5f));
    auto* h = RegisterModule("h", std::make_unique<List>());
    for (int i = 0; i < s.n_layer; ++i) blocks.push_back(h->Add(std::make_unique<Block>(s.c, s.n_head, rng)));
    ln_f = RegisterModule("ln_f", std::make_unique<Norm>(s.c, rng));
    head = RegisterModule("head", std::make_unique<Linear>(s.c, s.vocab, rng));
    std::vector<int32_t> pos(size_t(s.t));
    for (size_t i = 0; i < pos.size(); ++i) pos[i] = int32_t(i);
    positions_ = Tensor::FromVector(pos, {s.t});
  }
  Tensor Forward(const Tensor& ids) override {
    Tensor x = ops::Add(ops::Embedding(wte, ids), ops::Embedding(wpe, positions_));
    for (Block* b : blocks) x = (*b)(x);
    return (*head)((*ln_f)(x));
  }
  Tensor wte, wpe;
  std::vector<Block*> blocks;
  Norm* ln_f;
  Linear* head;

 private:
  Tensor positions_;
};

struct Batch { Tensor ids, targets; };

Batch MakeBatch(const Shape4& s, int64_t b, uint32_t seed = 3) {
  std::mt19937 rng(seed);
  std::vector<int32_t> ids(size_t(b * s.t)), targets(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    ids[i] = int32_t(rng() % uint32_t(s.vocab));
    targets[i] = int32_t(rng() % uint32_t(s.vocab));
  }
  return {Tensor::FromVector(ids, {b, s.t}), Tensor::FromVector(targets, {b, s.t})};
}

struct StepResult {
  std::vector<float> logits;
  float loss = 0;
  std::map<std::string, std::vector<float>> grads;
};

StepResult Step(Module& model, const Batch& batch, int backwards = 1) {
  model.ZeroGrad();
  StepResult r;
  Tensor logits = model(batch.ids);
  Tensor loss = ops::CrossEntropy(logits, batch.targets);
  for (int i = 0; i < backwards; ++i) loss.Backward(Tensor(), /*retain_graph=*/i + 1 < backwards);
  r.logits = logits.ToFloatVector();
  r.loss = loss.item();
  for (auto& [name, p] : model.NamedParameters()) {
    r.grads[name] = p.grad().defined() ? p.grad().ToFloatVector() : std::vector<float>();
  }
  return r;
}

bool Bitwise(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

void ExpectIdentical(const StepResult& plain, const StepResult& ckpt, const std::string& what) {
  EXPECT_TRUE(Bitwise(plain.logits, ckpt.logits)) << what << ": forward output differs";
  EXPECT_EQ(std::memcmp(&plain.loss, &ckpt.loss, sizeof(float)), 0) << what;
  ASSERT_EQ(plain.grads.size(), ckpt.grads.size());
  for (auto& [name, g] : plain.grads) {
    EXPECT_FALSE(g.empty()) << what << ": " << name << " got no gradient";
    EXPECT_TRUE(Bitwise(g, ckpt.grads.at(name))) << what << ": gradient of " << name << " differs";
  }
}

// The policy as configured: the last segment, where backward starts, is left plain.
CheckpointPolicy Policy(Kind kind, int k = 0) { return CheckpointPolicy{kind, k}; }
// The policy with its last segment checkpointed too: the whole partition, and the mechanism on
// one-block models.
CheckpointPolicy All(Kind kind, int k = 0) {
  CheckpointPolicy p{kind, k};
  p.checkpoint_last_segment = true;
  return p;
}

std::vector<size_t> Lengths(const std::vector<std::vector<int>>& plan) {
  std::vector<size_t> out;
  for (const auto& s : plan) out.push_back(s.size());
  return out;
}

// ---- Policies ------------------------------------------------------------------------------

TEST(CheckpointPolicy, SegmentsOfEachPolicy) {
  // sqrt: ⌈√n⌉ consecutive segments, longer first, covering every block once.
  EXPECT_THAT(Lengths(PlanCheckpointSegments(1, All(Kind::kSqrt))), ElementsAre(1));
  EXPECT_THAT(Lengths(PlanCheckpointSegments(3, All(Kind::kSqrt))), ElementsAre(2, 1));
  EXPECT_THAT(Lengths(PlanCheckpointSegments(4, All(Kind::kSqrt))), ElementsAre(2, 2));
  EXPECT_THAT(Lengths(PlanCheckpointSegments(8, All(Kind::kSqrt))), ElementsAre(3, 3, 2));
  EXPECT_THAT(Lengths(PlanCheckpointSegments(16, All(Kind::kSqrt))), ElementsAre(4, 4, 4, 4));
  EXPECT_THAT(Lengths(PlanCheckpointSegments(32, All(Kind::kSqrt))), ElementsAre(6, 6, 5, 5, 5, 5));
  std::vector<int> all;
  for (const auto& s : PlanCheckpointSegments(32, All(Kind::kSqrt))) all.insert(all.end(), s.begin(), s.end());
  for (int i = 0; i < 32; ++i) EXPECT_EQ(all[size_t(i)], i);

  EXPECT_EQ(PlanCheckpointSegments(3, All(Kind::kEveryBlock)),
            (std::vector<std::vector<int>>{{0}, {1}, {2}}));
  EXPECT_EQ(PlanCheckpointSegments(8, All(Kind::kEveryK, 3)),
            (std::vector<std::vector<int>>{{0}, {3}, {6}}));
  EXPECT_EQ(PlanCheckpointSegments(2, All(Kind::kAttention)),
            (std::vector<std::vector<int>>{{0}, {1}}));
  EXPECT_TRUE(PlanCheckpointSegments(0, All(Kind::kSqrt)).empty());

  // By default the last segment, where backward starts, is left out when it ends at the last
  // block; every_k's last segment may end earlier, and then stays.
  EXPECT_THAT(Lengths(PlanCheckpointSegments(8, Policy(Kind::kSqrt))), ElementsAre(3, 3));
  EXPECT_THAT(Lengths(PlanCheckpointSegments(32, Policy(Kind::kSqrt))), ElementsAre(6, 6, 5, 5, 5));
  EXPECT_TRUE(PlanCheckpointSegments(1, Policy(Kind::kSqrt)).empty());
  EXPECT_EQ(PlanCheckpointSegments(3, Policy(Kind::kEveryBlock)),
            (std::vector<std::vector<int>>{{0}, {1}}));
  EXPECT_EQ(PlanCheckpointSegments(8, Policy(Kind::kEveryK, 3)),
            (std::vector<std::vector<int>>{{0}, {3}, {6}}));
  EXPECT_EQ(PlanCheckpointSegments(7, Policy(Kind::kEveryK, 3)),
            (std::vector<std::vector<int>>{{0}, {3}}));
  EXPECT_EQ(PlanCheckpointSegments(2, Policy(Kind::kAttention)), (std::vector<std::vector<int>>{{0}}));
}

TEST(CheckpointPolicy, ParsedFromTheConfigSection) {
  config::ActivationCheckpointingConfig section;
  auto p = CheckpointPolicyFromConfig(section);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->kind, Kind::kSqrt);  // the default
  section.set_policy("every_k");
  section.set_every_k(4);
  p = CheckpointPolicyFromConfig(section);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->ToString(), "every_k, k=4");
  EXPECT_EQ(ParseCheckpointPolicy("ATTENTION", std::nullopt)->kind, Kind::kAttention);
  EXPECT_THAT(ParseCheckpointPolicy("most", std::nullopt).status().message(),
              HasSubstr("activation_checkpointing.policy \"most\" is unknown; known: sqrt, "
                        "every_block, every_k, attention"));
  EXPECT_THAT(ParseCheckpointPolicy("every_k", std::nullopt).status().message(),
              HasSubstr("needs activation_checkpointing.every_k"));
  EXPECT_THAT(ParseCheckpointPolicy("sqrt", 2).status().message(),
              HasSubstr("applies to policy \"every_k\" only"));
}

// ---- Same results, less memory -------------------------------------------------------------

// Recomputing runs the same ops on the same values in the same order, and backward runs the
// original graph, so every gradient is bitwise the plain model's. 5 blocks: sqrt makes uneven
// segments (2, 2, 1), the last left plain by default.
TEST(ActivationCheckpointing, GradientsAreBitwiseThoseOfThePlainModelForEveryPolicy) {
  Shape4 s;
  s.n_layer = 5;
  const Batch batch = MakeBatch(s, 2);
  TinyGpt plain(s);
  const StepResult want = Step(plain, batch);
  struct Case {
    CheckpointPolicy policy;
    int segments;
  };
  for (const Case& c : {Case{Policy(Kind::kSqrt), 2}, Case{Policy(Kind::kEveryBlock), 4},
                        Case{Policy(Kind::kEveryK, 2), 2}, Case{Policy(Kind::kAttention), 4},
                        Case{All(Kind::kSqrt), 3}, Case{All(Kind::kEveryBlock), 5},
                        Case{All(Kind::kEveryK, 2), 3}, Case{All(Kind::kAttention), 5}}) {
    TinyGpt model(s);
    auto summary = EnableActivationCheckpointing(model, c.policy);
    ASSERT_TRUE(summary.ok()) << summary.status();
    EXPECT_EQ(summary->segments, c.segments) << c.policy.ToString();
    EXPECT_EQ(summary->blocks, 5);
    ResetActivationCheckpointStats();
    const StepResult got = Step(model, batch);
    ExpectIdentical(want, got, c.policy.ToString());
    ActivationCheckpointStats st = GetActivationCheckpointStats();
    EXPECT_EQ(st.forwards, c.segments) << c.policy.ToString() << ": one kept input per segment";
    EXPECT_EQ(st.recomputes, c.segments) << c.policy.ToString() << ": each recomputed once";
    EXPECT_EQ(st.kept_forwards, c.policy.checkpoint_last_segment ? 0 : 1)
        << c.policy.ToString() << ": the last segment kept, not recomputed";
    EXPECT_GT(st.placeholders, 0);
    // A second step (gradients cleared, new graph) is the same again.
    ExpectIdentical(want, Step(model, batch), c.policy.ToString() + ", second step");
  }
  TinyGpt model(s);
  auto summary = EnableActivationCheckpointing(model, Policy(Kind::kSqrt));
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_EQ(summary->ToString(),
            "4 of 5 blocks in 2 segments (policy sqrt; the last block kept, not recomputed: "
            "backward starts there)");
  TinyGpt selective(s);
  EXPECT_EQ(EnableActivationCheckpointing(selective, Policy(Kind::kAttention))->ToString(),
            "the attention of 4 of 5 blocks (policy attention; the last block's kept, not "
            "recomputed: backward starts there)");
  TinyGpt whole(s);
  EXPECT_EQ(EnableActivationCheckpointing(whole, All(Kind::kSqrt))->ToString(),
            "5 of 5 blocks in 3 segments (policy sqrt)");
  Shape4 s8 = s;
  s8.n_layer = 8;
  TinyGpt eight(s8);
  EXPECT_EQ(EnableActivationCheckpointing(eight, Policy(Kind::kSqrt))->ToString(),
            "6 of 8 blocks in 2 segments (policy sqrt; the last 2 blocks kept, not recomputed: "
            "backward starts there)");
}

struct Memory {
  int64_t held_after_forward = 0;  // what the graph keeps for backward (and the logits)
  int64_t peak = 0;                // over forward and backward
};

Memory Measure(Module& model, const Batch& batch) {
  model.ZeroGrad();
  Allocator* a = GetAllocator(Device::CPU());
  const int64_t base = a->stats().current_bytes;
  a->ResetPeak();
  Memory m;
  {
    Tensor loss = ops::CrossEntropy(model(batch.ids), batch.targets);
    m.held_after_forward = a->stats().current_bytes - base;
    loss.Backward();
  }
  m.peak = a->stats().peak_bytes - base;
  return m;
}

TEST(ActivationCheckpointing, HoldsLessForBackward) {
  Shape4 s;
  s.n_layer = 8;
  s.c = 32;
  s.t = 16;
  const Batch batch = MakeBatch(s, 4);
  TinyGpt plain(s);
  const Memory p = Measure(plain, batch);
  std::map<std::string, Memory> got;
  std::map<std::string, Memory> last_kept;  // the default: the last segment kept, not recomputed
  for (Kind kind : {Kind::kSqrt, Kind::kEveryBlock, Kind::kAttention}) {
    TinyGpt model(s), model2(s);
    ASSERT_TRUE(EnableActivationCheckpointing(model, All(kind)).ok());
    got[All(kind).ToString()] = Measure(model, batch);
    ASSERT_TRUE(EnableActivationCheckpointing(model2, Policy(kind)).ok());
    last_kept[Policy(kind).ToString()] = Measure(model2, batch);
  }
  // One block's input, [B, T, C] floats: every_block keeps 8 of them instead of every block's
  // saved activations (about 18 C per token), so it holds a fraction of the plain model.
  const int64_t input = 4 * 16 * 32 * 4;
  const Memory& every = got["every_block"];
  EXPECT_LT(every.held_after_forward, p.held_after_forward / 4)
      << every.held_after_forward << " vs " << p.held_after_forward;
  EXPECT_LT(got["sqrt"].held_after_forward, p.held_after_forward / 4);
  EXPECT_LT(got["attention"].held_after_forward, p.held_after_forward);
  EXPECT_LT(got["attention"].held_after_forward, p.held_after_forward * 3 / 4);
  // Kept inputs: 8 (every_block) against 3 (sqrt), the rest being the same embedding, head and
  // loss tensors.
  EXPECT_EQ(every.held_after_forward - got["sqrt"].held_after_forward, 5 * input);
  for (auto& [name, m] : got) {
    EXPECT_LT(m.peak, p.peak) << name << ": peak " << m.peak << " vs plain " << p.peak;
  }
  // The recompute holds one segment's activations at a time: one block (every_block) is less than
  // three (sqrt's longest segment).
  EXPECT_LT(every.peak, got["sqrt"].peak);
  // Keeping the last segment's saved tensors from the forward into backward, which would have
  // rebuilt them first thing, saves one recompute. Since the engine frees each node's saved
  // tensors once it ran, a recompute of the last segment comes after the loss and head's
  // backward has freed what it used, so keeping can cost at most the kept segment's own saved
  // tensors at the peak (the difference in what the forward holds; exactly, the allocator's
  // counts are deterministic): nothing for sqrt and every_block here, one attention's for
  // attention.
  for (auto& [name, m] : last_kept) {
    const int64_t kept_extra = m.held_after_forward - got[name].held_after_forward;
    EXPECT_LE(m.peak, got[name].peak + kept_extra)
        << name << ": last segment kept " << m.peak << " vs all " << got[name].peak;
    if (name != "attention") EXPECT_EQ(m.peak, got[name].peak) << name;
    EXPECT_LT(m.held_after_forward, name == "attention" ? p.held_after_forward * 3 / 4 + input
                                                        : p.held_after_forward / 2)
        << name;
  }
}

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
