// LlamaKvCache: the rotated keys and the values a Llama's attention layers have seen, kept between
// calls so that generation runs each new token through the model once (Llama::ForwardCached)
// instead of the whole prefix again. Grouped-query attention's K/V heads are kept as they are
// (n_kv_head of them, never repeated for the query heads that share them), so the cache is
// n_head / n_kv_head times smaller than a multi-head one.
//
// Inference only: no autograd through it. It lives on the host in f32 whatever the model's
// device and dtype (a token's K/V is a few kB per layer), as GPT's KvCache does.
#ifndef BRAID_MODELS_LLAMA_LLAMA_KV_CACHE_H_
#define BRAID_MODELS_LLAMA_LLAMA_KV_CACHE_H_

#include <cstdint>
#include <vector>

namespace braid::models {

class LlamaKvCache {
 public:
  // Room for `capacity` positions of `batch` sequences over `n_layer` layers.
  LlamaKvCache(int64_t n_layer, int64_t batch, int64_t capacity);

  int64_t length() const { return length_; }  // positions cached (the next token's position)
  int64_t capacity() const { return capacity_; }
  int64_t batch() const { return batch_; }
  void Clear() { length_ = 0; }

  // Layer `layer`'s attention for `t` new positions, on the host: q [batch, t, H, D] and k, v
  // [batch, t, Hkv, D], q and k already rotated at positions length() .. length()+t-1. Stores the
  // new K and V there and returns [batch, t, H * D]: query head h of each new position attends
  // causally, with K/V head h / (H / Hkv), to every cached position and to the new ones up to
  // itself, scale 1/sqrt(D). Every layer is called with the same t before Advance(t).
  std::vector<float> Attend(int64_t layer, const std::vector<float>& q, const std::vector<float>& k,
                            const std::vector<float>& v, int64_t t, int64_t n_head,
                            int64_t n_kv_head);
  // After every layer has attended: the t new positions are now part of the context.
  void Advance(int64_t t);

 private:
  int64_t n_layer_, batch_, capacity_;
  int64_t length_ = 0;
  int64_t width_ = 0;  // Hkv * D: set by the first Attend
  std::vector<std::vector<float>> k_, v_;  // per layer: [batch, capacity, Hkv * D]
};

}  // namespace braid::models

#endif  // BRAID_MODELS_LLAMA_LLAMA_KV_CACHE_H_
