#include "models/gpt/kv_cache.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"

namespace braid::models {

KvCache::KvCache(int64_t n_layer, int64_t batch, int64_t capacity)
    : n_layer_(n_layer), batch_(batch), capacity_(capacity), k_(size_t(n_layer)),
      v_(size_t(n_layer)) {
  BRAID_CHECK(n_layer > 0 && batch > 0 && capacity > 0)
      << "KvCache needs n_layer, batch and capacity > 0, got " << n_layer << ", " << batch
      << ", " << capacity;
}

std::vector<float> KvCache::Attend(int64_t layer, const std::vector<float>& qkv, int64_t t,
                                   int64_t n_head) {
  BRAID_CHECK(layer >= 0 && layer < n_layer_) << "KvCache layer " << layer << " of " << n_layer_;
  BRAID_CHECK(t > 0 && length_ + t <= capacity_)
      << "KvCache holds " << length_ << " of " << capacity_ << " positions; " << t
      << " more do not fit (the caller must start a new window)";
  BRAID_CHECK(qkv.size() % size_t(3 * batch_ * t) == 0)
      << "KvCache: qkv of " << qkv.size() << " values is not [" << batch_ << ", " << t << ", 3C]";
  const int64_t C = int64_t(qkv.size()) / (3 * batch_ * t);
  if (width_ == 0) width_ = C;
  BRAID_CHECK(C == width_) << "KvCache: width " << C << " after " << width_;
  BRAID_CHECK(n_head > 0 && C % n_head == 0) << "KvCache: width " << C << ", n_head " << n_head;
  std::vector<float>& K = k_[size_t(layer)];
  std::vector<float>& V = v_[size_t(layer)];
  if (K.empty()) {
    K.assign(size_t(batch_ * capacity_ * C), 0.0f);
    V.assign(K.size(), 0.0f);
  }
  const int64_t D = C / n_head, past = length_;
  for (int64_t b = 0; b < batch_; ++b) {
    for (int64_t i = 0; i < t; ++i) {
      const float* row = qkv.data() + (b * t + i) * 3 * C;
      std::copy(row + C, row + 2 * C, K.begin() + (b * capacity_ + past + i) * C);
      std::copy(row + 2 * C, row + 3 * C, V.begin() + (b * capacity_ + past + i) * C);
    }
  }
  // Scores in f32 with a max-subtracted softmax, as the attention kernel computes them.
  const float scale = 1.0f / std::sqrt(float(D));
  std::vector<float> out(size_t(batch_ * t * C), 0.0f);
  std::vector<float> p(size_t(past + t));
  for (int64_t b = 0; b < batch_; ++b) {
    for (int64_t i = 0; i < t; ++i) {
      const int64_t n = past + i + 1;  // positions this query sees
      const float* q = qkv.data() + (b * t + i) * 3 * C;
      float* o = out.data() + (b * t + i) * C;
      for (int64_t h = 0; h < n_head; ++h) {
        float mx = -INFINITY;
        for (int64_t j = 0; j < n; ++j) {
          const float* k = K.data() + (b * capacity_ + j) * C + h * D;
          float dot = 0;
          for (int64_t d = 0; d < D; ++d) dot += q[h * D + d] * k[d];
          p[size_t(j)] = dot * scale;
          mx = std::max(mx, p[size_t(j)]);
        }
        float sum = 0;
        for (int64_t j = 0; j < n; ++j) sum += (p[size_t(j)] = std::exp(p[size_t(j)] - mx));
        const float inv = 1.0f / sum;
        for (int64_t j = 0; j < n; ++j) {
          const float w = p[size_t(j)] * inv;
          const float* v = V.data() + (b * capacity_ + j) * C + h * D;
          for (int64_t d = 0; d < D; ++d) o[h * D + d] += w * v[d];
        }
      }
    }
  }
  return out;
}

void KvCache::Advance(int64_t t) {
  BRAID_CHECK(t > 0 && length_ + t <= capacity_)
      << "KvCache::Advance(" << t << ") with " << length_ << " of " << capacity_ << " held";
  length_ += t;
}

}  // namespace braid::models
