// matmul, and Linear's forward with its bias (BIAS epilogue) or its bias and GELU (GELU_AUX_BIAS),
// for CUDA through cuBLASLt, following PlanMatmul (matmul_plan.h). f32, bf16 and f16 operands,
// f32 accumulation (CUBLAS_COMPUTE_32F, like the CPU backend; TF32 would be faster and is a
// later, opt-in choice).
//
// Per call only the pointers change: the descriptor, the layouts and the heuristic's algorithm
// are cached per LtPlanKey (lt_plan_cache.h), which includes each operand's alignment computed
// from its actual pointer and declared to the heuristic
// (CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_{A,B,C,D}_BYTES): views into ZeRO's flat buffers may be
// only 4 (f32) or 2 (half) bytes aligned, and an algorithm picked for 256-byte-aligned operands
// could then read out of bounds or fault. The algorithm's workspace and the temporary for an
// output aliasing an input are tensors from the device's allocator (the runtime's caching
// allocator), on the kernel stream. One cuBLASLt handle per device, kept for the process.
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <array>
#include <memory>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "backends/cuda/kernels/launchers.h"
#include "backends/cuda/kernels/lt_plan_cache.h"
#include "backends/cuda/kernels/matmul_plan.h"
#include "backends/cuda/kernels/register_util.h"
#include "backends/cuda/launch.h"
#include "core/check.h"
#include "core/kernel_checks.h"
#include "core/kernels.h"

namespace braid::cuda {
namespace {

// The most workspace the heuristic may choose an algorithm for (cuBLAS's own default on Hopper).
constexpr size_t kMaxWorkspaceBytes = size_t(32) << 20;
// The alignment the GELU epilogue's aux buffer (the pre-activation) must have to be fused.
constexpr uintptr_t kAuxAlignment = 256;

cublasLtHandle_t Handle(int device) {
  static std::mutex mu;
  static std::array<cublasLtHandle_t, kMaxCudaDevices> handles{};
  BRAID_CHECK(device >= 0 && device < kMaxCudaDevices) << "cuda matmul: device " << device;
  std::lock_guard<std::mutex> lock(mu);
  cublasLtHandle_t& h = handles[size_t(device)];
  if (h == nullptr) {
    const cublasStatus_t st = cublasLtCreate(&h);
    BRAID_CHECK(st == CUBLAS_STATUS_SUCCESS)
        << "cublasLtCreate failed on cuda:" << device << ": " << cublasGetStatusString(st);
  }
  return h;
}

cublasLtEpilogue_t ToLt(Epilogue e) {
  switch (e) {
    case Epilogue::kDefault: return CUBLASLT_EPILOGUE_DEFAULT;
    case Epilogue::kBias: return CUBLASLT_EPILOGUE_BIAS;
    case Epilogue::kGeluBias: return CUBLASLT_EPILOGUE_GELU_BIAS;
    case Epilogue::kGeluAuxBias: return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
  }
  return CUBLASLT_EPILOGUE_DEFAULT;
}

cudaDataType_t ToCuda(LtDType t) {
  switch (t) {
    case LtDType::kF32: return CUDA_R_32F;
    case LtDType::kBF16: return CUDA_R_16BF;
    case LtDType::kF16: return CUDA_R_16F;
  }
  return CUDA_R_32F;
}

template <DType kDType>
constexpr LtDType LtOf() {
  return kDType == DType::kBF16 ? LtDType::kBF16
                                : (kDType == DType::kF16 ? LtDType::kF16 : LtDType::kF32);
}

// A built plan: what cublasLtMatmul needs besides the pointers and scalars.
struct LtPlan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr;
  cublasLtMatmulAlgo_t algo{};
  size_t workspace = 0;
  // The bias pointer is an attribute of the (shared) descriptor: set and used under this lock.
  mutable std::mutex mu;
  ~LtPlan() {
    if (ld != nullptr) cublasLtMatrixLayoutDestroy(ld);
    if (lb != nullptr) cublasLtMatrixLayoutDestroy(lb);
    if (la != nullptr) cublasLtMatrixLayoutDestroy(la);
    if (desc != nullptr) cublasLtMatmulDescDestroy(desc);
  }
};

#define BRAID_LT_TRY(expr)                                                                  \
  do {                                                                                      \
    const cublasStatus_t _st = (expr);                                                      \
    if (_st != CUBLAS_STATUS_SUCCESS) {                                                     \
      return absl::InternalError(absl::StrCat("cuda matmul: " #expr " failed: ",           \
                                              cublasGetStatusString(_st), " for ",          \
                                              key.ToString()));                             \
    }                                                                                       \
  } while (0)

absl::StatusOr<cublasLtMatrixLayout_t> MakeLayout(const LtPlanKey& key, int64_t rows,
                                                  int64_t cols, int64_t ld, int64_t stride) {
  cublasLtMatrixLayout_t l = nullptr;
  BRAID_LT_TRY(cublasLtMatrixLayoutCreate(&l, ToCuda(key.dtype), uint64_t(rows), uint64_t(cols), ld));
  if (key.batch > 1) {
    const int32_t count = int32_t(key.batch);
    BRAID_LT_TRY(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count,
                                                  sizeof(count)));
    BRAID_LT_TRY(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                  &stride, sizeof(stride)));
  }
  return l;
}

absl::StatusOr<std::unique_ptr<LtPlan>> BuildPlan(const LtPlanKey& key) {
  auto plan = std::make_unique<LtPlan>();
  BRAID_LT_TRY(cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = key.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t tb = key.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  BRAID_LT_TRY(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  BRAID_LT_TRY(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  const cublasLtEpilogue_t ep = ToLt(key.epilogue);
  BRAID_LT_TRY(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof(ep)));
  // The heuristic reads the bias and aux pointers' values (never what they point to) for their
  // alignment: give it a stand-in with the alignment the key declares; each call sets the real
  // pointers. The aux buffer (GELU's pre-activation, D's shape and type) has D's leading
  // dimension, and is 256-byte aligned (LinearGeluForward runs unfused otherwise).
  if (key.epilogue != Epilogue::kDefault) {
    const void* bias_stand_in = reinterpret_cast<const void*>(uintptr_t(key.align_bias));
    BRAID_LT_TRY(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                &bias_stand_in, sizeof(bias_stand_in)));
  }
  if (key.epilogue == Epilogue::kGeluAuxBias) {
    const void* aux_stand_in = reinterpret_cast<const void*>(uintptr_t(kAuxAlignment));
    BRAID_LT_TRY(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                                &aux_stand_in, sizeof(aux_stand_in)));
    const int64_t aux_ld = key.ldd;
    BRAID_LT_TRY(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD,
                                                &aux_ld, sizeof(aux_ld)));
  }
  // Stored shapes: op(A) is [m, k], op(B) is [k, n], D is [m, n] (column-major).
  absl::StatusOr<cublasLtMatrixLayout_t> la =
      MakeLayout(key, key.trans_a ? key.k : key.m, key.trans_a ? key.m : key.k, key.lda, key.stride_a);
  if (!la.ok()) return la.status();
  plan->la = *la;
  absl::StatusOr<cublasLtMatrixLayout_t> lb =
      MakeLayout(key, key.trans_b ? key.n : key.k, key.trans_b ? key.k : key.n, key.ldb, key.stride_b);
  if (!lb.ok()) return lb.status();
  plan->lb = *lb;
  absl::StatusOr<cublasLtMatrixLayout_t> ld = MakeLayout(key, key.m, key.n, key.ldd, key.stride_d);
  if (!ld.ok()) return ld.status();
  plan->ld = *ld;

  cublasLtMatmulPreference_t pref = nullptr;
  BRAID_LT_TRY(cublasLtMatmulPreferenceCreate(&pref));
  std::unique_ptr<std::remove_pointer_t<cublasLtMatmulPreference_t>,
                  decltype(&cublasLtMatmulPreferenceDestroy)>
      pref_owner(pref, &cublasLtMatmulPreferenceDestroy);
  const size_t ws = kMaxWorkspaceBytes;
  BRAID_LT_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                    &ws, sizeof(ws)));
  const uint32_t align[4] = {key.align_a, key.align_b, key.align_d, key.align_d};  // C is D
  const cublasLtMatmulPreferenceAttributes_t align_attr[4] = {
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
  for (int i = 0; i < 4; ++i) {
    BRAID_LT_TRY(cublasLtMatmulPreferenceSetAttribute(pref, align_attr[i], &align[i], sizeof(uint32_t)));
  }
  cublasLtMatmulHeuristicResult_t heur{};
  int found = 0;
  BRAID_LT_TRY(cublasLtMatmulAlgoGetHeuristic(Handle(key.device), plan->desc, plan->la, plan->lb,
                                              plan->ld, plan->ld, pref, 1, &heur, &found));
  if (found == 0) {
    return absl::NotFoundError(
        absl::StrCat("cuda matmul: cuBLASLt has no algorithm for ", key.ToString()));
  }
  plan->algo = heur.algo;
  plan->workspace = heur.workspaceSize;
  return plan;
}

LtPlanCache<LtPlan>& Plans() {
  // Process lifetime, never destroyed; bounded (kDefaultLtPlanCacheCapacity, least recently used
  // evicted: its descriptors destroyed).
  static auto* cache = new LtPlanCache<LtPlan>(&BuildPlan);
  return *cache;
}

// D = alpha op(A) op(B) + beta D (+ bias) with the plan's layouts (A = Braid's b, B = Braid's a).
// `aux`: GELU_AUX_BIAS's pre-activation output (D's shape and leading dimension), else null.
void RunGemm(const Device& device, LtDType dt, int64_t elem_size, const MatmulPlan& p,
             const void* a_lt, const void* b_lt, void* d, const void* bias, float alpha,
             float beta, cudaStream_t stream, void* aux = nullptr) {
  const LtPlanKey key =
      MakeLtPlanKey(device.index, dt, p, reinterpret_cast<uintptr_t>(a_lt),
                    reinterpret_cast<uintptr_t>(b_lt), reinterpret_cast<uintptr_t>(d),
                    reinterpret_cast<uintptr_t>(bias), elem_size);
  // Held for the call: another thread's miss may evict the plan meanwhile.
  absl::StatusOr<std::shared_ptr<const LtPlan>> plan = Plans().Get(key);
  BRAID_CHECK(plan.ok()) << plan.status();
  const LtPlan& lt = **plan;
  Tensor workspace;  // freed on return: the allocator reuses it in the kernel stream's order
  if (lt.workspace > 0) {
    workspace = Tensor::Empty({int64_t((lt.workspace + 3) / 4)}, DType::kF32, device);
  }
  std::lock_guard<std::mutex> lock(lt.mu);
  if (bias != nullptr) {
    const cublasStatus_t st = cublasLtMatmulDescSetAttribute(
        lt.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias));
    BRAID_CHECK(st == CUBLAS_STATUS_SUCCESS)
        << "cuda matmul: setting the bias pointer failed: " << cublasGetStatusString(st);
  }
  if (aux != nullptr) {
    const cublasStatus_t st = cublasLtMatmulDescSetAttribute(
        lt.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof(aux));
    BRAID_CHECK(st == CUBLAS_STATUS_SUCCESS)
        << "cuda matmul: setting the aux pointer failed: " << cublasGetStatusString(st);
  }
  const cublasStatus_t st =
      cublasLtMatmul(Handle(device.index), lt.desc, &alpha, a_lt, lt.la, b_lt, lt.lb, &beta, d,
                     lt.ld, d, lt.ld, &lt.algo, lt.workspace > 0 ? workspace.raw_data() : nullptr,
                     lt.workspace, stream);
  BRAID_CHECK(st == CUBLAS_STATUS_SUCCESS)
      << "cuda matmul: cublasLtMatmul failed: " << cublasGetStatusString(st) << " for "
      << key.ToString();
}

MatmulCall CallOf(const kernels::checks::MatmulDims& dims, const Tensor& a, const Tensor& b,
                  const Tensor& out, bool trans_a, bool trans_b, float alpha, float beta) {
  MatmulCall call;
  call.batch = dims.batch;
  call.a_rows = dims.a_rows, call.a_cols = dims.a_cols;
  call.b_rows = dims.b_rows, call.b_cols = dims.b_cols;
  call.out_rows = out.size(-2), call.out_cols = out.size(-1);
  call.trans_a = trans_a, call.trans_b = trans_b, call.alpha = alpha, call.beta = beta;
  call.a_addr = reinterpret_cast<uintptr_t>(a.raw_data());
  call.b_addr = reinterpret_cast<uintptr_t>(b.raw_data());
  call.out_addr = reinterpret_cast<uintptr_t>(out.raw_data());
  call.elem_size = int64_t(SizeOf(out.dtype()));
  return call;
}

// out = beta * out for an empty sum (k == 0); beta == 0 must not read out.
void ScaleOnly(Tensor& out, float beta, cudaStream_t s) {
  if (beta == 1.0f) return;
  if (beta == 0.0f) {
    CheckCuda(LaunchFill(out.raw_data(), out.numel(), int(SizeOf(out.dtype())), 0, s),
              "matmul (k = 0)");
    return;
  }
  kernels::unary.Get(out.device(), out.dtype())(kernels::UnaryOp::kScale, out, beta, out);
}

template <DType kDType>
void Matmul(const Tensor& a, const Tensor& b, Tensor& out, bool trans_a, bool trans_b, float alpha,
            float beta) {
  CheckCudaTensors("matmul", {&a, &b, &out});
  const kernels::checks::MatmulDims dims =
      kernels::checks::Matmul("cuda", kDType, a, b, out, trans_a, trans_b);
  absl::StatusOr<MatmulPlan> plan =
      PlanMatmul(CallOf(dims, a, b, out, trans_a, trans_b, alpha, beta));
  BRAID_CHECK(plan.ok()) << plan.status();
  DeviceGuard guard(out.device().index);
  cudaStream_t s = KernelStream(out.device().index);
  switch (plan->kind) {
    case MatmulPlan::Kind::kNothing:
      return;
    case MatmulPlan::Kind::kScaleOnly:
      ScaleOnly(out, beta, s);
      return;
    case MatmulPlan::Kind::kGemm:
      break;
  }
  const int64_t es = int64_t(SizeOf(kDType));
  if (!plan->needs_aside) {
    RunGemm(out.device(), LtOf<kDType>(), es, *plan, b.raw_data(), a.raw_data(), out.raw_data(),
            nullptr, alpha, beta, s);
    return;
  }
  Tensor aside = Tensor::Empty(out.shape(), kDType, out.device());
  if (beta != 0.0f) {
    CheckCuda(cudaMemcpyAsync(aside.raw_data(), out.raw_data(), out.nbytes(),
                              cudaMemcpyDeviceToDevice, s),
              "matmul aside");
  }
  RunGemm(out.device(), LtOf<kDType>(), es, *plan, b.raw_data(), a.raw_data(), aside.raw_data(),
          nullptr, alpha, beta, s);
  CheckCuda(cudaMemcpyAsync(out.raw_data(), aside.raw_data(), out.nbytes(),
                            cudaMemcpyDeviceToDevice, s),
            "matmul aside");
}

// Linear's forward, out = x weightᵀ + bias, with the bias added by cuBLASLt's BIAS epilogue
// (one value per output column, as the plan's header explains) instead of a second kernel.
template <DType kDType>
void LinearForward(const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor& out) {
  CheckCudaTensors("linear_forward", {&x, &weight, &bias, &out});
  const kernels::checks::MatmulDims dims =
      kernels::checks::Matmul("cuda", kDType, x, weight, out, false, true);
  BRAID_CHECK(bias.dtype() == kDType && bias.numel() == out.size(-1))
      << "cuda kernel 'linear_forward': bias " << bias.DescribeForError() << " does not fit "
      << out.DescribeForError();
  MatmulCall call = CallOf(dims, x, weight, out, false, true, 1.0f, 0.0f);
  call.bias = true;
  absl::StatusOr<MatmulPlan> plan = PlanMatmul(call);
  BRAID_CHECK(plan.ok()) << plan.status();
  if (plan->kind != MatmulPlan::Kind::kGemm || plan->needs_aside || plan->unfused_bias) {
    // Nothing to fuse into (an empty sum, an aliased output): the two-kernel way.
    kernels::matmul.Get(out.device(), kDType)(x, weight, out, false, true, 1.0f, 0.0f);
    kernels::binary.Get(out.device(), kDType)(kernels::BinaryOp::kAdd, out, bias, out);
    return;
  }
  DeviceGuard guard(out.device().index);
  RunGemm(out.device(), LtOf<kDType>(), int64_t(SizeOf(kDType)), *plan, weight.raw_data(),
          x.raw_data(), out.raw_data(), bias.raw_data(), 1.0f, 0.0f,
          KernelStream(out.device().index));
}

// Linear then tanh-GELU: pre = x weightᵀ + bias, out = gelu_tanh(pre), with cuBLASLt's
// GELU_AUX_BIAS epilogue: one GEMM adds the bias, stores pre (the aux output, kept by the op for
// the backward's GELU derivative) and writes GELU(pre) to out. cuBLASLt's GELU is the tanh
// approximation, GPT-2's; kernels_gpu_test compares it with the CPU's GeluTanh. Where the
// epilogue cannot take the call (an aux leading dimension not a multiple of 8, an output
// aliasing an input, an empty sum, a pre not 256-byte aligned) it is the bias epilogue into pre,
// then the GELU kernel.
template <DType kDType>
void LinearGeluForward(const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor& pre,
                       Tensor& out) {
  CheckCudaTensors("linear_gelu_forward", {&x, &weight, &bias, &pre, &out});
  const kernels::checks::MatmulDims dims =
      kernels::checks::Matmul("cuda", kDType, x, weight, out, false, true);
  BRAID_CHECK(bias.dtype() == kDType && bias.numel() == out.size(-1))
      << "cuda kernel 'linear_gelu_forward': bias " << bias.DescribeForError()
      << " does not fit " << out.DescribeForError();
  BRAID_CHECK(pre.dtype() == kDType && pre.shape() == out.shape())
      << "cuda kernel 'linear_gelu_forward': pre " << pre.DescribeForError()
      << " must have the output's shape and dtype, " << out.DescribeForError();
  MatmulCall call = CallOf(dims, x, weight, out, false, true, 1.0f, 0.0f);
  call.bias = call.gelu = call.save_pre_gelu = true;
  absl::StatusOr<MatmulPlan> plan = PlanMatmul(call);
  BRAID_CHECK(plan.ok()) << plan.status();
  // pre is written by the GEMM too: it must not alias the inputs either.
  MatmulCall pre_call = call;
  pre_call.out_addr = reinterpret_cast<uintptr_t>(pre.raw_data());
  absl::StatusOr<MatmulPlan> pre_plan = PlanMatmul(pre_call);
  BRAID_CHECK(pre_plan.ok()) << pre_plan.status();
  const bool aux_aligned = reinterpret_cast<uintptr_t>(pre.raw_data()) % kAuxAlignment == 0;
  if (plan->kind != MatmulPlan::Kind::kGemm || plan->needs_aside || pre_plan->needs_aside ||
      plan->unfused_gelu || !aux_aligned) {
    kernels::linear_forward.Get(out.device(), kDType)(x, weight, bias, pre);
    kernels::unary.Get(out.device(), kDType)(kernels::UnaryOp::kGeluTanh, pre, 0.0f, out);
    return;
  }
  BRAID_CHECK(plan->epilogue == Epilogue::kGeluAuxBias) << plan->ToString();
  DeviceGuard guard(out.device().index);
  RunGemm(out.device(), LtOf<kDType>(), int64_t(SizeOf(kDType)), *plan, weight.raw_data(),
          x.raw_data(), out.raw_data(), bias.raw_data(), 1.0f, 0.0f,
          KernelStream(out.device().index), pre.raw_data());
}

// The backward of LinearGeluTanh's GELU: dpre = dout * gelu_tanh'(pre) and the bias gradient
// (dpre's column sums) in one pass over dout and pre, no temporary beyond dpre. Not cuBLASLt's
// DGELU_BGRAD epilogue: that fuses into the GEMM producing dout (the next Linear's dX), across
// two ops; this kernel is the op's own part of it, with sum_rows' bits (launchers.h).
template <DType kDType>
void LinearGeluBackward(const Tensor& pre, const Tensor& dout, Tensor& dpre, Tensor& dbias) {
  CheckCudaTensors("linear_gelu_backward", {&pre, &dout, &dpre, &dbias});
  BRAID_CHECK(pre.ndim() == 2 && pre.dtype() == kDType && dout.shape() == pre.shape() &&
              dout.dtype() == kDType && dpre.shape() == pre.shape() && dpre.dtype() == kDType &&
              dbias.dtype() == kDType && dbias.numel() == pre.size(1))
      << "cuda kernel 'linear_gelu_backward': pre " << pre.DescribeForError() << ", dout "
      << dout.DescribeForError() << ", dpre " << dpre.DescribeForError() << " must be one "
      << DTypeName(kDType) << " [rows, cols] shape and dbias " << dbias.DescribeForError()
      << " [cols]";
  const int fmt = kDType == DType::kBF16 ? 1 : (kDType == DType::kF16 ? 2 : 0);  // math::Format
  DeviceGuard guard(pre.device().index);
  CheckCuda(LaunchGeluBiasGrad(fmt, pre.raw_data(), dout.raw_data(), pre.size(0), pre.size(1),
                               dpre.raw_data(), dbias.raw_data(), KernelStream(pre.device().index)),
            "linear_gelu_backward");
}

}  // namespace

BRAID_REGISTER_KERNEL(kernels::matmul, DeviceType::kCUDA, &Matmul<DType::kF32>);
BRAID_REGISTER_KERNEL_FOR_DTYPE(kernels::matmul, DeviceType::kCUDA, DType::kBF16,
                                &Matmul<DType::kBF16>);
BRAID_REGISTER_KERNEL_FOR_DTYPE(kernels::matmul, DeviceType::kCUDA, DType::kF16,
                                &Matmul<DType::kF16>);
BRAID_REGISTER_KERNEL(kernels::linear_forward, DeviceType::kCUDA, &LinearForward<DType::kF32>);
BRAID_REGISTER_KERNEL_FOR_DTYPE(kernels::linear_forward, DeviceType::kCUDA, DType::kBF16,
                                &LinearForward<DType::kBF16>);
BRAID_REGISTER_KERNEL_FOR_DTYPE(kernels::linear_forward, DeviceType::kCUDA, DType::kF16,
                                &LinearForward<DType::kF16>);

BRAID_REGISTER_KERNEL(kernels::linear_gelu_forward, DeviceType::kCUDA,
                      &LinearGeluForward<DType::kF32>);
BRAID_REGISTER_KERNEL_FOR_DTYPE(kernels::linear_gelu_forward, DeviceType::kCUDA, DType::kBF16,
                                &LinearGeluForward<DType::kBF16>);
BRAID_REGISTER_KERNEL_FOR_DTYPE(kernels::linear_gelu_forward, DeviceType::kCUDA, DType::kF16,
                                &LinearGeluForward<DType::kF16>);

BRAID_REGISTER_KERNEL(kernels::linear_gelu_backward, DeviceType::kCUDA,
                      &LinearGeluBackward<DType::kF32>);
BRAID_REGISTER_KERNEL_FOR_DTYPE(kernels::linear_gelu_backward, DeviceType::kCUDA, DType::kBF16,
                                &LinearGeluBackward<DType::kBF16>);
BRAID_REGISTER_KERNEL_FOR_DTYPE(kernels::linear_gelu_backward, DeviceType::kCUDA, DType::kF16,
                                &LinearGeluBackward<DType::kF16>);

}  // namespace braid::cuda
