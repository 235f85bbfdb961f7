#include "models/nn/kv_cache.h"

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

void KvCache::CheckRoom(int64_t layer, int64_t t) const {
  BRAID_CHECK(layer >= 0 && layer < n_layer_) << "KvCache layer " << layer << " of " << n_layer_;
  BRAID_CHECK(t > 0 && length_ + t <= capacity_)
      << "KvCache holds " << length_ << " of " << capacity_ << " positions; " << t
      << " more do not fit (the caller must start a new window)";
}

std::vector<float> KvCache::Attend(int64_t layer, const std::vector<float>& q,
                                   const std::vector<float>& k, const std::vector<float>& v,
                                   int64_t t, int64_t n_head, int64_t n_kv_head) {
  CheckRoom(layer, t);
  BRAID_CHECK(n_kv_head > 0 && n_head % n_kv_head == 0)
      << "KvCache: " << n_head << " query heads over " << n_kv_head << " K/V heads";
  BRAID_CHECK(k.size() == v.size() && k.size() % size_t(batch_ * t * n_kv_head) == 0)
      << "KvCache: k and v of " << k.size() << " and " << v.size() << " values are not ["
      << batch_ << ", " << t << ", " << n_kv_head << ", D]";
  const int64_t D = int64_t(k.size()) / (batch_ * t * n_kv_head), W = n_kv_head * D;
  BRAID_CHECK(q.size() == size_t(batch_ * t * n_head * D))
      << "KvCache: q of " << q.size() << " values is not [" << batch_ << ", " << t << ", "
      << n_head << ", " << D << "]";
  return AttendRows(layer, {q.data(), n_head * D}, {k.data(), W}, {v.data(), W}, t, n_head,
                    n_kv_head, D);
}

std::vector<float> KvCache::Attend(int64_t layer, const std::vector<float>& qkv, int64_t t,
                                   int64_t n_head) {
  CheckRoom(layer, t);
  BRAID_CHECK(qkv.size() % size_t(3 * batch_ * t) == 0)
      << "KvCache: qkv of " << qkv.size() << " values is not [" << batch_ << ", " << t << ", 3C]";
  const int64_t C = int64_t(qkv.size()) / (3 * batch_ * t);
  BRAID_CHECK(n_head > 0 && C % n_head == 0) << "KvCache: width " << C << ", n_head " << n_head;
  return AttendRows(layer, {qkv.data(), 3 * C}, {qkv.data() + C, 3 * C},
                    {qkv.data() + 2 * C, 3 * C}, t, n_head, n_head, C / n_head);
}

std::vector<float> KvCache::AttendRows(int64_t layer, Rows q, Rows k, Rows v, int64_t t,
                                       int64_t n_head, int64_t n_kv_head, int64_t D) {
  const int64_t W = n_kv_head * D, C = n_head * D;
  if (width_ == 0) width_ = W;
  BRAID_CHECK(W == width_) << "KvCache: K/V width " << W << " after " << width_;
  std::vector<float>& K = k_[size_t(layer)];
  std::vector<float>& V = v_[size_t(layer)];
  if (K.empty()) {
    K.assign(size_t(batch_ * capacity_ * W), 0.0f);
    V.assign(K.size(), 0.0f);
  }
  const int64_t past = length_, group = n_head / n_kv_head;
  for (int64_t b = 0; b < batch_; ++b) {
    for (int64_t i = 0; i < t; ++i) {
      const float* kr = k.data + (b * t + i) * k.stride;
      const float* vr = v.data + (b * t + i) * v.stride;
      std::copy(kr, kr + W, K.begin() + (b * capacity_ + past + i) * W);
      std::copy(vr, vr + W, V.begin() + (b * capacity_ + past + i) * W);
    }
  }
  // Scores in f32 with a max-subtracted softmax, as the attention kernel computes them.
  const float scale = 1.0f / std::sqrt(float(D));
  std::vector<float> out(size_t(batch_ * t * C), 0.0f);
  std::vector<float> p(size_t(past + t));
  for (int64_t b = 0; b < batch_; ++b) {
    for (int64_t i = 0; i < t; ++i) {
      const int64_t n = past + i + 1;  // positions this query sees
      const float* qr = q.data + (b * t + i) * q.stride;
      float* o = out.data() + (b * t + i) * C;
      for (int64_t h = 0; h < n_head; ++h) {
        const float* qh = qr + h * D;
        const int64_t kvh = h / group;
        float* oh = o + h * D;
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
          for (int64_t d = 0; d < D; ++d) oh[d] += w * vj[d];
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
