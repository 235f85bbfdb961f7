// Activation checkpointing (launcher/activation_checkpointing/activation_checkpointing.h) on the small GPT-shaped model of
// activation_checkpointing_test_util.h, on the reference kernels: the policies' segments and
// their config section; the same gradients, bit for bit, as the plain model under every policy;
// less memory held for backward. Hooks and recomputation counts, a parameter-sharding pattern like
// ZeRO-3's, random ops replayed and misuse are in activation_checkpointing_recompute_test.cc.
#include "launcher/activation_checkpointing/activation_checkpointing.h"

#include <map>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "launcher/config/train_config.pb.h"
#include "core/ops.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "launcher/activation_checkpointing/activation_checkpointing_test_util.h"

namespace braid {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Kind = CheckpointPolicy::Kind;
using checkpointing_test::All;
using checkpointing_test::Batch;
using checkpointing_test::ExpectIdentical;
using checkpointing_test::MakeBatch;
using checkpointing_test::Policy;
using checkpointing_test::Shape4;
using checkpointing_test::Step;
using checkpointing_test::StepResult;
using checkpointing_test::TinyGpt;

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
    // The last block (its attention, for that policy) lies in the last segment: left as it is
    // unless the policy asks for it.
    Module* last = nullptr;
    for (auto& [name, m] : model.NamedModules()) {
      if (name == (c.policy.kind == Kind::kAttention ? "h.4.attn" : "h.4")) last = m;
    }
    ASSERT_NE(last, nullptr);
    EXPECT_EQ(IsActivationCheckpointed(*last), c.policy.checkpoint_last_segment)
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
    if (name != "attention") {
      EXPECT_EQ(m.peak, got[name].peak) << name;
    }
    EXPECT_LT(m.held_after_forward, name == "attention" ? p.held_after_forward * 3 / 4 + input
                                                        : p.held_after_forward / 2)
        << name;
  }
}

}  // namespace
}  // namespace braid
