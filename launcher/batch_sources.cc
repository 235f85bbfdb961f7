#include "launcher/batch_sources.h"

#include <unistd.h>

#include <algorithm>
#include <numeric>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/autograd.h"
#include "core/check.h"
#include "core/registry.h"
#include "models/data/distributed_sampler.h"
#include "models/data/find_data.h"
#include "models/data/mnist.h"
#include "models/data/token_data.h"
#include "models/data/token_manifest.h"

namespace braid::launcher {
namespace {

class RandomWindows : public BatchSource {
 public:
  explicit RandomWindows(data::RandomWindowSampler s) : s_(std::move(s)) {}
  Batch Next() override { return s_.Next(); }
  int64_t TokensPerBatch() const override { return s_.batch() * s_.context(); }

 private:
  data::RandomWindowSampler s_;
};

class Sequential : public BatchSource {
 public:
  Sequential(data::SequentialLoader s, int64_t tokens) : s_(std::move(s)), tokens_(tokens) {}
  Batch Next() override { return s_.Next(); }
  int64_t TokensPerBatch() const override { return tokens_; }

 private:
  data::SequentialLoader s_;
  int64_t tokens_;
};

class MnistBatches : public BatchSource {
 public:
  MnistBatches(data::MnistSplit split, data::DistributedSampler sampler, int64_t batch, Device d)
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
    std::vector<float> x(size_t(batch_ * data::kMnistPixels));
    std::vector<int32_t> y(static_cast<size_t>(batch_));
    const float* img = train_.images.data<float>();
    const int32_t* lab = train_.labels.data<int32_t>();
    for (int64_t b = 0; b < batch_; ++b) {
      if (pos_ >= int64_t(order_.size())) {
        order_ = sampler_.Indices(epoch_++);
        pos_ = 0;
      }
      int64_t i = order_[size_t(pos_++)];
      std::copy(img + i * data::kMnistPixels, img + (i + 1) * data::kMnistPixels,
                x.begin() + b * data::kMnistPixels);
      y[size_t(b)] = lab[i];
    }
    return Batch{Tensor::FromVector(x, {batch_, data::kMnistPixels}, device_),
                 Tensor::FromVector(y, {batch_}, device_)};
  }
  int64_t TokensPerBatch() const override { return batch_; }

 private:
  data::MnistData train_, test_;
  data::DistributedSampler sampler_;
  int64_t batch_;
  Device device_;
  std::vector<int64_t> order_;
  int64_t pos_ = 0, epoch_ = 0;
};

// The model's context, as its registration says (ModelSpec::context); 1 for a model of samples.
int64_t ContextOf(const config::TrainConfig& cfg, Module&) {
  absl::StatusOr<ModelSpec> spec = Registry::Get().GetModel(cfg.model().name());
  return spec.ok() && spec->context ? spec->context(cfg.model()) : 1;
}

}  // namespace

absl::StatusOr<std::unique_ptr<BatchSource>> BuildData(const config::TrainConfig& cfg, Module& model,
                                                       int dp_rank, int dp_size, Device device) {
  const auto& d = cfg.data();
  int64_t batch = cfg.train_micro_batch_size_per_gpu();
  if (d.dataset() == "mnist") {
    BRAID_ASSIGN_OR_RETURN(data::MnistSplit split, data::LoadMnist());
    data::DistributedSamplerOptions o;
    o.seed = d.seed();
    BRAID_ASSIGN_OR_RETURN(auto sampler, data::DistributedSampler::Create(
                                             split.train.size(), dp_rank, dp_size, o));
    return std::unique_ptr<BatchSource>(
        std::make_unique<MnistBatches>(std::move(split), std::move(sampler), batch, device));
  }
  std::string path = d.path();
  if (path.empty()) {
    BRAID_ASSIGN_OR_RETURN(path, data::FindDataFile(data::kMobyDickText));
  }
  std::shared_ptr<const data::TokenFile> shared;
  if (d.dataset() == "tokens" && access(path.c_str(), F_OK) != 0) {
    // Most often the preparation step was skipped or wrote elsewhere.
    return absl::NotFoundError(absl::StrCat(
        "data.path '", path, "' does not exist: prepare the data first (bazel run "
        "//tools:prepare_data -- --tokenizer=gpt2 --out=<folder> <your text>, docs/DATA.md) and "
        "give data.path that folder"));
  }
  if (d.dataset() == "tokens" && data::IsTokenDatasetPath(path)) {
    // A prepared data set (//tools:prepare_data): every shard checked, and every id checked
    // against the model's vocabulary, here at start rather than as an abort mid-run.
    BRAID_ASSIGN_OR_RETURN(data::TokenDataset set, data::TokenDataset::Open(path));
    if (cfg.model().vocab_size() > 0) {
      BRAID_RETURN_IF_ERROR(set.CheckVocab(cfg.model().vocab_size()));
    }
    BRAID_ASSIGN_OR_RETURN(shared, set.Tokens(data::Split::kTrain));
  } else {
    const data::TokenType tt = d.token_dtype() == "u32"   ? data::TokenType::kU32
                               : d.token_dtype() == "u16" ? data::TokenType::kU16
                                                          : data::TokenType::kU8;
    BRAID_ASSIGN_OR_RETURN(data::TokenFile file, data::TokenFile::Open(path, tt));
    shared = std::make_shared<const data::TokenFile>(std::move(file));
  }
  int64_t t = ContextOf(cfg, model);
  if (d.sampler() == "sequential") {
    BRAID_ASSIGN_OR_RETURN(auto s, data::SequentialLoader::Create(shared, batch, t, dp_rank,
                                                                  dp_size, device));
    return std::unique_ptr<BatchSource>(std::make_unique<Sequential>(std::move(s), batch * t));
  }
  BRAID_ASSIGN_OR_RETURN(auto s, data::RandomWindowSampler::Create(shared, batch, t, d.seed(),
                                                                   dp_rank, device));
  return std::unique_ptr<BatchSource>(std::make_unique<RandomWindows>(std::move(s)));
}

}  // namespace braid::launcher
