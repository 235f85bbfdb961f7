#include "models/data/mnist_batches.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "core/autograd.h"
#include "core/check.h"
#include "core/config/sections.pb.h"
#include "models/data/distributed_sampler.h"
#include "models/data/mnist.h"

namespace braid::data {
namespace {

class MnistBatches : public BatchSource {
 public:
  MnistBatches(MnistSplit split, DistributedSampler sampler, int64_t batch, Device d)
      : train_(std::move(split.train)), test_(std::move(split.test)), sampler_(std::move(sampler)),
        batch_(batch), device_(d) {}
  bool has_evaluation() const override { return true; }
  std::string Evaluate(Module& model) override {
    autograd::NoGradGuard no_grad;
    model.Eval();
    // On the parameters' device and in their dtype (bf16/f16 under mixed precision), as
    // training's inputs are (on CUDA the batches are made on the host and prefetched).
    const Tensor first = model.Parameters().front();  // a handle: Parameters() is a copy
    std::vector<float> logits =
        model(test_.images.To(first.device()).To(first.dtype())).ToFloatVector();
    model.Train();
    std::vector<int32_t> labels = test_.labels.ToVector<int32_t>();
    int64_t right = 0, n = int64_t(labels.size());
    for (int64_t i = 0; i < n; ++i) {
      const float* row = logits.data() + i * 10;
      right += int64_t(std::max_element(row, row + 10) - row) == labels[size_t(i)];
    }
    return absl::StrFormat("test accuracy %.2f%% (%d/%d held-out digits)", 100.0 * right / n,
                           right, n);
  }
  Batch Next() override {
    std::vector<float> x(size_t(batch_ * kMnistPixels));
    std::vector<int32_t> y(static_cast<size_t>(batch_));
    const float* img = train_.images.data<float>();
    const int32_t* lab = train_.labels.data<int32_t>();
    for (int64_t b = 0; b < batch_; ++b) {
      if (pos_ >= int64_t(order_.size())) {
        order_ = sampler_.Indices(epoch_++);
        pos_ = 0;
      }
      int64_t i = order_[size_t(pos_++)];
      std::copy(img + i * kMnistPixels, img + (i + 1) * kMnistPixels, x.begin() + b * kMnistPixels);
      y[size_t(b)] = lab[i];
    }
    return Batch{Tensor::FromVector(x, {batch_, kMnistPixels}, device_),
                 Tensor::FromVector(y, {batch_}, device_)};
  }
  int64_t TokensPerBatch() const override { return batch_; }

 private:
  MnistData train_, test_;
  DistributedSampler sampler_;
  int64_t batch_;
  Device device_;
  std::vector<int64_t> order_;
  int64_t pos_ = 0, epoch_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<BatchSource>> OpenMnistBatches(const BatchSourceRequest& request) {
  BRAID_CHECK(request.config != nullptr);
  BRAID_ASSIGN_OR_RETURN(MnistSplit split, LoadMnist());
  DistributedSamplerOptions o;
  o.seed = request.config->data().seed();
  BRAID_ASSIGN_OR_RETURN(auto sampler, DistributedSampler::Create(split.train.size(), request.dp_rank,
                                                                  request.dp_size, o));
  return std::unique_ptr<BatchSource>(
      std::make_unique<MnistBatches>(std::move(split), std::move(sampler), request.batch, request.device));
}

}  // namespace braid::data
