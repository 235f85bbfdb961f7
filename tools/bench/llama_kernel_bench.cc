// The kernel-sum limit of a llama-mini training step: every kernel one step of
// launcher/configs/llama-mini.pbtxt calls (4 layers, 4 query heads over 2 K/V heads, width 256,
// SwiGLU 768, context 128, micro-batch 16, byte vocabulary, untied head, AdamW), each timed alone
// on llama-mini-sized tensors and summed by its calls per step. No autograd, allocation or
// bookkeeping: the step time a trainer with no overhead would reach, so the trainer's measured
// step divided into it is the share of the limit Braid reaches (gemm_bench's step_estimate is the
// same for gpt-mini). One JSON object per line:
//   {"bench":"llama_kernel", ...}         ms per call (median and fastest of --reps) and calls;
//   {"bench":"llama_step_estimate", ...}  their sum over one step, matrix products apart.
//
//   bazel build //tools/bench:llama_kernel_bench && bazel-bin/tools/bench/llama_kernel_bench
//
// --clock=cpu times each kernel in the process's CPU time instead of elapsed time (see
// tools/bench/kernel_timing.h): on a machine other jobs share, the limit then moves far less
// between runs.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/thread_pool.h"
#include "core/kernels.h"
#include "core/tensor.h"
#include "tools/bench/kernel_timing.h"

ABSL_FLAG(int, threads, 1, "threads of the CPU backend (and OpenBLAS)");
ABSL_FLAG(std::string, clock, "wall",
          "wall (elapsed time) or cpu (the process's CPU time, steadier on a shared machine)");
ABSL_FLAG(int, reps, 15, "timed repetitions per kernel (the median and the fastest are reported)");

namespace braid {
namespace {

const Device kCpu = Device::CPU();

std::shared_ptr<Tensor> Random(const Shape& shape, std::mt19937& rng, float lo = -1.0f,
                               float hi = 1.0f) {
  auto t = std::make_shared<Tensor>(Tensor::Empty(shape));
  std::uniform_real_distribution<float> d(lo, hi);
  float* p = t->data<float>();
  for (int64_t i = 0; i < t->numel(); ++i) p[i] = d(rng);
  return t;
}
std::shared_ptr<Tensor> Empty(const Shape& shape) {
  return std::make_shared<Tensor>(Tensor::Zeros(shape));
}

using bench::Time;
using bench::Timing;

struct Case {
  std::string name;
  int calls_per_step;
  bool matmul;
  std::function<void()> fn;
};

constexpr int64_t B = 16, T = 128, C = 256, H = 4, HKV = 2, D = C / H, I = 768, V = 256, L = 4;
constexpr int64_t N = B * T;
constexpr int64_t kParams = 3279104;  // llama-mini's (LlamaConfig::Mini)

// A Linear(in, out) without bias runs three products per step: forward x·Wᵀ, backward dX = dY·W
// and dW = dYᵀ·X, all three into a new output (beta 0, as core/ops.cc's Linear calls them: the
// weight's gradient is zeroed each step, so dW becomes .grad itself, not added into it).
void AddLinear(std::vector<Case>& cases, const std::string& name, int64_t in, int64_t out,
               int calls, std::mt19937& rng) {
  auto x = Random({N, in}, rng), w = Random({out, in}, rng), y = Empty({N, out});
  auto dy = Random({N, out}, rng), dx = Empty({N, in}), dw = Empty({out, in});
  auto mm = kernels::matmul.Get(kCpu);
  cases.push_back({name + "_fwd_xWt", calls, true, [=] { mm(*x, *w, *y, false, true, 1.0f, 0.0f); }});
  cases.push_back({name + "_bwd_dYW", calls, true, [=] { mm(*dy, *w, *dx, false, false, 1.0f, 0.0f); }});
  cases.push_back({name + "_bwd_dYtX", calls, true, [=] { mm(*dy, *x, *dw, true, false, 1.0f, 0.0f); }});
}

std::vector<Case> Cases(std::mt19937& rng) {
  std::vector<Case> cases;
  const int l = int(L);
  AddLinear(cases, "q_proj", C, H * D, l, rng);
  AddLinear(cases, "k_proj", C, HKV * D, l, rng);
  AddLinear(cases, "v_proj", C, HKV * D, l, rng);
  AddLinear(cases, "o_proj", H * D, C, l, rng);
  AddLinear(cases, "gate_proj", C, I, l, rng);
  AddLinear(cases, "up_proj", C, I, l, rng);
  AddLinear(cases, "down_proj", I, C, l, rng);
  AddLinear(cases, "lm_head", C, V, 1, rng);

  // RMSNorm: two per layer and the final one.
  auto x = Random({N, C}, rng, -1.0f, 3.0f), w = Random({C}, rng), xn = Empty({N, C});
  auto rstd = Empty({N}), dx = Empty({N, C}), dw = Empty({C});
  kernels::rmsnorm_forward.Get(kCpu)(*x, *w, 1e-5f, *xn, *rstd);
  cases.push_back({"rmsnorm_fwd [2048,256]", 2 * l + 1, false,
                   [=] { kernels::rmsnorm_forward.Get(kCpu)(*x, *w, 1e-5f, *xn, *rstd); }});
  cases.push_back({"rmsnorm_bwd [2048,256]", 2 * l + 1, false, [=] {
                     kernels::rmsnorm_backward.Get(kCpu)(*xn, *x, *w, *rstd, *dx, *dw);
                   }});
  // Rotary embedding on q and on k, forward; backward is the same slot, inverse.
  auto q = Random({B, T, H, D}, rng), qr = Empty({B, T, H, D});
  auto k = Random({B, T, HKV, D}, rng), kr = Empty({B, T, HKV, D});
  kernels::RopeParams fwd, inv;
  inv.inverse = true;
  cases.push_back({"rope_fwd q [16,128,4,64]", l, false, [=] { kernels::rope.Get(kCpu)(*q, fwd, *qr); }});
  cases.push_back({"rope_fwd k [16,128,2,64]", l, false, [=] { kernels::rope.Get(kCpu)(*k, fwd, *kr); }});
  cases.push_back({"rope_bwd q [16,128,4,64]", l, false, [=] { kernels::rope.Get(kCpu)(*q, inv, *qr); }});
  cases.push_back({"rope_bwd k [16,128,2,64]", l, false, [=] { kernels::rope.Get(kCpu)(*k, inv, *kr); }});
  // Grouped-query attention.
  auto v = Random({B, T, HKV, D}, rng), ao = Empty({B, T, H, D}), att = Empty({B, H, T, T});
  auto dao = Random({B, T, H, D}, rng), dq = Empty({B, T, H, D});
  auto dk = Empty({B, T, HKV, D}), dv = Empty({B, T, HKV, D});
  kernels::gqa_forward.Get(kCpu)(*q, *k, *v, *ao, *att);
  cases.push_back({"gqa_fwd B16 T128 H4 Hkv2 D64", l, false,
                   [=] { kernels::gqa_forward.Get(kCpu)(*q, *k, *v, *ao, *att); }});
  cases.push_back({"gqa_bwd B16 T128 H4 Hkv2 D64", l, false, [=] {
                     kernels::gqa_backward.Get(kCpu)(*dao, *q, *k, *v, *att, *dq, *dk, *dv);
                   }});
  // SwiGLU: silu(gate) * up, [2048, 768].
  auto gate = Random({N, I}, rng, -3.0f, 3.0f), up = Random({N, I}, rng), act = Empty({N, I});
  auto dact = Random({N, I}, rng), dgate = Empty({N, I}), dup = Empty({N, I});
  cases.push_back({"swiglu_fwd [2048,768]", l, false,
                   [=] { kernels::swiglu_forward.Get(kCpu)(*gate, *up, *act); }});
  cases.push_back({"swiglu_bwd [2048,768]", l, false, [=] {
                     kernels::swiglu_backward.Get(kCpu)(*dact, *gate, *up, *dgate, *dup);
                   }});
  // Cross-entropy over the byte vocabulary.
  auto logits = Random({N, V}, rng, -4.0f, 4.0f);
  auto targets = std::make_shared<Tensor>(Tensor::Empty({N}, DType::kI32));
  for (int64_t i = 0; i < N; ++i) targets->data<int32_t>()[i] = int32_t(rng() % V);
  auto losses = Empty({N}), probs = Empty({N, V}), dlogits = Empty({N, V});
  auto dloss = std::make_shared<Tensor>(Tensor::Full({N}, 1.0f / float(N)));
  kernels::cross_entropy_forward.Get(kCpu)(*logits, *targets, *losses, *probs);
  cases.push_back({"cross_entropy_fwd [2048,256]", 1, false, [=] {
                     kernels::cross_entropy_forward.Get(kCpu)(*logits, *targets, *losses, *probs);
                   }});
  cases.push_back({"cross_entropy_bwd [2048,256]", 1, false, [=] {
                     kernels::cross_entropy_backward.Get(kCpu)(*probs, *targets, *dloss, *dlogits);
                   }});
  // The loss's mean and its gradient's spread (core/ops.cc's CrossEntropy): 1 / count of the
  // targets, the losses summed and scaled; backward scales the incoming gradient and adds it
  // to a zeroed [2048].
  auto inv_count = Empty({}), loss = Empty({}), g = Random({}, rng), gs = Empty({}), dl = Empty({N});
  cases.push_back({"loss_mean fwd+bwd [2048]", 1, false, [=] {
                     kernels::inverse_count_nonnegative.Get(kCpu)(*targets, *inv_count);
                     kernels::sum_all.Get(kCpu)(*losses, *loss);
                     kernels::binary.Get(kCpu)(kernels::BinaryOp::kMul, *loss, *inv_count, *loss);
                     kernels::binary.Get(kCpu)(kernels::BinaryOp::kMul, *g, *inv_count, *gs);
                     kernels::fill.Get(kCpu)(*dl, 0.0f);
                     kernels::binary.Get(kCpu)(kernels::BinaryOp::kAdd, *dl, *gs, *dl);
                   }});
  // The untied embedding: one lookup, one scatter-add into a gradient zeroed first.
  auto embed = Random({V, C}, rng), emb = Empty({N, C}), dembed = Empty({V, C});
  cases.push_back({"embedding_fwd [2048]x[256,256]", 1, false,
                   [=] { kernels::embedding_forward.Get(kCpu)(*embed, *targets, *emb); }});
  cases.push_back({"embedding_bwd [2048]x[256,256]", 1, false, [=] {
                     kernels::fill.Get(kCpu)(*dembed, 0.0f);
                     kernels::embedding_backward.Get(kCpu)(*x, *targets, *dembed);
                   }});
  // Two residual adds per layer; gradients of tensors read twice or more add up in autograd:
  // per layer the block input (norm and residual), the normed input (q, k, v: two adds), the
  // residual h (norm and residual) and the normed h (gate and up): five [2048, 256] adds.
  cases.push_back({"residual_add [2048,256]", 2 * l, false, [=] {
                     kernels::binary.Get(kCpu)(kernels::BinaryOp::kAdd, *x, *xn, *dx);
                   }});
  cases.push_back({"grad_accumulate axpby [2048,256]", 5 * l, false,
                   [=] { kernels::axpby.Get(kCpu)(1.0f, *x, 1.0f, *dx); }});
  auto p = Random({kParams}, rng), pg = Random({kParams}, rng);
  auto pm = Empty({kParams}), pv = Empty({kParams});
  // The gradient norm, measured every step (core/optimizer.cc's SquaredGradNormOnDevice): each
  // gradient squared into a scratch tensor and summed, here over all of them at once.
  auto sq = Empty({kParams}), sq_sum = Empty({});
  cases.push_back({"grad_norm square 3.28M params", 1, false, [=] {
                     kernels::unary.Get(kCpu)(kernels::UnaryOp::kSquare, *pg, 0.0f, *sq);
                   }});
  cases.push_back({"grad_norm sum 3.28M params", 1, false,
                   [=] { kernels::sum_all.Get(kCpu)(*sq, *sq_sum); }});
  cases.push_back({"adamw 3.28M params", 1, false, [=] {
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
  const int threads = std::max(1, absl::GetFlag(FLAGS_threads));
  const int reps = std::max(1, absl::GetFlag(FLAGS_reps));
  if (!bench::SetTimingClock(absl::GetFlag(FLAGS_clock))) {
    std::fprintf(stderr, "%s: --clock=%s is not a clock; use --clock=wall or --clock=cpu\n",
                 "llama_kernel_bench", absl::GetFlag(FLAGS_clock).c_str());
    return 2;
  }
  cpu::SetNumThreads(threads);
  std::mt19937 rng(1);
  Timing matmul{0, 0}, other{0, 0};
  for (const Case& c : Cases(rng)) {
    Timing t = Time(c.fn, reps);
    Timing& sum = c.matmul ? matmul : other;
    sum.median += c.calls_per_step * t.median;
    sum.best += c.calls_per_step * t.best;
    std::printf(
        "{\"bench\":\"llama_kernel\",\"name\":\"%s\",\"threads\":%d,\"ms\":%.4f,"
        "\"best_ms\":%.4f,\"calls_per_step\":%d}\n",
        c.name.c_str(), threads, t.median * 1e3, t.best * 1e3, c.calls_per_step);
    std::fflush(stdout);
  }
  for (auto [label, g, k] : {std::make_tuple("median", matmul.median, other.median),
                             std::make_tuple("best", matmul.best, other.best)}) {
    std::printf(
        "{\"bench\":\"llama_step_estimate\",\"of\":\"%s\",\"threads\":%d,\"matmul_ms\":%.2f,"
        "\"other_kernels_ms\":%.2f,\"total_ms\":%.2f,\"tokens_per_s\":%.0f}\n",
        label, threads, g * 1e3, k * 1e3, (g + k) * 1e3, double(N) / (g + k));
  }
  return 0;
}
