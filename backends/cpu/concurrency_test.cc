// Kernels called from several threads at once, as when each cpu:N device of a single-process
// data-parallel run is driven by its own thread: results must equal those of a lone caller.
#include <thread>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/test_util.h"
#include "core/kernels.h"
#include "gtest/gtest.h"

namespace braid::cpu {
namespace {

using testing::BitEqual;
using testing::RandomTensor;

const Device kCpu = Device::CPU();

struct Inputs {
  Tensor x, w, ln_w, ln_b, qkv, g;
};

// A slice of a transformer block's kernels; returns every output.
std::vector<Tensor> RunBlock(const Inputs& in) {
  const int64_t n = in.x.size(0), c = in.x.size(1);
  Tensor h = Tensor::Empty({n, 3 * c});
  kernels::matmul.Get(kCpu)(in.x, in.w, h, false, true, 1.0f, 0.0f);
  Tensor act = Tensor::Empty(h.shape());
  kernels::unary.Get(kCpu)(kernels::UnaryOp::kGeluTanh, h, 0.0f, act);
  Tensor ln = Tensor::Empty({n, c}), mean = Tensor::Empty({n}), rstd = Tensor::Empty({n});
  kernels::layernorm_forward.Get(kCpu)(in.x, in.ln_w, in.ln_b, 1e-5f, ln, mean, rstd);
  Tensor dx = Tensor::Empty({n, c}), dw = Tensor::Zeros({c}), db = Tensor::Zeros({c});
  kernels::layernorm_backward.Get(kCpu)(in.g, in.x, in.ln_w, mean, rstd, dx, dw, db);
  const int64_t b = in.qkv.size(0), t = in.qkv.size(1);
  Tensor out = Tensor::Empty({b, t, c}), att = Tensor::Empty({b, 4, t, t});
  kernels::attention_forward.Get(kCpu)(in.qkv, 4, out, att);
  Tensor dqkv = Tensor::Empty(in.qkv.shape());
  kernels::attention_backward.Get(kCpu)(out, in.qkv, att, 4, dqkv);
  Tensor s = Tensor::Empty({1});
  kernels::sum_all.Get(kCpu)(act, s);
  return {h, act, ln, mean, rstd, dx, dw, db, out, att, dqkv, s};
}

TEST(ConcurrencyTest, DeviceThreadsSharingThePoolGetTheSameResults) {
  std::mt19937 rng(3);
  const int kCallers = 3;
  std::vector<Inputs> inputs;
  for (int i = 0; i < kCallers; ++i) {
    inputs.push_back(Inputs{RandomTensor({512, 64}, rng), RandomTensor({192, 64}, rng),
                            RandomTensor({64}, rng), RandomTensor({64}, rng),
                            RandomTensor({4, 32, 192}, rng), RandomTensor({512, 64}, rng)});
  }
  SetNumThreads(1);
  std::vector<std::vector<Tensor>> want;
  for (const Inputs& in : inputs) want.push_back(RunBlock(in));

  SetNumThreads(2);  // the pool and OpenBLAS both threaded, and shared by the callers
  std::vector<std::vector<std::vector<Tensor>>> got(kCallers);
  std::vector<std::thread> callers;
  for (int i = 0; i < kCallers; ++i) {
    callers.emplace_back([&, i] {
      for (int rep = 0; rep < 20; ++rep) got[size_t(i)].push_back(RunBlock(inputs[size_t(i)]));
    });
  }
  for (auto& th : callers) th.join();
  SetNumThreads(1);
  for (int i = 0; i < kCallers; ++i) {
    for (const auto& outputs : got[size_t(i)]) {
      for (size_t k = 0; k < outputs.size(); ++k) {
        if (k == 0 || k == 1 || k == 11) {
          // OpenBLAS may block a threaded product differently: equal within rounding.
          EXPECT_TRUE(testing::AllClose(outputs[k], want[size_t(i)][k], 1e-5f, 1e-5f))
              << "caller " << i << " output " << k;
        } else {
          EXPECT_TRUE(BitEqual(outputs[k], want[size_t(i)][k]))
              << "caller " << i << " output " << k;
        }
      }
    }
  }
}

}  // namespace
}  // namespace braid::cpu
