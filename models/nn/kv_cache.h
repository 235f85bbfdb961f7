// KvCache: the keys and values a decoder's attention layers have seen, kept between calls so that
// generation runs each new token through the model once (Gpt::ForwardCached,
// Llama::ForwardCached) instead of the whole prefix again: the matrix products per token stay
// constant and only attention grows with the context, as in every inference engine (nanoGPT
// recomputes the prefix instead). One cache for multi-head and grouped-query attention: GPT's
// heads are the case n_kv_head == n_head; a Llama's K/V heads are kept as they are (never
// repeated for the query heads that share them), so its cache is n_head / n_kv_head times
// smaller than a multi-head one.
//
// Inference only: no autograd through it. It lives on the host in f32 whatever the model's
// device and dtype (a token's K/V is a few kB per layer; copying it is not what generation
// waits on here), so the same cache serves a CPU or a GPU model.
#ifndef BRAID_MODELS_NN_KV_CACHE_H_
#define BRAID_MODELS_NN_KV_CACHE_H_

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

  // Layer `layer`'s attention for `t` new positions, on the host: q [batch, t, H, D] and k, v
  // [batch, t, Hkv, D], q and k already at positions length() .. length()+t-1 (rotated, for a
  // model with rotary embeddings). Stores the new K and V there and returns [batch, t, H * D]:
  // query head h of each new position attends causally, with K/V head h / (H / Hkv), to every
  // cached position and to the new ones up to itself, scale 1/sqrt(D). Every layer is called
  // with the same t before Advance(t).
  std::vector<float> Attend(int64_t layer, const std::vector<float>& q, const std::vector<float>& k,
                            const std::vector<float>& v, int64_t t, int64_t n_head,
                            int64_t n_kv_head);
  // The same for multi-head attention with q, k and v side by side: `qkv` is a layer's c_attn
  // output, [batch, t, 3C] with head h at features [h*D, (h+1)*D) of each (the layout of
  // ops::CausalSelfAttention), n_head = C / D; returns [batch, t, C].
  std::vector<float> Attend(int64_t layer, const std::vector<float>& qkv, int64_t t,
                            int64_t n_head);
  // After every layer has attended: the t new positions are now part of the context.
  void Advance(int64_t t);

 private:
  // Row (b, i) of the t new positions starts at data + (b * t + i) * stride.
  struct Rows {
    const float* data;
    int64_t stride;
  };
  void CheckRoom(int64_t layer, int64_t t) const;
  // What both Attends do once their shapes are checked: D is the head size.
  std::vector<float> AttendRows(int64_t layer, Rows q, Rows k, Rows v, int64_t t, int64_t n_head,
                                int64_t n_kv_head, int64_t D);

  int64_t n_layer_, batch_, capacity_;
  int64_t length_ = 0;
  int64_t width_ = 0;  // Hkv * D: set by the first Attend (a tensor-parallel rank holds fewer heads)
  std::vector<std::vector<float>> k_, v_;  // per layer: [batch, capacity, Hkv * D]
};

}  // namespace braid::models

#endif  // BRAID_MODELS_NN_KV_CACHE_H_
