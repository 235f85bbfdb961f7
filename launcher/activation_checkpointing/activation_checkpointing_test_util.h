// The small GPT-shaped model and step helpers that activation checkpointing's two test files
// (activation_checkpointing_test.cc, activation_checkpointing_recompute_test.cc) run on. Defined
// here because core's tests cannot link models/; a testonly library so both files share one copy.
#ifndef BRAID_LAUNCHER_ACTIVATION_CHECKPOINTING_ACTIVATION_CHECKPOINTING_TEST_UTIL_H_
#define BRAID_LAUNCHER_ACTIVATION_CHECKPOINTING_ACTIVATION_CHECKPOINTING_TEST_UTIL_H_

#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/module.h"
#include "core/ops.h"
#include "core/tensor.h"
#include "core/testing/test_util.h"
#include "launcher/activation_checkpointing/activation_checkpointing.h"

namespace braid::checkpointing_test {

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

Batch MakeBatch(const Shape4& s, int64_t b, uint32_t seed = 3);

struct StepResult {
  std::vector<float> logits;
  float loss = 0;
  std::map<std::string, std::vector<float>> grads;
};

StepResult Step(Module& model, const Batch& batch, int backwards = 1);

bool Bitwise(const std::vector<float>& a, const std::vector<float>& b);

void ExpectIdentical(const StepResult& plain, const StepResult& ckpt, const std::string& what);

// The policy as configured: the last segment, where backward starts, is left plain.
CheckpointPolicy Policy(CheckpointPolicy::Kind kind, int k = 0);
// The policy with its last segment checkpointed too: the whole partition, and the mechanism on
// one-block models.
CheckpointPolicy All(CheckpointPolicy::Kind kind, int k = 0);

}  // namespace braid::checkpointing_test

#endif  // BRAID_LAUNCHER_ACTIVATION_CHECKPOINTING_ACTIVATION_CHECKPOINTING_TEST_UTIL_H_
