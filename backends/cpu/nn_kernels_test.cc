// layernorm, softmax, cross-entropy and embedding against the reference kernels (and the
// backward kernels against finite differences of the forward ones).
#include <cmath>
#include <limits>
#include <vector>

#include "backends/cpu/test_util.h"
#include "core/kernels.h"
#include "core/testing/reference_kernels.h"
#include "gtest/gtest.h"

namespace braid::cpu {
namespace {

using testing::AllClose;
using testing::BitEqual;
using testing::KernelTest;
using testing::RandomIds;
using testing::RandomTensor;

const Device kCpu = Device::CPU();

// (rows, cols): single elements, odd widths around the vector width, gpt-mini's width.
const std::vector<std::pair<int64_t, int64_t>> kRowShapes = {
    {1, 1}, {1, 7}, {3, 8}, {5, 9}, {2, 17}, {13, 33}, {64, 256}, {7, 1000}};

class NnTest : public KernelTest {};

TEST_P(NnTest, LayerNormForwardMatchesReference) {
  for (auto [rows, cols] : kRowShapes) {
    // An offset keeps the mean away from zero, as in real activations.
    Tensor x = RandomTensor({rows, cols}, rng_, -1.0f, 3.0f);
    Tensor w = RandomTensor({cols}, rng_), b = RandomTensor({cols}, rng_);
    Tensor out = Tensor::Empty({rows, cols}), mean = Tensor::Empty({rows}),
           rstd = Tensor::Empty({rows});
    Tensor rout = Tensor::Empty({rows, cols}), rmean = Tensor::Empty({rows}),
           rrstd = Tensor::Empty({rows});
    kernels::layernorm_forward.Get(kCpu)(x, w, b, 1e-5f, out, mean, rstd);
    reference::layernorm_forward(x, w, b, 1e-5f, rout, rmean, rrstd);
    std::string what = std::to_string(rows) + "x" + std::to_string(cols);
    EXPECT_TRUE(AllClose(mean, rmean, 1e-6f, 1e-6f)) << what;
    // 1-wide rows have zero variance: rstd = 1/sqrt(eps) ~ 316, a large but exact case.
    EXPECT_TRUE(AllClose(rstd, rrstd, 1e-5f, 1e-5f)) << what;
    EXPECT_TRUE(AllClose(out, rout, 1e-5f, 1e-5f)) << what;
  }
}

TEST_P(NnTest, LayerNormBackwardMatchesReference) {
  for (auto [rows, cols] : kRowShapes) {
    Tensor x = RandomTensor({rows, cols}, rng_, -1.0f, 3.0f);
    Tensor w = RandomTensor({cols}, rng_), b = RandomTensor({cols}, rng_);
    Tensor g = RandomTensor({rows, cols}, rng_);
    Tensor out = Tensor::Empty({rows, cols}), mean = Tensor::Empty({rows}),
           rstd = Tensor::Empty({rows});
    reference::layernorm_forward(x, w, b, 1e-5f, out, mean, rstd);
    // dweight/dbias are added into: start both from the same non-zero values.
    Tensor dw0 = RandomTensor({cols}, rng_), db0 = RandomTensor({cols}, rng_);
    Tensor dx = Tensor::Empty({rows, cols}), dw = dw0.Clone(), db = db0.Clone();
    Tensor rdx = Tensor::Empty({rows, cols}), rdw = dw0.Clone(), rdb = db0.Clone();
    kernels::layernorm_backward.Get(kCpu)(g, x, w, mean, rstd, dx, dw, db);
    reference::layernorm_backward(g, x, w, mean, rstd, rdx, rdw, rdb);
    std::string what = std::to_string(rows) + "x" + std::to_string(cols);
    if (cols > 1) {
      EXPECT_TRUE(AllClose(dx, rdx, 2e-5f, 1e-4f)) << what;
    }
    EXPECT_TRUE(AllClose(dw, rdw, 2e-6f * float(rows), 1e-5f)) << what;
    EXPECT_TRUE(AllClose(db, rdb, 2e-6f * float(rows), 1e-5f)) << what;
  }
}

TEST_P(NnTest, LayerNormBackwardMatchesFiniteDifferences) {
  const int64_t rows = 3, cols = 11;
  Tensor x = RandomTensor({rows, cols}, rng_, -1.0f, 3.0f);
  Tensor w = RandomTensor({cols}, rng_), b = RandomTensor({cols}, rng_);
  Tensor g = RandomTensor({rows, cols}, rng_);
  Tensor out = Tensor::Empty({rows, cols}), mean = Tensor::Empty({rows}),
         rstd = Tensor::Empty({rows});
  auto loss = [&] {
    kernels::layernorm_forward.Get(kCpu)(x, w, b, 1e-5f, out, mean, rstd);
    return testing::WeightedSum(out, g);
  };
  std::vector<double> nx = testing::NumericGrad(x, loss);
  std::vector<double> nw = testing::NumericGrad(w, loss);
  std::vector<double> nb = testing::NumericGrad(b, loss);
  loss();  // restore mean/rstd for the unperturbed input
  Tensor dx = Tensor::Empty({rows, cols}), dw = Tensor::Zeros({cols}), db = Tensor::Zeros({cols});
  kernels::layernorm_backward.Get(kCpu)(g, x, w, mean, rstd, dx, dw, db);
  EXPECT_TRUE(testing::GradClose(dx, nx, 5e-3, 1e-2));
  EXPECT_TRUE(testing::GradClose(dw, nw, 5e-3, 1e-2));
  EXPECT_TRUE(testing::GradClose(db, nb, 5e-3, 1e-2));
}

TEST_P(NnTest, SoftmaxMatchesReference) {
  for (auto [rows, cols] : kRowShapes) {
    Tensor x = RandomTensor({rows, cols}, rng_, -8.0f, 8.0f), dy = RandomTensor({rows, cols}, rng_);
    Tensor y = Tensor::Empty({rows, cols}), ry = Tensor::Empty({rows, cols});
    kernels::softmax_forward.Get(kCpu)(x, y);
    reference::softmax_forward(x, ry);
    EXPECT_TRUE(AllClose(y, ry, 1e-7f, 1e-5f)) << rows << "x" << cols;
    Tensor dx = Tensor::Empty({rows, cols}), rdx = Tensor::Empty({rows, cols});
    kernels::softmax_backward.Get(kCpu)(ry, dy, dx);
    reference::softmax_backward(ry, dy, rdx);
    EXPECT_TRUE(AllClose(dx, rdx, 1e-6f, 1e-5f)) << rows << "x" << cols;
  }
}

TEST_P(NnTest, SoftmaxHandlesLargeLogits) {
  // Max subtraction: huge logits must not overflow, -inf entries get probability 0.
  std::vector<float> v = {1000.0f, 999.0f, -1000.0f, -std::numeric_limits<float>::infinity(),
                          50.0f,   88.0f,  89.0f,    0.0f,
                          1.0f};
  Tensor x = Tensor::FromVector(v, {1, int64_t(v.size())});
  Tensor y = Tensor::Empty(x.shape()), ry = Tensor::Empty(x.shape());
  kernels::softmax_forward.Get(kCpu)(x, y);
  reference::softmax_forward(x, ry);
  EXPECT_TRUE(AllClose(y, ry, 1e-7f, 1e-5f));
}

TEST_P(NnTest, SoftmaxBackwardMatchesFiniteDifferences) {
  Tensor x = RandomTensor({2, 9}, rng_, -2.0f, 2.0f), w = RandomTensor({2, 9}, rng_);
  Tensor y = Tensor::Empty({2, 9});
  auto loss = [&] {
    kernels::softmax_forward.Get(kCpu)(x, y);
    return testing::WeightedSum(y, w);
  };
  std::vector<double> numeric = testing::NumericGrad(x, loss, 1e-3f);
  loss();
  Tensor dx = Tensor::Empty({2, 9});
  kernels::softmax_backward.Get(kCpu)(y, w, dx);
  EXPECT_TRUE(testing::GradClose(dx, numeric, 1e-3, 1e-2));
}

TEST_P(NnTest, CrossEntropyMatchesReferenceWithIgnoredTargets) {
  for (auto [n, v] : std::vector<std::pair<int64_t, int64_t>>{
           {1, 1}, {1, 5}, {7, 9}, {33, 256}, {2048 / 16, 257}}) {
    Tensor logits = RandomTensor({n, v}, rng_, -6.0f, 6.0f);
    Tensor targets = RandomIds(n, v, rng_, /*ignore_every=*/4);
    if (n > 1) targets.data<int32_t>()[0] = -1;  // at least one ignored row
    Tensor losses = Tensor::Empty({n}), probs = Tensor::Empty({n, v});
    Tensor rlosses = Tensor::Empty({n}), rprobs = Tensor::Empty({n, v});
    kernels::cross_entropy_forward.Get(kCpu)(logits, targets, losses, probs);
    reference::cross_entropy_forward(logits, targets, rlosses, rprobs);
    std::string what = std::to_string(n) + "x" + std::to_string(v);
    EXPECT_TRUE(AllClose(losses, rlosses, 1e-5f, 1e-5f)) << what;
    EXPECT_TRUE(AllClose(probs, rprobs, 1e-7f, 1e-5f)) << what;
    Tensor dloss = RandomTensor({n}, rng_, 0.1f, 1.0f);
    Tensor dl = Tensor::Empty({n, v}), rdl = Tensor::Empty({n, v});
    kernels::cross_entropy_backward.Get(kCpu)(rprobs, targets, dloss, dl);
    reference::cross_entropy_backward(rprobs, targets, dloss, rdl);
    EXPECT_TRUE(AllClose(dl, rdl, 1e-7f, 1e-5f)) << what;
  }
}

TEST_P(NnTest, CrossEntropyBackwardMatchesFiniteDifferences) {
  const int64_t n = 4, v = 7;
  Tensor logits = RandomTensor({n, v}, rng_, -2.0f, 2.0f);
  Tensor targets = Tensor::FromVector<int32_t>({3, -1, 0, 6}, {n});
  Tensor dloss = RandomTensor({n}, rng_, 0.1f, 1.0f);
  Tensor losses = Tensor::Empty({n}), probs = Tensor::Empty({n, v});
  auto loss = [&] {
    kernels::cross_entropy_forward.Get(kCpu)(logits, targets, losses, probs);
    return testing::WeightedSum(losses, dloss);
  };
  std::vector<double> numeric = testing::NumericGrad(logits, loss, 1e-3f);
  loss();
  Tensor dl = Tensor::Empty({n, v});
  kernels::cross_entropy_backward.Get(kCpu)(probs, targets, dloss, dl);
  EXPECT_TRUE(testing::GradClose(dl, numeric, 1e-3, 1e-2));
}

TEST_P(NnTest, EmbeddingMatchesReferenceWithRepeatedIds) {
  for (auto [n, v, c] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
           {1, 1, 1}, {5, 3, 7}, {64, 10, 33}, {2048, 256, 256}, {100, 2, 9}}) {
    Tensor w = RandomTensor({v, c}, rng_);
    Tensor ids = RandomIds(n, v, rng_);  // n > v: ids repeat
    Tensor out = Tensor::Empty({n, c}), rout = Tensor::Empty({n, c});
    kernels::embedding_forward.Get(kCpu)(w, ids, out);
    reference::embedding_forward(w, ids, rout);
    EXPECT_TRUE(BitEqual(out, rout));
    Tensor g = RandomTensor({n, c}, rng_);
    Tensor dw0 = RandomTensor({v, c}, rng_);  // backward adds into dweight
    Tensor dw = dw0.Clone(), rdw = dw0.Clone();
    kernels::embedding_backward.Get(kCpu)(g, ids, dw);
    reference::embedding_backward(g, ids, rdw);
    EXPECT_TRUE(AllClose(dw, rdw, 1e-6f * float(n), 1e-5f)) << n << " ids, " << v << "x" << c;
  }
}

TEST_P(NnTest, ThreadCountIndependent) {
  const int64_t rows = 2048, cols = 256;
  Tensor x = RandomTensor({rows, cols}, rng_), w = RandomTensor({cols}, rng_),
         b = RandomTensor({cols}, rng_), g = RandomTensor({rows, cols}, rng_);
  Tensor ids = RandomIds(rows, 256, rng_, 5);
  auto [one, two] = testing::RunWithThreads([&] {
    Tensor out = Tensor::Empty({rows, cols}), mean = Tensor::Empty({rows}),
           rstd = Tensor::Empty({rows});
    kernels::layernorm_forward.Get(kCpu)(x, w, b, 1e-5f, out, mean, rstd);
    Tensor dx = Tensor::Empty({rows, cols}), dw = Tensor::Zeros({cols}), db = Tensor::Zeros({cols});
    kernels::layernorm_backward.Get(kCpu)(g, x, w, mean, rstd, dx, dw, db);
    Tensor sm = Tensor::Empty({rows, cols}), dsm = Tensor::Empty({rows, cols});
    kernels::softmax_forward.Get(kCpu)(x, sm);
    kernels::softmax_backward.Get(kCpu)(sm, g, dsm);
    Tensor losses = Tensor::Empty({rows}), probs = Tensor::Empty({rows, cols});
    kernels::cross_entropy_forward.Get(kCpu)(x, ids, losses, probs);
    Tensor dl = Tensor::Empty({rows, cols});
    kernels::cross_entropy_backward.Get(kCpu)(probs, ids, losses, dl);
    std::mt19937 id_rng(7);
    Tensor pos_ids = RandomIds(rows, 256, id_rng);
    Tensor emb = Tensor::Empty({rows, cols}), demb = Tensor::Zeros({256, cols});
    kernels::embedding_forward.Get(kCpu)(x.Slice(0, 256), pos_ids, emb);
    kernels::embedding_backward.Get(kCpu)(g, pos_ids, demb);
    return std::vector<Tensor>{out, mean, rstd, dx, dw, db, sm, dsm, losses, probs, dl, emb, demb};
  });
  for (size_t i = 0; i < one.size(); ++i) EXPECT_TRUE(BitEqual(one[i], two[i])) << "output " << i;
}

TEST_P(NnTest, EmptyInputsAreNoOps) {
  Tensor x = Tensor::Empty({0, 5}), w = Tensor::Full({5}, 1.0f), b = Tensor::Zeros({5});
  Tensor out = Tensor::Empty({0, 5}), mean = Tensor::Empty({0}), rstd = Tensor::Empty({0});
  kernels::layernorm_forward.Get(kCpu)(x, w, b, 1e-5f, out, mean, rstd);
  Tensor dw = Tensor::Zeros({5}), db = Tensor::Zeros({5}), dx = Tensor::Empty({0, 5});
  kernels::layernorm_backward.Get(kCpu)(out, x, w, mean, rstd, dx, dw, db);
  EXPECT_TRUE(BitEqual(dw, Tensor::Zeros({5})));
  Tensor ids = Tensor::Empty({0}, DType::kI32);
  Tensor emb = Tensor::Empty({0, 5});
  kernels::embedding_forward.Get(kCpu)(Tensor::Zeros({3, 5}), ids, emb);
}

INSTANTIATE_TEST_SUITE_P(Configs, NnTest, ::testing::ValuesIn(testing::AllConfigs()),
                         testing::ConfigName);

}  // namespace
}  // namespace braid::cpu
