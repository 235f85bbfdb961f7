#include "models/llama/llama.h"

#include <memory>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/autograd.h"
#include "core/check.h"
#include "core/ops.h"

namespace braid::models {

LlamaConfig LlamaConfig::Mini() { return LlamaConfig{}; }

std::string LlamaConfig::Problems() const {
  std::vector<std::string> p;
  for (auto [name, v] : {std::pair<const char*, int64_t>{"n_layer", n_layer},
                         {"n_head", n_head}, {"n_kv_head", n_kv_head}, {"n_embd", n_embd},
                         {"intermediate_size", intermediate_size}, {"vocab_size", vocab_size},
                         {"block_size", block_size}}) {
    if (v < 1) p.push_back(absl::StrCat(name, " (", v, ") must be >= 1"));
  }
  if (!p.empty()) return absl::StrJoin(p, "; ");
  if (n_embd % n_head != 0) {
    p.push_back(absl::StrCat("n_embd (", n_embd, ") is not a multiple of n_head (", n_head, ")"));
  } else if (head_dim() % 2 != 0) {
    p.push_back(absl::StrCat("the head width n_embd / n_head (", head_dim(),
                             ") is odd; rotary embeddings rotate pairs of features"));
  }
  if (n_head % n_kv_head != 0) {
    p.push_back(absl::StrCat("n_head (", n_head, ") is not a multiple of n_kv_head (", n_kv_head,
                             "): each K/V head serves a whole group of query heads"));
  }
  if (!(rope_theta > 0)) p.push_back(absl::StrCat("rope_theta (", rope_theta, ") must be > 0"));
  if (!(rms_norm_eps > 0)) p.push_back(absl::StrCat("rms_norm_eps (", rms_norm_eps, ") must be > 0"));
  if (rope_scaling != "" && rope_scaling != "linear" && rope_scaling != "ntk") {
    p.push_back(absl::StrCat("rope_scaling \"", rope_scaling,
                             "\" is not supported (supported: linear, ntk, or none)"));
  }
  if (!(rope_scaling_factor >= 1.0f)) {
    p.push_back(absl::StrCat("rope_scaling_factor (", rope_scaling_factor, ") must be >= 1"));
  }
  return absl::StrJoin(p, "; ");
}

const char kLlamaTensorPlan[] = R"(# Llama (models/llama), Megatron-style
model.embed_tokens               vocab_embedding
model.layers.*.self_attn.q_proj  colwise
model.layers.*.self_attn.k_proj  colwise
model.layers.*.self_attn.v_proj  colwise
model.layers.*.self_attn.o_proj  rowwise
model.layers.*.mlp.gate_proj     colwise
model.layers.*.mlp.up_proj       colwise
model.layers.*.mlp.down_proj     rowwise
lm_head                          colwise
output                           vocab_sharded
sequence_dim                     1
divides                          n_head
divides                          n_kv_head
)";

namespace {

class Attention : public Module {
 public:
  Attention(const LlamaConfig& c, std::mt19937_64& rng, Device d) : Module("LlamaAttention") {
    head_dim_ = c.head_dim();
    rope_.theta = c.rope_theta;
    if (c.rope_scaling == "linear") rope_.position_scale = c.rope_scaling_factor;
    if (c.rope_scaling == "ntk") rope_.ntk_factor = c.rope_scaling_factor;
    const int64_t kv = c.n_kv_head * head_dim_;
    q_proj_ = RegisterModule("q_proj", std::make_unique<nn::Linear>(c.n_embd, c.n_embd, false, c.init_std, rng, d));
    k_proj_ = RegisterModule("k_proj", std::make_unique<nn::Linear>(c.n_embd, kv, false, c.init_std, rng, d));
    v_proj_ = RegisterModule("v_proj", std::make_unique<nn::Linear>(c.n_embd, kv, false, c.init_std, rng, d));
    o_proj_ = RegisterModule("o_proj", std::make_unique<nn::Linear>(c.n_embd, c.n_embd, false, c.init_std, rng, d));
  }
  Tensor Forward(const Tensor& x) override {
    Tensor q = (*q_proj_)(x), k = (*k_proj_)(x), v = (*v_proj_)(x);
    // From q, not x: under sequence parallelism x is this rank's part of the sequence and the
    // projections gather the whole of it.
    const int64_t b = q.size(0), t = q.size(1);
    // The heads this module was given: all of them, or a tensor-parallel rank's share.
    BRAID_CHECK(q.size(-1) % head_dim_ == 0 && k.size(-1) % head_dim_ == 0)
        << "attention widths " << q.size(-1) << " (q) and " << k.size(-1)
        << " (k) are not whole heads of " << head_dim_
        << " features (a tensor-parallel split must keep heads whole)";
    const int64_t h = q.size(-1) / head_dim_, hkv = k.size(-1) / head_dim_;
    q = ops::RotaryEmbedding(q.Reshape({b, t, h, head_dim_}), rope_);
    k = ops::RotaryEmbedding(k.Reshape({b, t, hkv, head_dim_}), rope_);
    v = v.Reshape({b, t, hkv, head_dim_});
    return (*o_proj_)(ops::GroupedQueryAttention(q, k, v).Reshape({b, t, h * head_dim_}));
  }
  // Inference with the cache: the new positions' q and k rotated at their place after the
  // cached ones, attention over the cache on the host (models/nn/kv_cache.h).
  Tensor ForwardCached(const Tensor& x, KvCache& cache, int64_t layer) {
    Tensor q = (*q_proj_)(x), k = (*k_proj_)(x), v = (*v_proj_)(x);
    const int64_t b = q.size(0), t = q.size(1);
    const int64_t h = q.size(-1) / head_dim_, hkv = k.size(-1) / head_dim_;
    ops::RopeOptions rope = rope_;
    rope.position_offset = cache.length();
    q = ops::RotaryEmbedding(q.Reshape({b, t, h, head_dim_}), rope);
    k = ops::RotaryEmbedding(k.Reshape({b, t, hkv, head_dim_}), rope);
    std::vector<float> y = cache.Attend(layer, q.ToFloatVector(), k.ToFloatVector(),
                                        v.ToFloatVector(), t, h, hkv);
    Tensor yt = Tensor::FromVector(y, {b, t, h * head_dim_}, q.device());
    return (*o_proj_)(ops::Cast(yt, q.dtype()));
  }

 private:
  int64_t head_dim_;
  ops::RopeOptions rope_;
  nn::Linear *q_proj_, *k_proj_, *v_proj_, *o_proj_;
};

class Mlp : public Module {
 public:
  Mlp(const LlamaConfig& c, std::mt19937_64& rng, Device d) : Module("LlamaMLP") {
    const int64_t i = c.intermediate_size;
    gate_proj_ = RegisterModule("gate_proj", std::make_unique<nn::Linear>(c.n_embd, i, false, c.init_std, rng, d));
    up_proj_ = RegisterModule("up_proj", std::make_unique<nn::Linear>(c.n_embd, i, false, c.init_std, rng, d));
    down_proj_ = RegisterModule("down_proj", std::make_unique<nn::Linear>(i, c.n_embd, false, c.init_std, rng, d));
  }
  Tensor Forward(const Tensor& x) override {
    return (*down_proj_)(ops::SwiGlu((*gate_proj_)(x), (*up_proj_)(x)));
  }

 private:
  nn::Linear *gate_proj_, *up_proj_, *down_proj_;
};

class DecoderLayer : public Module {
 public:
  DecoderLayer(const LlamaConfig& c, std::mt19937_64& rng, Device d) : Module("LlamaDecoderLayer") {
    set_block(true);
    // Registered in Hugging Face's order (self_attn, mlp, then the norms), so NamedParameters
    // lists a layer as its state dict does.
    self_attn_ = RegisterModule("self_attn", std::make_unique<Attention>(c, rng, d));
    mlp_ = RegisterModule("mlp", std::make_unique<Mlp>(c, rng, d));
    input_layernorm_ = RegisterModule("input_layernorm", std::make_unique<nn::RmsNorm>(c.n_embd, c.rms_norm_eps, d));
    post_attention_layernorm_ = RegisterModule(
        "post_attention_layernorm", std::make_unique<nn::RmsNorm>(c.n_embd, c.rms_norm_eps, d));
  }
  Tensor Forward(const Tensor& x) override {
    Tensor h = ops::Add(x, (*self_attn_)((*input_layernorm_)(x)));
    return ops::Add(h, (*mlp_)((*post_attention_layernorm_)(h)));
  }
  Tensor ForwardCached(const Tensor& x, KvCache& cache, int64_t layer) {
    Tensor h = ops::Add(x, self_attn_->ForwardCached((*input_layernorm_)(x), cache, layer));
    return ops::Add(h, (*mlp_)((*post_attention_layernorm_)(h)));
  }

 private:
  Attention* self_attn_;
  Mlp* mlp_;
  nn::RmsNorm *input_layernorm_, *post_attention_layernorm_;
};

// A container that is never called: it gives its children their place in the names
// (model.layers.0..., as PyTorch's ModuleList and LlamaModel do).
class Container : public Module {
 public:
  explicit Container(std::string type) : Module(std::move(type)) {}
  template <typename M>
  M* Add(const std::string& name, std::unique_ptr<M> m) {
    return RegisterModule(name, std::move(m));
  }
  Tensor Forward(const Tensor&) override {
    BRAID_CHECK(false) << type_name() << " is not called; its parts are";
    return Tensor();
  }
};

}  // namespace

Llama::Llama(const LlamaConfig& cfg, Device device) : Module("Llama"), cfg_(cfg) {
  const std::string problems = cfg.Problems();
  BRAID_CHECK(problems.empty()) << "llama: " << problems;
  std::mt19937_64 rng(cfg.seed);
  auto* model = RegisterModule("model", std::make_unique<Container>("LlamaModel"));
  embed_tokens_ = model->Add("embed_tokens", std::make_unique<nn::Embedding>(
                                                 cfg.vocab_size, cfg.n_embd, cfg.init_std, rng, device));
  auto* layers = model->Add("layers", std::make_unique<Container>("ModuleList"));
  for (int64_t i = 0; i < cfg.n_layer; ++i) {
    layers_list_.push_back(
        layers->Add(std::to_string(i), std::make_unique<DecoderLayer>(cfg, rng, device)));
  }
  norm_ = model->Add("norm", std::make_unique<nn::RmsNorm>(cfg.n_embd, cfg.rms_norm_eps, device));
  if (cfg.tie_embeddings) {
    lm_head_ = RegisterModule("lm_head", std::make_unique<nn::TiedLinear>(embed_tokens_->weight()));
  } else {
    lm_head_ = RegisterModule("lm_head", std::make_unique<nn::Linear>(cfg.n_embd, cfg.vocab_size,
                                                                      false, cfg.init_std, rng, device));
  }
}

// The forward is the composition of the pipeline layers, so a model cut into stages computes
// exactly what the whole model does.
std::vector<PipelineLayer> Llama::PipelineLayers() {
  if (!layers_.empty()) return layers_;  // built once: Forward runs them every call
  layers_.push_back({"embedding",
                     [this](const Tensor& ids) {
                       BRAID_CHECK(ids.ndim() == 2 && ids.dtype() == DType::kI32 &&
                                   ids.size(1) <= cfg_.block_size)
                           << "Llama input must be i32 token ids [B, T] with T <= block_size "
                           << cfg_.block_size << ", got " << ids.DescribeForError();
                       return (*embed_tokens_)(ids);
                     },
                     {"model.embed_tokens.weight"}});
  for (size_t i = 0; i < layers_list_.size(); ++i) {
    Module* layer = layers_list_[i];
    const std::string name = absl::StrCat("model.layers.", i);
    std::vector<std::string> params;
    for (auto& [n, p] : layer->NamedParameters()) params.push_back(absl::StrCat(name, ".", n));
    layers_.push_back({name, [layer](const Tensor& x) { return (*layer)(x); }, params});
  }
  layers_.push_back({"head", [this](const Tensor& x) { return (*lm_head_)((*norm_)(x)); },
                     {"model.norm.weight", cfg_.tie_embeddings ? "model.embed_tokens.weight"
                                                               : "lm_head.weight"}});
  return layers_;
}

Tensor Llama::ForwardCached(const Tensor& ids, KvCache& cache) {
  BRAID_CHECK(ids.ndim() == 2 && ids.dtype() == DType::kI32 && ids.size(0) == cache.batch())
      << "Llama::ForwardCached takes i32 token ids [" << cache.batch() << ", T], got "
      << ids.DescribeForError();
  BRAID_CHECK(cache.length() + ids.size(1) <= cfg_.block_size)
      << "Llama::ForwardCached: " << cache.length() << " cached + " << ids.size(1)
      << " new positions exceed block_size " << cfg_.block_size;
  autograd::NoGradGuard no_grad;
  Tensor x = (*embed_tokens_)(ids);
  for (size_t i = 0; i < layers_list_.size(); ++i) {
    x = static_cast<DecoderLayer*>(layers_list_[i])->ForwardCached(x, cache, int64_t(i));
  }
  cache.Advance(ids.size(1));
  return (*lm_head_)((*norm_)(x));
}

KvCache Llama::NewKvCache(int64_t batch) const {
  return KvCache(cfg_.n_layer, batch, cfg_.block_size);
}

Tensor Llama::Forward(const Tensor& ids) {
  if (layers_.empty()) PipelineLayers();
  Tensor x = ids;
  for (const PipelineLayer& layer : layers_) x = layer.forward(x);
  return x;
}

double TrainFlopsPerToken(const LlamaConfig& c) {
  const double d = double(c.n_embd), l = double(c.n_layer), t = double(c.block_size);
  const double kv = double(c.n_kv_head * c.head_dim()), i = double(c.intermediate_size);
  // Per layer: q and o (d² each), k and v (d·kv each), gate, up and down (d·i each), two norms.
  const double per_layer = 2 * d * d + 2 * d * kv + 3 * d * i + 2 * d;
  const double n = l * per_layer + double(c.vocab_size) * d /* the head */ + d /* model.norm */;
  return 6 * n + 12 * l * d * t;
}

double Llama::FlopsPerToken() const {
  const double c = double(cfg_.n_embd), l = double(cfg_.n_layer), t = double(cfg_.block_size);
  const double kv = double(cfg_.n_kv_head * cfg_.head_dim()), i = double(cfg_.intermediate_size);
  const double v = double(cfg_.vocab_size);
  // 2 FLOPs per weight of every matrix product, plus attention's QK^T and AV (causal: ~T/2).
  const double weights = l * (2 * c * c + 2 * c * kv + 3 * c * i) + v * c;
  const double attn = l * 2.0 * 2.0 * c * (t / 2.0);
  return 2.0 * weights + attn;
}

}  // namespace braid::models
