#include "models/llama/llama_kv_cache.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"

namespace braid::models {

LlamaKvCache::LlamaKvCache(int64_t n_layer, int64_t batch, int64_t capacity)
    : n_layer_(n_layer), batch_(batch), capacity_(capacity), k_(size_t(n_layer)),
      v_(size_t(n_layer)) {
  BRAID_CHECK(n_layer > 0 && batch > 0 && capacity > 0)
      << "LlamaKvCache needs n_layer, batch and capacity > 0, got " << n_layer << ", " << batch
      << ", " << capacity;
}

std::vector<float> LlamaKvCache::Attend(int64_t layer, const std::vector<float>& q,
                                        const std::vector<float>& k, const std::vector<float>& v,
                                        int64_t t, int64_t n_head, int64_t n_kv_head) {
  BRAID_CHECK(layer >= 0 && layer < n_layer_) << "LlamaKvCache layer " << layer << " of " << n_layer_;
  BRAID_CHECK(t > 0 && length_ + t <= capacity_)
      << "LlamaKvCache holds " << length_ << " of " << capacity_ << " positions; " << t
      << " more do not fit (the caller must start a new window)";
  BRAID_CHECK(n_kv_head > 0 && n_head % n_kv_head == 0)
      << "LlamaKvCache: " << n_head << " query heads over " << n_kv_head << " K/V heads";
  BRAID_CHECK(k.size() == v.size() && k.size() % size_t(batch_ * t * n_kv_head) == 0)
      << "LlamaKvCache: k and v of " << k.size() << " and " << v.size() << " values are not ["
      << batch_ << ", " << t << ", " << n_kv_head << ", D]";
  const int64_t D = int64_t(k.size()) / (batch_ * t * n_kv_head), W = n_kv_head * D;
  BRAID_CHECK(q.size() == size_t(batch_ * t * n_head * D))
      << "LlamaKvCache: q of " << q.size() << " values is not [" << batch_ << ", " << t << ", "
      << n_head << ", " << D << "]";
  if (width_ == 0) width_ = W;
  BRAID_CHECK(W == width_) << "LlamaKvCache: K/V width " << W << " after " << width_;
  std::vector<float>& K = k_[size_t(layer)];
  std::vector<float>& V = v_[size_t(layer)];
  if (K.empty()) {
    K.assign(size_t(batch_ * capacity_ * W), 0.0f);
    V.assign(K.size(), 0.0f);
  }
  const int64_t past = length_, group = n_head / n_kv_head;
  for (int64_t b = 0; b < batch_; ++b) {
    for (int64_t i = 0; i < t; ++i) {
      std::copy(k.begin() + (b * t + i) * W, k.begin() + (b * t + i + 1) * W,
                K.begin() + (b * capacity_ + past + i) * W);
      std::copy(v.begin() + (b * t + i) * W, v.begin() + (b * t + i + 1) * W,
                V.begin() + (b * capacity_ + past + i) * W);
    }
  }
  // Scores in f32 with a max-subtracted softmax, as the attention kernel computes them.
  const float scale = 1.0f / std::sqrt(float(D));
  std::vector<float> out(size_t(batch_ * t * n_head * D), 0.0f);
  std::vector<float> p(size_t(past + t));
  for (int64_t b = 0; b < batch_; ++b) {
    for (int64_t i = 0; i < t; ++i) {
      const int64_t n = past + i + 1;  // positions this query sees
      for (int64_t h = 0; h < n_head; ++h) {
        const float* qh = q.data() + ((b * t + i) * n_head + h) * D;
        const int64_t kvh = h / group;
        float* o = out.data() + ((b * t + i) * n_head + h) * D;
        float mx = -INFINITY;
        for (int64_t j = 0; j < n; ++j) {
          const float* kj = K.data() + (b * capacity_ + j) * W + kvh * D;
          float dot = 0;
          for (int64_t d = 0; d < D; ++d) dot += qh[d] * kj[d];
          p[size_t(j)] = dot * scale;
          mx = std::max(mx, p[size_t(j)]);
        }
        float sum = 0;
        for (int64_t j = 0; j < n; ++j) sum += (p[size_t(j)] = std::exp(p[size_t(j)] - mx));
        const float inv = 1.0f / sum;
        for (int64_t j = 0; j < n; ++j) {
          const float w = p[size_t(j)] * inv;
          const float* vj = V.data() + (b * capacity_ + j) * W + kvh * D;
          for (int64_t d = 0; d < D; ++d) o[d] += w * vj[d];
        }
      }
    }
  }
  return out;
}

void LlamaKvCache::Advance(int64_t t) {
  BRAID_CHECK(t > 0 && length_ + t <= capacity_)
      << "LlamaKvCache::Advance(" << t << ") with " << length_ << " of " << capacity_ << " held";
  length_ += t;
}

}  // namespace braid::models
