// The Llama model's contract: Hugging Face's names and shapes, llama-mini's parameter count,
// tied and untied heads, the pipeline layers composing to the forward, causality, and grouped
// K/V heads equal to the same heads repeated. (Parity of the numbers with a PyTorch Llama is
// tests/parity/llama_parity_test.)
#include "models/llama/llama.h"

#include <map>
#include <string>

#include "core/autograd.h"
#include "core/ops.h"
#include "core/testing/compare.h"
#include "gtest/gtest.h"

namespace braid::models {
namespace {

LlamaConfig Small(bool tied) {
  LlamaConfig c;
  c.vocab_size = 32;
  c.block_size = 16;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_kv_head = 2;
  c.n_embd = 16;
  c.intermediate_size = 24;
  c.tie_embeddings = tied;
  return c;
}

Tensor Ids(int64_t b, int64_t t, int64_t vocab, int salt = 0) {
  std::vector<int32_t> v(size_t(b * t));
  for (size_t i = 0; i < v.size(); ++i) v[i] = int32_t((i * 7 + 3 + salt * 5) % vocab);
  return Tensor::FromVector(v, {b, t});
}

TEST(Llama, MiniHasHuggingFaceNamesAndGptMinisSize) {
  Llama m(LlamaConfig::Mini());
  EXPECT_EQ(m.NumParameters(), 3279104);  // gpt-mini: 3,257,856
  std::map<std::string, Shape> want = {
      {"model.embed_tokens.weight", {256, 256}},
      {"model.norm.weight", {256}},
      {"lm_head.weight", {256, 256}},
  };
  for (int i = 0; i < 4; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    want[p + "self_attn.q_proj.weight"] = {256, 256};
    want[p + "self_attn.k_proj.weight"] = {128, 256};  // 2 K/V heads of 64
    want[p + "self_attn.v_proj.weight"] = {128, 256};
    want[p + "self_attn.o_proj.weight"] = {256, 256};
    want[p + "mlp.gate_proj.weight"] = {768, 256};
    want[p + "mlp.up_proj.weight"] = {768, 256};
    want[p + "mlp.down_proj.weight"] = {256, 768};
    want[p + "input_layernorm.weight"] = {256};
    want[p + "post_attention_layernorm.weight"] = {256};
  }
  auto sd = m.StateDict();
  ASSERT_EQ(sd.size(), want.size());
  for (auto& [name, shape] : want) {
    ASSERT_TRUE(sd.count(name)) << name;
    EXPECT_EQ(sd[name].shape(), shape) << name;
  }
  ASSERT_EQ(m.NamedBlocks().size(), 4u);
  EXPECT_EQ(m.NamedBlocks()[3].first, "model.layers.3");
  // Norms take no weight decay; matrices do.
  for (auto& [name, t] : m.NamedParameters()) {
    EXPECT_EQ(t.weight_decay(), name.find("norm") == std::string::npos) << name;
  }
}

TEST(Llama, TiedHeadIsTheEmbedding) {
  Llama tied(Small(true)), untied(Small(false));
  EXPECT_EQ(tied.StateDict().count("lm_head.weight"), 0u);
  EXPECT_EQ(untied.NumParameters() - tied.NumParameters(), 32 * 16);
  // The tied head's logits are x . embed_tokensᵀ: scaling the embedding's rows moves them.
  Tensor ids = Ids(1, 5, 32);
  std::vector<float> before = tied(ids).ToFloatVector();
  {
    autograd::NoGradGuard ng;
    Tensor w = tied.StateDict().at("model.embed_tokens.weight");
    w.Detach().CopyFrom(ops::Scale(w.Detach(), 2.0f));
  }
  std::vector<float> after = tied(ids).ToFloatVector();
  EXPECT_GT(testing::MaxAbsDiff(before, after), 1e-3);
}

TEST(Llama, PipelineLayersComposeToTheForward) {
  Llama m(Small(false));
  std::vector<PipelineLayer> layers = m.PipelineLayers();
  ASSERT_EQ(layers.size(), 4u);
  EXPECT_EQ(layers[0].name, "embedding");
  EXPECT_EQ(layers[1].name, "model.layers.0");
  EXPECT_EQ(layers[3].name, "head");
  EXPECT_EQ(layers[3].parameters, (std::vector<std::string>{"model.norm.weight", "lm_head.weight"}));
  // Every parameter is some layer's.
  std::map<std::string, int> used;
  for (const PipelineLayer& l : layers)
    for (const std::string& p : l.parameters) ++used[p];
  for (auto& [name, t] : m.NamedParameters()) EXPECT_EQ(used[name], 1) << name;
  Tensor ids = Ids(2, 6, 32);
  Tensor x = ids;
  for (const PipelineLayer& l : layers) x = l.forward(x);
  EXPECT_EQ(x.shape(), (Shape{2, 6, 32}));
  EXPECT_EQ(testing::MaxAbsDiff(x.ToFloatVector(), m(ids).ToFloatVector()), 0.0);
  Llama tied(Small(true));
  EXPECT_EQ(tied.PipelineLayers().back().parameters,
            (std::vector<std::string>{"model.norm.weight", "model.embed_tokens.weight"}));
}

TEST(Llama, IsCausal) {
  Llama m(Small(false));
  Tensor a = Ids(1, 8, 32, 0), b = Ids(1, 8, 32, 0);
  std::vector<int32_t> v = b.ToVector<int32_t>();
  v[7] = (v[7] + 1) % 32;  // only the last token differs
  b = Tensor::FromVector(v, {1, 8});
  std::vector<float> la = m(a).ToFloatVector(), lb = m(b).ToFloatVector();
  const size_t first7 = 7 * 32;
  EXPECT_EQ(testing::MaxAbsDiff({la.begin(), la.begin() + first7}, {lb.begin(), lb.begin() + first7}), 0.0);
  EXPECT_GT(testing::MaxAbsDiff(la, lb), 1e-6);
}

// Grouped K/V heads compute what the same heads repeated for every query head compute
// (Hugging Face's repeat_kv): a model with n_kv_head = n_head whose K/V weights repeat the
// grouped model's K/V rows gives the same logits.
TEST(Llama, GroupedKvEqualsRepeatedKv) {
  LlamaConfig gc = Small(false), fc = Small(false);
  fc.n_kv_head = fc.n_head;
  Llama grouped(gc), full(fc);
  std::map<std::string, Tensor> sd = grouped.StateDict();
  const int64_t d = gc.head_dim(), group = gc.n_head / gc.n_kv_head;
  for (int i = 0; i < 2; ++i) {
    for (const char* p : {"k_proj", "v_proj"}) {
      const std::string name = "model.layers." + std::to_string(i) + ".self_attn." + p + ".weight";
      std::vector<float> w = sd.at(name).ToFloatVector(), rep;
      for (int64_t h = 0; h < gc.n_head; ++h) {
        const int64_t kv = h / group;
        rep.insert(rep.end(), w.begin() + kv * d * gc.n_embd, w.begin() + (kv + 1) * d * gc.n_embd);
      }
      sd[name] = Tensor::FromVector(rep, {gc.n_head * d, gc.n_embd});
    }
  }
  ASSERT_TRUE(full.LoadStateDict(sd).ok());
  Tensor ids = Ids(2, 7, 32);
  std::vector<float> lg = grouped(ids).ToFloatVector(), lf = full(ids).ToFloatVector();
  EXPECT_LE(testing::MaxAbsDiff(lg, lf), 1e-6);
}

// 6 per multiplying weight: every parameter but the embedding table when untied (llama-mini:
// 3,279,104 - 65,536), plus attention's 12 L d T.
TEST(Llama, TrainFlopsPerTokenCountsEveryMultiplyingWeight) {
  const LlamaConfig c = LlamaConfig::Mini();
  EXPECT_DOUBLE_EQ(TrainFlopsPerToken(c), 6.0 * (3279104 - 256 * 256) + 12.0 * 4 * 256 * 128);
  LlamaConfig tied = c;
  tied.tie_embeddings = true;  // the head still multiplies
  EXPECT_DOUBLE_EQ(TrainFlopsPerToken(tied), TrainFlopsPerToken(c));
}

TEST(Llama, ShapeProblemsNameTheFields) {
  LlamaConfig c = Small(false);
  c.n_kv_head = 3;
  EXPECT_EQ(c.Problems(),
            "n_head (4) is not a multiple of n_kv_head (3): each K/V head serves a whole group of "
            "query heads");
  c = Small(false);
  c.n_embd = 20;  // 5 per head
  c.rope_scaling = "yarn";
  EXPECT_EQ(c.Problems(),
            "the head width n_embd / n_head (5) is odd; rotary embeddings rotate pairs of "
            "features; rope_scaling \"yarn\" is not supported (supported: linear, ntk, or none)");
  EXPECT_EQ(Small(true).Problems(), "");
}

// ---- The KV cache (inference) ----------------------------------------------------------------

// Columns [begin, end) of logits [B, T, V], flattened as a [B, end - begin, V] tensor would be.
std::vector<float> Positions(const Tensor& logits, int64_t begin, int64_t end) {
  const int64_t B = logits.size(0), T = logits.size(1), V = logits.size(2);
  std::vector<float> all = logits.ToFloatVector(), out;
  for (int64_t b = 0; b < B; ++b) {
    out.insert(out.end(), all.begin() + (b * T + begin) * V, all.begin() + (b * T + end) * V);
  }
  return out;
}

Tensor Columns(const Tensor& ids, int64_t begin, int64_t end) {
  const int64_t B = ids.size(0), T = ids.size(1);
  std::vector<int32_t> all = ids.ToVector<int32_t>(), out;
  for (int64_t b = 0; b < B; ++b) {
    out.insert(out.end(), all.begin() + b * T + begin, all.begin() + b * T + end);
  }
  return Tensor::FromVector(out, {B, end - begin});
}

// Logits through the cache, a prefix then chunks of 1 and 3 positions, equal the full forward's
// at the same positions (f32 rounding apart: the cache's attention sums in another order), with
// grouped K/V heads, untied and tied, and with linear RoPE scaling (the offset of each chunk's
// positions meets the scale). Weights large enough that the logits differ between positions.
TEST(Llama, CachedLogitsEqualTheFullForward) {
  for (int variant = 0; variant < 2; ++variant) {
    LlamaConfig c = Small(variant == 1);
    c.init_std = 0.3f;
    if (variant == 1) {
      c.rope_scaling = "linear";
      c.rope_scaling_factor = 2.0f;
    }
    Llama m(c);
    Tensor ids = Ids(2, 12, c.vocab_size, variant);
    Tensor full;
    {
      autograd::NoGradGuard no_grad;
      full = m(ids);
    }
    KvCache cache = m.NewKvCache(2);
    EXPECT_EQ(cache.capacity(), c.block_size);
    int64_t at = 0;
    for (int64_t step : {5, 1, 1, 3, 2}) {
      Tensor out = m.ForwardCached(Columns(ids, at, at + step), cache);
      ASSERT_EQ(out.shape(), (Shape{2, step, c.vocab_size}));
      EXPECT_LE(testing::MaxRelDiff(out.ToFloatVector(), Positions(full, at, at + step)), 1e-5)
          << "variant " << variant << ", positions " << at << ".." << at + step - 1;
      at += step;
      EXPECT_EQ(cache.length(), at);
    }
    // The comparison can fail: logits of different positions differ by far more.
    EXPECT_GT(testing::MaxRelDiff(Positions(full, 10, 11), Positions(full, 11, 12)), 1e-2);
  }
}

// A cache holding another sequence gives other logits: the cache is what the new token reads.
TEST(Llama, AWrongCacheChangesTheLogits) {
  LlamaConfig c = Small(false);
  c.init_std = 0.3f;
  Llama m(c);
  Tensor a = Ids(1, 8, c.vocab_size, 1), b = Ids(1, 8, c.vocab_size, 2);
  Tensor full;
  {
    autograd::NoGradGuard no_grad;
    full = m(a);
  }
  KvCache cache = m.NewKvCache();
  m.ForwardCached(Columns(b, 0, 7), cache);
  Tensor last = m.ForwardCached(Columns(a, 7, 8), cache);
  EXPECT_GT(testing::MaxRelDiff(last.ToFloatVector(), Positions(full, 7, 8)), 1e-3);
}

}  // namespace
}  // namespace braid::models
