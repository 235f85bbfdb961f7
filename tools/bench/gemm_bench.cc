// Benchmarks of the CPU backend at gpt-mini sizes (width 256, 4 layers, 4 heads, context 128,
// batch 16, vocab 256), printing one JSON object per line:
//   {"bench":"gemm", ...}    GFLOP/s of the matmul kernel for every product a Linear layer
//                            runs (x Wᵀ, dY W, dYᵀ X) and for 1024³;
//   {"bench":"kernel", ...}  ms per call of the fused kernels (layernorm, GELU, attention,
//                            cross-entropy, ...), forward and backward;
//   {"bench":"step_estimate", ...}  those timings summed over one training step's calls.
// Each figure is the median (and the fastest) of --reps timed runs after a warm-up, at every
// --threads count.
// --clock=cpu times in the process's CPU time instead of elapsed time
// (tools/bench/kernel_timing.h).
//
//   bazel run -c opt //tools/bench:gemm_bench -- --threads=1,2 --reps=15
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_split.h"
#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/thread_pool.h"
#include "core/kernels.h"
#include "core/tensor.h"
#include "tools/bench/kernel_timing.h"

ABSL_FLAG(std::string, threads, "1,2", "comma-separated thread counts to measure");
ABSL_FLAG(std::string, clock, "wall",
          "wall (elapsed time) or cpu (the process's CPU time, steadier on a shared machine)");
ABSL_FLAG(int, reps, 15, "timed repetitions per measurement (the median is reported)");
ABSL_FLAG(std::string, only, "all", "gemm, kernels or all");
ABSL_FLAG(std::string, filter, "", "run only the cases whose name contains this");

namespace braid {
namespace {

const Device kCpu = Device::CPU();

Tensor Random(const Shape& shape, std::mt19937& rng, float lo = -1.0f, float hi = 1.0f) {
  Tensor t = Tensor::Empty(shape);
  std::uniform_real_distribution<float> d(lo, hi);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = d(rng);
  return t;
}

using bench::Time;
using bench::Timing;

struct GemmCase {
  const char* name;
  int64_t m, n, k;
  bool ta, tb;
  int calls_per_step;  // in one gpt-mini training step
};

// rows = B * T = 2048. Linear(in, out): forward x Wᵀ [rows,in]x[out,in]ᵀ, backward dX = dY W and
// dW = dYᵀ X. Per layer: c_attn 256->768, c_proj 256->256, c_fc 256->1024, mlp proj 1024->256;
// plus the 256->256 lm_head once.
std::vector<GemmCase> GemmCases() {
  return {
      {"c_attn_fwd_xWt", 2048, 768, 256, false, true, 4},
      {"c_attn_bwd_dYW", 2048, 256, 768, false, false, 4},
      {"c_attn_bwd_dYtX", 768, 256, 2048, true, false, 4},
      {"c_proj_fwd_xWt", 2048, 256, 256, false, true, 5},
      {"c_proj_bwd_dYW", 2048, 256, 256, false, false, 5},
      {"c_proj_bwd_dYtX", 256, 256, 2048, true, false, 5},
      {"c_fc_fwd_xWt", 2048, 1024, 256, false, true, 4},
      {"c_fc_bwd_dYW", 2048, 256, 1024, false, false, 4},
      {"c_fc_bwd_dYtX", 1024, 256, 2048, true, false, 4},
      {"mlp_proj_fwd_xWt", 2048, 256, 1024, false, true, 4},
      {"mlp_proj_bwd_dYW", 2048, 1024, 256, false, false, 4},
      {"mlp_proj_bwd_dYtX", 256, 1024, 2048, true, false, 4},
      {"square_1024", 1024, 1024, 1024, false, false, 0},
  };
}

Timing RunGemm(const GemmCase& c, int threads, int reps, std::mt19937& rng) {
  Tensor a = Random(c.ta ? Shape{c.k, c.m} : Shape{c.m, c.k}, rng);
  Tensor b = Random(c.tb ? Shape{c.n, c.k} : Shape{c.k, c.n}, rng);
  Tensor out = Tensor::Empty({c.m, c.n});
  auto mm = kernels::matmul.Get(kCpu);
  Timing t = Time([&] { mm(a, b, out, c.ta, c.tb, 1.0f, 0.0f); }, reps);
  const double flop = 2.0 * double(c.m) * double(c.n) * double(c.k);
  std::printf(
      "{\"bench\":\"gemm\",\"name\":\"%s\",\"m\":%lld,\"n\":%lld,\"k\":%lld,\"trans_a\":%s,"
      "\"trans_b\":%s,\"threads\":%d,\"ms\":%.4f,\"gflops\":%.2f,\"best_ms\":%.4f,"
      "\"gflops_best\":%.2f}\n",
      c.name, (long long)c.m, (long long)c.n, (long long)c.k, c.ta ? "true" : "false",
      c.tb ? "true" : "false", threads, t.median * 1e3, flop / t.median / 1e9, t.best * 1e3,
      flop / t.best / 1e9);
  std::fflush(stdout);
  return t;
}

struct KernelCase {
  std::string name;
  int calls_per_step;
  std::function<void()> fn;
};

// gpt-mini's per-step kernel calls, on gpt-mini-sized tensors.
std::vector<KernelCase> KernelCases(std::mt19937& rng) {
  const int64_t B = 16, T = 128, C = 256, H = 4, V = 256, N = B * T, L = 4;
  const int64_t params = 3300000;
  auto x = std::make_shared<Tensor>(Random({N, C}, rng, -1.0f, 3.0f));
  auto w = std::make_shared<Tensor>(Random({C}, rng));
  auto bias = std::make_shared<Tensor>(Random({C}, rng));
  auto ln_out = std::make_shared<Tensor>(Tensor::Empty({N, C}));
  auto mean = std::make_shared<Tensor>(Tensor::Empty({N}));
  auto rstd = std::make_shared<Tensor>(Tensor::Empty({N}));
  auto dx = std::make_shared<Tensor>(Tensor::Empty({N, C}));
  auto dw = std::make_shared<Tensor>(Tensor::Zeros({C}));
  auto db = std::make_shared<Tensor>(Tensor::Zeros({C}));
  auto h = std::make_shared<Tensor>(Random({N, 4 * C}, rng, -3.0f, 3.0f));
  auto h_out = std::make_shared<Tensor>(Tensor::Empty({N, 4 * C}));
  auto h_g = std::make_shared<Tensor>(Random({N, 4 * C}, rng));
  auto qkv = std::make_shared<Tensor>(Random({B, T, 3 * C}, rng));
  auto att_out = std::make_shared<Tensor>(Tensor::Empty({B, T, C}));
  auto att = std::make_shared<Tensor>(Tensor::Empty({B, H, T, T}));
  auto datt_out = std::make_shared<Tensor>(Random({B, T, C}, rng));
  auto dqkv = std::make_shared<Tensor>(Tensor::Empty({B, T, 3 * C}));
  auto logits = std::make_shared<Tensor>(Random({N, V}, rng, -4.0f, 4.0f));
  auto targets = std::make_shared<Tensor>(Tensor::Empty({N}, DType::kI32));
  for (int64_t i = 0; i < N; ++i) targets->data<int32_t>()[i] = int32_t(rng() % V);
  auto losses = std::make_shared<Tensor>(Tensor::Empty({N}));
  auto probs = std::make_shared<Tensor>(Tensor::Empty({N, V}));
  auto dloss = std::make_shared<Tensor>(Tensor::Full({N}, 1.0f / float(N)));
  auto dlogits = std::make_shared<Tensor>(Tensor::Empty({N, V}));
  auto wte = std::make_shared<Tensor>(Random({V, C}, rng));
  auto dwte = std::make_shared<Tensor>(Tensor::Zeros({V, C}));
  auto emb = std::make_shared<Tensor>(Tensor::Empty({N, C}));
  auto p = std::make_shared<Tensor>(Random({params}, rng));
  auto pg = std::make_shared<Tensor>(Random({params}, rng));
  auto pm = std::make_shared<Tensor>(Tensor::Zeros({params}));
  auto pv = std::make_shared<Tensor>(Tensor::Zeros({params}));
  auto bias3 = std::make_shared<Tensor>(Random({3 * C}, rng));
  auto y3 = std::make_shared<Tensor>(Random({N, 3 * C}, rng));
  auto gb3 = std::make_shared<Tensor>(Tensor::Empty({3 * C}));
  kernels::layernorm_forward.Get(kCpu)(*x, *w, *bias, 1e-5f, *ln_out, *mean, *rstd);
  kernels::attention_forward.Get(kCpu)(*qkv, int(H), *att_out, *att);
  kernels::cross_entropy_forward.Get(kCpu)(*logits, *targets, *losses, *probs);

  std::vector<KernelCase> cases;
  cases.push_back(
      {"layernorm_fwd [2048,256]", int(2 * L + 1),
       [=] { kernels::layernorm_forward.Get(kCpu)(*x, *w, *bias, 1e-5f, *ln_out, *mean, *rstd); }});
  cases.push_back({"layernorm_bwd [2048,256]", int(2 * L + 1), [=] {
                     kernels::layernorm_backward.Get(kCpu)(*ln_out, *x, *w, *mean, *rstd, *dx, *dw,
                                                           *db);
                   }});
  cases.push_back({"gelu_fwd [2048,1024]", int(L), [=] {
                     kernels::unary.Get(kCpu)(kernels::UnaryOp::kGeluTanh, *h, 0.0f, *h_out);
                   }});
  cases.push_back(
      {"gelu_bwd [2048,1024]", int(L),
       [=] { kernels::unary_backward.Get(kCpu)(kernels::UnaryOp::kGeluTanh, *h, *h_g, *h_out); }});
  cases.push_back({"attention_fwd B16 T128 C256 H4", int(L),
                   [=] { kernels::attention_forward.Get(kCpu)(*qkv, int(H), *att_out, *att); }});
  cases.push_back({"attention_bwd B16 T128 C256 H4", int(L), [=] {
                     kernels::attention_backward.Get(kCpu)(*datt_out, *qkv, *att, int(H), *dqkv);
                   }});
  cases.push_back({"cross_entropy_fwd [2048,256]", 1, [=] {
                     kernels::cross_entropy_forward.Get(kCpu)(*logits, *targets, *losses, *probs);
                   }});
  cases.push_back({"cross_entropy_bwd [2048,256]", 1, [=] {
                     kernels::cross_entropy_backward.Get(kCpu)(*probs, *targets, *dloss, *dlogits);
                   }});
  cases.push_back({"embedding_fwd [2048]x[256,256]", 2,
                   [=] { kernels::embedding_forward.Get(kCpu)(*wte, *targets, *emb); }});
  // Each embedding's gradient is zeroed, then scattered into (core/ops.cc's Embedding).
  cases.push_back({"embedding_bwd [2048]x[256,256]", 2, [=] {
                     kernels::fill.Get(kCpu)(*dwte, 0.0f);
                     kernels::embedding_backward.Get(kCpu)(*x, *targets, *dwte);
                   }});
  // The loss's mean and its gradient's spread (core/ops.cc's CrossEntropy).
  auto inv = std::make_shared<Tensor>(Tensor::Empty({}));
  auto loss = std::make_shared<Tensor>(Tensor::Empty({}));
  auto g = std::make_shared<Tensor>(Tensor::Full({}, 1.0f));
  auto gs = std::make_shared<Tensor>(Tensor::Empty({}));
  auto dl = std::make_shared<Tensor>(Tensor::Empty({N}));
  cases.push_back({"loss_mean fwd+bwd [2048]", 1, [=] {
                     kernels::inverse_count_nonnegative.Get(kCpu)(*targets, *inv);
                     kernels::sum_all.Get(kCpu)(*losses, *loss);
                     kernels::binary.Get(kCpu)(kernels::BinaryOp::kMul, *loss, *inv, *loss);
                     kernels::binary.Get(kCpu)(kernels::BinaryOp::kMul, *g, *inv, *gs);
                     kernels::fill.Get(kCpu)(*dl, 0.0f);
                     kernels::binary.Get(kCpu)(kernels::BinaryOp::kAdd, *dl, *gs, *dl);
                   }});
  // Bias add after every Linear (17 per step; sized as c_attn) and residual adds (8).
  cases.push_back({"bias_add [2048,768]+[768]", 17,
                   [=] { kernels::binary.Get(kCpu)(kernels::BinaryOp::kAdd, *y3, *bias3, *y3); }});
  cases.push_back({"residual_add [2048,256]", int(2 * L),
                   [=] { kernels::binary.Get(kCpu)(kernels::BinaryOp::kAdd, *x, *ln_out, *dx); }});
  cases.push_back(
      {"bias_grad sum_rows [2048,768]", 17, [=] { kernels::sum_rows.Get(kCpu)(*y3, *gb3, 0.0f); }});
  // Gradient accumulation into the residual stream (autograd adds branch gradients).
  cases.push_back({"grad_accumulate axpby [2048,256]", int(4 * L),
                   [=] { kernels::axpby.Get(kCpu)(1.0f, *x, 1.0f, *dx); }});
  // Interleaving check: an OpenBLAS product followed by a pool-parallel kernel (both threaded
  // when threads > 1), as in Linear + GELU. Compare with the two timed separately.
  auto fc_w = std::make_shared<Tensor>(Random({4 * C, C}, rng));
  cases.push_back({"interleaved c_fc_fwd matmul + gelu_fwd", 0, [=] {
                     kernels::matmul.Get(kCpu)(*x, *fc_w, *h, false, true, 1.0f, 0.0f);
                     kernels::unary.Get(kCpu)(kernels::UnaryOp::kGeluTanh, *h, 0.0f, *h_out);
                   }});
  // The gradient norm, measured every step (core/optimizer.cc's SquaredGradNormOnDevice): each
  // gradient squared into a scratch tensor and summed, here over all of them at once.
  auto sq = std::make_shared<Tensor>(Tensor::Empty({params}));
  auto sq_sum = std::make_shared<Tensor>(Tensor::Empty({}));
  cases.push_back({"grad_norm square 3.3M params", 1, [=] {
                     kernels::unary.Get(kCpu)(kernels::UnaryOp::kSquare, *pg, 0.0f, *sq);
                   }});
  cases.push_back(
      {"grad_norm sum 3.3M params", 1, [=] { kernels::sum_all.Get(kCpu)(*sq, *sq_sum); }});
  cases.push_back({"adamw 3.3M params", 1, [=] {
                     kernels::adamw.Get(kCpu)(
                         *p, *pg, *pm, *pv,
                         kernels::AdamWParams{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 10});
                   }});
  return cases;
}

}  // namespace
}  // namespace braid

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  using namespace braid;
  std::vector<int> thread_counts;
  for (absl::string_view s : absl::StrSplit(absl::GetFlag(FLAGS_threads), ',')) {
    thread_counts.push_back(std::stoi(std::string(s)));
  }
  const int reps = std::max(1, absl::GetFlag(FLAGS_reps));
  if (!bench::SetTimingClock(absl::GetFlag(FLAGS_clock))) {
    std::fprintf(stderr, "%s: --clock=%s is not a clock; use --clock=wall or --clock=cpu\n",
                 "gemm_bench", absl::GetFlag(FLAGS_clock).c_str());
    return 2;
  }
  const std::string only = absl::GetFlag(FLAGS_only);
  const std::string filter = absl::GetFlag(FLAGS_filter);
  std::mt19937 rng(1);
  std::printf("{\"bench\":\"config\",\"simd\":%s,\"reps\":%d}\n",
              cpu::SimdEnabled() ? "true" : "false", reps);
  for (int threads : thread_counts) {
    cpu::SetNumThreads(threads);
    Timing gemm_step{0, 0}, kernel_step{0, 0};
    if (only == "all" || only == "gemm") {
      for (const auto& c : GemmCases()) {
        if (std::string(c.name).find(filter) == std::string::npos) continue;
        Timing t = RunGemm(c, threads, reps, rng);
        gemm_step.median += c.calls_per_step * t.median;
        gemm_step.best += c.calls_per_step * t.best;
      }
    }
    if (only == "all" || only == "kernels") {
      // Fork-join cost of one ParallelFor over two chunks of no work (inline with 1 thread).
      Timing fj = Time(
          [] {
            for (int i = 0; i < 1000; ++i) cpu::ParallelFor(2, 1, [](int64_t, int64_t) {});
          },
          reps);
      std::printf(
          "{\"bench\":\"parallel_for_overhead\",\"threads\":%d,\"us\":%.3f,"
          "\"best_us\":%.3f}\n",
          threads, fj.median * 1e3, fj.best * 1e3);
      for (const auto& c : KernelCases(rng)) {
        if (c.name.find(filter) == std::string::npos) continue;
        Timing t = Time(c.fn, reps);
        kernel_step.median += c.calls_per_step * t.median;
        kernel_step.best += c.calls_per_step * t.best;
        std::printf(
            "{\"bench\":\"kernel\",\"name\":\"%s\",\"threads\":%d,\"ms\":%.4f,"
            "\"best_ms\":%.4f,\"calls_per_step\":%d}\n",
            c.name.c_str(), threads, t.median * 1e3, t.best * 1e3, c.calls_per_step);
        std::fflush(stdout);
      }
    }
    if (only == "all") {
      // Kernel time only (no autograd or allocation): 16 x 128 tokens per step.
      for (auto [label, g, k] : {std::make_tuple("median", gemm_step.median, kernel_step.median),
                                 std::make_tuple("best", gemm_step.best, kernel_step.best)}) {
        std::printf(
            "{\"bench\":\"step_estimate\",\"of\":\"%s\",\"threads\":%d,"
            "\"matmul_ms\":%.2f,\"other_kernels_ms\":%.2f,\"total_ms\":%.2f,"
            "\"tokens_per_s\":%.0f}\n",
            label, threads, g * 1e3, k * 1e3, (g + k) * 1e3, 2048.0 / (g + k));
      }
    }
  }
  return 0;
}
