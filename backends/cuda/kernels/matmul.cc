// matmul for CUDA through cuBLASLt, following PlanMatmul (matmul_plan.h). f32 in, f32 out,
// CUBLAS_COMPUTE_32F (full f32 products, like the CPU backend; TF32 would be faster and is a
// later, opt-in choice). One cuBLASLt handle and a 32 MiB workspace per device, made on first
// use and kept for the process.
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <array>
#include <mutex>

#include "backends/cuda/kernels/launchers.h"
#include "backends/cuda/kernels/matmul_plan.h"
#include "backends/cuda/kernels/register_util.h"
#include "backends/cuda/launch.h"
#include "core/check.h"
#include "core/kernel_checks.h"
#include "core/kernels.h"

namespace braid::cuda {
namespace {

constexpr size_t kWorkspaceBytes = size_t(32) << 20;

struct LtDevice {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
};

LtDevice& Lt(int device) {
  static std::mutex mu;
  static std::array<LtDevice, kMaxCudaDevices> devices;
  BRAID_CHECK(device >= 0 && device < kMaxCudaDevices) << "cuda matmul: device " << device;
  std::lock_guard<std::mutex> lock(mu);
  LtDevice& d = devices[size_t(device)];
  if (d.handle == nullptr) {
    const cublasStatus_t st = cublasLtCreate(&d.handle);
    BRAID_CHECK(st == CUBLAS_STATUS_SUCCESS)
        << "cublasLtCreate failed on cuda:" << device << ": " << cublasGetStatusString(st);
    CheckCuda(cudaMalloc(&d.workspace, kWorkspaceBytes), "cuBLASLt workspace");
  }
  return d;
}

#define BRAID_CHECK_CUBLAS(expr)                                                     \
  do {                                                                               \
    const cublasStatus_t _st = (expr);                                               \
    BRAID_CHECK(_st == CUBLAS_STATUS_SUCCESS)                                        \
        << "cuda matmul: " #expr " failed: " << cublasGetStatusString(_st);         \
  } while (0)

cublasLtEpilogue_t ToLt(Epilogue e) {
  switch (e) {
    case Epilogue::kDefault: return CUBLASLT_EPILOGUE_DEFAULT;
    case Epilogue::kBias: return CUBLASLT_EPILOGUE_BIAS;
    case Epilogue::kGeluBias: return CUBLASLT_EPILOGUE_GELU_BIAS;
    case Epilogue::kGeluAuxBias: return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
  }
  return CUBLASLT_EPILOGUE_DEFAULT;
}

cublasLtMatrixLayout_t Layout(int64_t rows, int64_t cols, int64_t ld, int64_t batch,
                              int64_t stride) {
  cublasLtMatrixLayout_t l = nullptr;
  BRAID_CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&l, CUDA_R_32F, uint64_t(rows), uint64_t(cols), ld));
  if (batch > 1) {
    int32_t count = int32_t(batch);
    BRAID_CHECK_CUBLAS(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                                                        &count, sizeof(count)));
    BRAID_CHECK_CUBLAS(cublasLtMatrixLayoutSetAttribute(
        l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)));
  }
  return l;
}

// D = alpha op(A) op(B) + beta D with the plan's layouts (A = Braid's b, B = Braid's a).
void RunGemm(int device, const MatmulPlan& p, const float* a_lt, const float* b_lt, float* d,
             float alpha, float beta, cudaStream_t stream) {
  LtDevice& lt = Lt(device);
  cublasLtMatmulDesc_t desc = nullptr;
  BRAID_CHECK_CUBLAS(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = p.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t tb = p.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  BRAID_CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  BRAID_CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  const cublasLtEpilogue_t ep = ToLt(p.epilogue);
  BRAID_CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof(ep)));
  cublasLtMatrixLayout_t la = Layout(p.a_rows, p.a_cols, p.lda, p.batch, p.stride_a);
  cublasLtMatrixLayout_t lb = Layout(p.b_rows, p.b_cols, p.ldb, p.batch, p.stride_b);
  cublasLtMatrixLayout_t ld = Layout(p.m, p.n, p.ldd, p.batch, p.stride_d);
  cublasLtMatmulPreference_t pref = nullptr;
  BRAID_CHECK_CUBLAS(cublasLtMatmulPreferenceCreate(&pref));
  const size_t ws = kWorkspaceBytes;
  BRAID_CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  cublasLtMatmulHeuristicResult_t heur{};
  int found = 0;
  BRAID_CHECK_CUBLAS(
      cublasLtMatmulAlgoGetHeuristic(lt.handle, desc, la, lb, ld, ld, pref, 1, &heur, &found));
  BRAID_CHECK(found > 0) << "cuda matmul: cuBLASLt has no algorithm for " << p.ToString();
  BRAID_CHECK_CUBLAS(cublasLtMatmul(lt.handle, desc, &alpha, a_lt, la, b_lt, lb, &beta, d, ld, d,
                                    ld, &heur.algo, lt.workspace, ws, stream));
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(ld);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatmulDescDestroy(desc);
}

void Matmul(const Tensor& a, const Tensor& b, Tensor& out, bool trans_a, bool trans_b, float alpha,
            float beta) {
  CheckCudaTensors("matmul", {&a, &b, &out});
  const kernels::checks::MatmulDims dims =
      kernels::checks::Matmul("cuda", DType::kF32, a, b, out, trans_a, trans_b);
  MatmulCall call;
  call.batch = dims.batch;
  call.a_rows = dims.a_rows, call.a_cols = dims.a_cols;
  call.b_rows = dims.b_rows, call.b_cols = dims.b_cols;
  call.out_rows = out.size(-2), call.out_cols = out.size(-1);
  call.trans_a = trans_a, call.trans_b = trans_b, call.alpha = alpha, call.beta = beta;
  call.a_addr = reinterpret_cast<uintptr_t>(a.raw_data());
  call.b_addr = reinterpret_cast<uintptr_t>(b.raw_data());
  call.out_addr = reinterpret_cast<uintptr_t>(out.raw_data());
  absl::StatusOr<MatmulPlan> plan = PlanMatmul(call);
  BRAID_CHECK(plan.ok()) << plan.status();
  DeviceGuard guard(out.device().index);
  cudaStream_t s = KernelStream(out.device().index);
  float* po = out.data<float>();
  switch (plan->kind) {
    case MatmulPlan::Kind::kNothing:
      return;
    case MatmulPlan::Kind::kScaleOnly:
      // An empty sum: out = beta * out, and beta == 0 must not read out.
      CheckCuda(LaunchAxpby(beta, po, 0.0f, po, out.numel(), s), "matmul (k = 0)");
      return;
    case MatmulPlan::Kind::kGemm:
      break;
  }
  float* dst = po;
  if (plan->needs_aside) {
    CheckCuda(cudaMallocAsync(reinterpret_cast<void**>(&dst), out.nbytes(), s), "matmul aside");
    if (beta != 0.0f) {
      CheckCuda(cudaMemcpyAsync(dst, po, out.nbytes(), cudaMemcpyDeviceToDevice, s), "matmul aside");
    }
  }
  RunGemm(out.device().index, *plan, b.data<float>(), a.data<float>(), dst, alpha, beta, s);
  if (plan->needs_aside) {
    CheckCuda(cudaMemcpyAsync(po, dst, out.nbytes(), cudaMemcpyDeviceToDevice, s), "matmul aside");
    CheckCuda(cudaFreeAsync(dst, s), "matmul aside");
  }
}

}  // namespace

BRAID_REGISTER_KERNEL(kernels::matmul, DeviceType::kCUDA, &Matmul);

}  // namespace braid::cuda
