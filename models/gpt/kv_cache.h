// KvCache: the keys and values a GPT's attention layers have seen, kept between calls so that
// generation runs each new token through the model once (Gpt::ForwardCached) instead of the
// whole prefix again: the matrix products per token stay constant and only attention grows
// with the context, as in every inference engine (nanoGPT recomputes the prefix instead).
//
// Inference only: no autograd through it. It lives on the host in f32 whatever the model's
// device and dtype (a token's K/V is a few kB per layer; copying it is not what generation
// waits on here), so the same cache serves a CPU or a GPU model.
#ifndef BRAID_MODELS_GPT_KV_CACHE_H_
#define BRAID_MODELS_GPT_KV_CACHE_H_

#include <cstdint>
#include <vector>

namespace braid::models {

class KvCache {
 public:
  // Room for `capacity` positions of `batch` sequences over `n_layer` layers.
  KvCache(int64_t n_layer, int64_t batch, int64_t capacity);

  int64_t length() const { return length_; }  // positions cached (the next token's position)
  int64_t capacity() const { return capacity_; }
  int64_t batch() const { return batch_; }
  void Clear() { length_ = 0; }

  // Layer `layer`'s attention for `t` new positions: `qkv` is that layer's c_attn output on the
  // host, [batch, t, 3C] with q, k, v side by side and head h at features [h*D, (h+1)*D) of
  // each (the layout of ops::CausalSelfAttention), n_head = C / D. Stores the new K and V at
  // positions length() .. length()+t-1 and returns [batch, t, C]: each new position attends
  // causally to every cached position and to the new ones up to itself, scale 1/sqrt(D).
  // Every layer is called with the same t before Advance(t).
  std::vector<float> Attend(int64_t layer, const std::vector<float>& qkv, int64_t t,
                            int64_t n_head);
  // After every layer has attended: the t new positions are now part of the context.
  void Advance(int64_t t);

 private:
  int64_t n_layer_, batch_, capacity_;
  int64_t length_ = 0;
  int64_t width_ = 0;  // C: set by the first Attend (a tensor-parallel rank holds fewer heads)
  std::vector<std::vector<float>> k_, v_;  // per layer: [batch, capacity, C]
};

}  // namespace braid::models

#endif  // BRAID_MODELS_GPT_KV_CACHE_H_
