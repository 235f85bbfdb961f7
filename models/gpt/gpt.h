// GPT-2 (nanoGPT layout): token + learned position embeddings, pre-LayerNorm blocks of causal
// self-attention and a GELU MLP, a final LayerNorm, and the token embedding tied to the head.
// Parameter names are PyTorch's: wte.weight, wpe.weight, h.{i}.ln_1.weight, h.{i}.attn.c_attn.*,
// h.{i}.attn.c_proj.*, h.{i}.ln_2.*, h.{i}.mlp.c_fc.*, h.{i}.mlp.c_proj.*, ln_f.* (no lm_head:
// it is wte). With stable_embedding, also wte_norm.weight and wte_norm.bias. See docs/MODELS.md.
//
// Written so that tensor parallelism can split it by a plan (plugins/tensor_parallel): the
// embeddings and the tied head are modules (wte, wpe, lm_head) a plan can name, and attention
// takes its head count from the width of what c_attn gives it (so c_attn split by heads gives a
// rank its share of the heads, with no second GPT).
#ifndef BRAID_MODELS_GPT_GPT_H_
#define BRAID_MODELS_GPT_GPT_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "core/module.h"
#include "models/nn/kv_cache.h"
#include "models/nn/layers.h"

namespace braid::models {

struct GptConfig {
  int64_t vocab_size = 256;         // real tokens
  int64_t padded_vocab_size = 256;  // rows of wte (tensor-core friendly); extra rows never targets
  int64_t block_size = 128;         // context
  int64_t n_layer = 4, n_head = 4, n_embd = 256;
  float ln_eps = 1e-5f;
  uint64_t seed = 1234;  // init stream
  // bitsandbytes' StableEmbedding: a LayerNorm (wte_norm) on the token embedding's output,
  // before the position embedding is added. It keeps the embedding's scale in check when its
  // rare rows get noisy 8-bit or half-precision updates. Off: the model is exactly nanoGPT's.
  bool stable_embedding = false;

  static GptConfig Mini();      // the reference run's gpt-mini: 3,257,856 parameters
  static GptConfig Gpt2_124M();  // 12 x 12 x 768, context 1024, vocab 50257 padded to 50304
  static absl::StatusOr<GptConfig> ByName(const std::string& name);
};

// The FLOPs of one training step per token by nanoGPT's and PaLM's estimate (PaLM, appendix B):
// 6·N + 12·L·d·T, N the parameters less the position embedding (the tied head counted once, as
// the embedding), 6·N for the matrix products (2 per weight forward, 4 backward) and 12·L·d·T
// for attention's QKᵀ and AV over the whole context (causality not discounted). The MFU's
// numerator (ModelSpec::train_flops_per_token).
double TrainFlopsPerToken(const GptConfig& c);

class Gpt : public Module {
 public:
  Gpt(const GptConfig& cfg, Device device = Device::CPU());
  // ids: [B, T] i32 with T <= block_size -> logits [B, T, padded_vocab_size].
  Tensor Forward(const Tensor& ids) override;
  // Generation: ids [B, T] i32 are the next T positions of sequences whose earlier positions
  // `cache` holds (none, for a fresh cache); -> logits [B, T, padded_vocab_size], equal to what
  // Forward gives at those positions for the whole sequence, and the cache now holds them too.
  // No autograd. Fatal when the cache's length + T exceeds block_size: the caller slides the
  // window (tools/sample starts a fresh cache over the context's newest half).
  Tensor ForwardCached(const Tensor& ids, KvCache& cache);
  KvCache NewKvCache(int64_t batch = 1) const;  // room for block_size positions
  // embedding (ids -> x, with wte_norm when there is one), h.0 .. h.{n-1}, head (ln_f and the tied LM head: x -> logits).
  std::vector<PipelineLayer> PipelineLayers() override;
  const GptConfig& config() const { return cfg_; }
  // Forward FLOPs per token for the matrix products (x3 for a training step), as llm.c counts.
  double FlopsPerToken() const;

 private:
  GptConfig cfg_;
  Device device_;
  nn::Embedding *wte_, *wpe_;
  nn::LayerNorm* wte_norm_ = nullptr;  // only with stable_embedding
  std::vector<Module*> blocks_;
  nn::LayerNorm* ln_f_;
  nn::TiedLinear* lm_head_;  // x · wteᵀ: no parameter of its own
  Tensor positions_;  // [block_size] i32, 0..block_size-1
  std::vector<PipelineLayer> layers_;
};

// The tensor-parallel plan (plugins/tensor_parallel/plan.h), registered with the model
// (ModelSpec::tensor_plan): Megatron-LM's split of GPT-2 (Shoeybi et al. 2019): attention by
// heads (c_attn's q|k|v columns in three chunks, c_proj by rows), the MLP column then row, the
// token embedding and the tied head over the vocabulary. LayerNorms stay replicated; under
// sequence parallelism the position embedding is sliced along the sequence.
extern const char kGptTensorPlan[];

}  // namespace braid::models

#endif  // BRAID_MODELS_GPT_GPT_H_
