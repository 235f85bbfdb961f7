// A model built outside models/ as a plugin (libbraid_tiny_lm.so), written only against the
// documented API (docs/WRITING_A_MODEL.md, "A model of your own, outside the tree"): core's
// Module, ops, deferred initialisation and registry, and the config schema's ModelConfig. The
// training program loads it at run time from a config's `model { name: "tiny_lm" path: ... }`,
// or by its name from the plugin search path, and trains it like a linked-in model.
//
// "tiny_lm" is a small causal language model over bytes: a token embedding, `n_layer` pre-norm
// blocks (causal self-attention, then a ReLU MLP `mlp_ratio` times wider), a final RMSNorm and an
// untied head. It takes the config's shape fields and one option of its own, cuts into
// pipeline layers, and carries its tensor-parallel plan (kTensorPlan): every matrix it splits is
// a module of its own (Projection, TokenEmbedding), because a plan names modules and replaces
// their forwards. Its loss is the default (cross-entropy against the next tokens).
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/config/sections.pb.h"
#include "core/deferred_init.h"
#include "core/module.h"
#include "core/ops.h"
#include "core/plugin_api.h"
#include "core/registry.h"

namespace tiny_lm {
namespace {

using braid::Device;
using braid::Module;
using braid::Tensor;

struct Shape {
  int64_t n_layer = 2, n_head = 2, n_embd = 64, block_size = 64, vocab_size = 256, mlp_ratio = 4;
};

// Initial values as a pure function of (seed, element index): any range of a parameter can be
// produced on its own, which is what deferred initialisation (ZeRO-3) asks of a model, and every
// rank gets the values a whole build gives. SplitMix64 to two uniforms, Box-Muller to a normal.
braid::Initializer NormalInit(uint64_t seed, float stddev) {
  return [seed, stddev](float* out, int64_t begin, int64_t end) {
    auto mix = [](uint64_t z) {
      z += 0x9E3779B97F4A7C15ull;
      z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
      z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
      return z ^ (z >> 31);
    };
    for (int64_t i = begin; i < end; ++i) {
      const uint64_t a = mix(seed ^ mix(uint64_t(2 * i))), b = mix(seed ^ mix(uint64_t(2 * i + 1)));
      const double u1 = (double(a >> 11) + 1.0) / 9007199254740993.0;  // (0, 1]
      const double u2 = double(b >> 11) / 9007199254740992.0;          // [0, 1)
      out[i - begin] = float(stddev * std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
    }
  };
}

// Hands each parameter a seed of its own, in construction order.
class Seeds {
 public:
  explicit Seeds(uint64_t seed) : next_(seed * 0x100000001B3ull) {}
  uint64_t Next() { return next_ += 0x9E3779B97F4A7C15ull; }

 private:
  uint64_t next_;
};

Tensor Weight(int64_t out, int64_t in, Seeds& seeds, Device d) {
  return braid::MakeParameter({out, in}, NormalInit(seeds.Next(), 0.02f), d);
}

Tensor NormWeight(int64_t dim, Device d) {
  Tensor w = braid::MakeConstantParameter({dim}, 1.0f, d);
  w.set_weight_decay(false);  // norms are not decayed
  return w;
}

// A bias-free linear layer, y = x W^T, W [out, in] named "weight": a module of its own so that a
// tensor-parallel plan can name it and split W by rows (colwise) or by columns (rowwise).
class Projection : public Module {
 public:
  Projection(int64_t out, int64_t in, Seeds& seeds, Device d) : Module("TinyProjection") {
    w_ = RegisterParameter("weight", Weight(out, in, seeds, d));
  }
  Tensor Forward(const Tensor& x) override { return braid::ops::Linear(x, w_, Tensor()); }

 private:
  Tensor w_;
};

// The token embedding, "weight" [vocab, n_embd]: a plan's vocab_embedding splits its rows.
class TokenEmbedding : public Module {
 public:
  TokenEmbedding(int64_t vocab, int64_t dim, Seeds& seeds, Device d) : Module("TinyEmbedding") {
    w_ = RegisterParameter("weight", Weight(vocab, dim, seeds, d));
  }
  Tensor Forward(const Tensor& ids) override { return braid::ops::Embedding(w_, ids); }

 private:
  Tensor w_;
};

// RMSNorm's learned scale, "weight" [n_embd], never decayed.
class Norm : public Module {
 public:
  Norm(int64_t dim, Device d) : Module("TinyNorm") { w_ = RegisterParameter("weight", NormWeight(dim, d)); }
  Tensor Forward(const Tensor& x) override { return braid::ops::RmsNorm(x, w_); }

 private:
  Tensor w_;
};

// One transformer layer: the unit strategies bucket, shard, recompute and pipeline.
class Block : public Module {
 public:
  Block(const Shape& s, Seeds& seeds, Device d)
      : Module("TinyBlock"), head_dim_(s.n_embd / s.n_head) {
    const int64_t c = s.n_embd, hidden = s.mlp_ratio * s.n_embd;
    attn_norm_ = RegisterModule("attn_norm", std::make_unique<Norm>(c, d));
    qkv_ = RegisterModule("qkv", std::make_unique<Projection>(3 * c, c, seeds, d));
    attn_out_ = RegisterModule("attn_out", std::make_unique<Projection>(c, c, seeds, d));
    mlp_norm_ = RegisterModule("mlp_norm", std::make_unique<Norm>(c, d));
    mlp_in_ = RegisterModule("mlp_in", std::make_unique<Projection>(hidden, c, seeds, d));
    mlp_out_ = RegisterModule("mlp_out", std::make_unique<Projection>(c, hidden, seeds, d));
    set_block(true);
  }
  // Projections are called through operator(): a plan replaces their forwards there. The head
  // count is read from the width qkv gives (q|k|v, head_dim_ each), not from the config: under
  // tensor parallelism qkv yields this rank's heads only.
  Tensor Forward(const Tensor& x) override {
    using namespace braid::ops;
    Tensor qkv = (*qkv_)((*attn_norm_)(x));
    const int heads = int(qkv.size(-1) / (3 * head_dim_));
    Tensor h = Add(x, (*attn_out_)(CausalSelfAttention(qkv, heads)));
    return Add(h, (*mlp_out_)(Relu((*mlp_in_)((*mlp_norm_)(h)))));
  }

 private:
  int64_t head_dim_;
  Norm *attn_norm_, *mlp_norm_;
  Projection *qkv_, *attn_out_, *mlp_in_, *mlp_out_;
};

class Blocks : public Module {  // a container that only gives the blocks their names
 public:
  Blocks() : Module("TinyBlocks") {}
  Block* Add(int i, std::unique_ptr<Block> b) { return RegisterModule(std::to_string(i), std::move(b)); }
  Tensor Forward(const Tensor&) override { return Tensor(); }
};

// Names: embed.weight, blocks.{i}.{attn_norm, qkv, attn_out, mlp_norm, mlp_in, mlp_out}.weight,
// norm.weight, head.weight.
class TinyLm : public Module {
 public:
  TinyLm(const Shape& s, uint64_t seed, Device d) : Module("TinyLm") {
    Seeds seeds(seed);
    embed_ = RegisterModule("embed", std::make_unique<TokenEmbedding>(s.vocab_size, s.n_embd, seeds, d));
    Blocks* blocks = RegisterModule("blocks", std::make_unique<Blocks>());
    for (int i = 0; i < s.n_layer; ++i) {
      blocks_.push_back(blocks->Add(i, std::make_unique<Block>(s, seeds, d)));
    }
    norm_ = RegisterModule("norm", std::make_unique<Norm>(s.n_embd, d));
    head_ = RegisterModule("head", std::make_unique<Projection>(s.vocab_size, s.n_embd, seeds, d));
  }

  // Embedding, the blocks, the head: Forward is their composition, so a pipeline of stages
  // computes what the whole model does. Modules are called through operator() (hooks run there,
  // and a tensor-parallel plan's replaced forwards).
  std::vector<braid::PipelineLayer> PipelineLayers() override {
    if (!layers_.empty()) return layers_;
    layers_.push_back({"embedding", [this](const Tensor& ids) { return (*embed_)(ids); },
                       {"embed.weight"}});
    for (size_t i = 0; i < blocks_.size(); ++i) {
      const std::string p = absl::StrCat("blocks.", i, ".");
      Block* b = blocks_[i];
      layers_.push_back({absl::StrCat("blocks.", i), [b](const Tensor& x) { return (*b)(x); },
                         {p + "attn_norm.weight", p + "qkv.weight", p + "attn_out.weight",
                          p + "mlp_norm.weight", p + "mlp_in.weight", p + "mlp_out.weight"}});
    }
    layers_.push_back({"head", [this](const Tensor& x) { return (*head_)((*norm_)(x)); },
                       {"norm.weight", "head.weight"}});
    return layers_;
  }

  Tensor Forward(const Tensor& ids) override {
    if (layers_.empty()) PipelineLayers();
    Tensor x = ids;
    for (const braid::PipelineLayer& layer : layers_) x = layer.forward(x);
    return x;
  }

 private:
  TokenEmbedding* embed_;
  Norm* norm_;
  Projection* head_;
  std::vector<Block*> blocks_;
  std::vector<braid::PipelineLayer> layers_;
};

// The tensor-parallel plan (the language of plugins/tensor_parallel/plan.h; the tensor-parallel
// strategy applies it, docs/WRITING_A_MODEL.md "Tensor-parallel plans"), Megatron-style: attention
// and the MLP each a colwise projection then a rowwise one, so each costs one all-reduce forward
// and one backward. qkv is q|k|v fused: chunks=3 gives each rank its heads of each. The embedding
// and the head are split over the vocabulary, and the loss then never gathers the logits. Every
// activation between split layers is [B, T, C], so sequence parallelism may split T. A tensor
// size that does not divide n_head is refused at start; one that does not divide a split matrix
// (the vocabulary, the MLP's width) is refused naming the matrix.
constexpr char kTensorPlan[] = R"(# tiny_lm (tests/external_plugin/external_model.cc)
embed              vocab_embedding
blocks.*.qkv       colwise chunks=3
blocks.*.attn_out  rowwise
blocks.*.mlp_in    colwise
blocks.*.mlp_out   rowwise
head               colwise
output             vocab_sharded
sequence_dim       1
divides            n_head
)";

// The validated section's shape (validation filled in every field and option).
Shape ShapeOf(const braid::config::ModelConfig& m) {
  Shape s;
  s.n_layer = m.n_layer();
  s.n_head = m.n_head();
  s.n_embd = m.n_embd();
  s.block_size = m.block_size();
  s.vocab_size = m.vocab_size();
  auto it = m.options().find("mlp_ratio");
  if (it != m.options().end()) (void)absl::SimpleAtoi(it->second, &s.mlp_ratio);
  return s;
}

// Defaults first, written back so the effective config shows the whole shape; then one message
// per problem, naming the field.
void Validate(braid::config::ModelConfig* m, const std::string& dataset_name,
              const braid::DatasetSpec* dataset, braid::ConfigProblems* problems) {
  const Shape d;
  if (!m->has_n_layer()) m->set_n_layer(int32_t(d.n_layer));
  if (!m->has_n_head()) m->set_n_head(int32_t(d.n_head));
  if (!m->has_n_embd()) m->set_n_embd(int32_t(d.n_embd));
  if (!m->has_block_size()) m->set_block_size(int32_t(d.block_size));
  if (!m->has_vocab_size()) {
    m->set_vocab_size(int32_t(dataset != nullptr && dataset->vocab_size > 0 ? dataset->vocab_size
                                                                            : d.vocab_size));
  }
  auto& options = *m->mutable_options();
  if (options.find("mlp_ratio") == options.end()) options["mlp_ratio"] = std::to_string(d.mlp_ratio);
  int64_t ratio = 0;
  if (!absl::SimpleAtoi(options["mlp_ratio"], &ratio) || ratio < 1) {
    problems->push_back(absl::StrCat("model.options \"mlp_ratio\" (", options["mlp_ratio"],
                                     ") must be an integer >= 1"));
  }
  if (m->n_embd() % m->n_head() != 0) {
    problems->push_back(absl::StrCat("model.n_embd (", m->n_embd(),
                                     ") must be a multiple of model.n_head (", m->n_head(), ")"));
  }
  if (dataset != nullptr && dataset->vocab_size > m->vocab_size()) {
    problems->push_back(absl::StrCat("model.vocab_size (", m->vocab_size(), ") is smaller than data.dataset \"",
                                     dataset_name, "\"'s ", dataset->vocab_size, " token values"));
  }
}

}  // namespace
}  // namespace tiny_lm

BRAID_PLUGIN(registry) {
  braid::ModelSpec spec;
  spec.build = [](const braid::config::ModelConfig& m, uint64_t seed,
                  braid::Device device) -> absl::StatusOr<std::unique_ptr<braid::Module>> {
    return std::unique_ptr<braid::Module>(
        std::make_unique<tiny_lm::TinyLm>(tiny_lm::ShapeOf(m), seed, device));
  };
  spec.fields = {"n_layer", "n_head", "n_embd", "block_size", "vocab_size"};
  spec.options = {{"mlp_ratio", braid::ModelOption::Kind::kInt}};
  spec.validate = tiny_lm::Validate;
  spec.tensor_plan = tiny_lm::kTensorPlan;
  spec.takes = "tokens";  // what data.dataset must yield
  spec.context = [](const braid::config::ModelConfig& m) { return int64_t(m.block_size()); };
  // 6 FLOPs per weight per token (2 forward, 4 backward) plus attention's two T x T products.
  spec.train_flops_per_token = [](const braid::config::ModelConfig& m) {
    const tiny_lm::Shape s = tiny_lm::ShapeOf(m);
    const double c = double(s.n_embd), per_layer = (4 + 2 * s.mlp_ratio) * c * c;
    return 6.0 * (s.n_layer * per_layer + double(s.vocab_size) * c) +
           12.0 * double(s.n_layer) * c * double(s.block_size);
  };
  // The origin is filled in by the loader: this plugin's file, as error messages show it.
  return registry->AddModel("tiny_lm", std::move(spec)).ok() ? 0 : 1;
}
