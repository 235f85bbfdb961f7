#include "tools/sample/uncached_decoder.h"

#include <algorithm>
#include <vector>

#include "core/autograd.h"
#include "core/check.h"

namespace braid::tools {
namespace {

class Uncached : public TokenDecoder {
 public:
  Uncached(Module& model, int64_t capacity) : model_(model), capacity_(capacity) {
    autograd::NoGradGuard no_grad;
    rows_ = model_.Forward(Tensor::FromVector(std::vector<int32_t>{0}, {1, 1})).size(-1);
  }

  Tensor Step(const Tensor& ids) override {
    BRAID_CHECK(ids.ndim() == 2) << "ids must be [B, t]";
    const int64_t b = ids.size(0), t = ids.size(1);
    BRAID_CHECK(length_ + t <= capacity_) << "context " << capacity_ << " exceeded";
    BRAID_CHECK(ids_.empty() || b == batch_) << "the batch changed between steps";
    batch_ = b;
    // Append the new ids to each sequence's row: [B, length] -> [B, length + t].
    std::vector<int32_t> fresh = ids.ToVector<int32_t>(), all(size_t(b * (length_ + t)));
    for (int64_t i = 0; i < b; ++i) {
      std::copy(ids_.begin() + i * length_, ids_.begin() + (i + 1) * length_,
                all.begin() + i * (length_ + t));
      std::copy(fresh.begin() + i * t, fresh.begin() + (i + 1) * t,
                all.begin() + i * (length_ + t) + length_);
    }
    ids_ = std::move(all);
    length_ += t;
    autograd::NoGradGuard no_grad;
    std::vector<float> logits =
        model_.Forward(Tensor::FromVector(ids_, {b, length_})).ToFloatVector();
    // The last t positions of each sequence.
    std::vector<float> out(size_t(b * t * rows_));
    for (int64_t i = 0; i < b; ++i) {
      std::copy(logits.begin() + (i * length_ + length_ - t) * rows_,
                logits.begin() + (i + 1) * length_ * rows_, out.begin() + i * t * rows_);
    }
    return Tensor::FromVector(out, {b, t, rows_});
  }
  int64_t length() const override { return length_; }
  int64_t capacity() const override { return capacity_; }
  int64_t vocab_rows() const override { return rows_; }
  void Clear() override {
    ids_.clear();
    length_ = 0;
  }

 private:
  Module& model_;
  int64_t capacity_, rows_ = 0, length_ = 0, batch_ = 0;
  std::vector<int32_t> ids_;  // [batch_, length_]
};

}  // namespace

std::unique_ptr<TokenDecoder> UncachedDecoder(Module& model, int64_t capacity) {
  return std::make_unique<Uncached>(model, capacity);
}

}  // namespace braid::tools
