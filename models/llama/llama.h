// A Llama-style decoder (Llama 2/3, Mistral, Qwen2, SmolLM): token embedding, pre-RMSNorm
// blocks of grouped-query causal self-attention with rotary position embeddings and a SwiGLU
// MLP, a final RMSNorm and an LM head, no biases anywhere; the head tied to the embedding or a
// weight of its own.
//
// Parameter names and layouts are Hugging Face's LlamaForCausalLM's, so a state dict moves
// between Braid and Hugging Face's tools unchanged: model.embed_tokens.weight,
// model.layers.{i}.self_attn.{q,k,v,o}_proj.weight, model.layers.{i}.mlp.{gate,up,down}_proj.weight,
// model.layers.{i}.{input,post_attention}_layernorm.weight, model.norm.weight and, untied,
// lm_head.weight. RoPE uses Hugging Face's half-split (rotate_half) layout, so q_proj and k_proj
// need no permutation.
//
// Written so that tensor parallelism can split it by a plan (kLlamaTensorPlan): attention takes
// its query and K/V head counts from the widths q_proj and k_proj give it, so a rank that holds
// its share of each runs its share of the heads with no second model.
#ifndef BRAID_MODELS_LLAMA_LLAMA_H_
#define BRAID_MODELS_LLAMA_LLAMA_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/module.h"
#include "models/nn/kv_cache.h"
#include "models/nn/layers.h"

namespace braid::models {

struct LlamaConfig {
  int64_t vocab_size = 256;
  int64_t block_size = 128;  // the longest context it is trained on (max_position_embeddings)
  int64_t n_layer = 4, n_head = 4, n_kv_head = 2, n_embd = 256;
  int64_t intermediate_size = 768;  // the SwiGLU MLP's hidden width
  float rope_theta = 10000.0f;
  // RoPE scaling (Hugging Face's rope_scaling): "" (none), "linear" (positions divided by
  // rope_scaling_factor) or "ntk" (static NTK-aware: theta raised; ops::RopeOptions).
  std::string rope_scaling;
  float rope_scaling_factor = 1.0f;
  float rms_norm_eps = 1e-5f;
  bool tie_embeddings = false;  // Hugging Face's tie_word_embeddings
  float init_std = 0.02f;       // Hugging Face's initializer_range
  uint64_t seed = 1234;         // init stream

  int64_t head_dim() const { return n_embd / n_head; }
  // llama-mini: 4 layers x 4 query heads (2 K/V heads) x 256 wide, SwiGLU 768, context 128,
  // byte vocabulary, untied: 3,279,104 parameters, about gpt-mini's 3,257,856.
  static LlamaConfig Mini();
  // "" when the shape is consistent, else what is wrong, naming the fields.
  std::string Problems() const;
};

// The tensor-parallel plan (plugins/tensor_parallel/plan.h): Megatron's split of attention by
// heads (q/k/v column-parallel, each rank its share of the query and of the K/V heads; o
// row-parallel), the MLP column (gate, up) then row (down), embedding and head over the
// vocabulary. Norms stay replicated.
extern const char kLlamaTensorPlan[];

// The FLOPs of one training step per token, as GPT's (models/gpt): 6 per weight that multiplies
// (every matrix and norm, the head counted once whether tied or not; the embedding lookup is
// none) plus attention's 12 · n_layer · n_embd · block_size. For the MFU.
double TrainFlopsPerToken(const LlamaConfig& c);

class Llama : public Module {
 public:
  Llama(const LlamaConfig& cfg, Device device = Device::CPU());
  // ids: [B, T] i32 with T <= block_size -> logits [B, T, vocab_size].
  Tensor Forward(const Tensor& ids) override;
  // Inference: ids [B, t] are the t positions after the cache's (cache.length() + t <=
  // block_size); returns their logits [B, t, vocab_size] and adds them to the cache. Equal to the
  // last t positions of Forward over the whole sequence, up to f32 rounding (llama_test).
  Tensor ForwardCached(const Tensor& ids, KvCache& cache);
  KvCache NewKvCache(int64_t batch = 1) const;  // room for block_size positions
  // embedding, model.layers.0 .. model.layers.{n-1}, head (model.norm and lm_head).
  std::vector<PipelineLayer> PipelineLayers() override;
  const LlamaConfig& config() const { return cfg_; }
  // Forward FLOPs per token of the matrix products (x3 for a training step), GPT's way.
  double FlopsPerToken() const;

 private:
  LlamaConfig cfg_;
  nn::Embedding* embed_tokens_;
  std::vector<Module*> layers_list_;
  nn::RmsNorm* norm_;
  Module* lm_head_;  // nn::Linear, or nn::TiedLinear over embed_tokens' weight
  std::vector<PipelineLayer> layers_;
};

}  // namespace braid::models

#endif  // BRAID_MODELS_LLAMA_LLAMA_H_
