#include "models/gpt/gpt.h"

#include <cmath>
#include <numeric>
#include <random>

#include "absl/strings/str_cat.h"
#include "core/autograd.h"
#include "core/ops.h"

namespace braid::models {

GptConfig GptConfig::Mini() { return GptConfig{}; }

GptConfig GptConfig::Gpt2_124M() {
  GptConfig c;
  c.vocab_size = 50257;
  c.padded_vocab_size = 50304;
  c.block_size = 1024;
  c.n_layer = 12;
  c.n_head = 12;
  c.n_embd = 768;
  return c;
}

absl::StatusOr<GptConfig> GptConfig::ByName(const std::string& name) {
  if (name == "gpt-mini") return Mini();
  if (name == "gpt2-124m") return Gpt2_124M();
  return absl::InvalidArgumentError(
      absl::StrCat("unknown GPT config '", name, "' (known: gpt-mini, gpt2-124m)"));
}

namespace {

class Attention : public Module {
 public:
  Attention(const GptConfig& c, std::mt19937_64& rng, Device d) : Module("CausalSelfAttention") {
    head_dim_ = c.n_embd / c.n_head;
    float proj_std = 0.02f / std::sqrt(2.0f * float(c.n_layer));
    c_attn_ = RegisterModule("c_attn", std::make_unique<nn::Linear>(c.n_embd, 3 * c.n_embd, true, 0.02f, rng, d));
    c_proj_ = RegisterModule("c_proj", std::make_unique<nn::Linear>(c.n_embd, c.n_embd, true, proj_std, rng, d));
  }
  Tensor Forward(const Tensor& x) override {
    Tensor qkv = (*c_attn_)(x);
    // The heads this module was given: all of them, or a tensor-parallel rank's share.
    const int64_t width = qkv.size(-1);
    BRAID_CHECK(width % (3 * head_dim_) == 0)
        << "attention input width " << width << " is not 3 x a whole number of heads of "
        << head_dim_ << " features (a tensor-parallel split must keep heads whole)";
    return (*c_proj_)(ops::CausalSelfAttention(qkv, int(width / (3 * head_dim_))));
  }
  // The same for x's new positions, attending to what `cache` holds for this layer too.
  Tensor ForwardCached(const Tensor& x, KvCache& cache, int64_t layer) {
    Tensor qkv = (*c_attn_)(x);
    const int64_t n_head = qkv.size(-1) / (3 * head_dim_);
    std::vector<float> y = cache.Attend(layer, qkv.ToFloatVector(), qkv.size(1), n_head);
    Tensor yt = Tensor::FromVector(y, {qkv.size(0), qkv.size(1), qkv.size(-1) / 3}, qkv.device());
    return (*c_proj_)(ops::Cast(yt, qkv.dtype()));
  }

 private:
  int64_t head_dim_;
  nn::Linear *c_attn_, *c_proj_;
};

class Mlp : public Module {
 public:
  Mlp(const GptConfig& c, std::mt19937_64& rng, Device d) : Module("MLP") {
    float proj_std = 0.02f / std::sqrt(2.0f * float(c.n_layer));
    // c_fc computes GELU(x W + b) as one op (ops::LinearGeluTanh): a device with a fused
    // kernel (CUDA's cuBLASLt GELU epilogue) runs one GEMM for it; elsewhere it is Linear then
    // GeluTanh, as before.
    c_fc_ = RegisterModule("c_fc", std::make_unique<nn::Linear>(c.n_embd, 4 * c.n_embd, true, 0.02f, rng, d,
                                                                 nn::Activation::kGeluTanh));
    c_proj_ = RegisterModule("c_proj", std::make_unique<nn::Linear>(4 * c.n_embd, c.n_embd, true, proj_std, rng, d));
  }
  Tensor Forward(const Tensor& x) override { return (*c_proj_)((*c_fc_)(x)); }

 private:
  nn::Linear *c_fc_, *c_proj_;
};

class Block : public Module {
 public:
  Block(const GptConfig& c, std::mt19937_64& rng, Device d) : Module("Block") {
    set_block(true);
    ln_1_ = RegisterModule("ln_1", std::make_unique<nn::LayerNorm>(c.n_embd, c.ln_eps, d));
    attn_ = RegisterModule("attn", std::make_unique<Attention>(c, rng, d));
    ln_2_ = RegisterModule("ln_2", std::make_unique<nn::LayerNorm>(c.n_embd, c.ln_eps, d));
    mlp_ = RegisterModule("mlp", std::make_unique<Mlp>(c, rng, d));
  }
  Tensor Forward(const Tensor& x) override {
    Tensor h = ops::Add(x, (*attn_)((*ln_1_)(x)));
    return ops::Add(h, (*mlp_)((*ln_2_)(h)));
  }
  Tensor ForwardCached(const Tensor& x, KvCache& cache, int64_t layer) {
    Tensor h = ops::Add(x, attn_->ForwardCached((*ln_1_)(x), cache, layer));
    return ops::Add(h, (*mlp_)((*ln_2_)(h)));
  }

 private:
  nn::LayerNorm *ln_1_, *ln_2_;
  Attention* attn_;
  Mlp* mlp_;
};

// A list of blocks named 0..n-1 (so names read h.0.*, as in PyTorch's ModuleList).
class BlockList : public Module {
 public:
  BlockList() : Module("ModuleList") {}
  Module* Add(std::unique_ptr<Module> m) {
    return RegisterModule(std::to_string(NamedChildren().size()), std::move(m));
  }
  Tensor Forward(const Tensor&) override {
    BRAID_CHECK(false) << "a ModuleList is not called; its blocks are";
    return Tensor();
  }
};

}  // namespace

Gpt::Gpt(const GptConfig& cfg, Device device) : Module("GPT"), cfg_(cfg), device_(device) {
  BRAID_CHECK(cfg.n_embd % cfg.n_head == 0) << "n_embd " << cfg.n_embd << " not divisible by n_head " << cfg.n_head;
  std::mt19937_64 rng(cfg.seed);
  wte_ = RegisterModule("wte", std::make_unique<nn::Embedding>(cfg.padded_vocab_size, cfg.n_embd, 0.02f, rng, device));
  if (cfg.stable_embedding) {
    // A module of its own, not part of wte: tensor parallelism splits wte over the vocabulary
    // and sums its partial lookups in wte's forward, so the norm must come after that sum. It
    // draws nothing from `rng` (ones and zeros), so every other parameter's init is unchanged,
    // and like every norm it takes no weight decay (nn::LayerNorm).
    wte_norm_ = RegisterModule("wte_norm", std::make_unique<nn::LayerNorm>(cfg.n_embd, cfg.ln_eps, device));
    // The token embedding carries its state-dict name: an 8-bit optimizer (plugins/adam8bit)
    // keeps 32-bit states for the parameter named "wte.weight", the other half of
    // bitsandbytes' StableEmbedding. Without stable_embedding it stays "weight", as before.
    wte_->weight().set_name("wte.weight");
  }
  wpe_ = RegisterModule("wpe", std::make_unique<nn::Embedding>(cfg.block_size, cfg.n_embd, 0.02f, rng, device));
  auto* h = RegisterModule("h", std::make_unique<BlockList>());
  for (int64_t i = 0; i < cfg.n_layer; ++i) blocks_.push_back(h->Add(std::make_unique<Block>(cfg, rng, device)));
  ln_f_ = RegisterModule("ln_f", std::make_unique<nn::LayerNorm>(cfg.n_embd, cfg.ln_eps, device));
  lm_head_ = RegisterModule("lm_head", std::make_unique<nn::TiedLinear>(wte_->weight()));
  std::vector<int32_t> pos(size_t(cfg.block_size));
  std::iota(pos.begin(), pos.end(), 0);
  positions_ = Tensor::FromVector(pos, {cfg.block_size}, device);
}

// The forward is the composition of the pipeline layers, so a model cut into stages computes
// exactly what the whole model does.
std::vector<PipelineLayer> Gpt::PipelineLayers() {
  if (!layers_.empty()) return layers_;  // built once: Forward runs them every call
  std::vector<PipelineLayer>& layers = layers_;
  layers.push_back({"embedding",
                    [this](const Tensor& ids) {
                      BRAID_CHECK(ids.ndim() == 2 && ids.dtype() == DType::kI32 &&
                                  ids.size(1) <= cfg_.block_size)
                          << "GPT input must be i32 token ids [B, T] with T <= block_size "
                          << cfg_.block_size << ", got " << ids.DescribeForError();
                      int64_t t = ids.size(1);
                      Tensor tok = (*wte_)(ids);
                      if (wte_norm_ != nullptr) tok = (*wte_norm_)(tok);
                      return ops::Add(tok, (*wpe_)(positions_.Slice(0, t)));
                    },
                    wte_norm_ != nullptr
                        ? std::vector<std::string>{"wte.weight", "wte_norm.weight",
                                                   "wte_norm.bias", "wpe.weight"}
                        : std::vector<std::string>{"wte.weight", "wpe.weight"}});
  for (size_t i = 0; i < blocks_.size(); ++i) {
    Module* b = blocks_[i];
    std::string name = absl::StrCat("h.", i);
    std::vector<std::string> params;
    for (auto& [n, p] : b->NamedParameters()) params.push_back(absl::StrCat(name, ".", n));
    layers.push_back({name, [b](const Tensor& x) { return (*b)(x); }, params});
  }
  layers.push_back({"head",
                    [this](const Tensor& x) {
                      return (*lm_head_)((*ln_f_)(x));  // tied: x · wteᵀ
                    },
                    {"ln_f.weight", "ln_f.bias", "wte.weight"}});
  return layers;
}

Tensor Gpt::Forward(const Tensor& ids) {
  if (layers_.empty()) PipelineLayers();
  Tensor x = ids;
  for (const PipelineLayer& layer : layers_) x = layer.forward(x);
  return x;
}

Tensor Gpt::ForwardCached(const Tensor& ids, KvCache& cache) {
  autograd::NoGradGuard no_grad;
  const int64_t past = cache.length();
  BRAID_CHECK(ids.ndim() == 2 && ids.dtype() == DType::kI32 && ids.size(0) == cache.batch())
      << "cached GPT input must be i32 token ids [" << cache.batch() << ", T], got "
      << ids.DescribeForError();
  const int64_t t = ids.size(1);
  BRAID_CHECK(t > 0 && past + t <= cfg_.block_size && past + t <= cache.capacity())
      << "cached GPT forward: " << past << " positions held + " << t << " new exceeds the context "
      << std::min(cfg_.block_size, cache.capacity());
  Tensor tok = (*wte_)(ids);
  if (wte_norm_ != nullptr) tok = (*wte_norm_)(tok);
  Tensor x = ops::Add(tok, (*wpe_)(positions_.Slice(past, past + t)));
  for (size_t i = 0; i < blocks_.size(); ++i) {
    x = static_cast<Block*>(blocks_[i])->ForwardCached(x, cache, int64_t(i));
  }
  cache.Advance(t);
  return (*lm_head_)((*ln_f_)(x));
}

KvCache Gpt::NewKvCache(int64_t batch) const {
  return KvCache(cfg_.n_layer, batch, cfg_.block_size);
}

double TrainFlopsPerToken(const GptConfig& c) {
  const double d = double(c.n_embd), l = double(c.n_layer), t = double(c.block_size);
  // Per block: ln_1, ln_2 (2d each), c_attn (3d² + 3d), attn.c_proj (d² + d), c_fc (4d² + 4d),
  // mlp.c_proj (4d² + d).
  const double per_block = 12 * d * d + 13 * d;
  const double n = double(c.padded_vocab_size) * d + l * per_block + 2 * d /* ln_f */ +
                   (c.stable_embedding ? 2 * d : 0.0) /* wte_norm */;
  return 6 * n + 12 * l * d * t;
}

double Gpt::FlopsPerToken() const {
  double c = double(cfg_.n_embd), l = double(cfg_.n_layer), t = double(cfg_.block_size);
  double v = double(cfg_.padded_vocab_size);
  // Per token: 2 FLOPs per weight of every matmul, plus attention's QK^T and AV (causal: ~T/2).
  double weights = l * (3 * c * c + c * c + 8 * c * c) + v * c;  // wte_norm: no matmul
  double attn = l * 2.0 * 2.0 * c * (t / 2.0);
  return 2.0 * weights + attn;
}

const char kGptTensorPlan[] = R"(# GPT (models/gpt), Megatron-style
wte              vocab_embedding
h.*.attn.c_attn  colwise chunks=3
h.*.attn.c_proj  rowwise
h.*.mlp.c_fc     colwise
h.*.mlp.c_proj   rowwise
lm_head          colwise
wpe              sequence_slice
output           vocab_sharded
sequence_dim     1
divides          n_head
)";

}  // namespace braid::models
