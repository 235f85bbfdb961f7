#include "core/kernels.h"

#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace braid::kernels {

KernelSlot<CopyFn> copy("copy");
KernelSlot<FillFn> fill("fill");
KernelSlot<BinaryFn> binary("binary");
KernelSlot<UnaryFn> unary("unary");
KernelSlot<UnaryBackwardFn> unary_backward("unary_backward");
KernelSlot<AxpbyFn> axpby("axpby");
KernelSlot<SumAllFn> sum_all("sum_all");
KernelSlot<SumRowsFn> sum_rows("sum_rows");
KernelSlot<MatmulFn> matmul("matmul");
KernelSlot<LinearFwdFn> linear_forward("linear_forward");
KernelSlot<LinearGeluFwdFn> linear_gelu_forward("linear_gelu_forward");
KernelSlot<LinearGeluBwdFn> linear_gelu_backward("linear_gelu_backward");
KernelSlot<LayerNormFwdFn> layernorm_forward("layernorm_forward");
KernelSlot<LayerNormBwdFn> layernorm_backward("layernorm_backward");
KernelSlot<SoftmaxFwdFn> softmax_forward("softmax_forward");
KernelSlot<SoftmaxBwdFn> softmax_backward("softmax_backward");
KernelSlot<CrossEntropyFwdFn> cross_entropy_forward("cross_entropy_forward");
KernelSlot<CrossEntropyBwdFn> cross_entropy_backward("cross_entropy_backward");
KernelSlot<InverseCountNonnegativeFn> inverse_count_nonnegative("inverse_count_nonnegative");
KernelSlot<EmbeddingFwdFn> embedding_forward("embedding_forward");
KernelSlot<EmbeddingBwdFn> embedding_backward("embedding_backward");
KernelSlot<AttentionFwdFn> attention_forward("attention_forward");
KernelSlot<AttentionBwdFn> attention_backward("attention_backward");
KernelSlot<FlashAttentionFwdFn> flash_attention_forward("flash_attention_forward");
KernelSlot<FlashAttentionBwdFn> flash_attention_backward("flash_attention_backward");
KernelSlot<RmsNormFwdFn> rmsnorm_forward("rmsnorm_forward");
KernelSlot<RmsNormBwdFn> rmsnorm_backward("rmsnorm_backward");
KernelSlot<SwiGluFwdFn> swiglu_forward("swiglu_forward");
KernelSlot<SwiGluBwdFn> swiglu_backward("swiglu_backward");
KernelSlot<RopeFn> rope("rope");
KernelSlot<GqaFwdFn> gqa_forward("gqa_forward");
KernelSlot<GqaBwdFn> gqa_backward("gqa_backward");
KernelSlot<DropoutFn> dropout("dropout");
KernelSlot<AdamWFn> adamw("adamw");
KernelSlot<SgdFn> sgd("sgd");

// ---- Half fallbacks: up-cast, the f32 kernel, round once ------------------------------------
namespace {

bool IsHalf(DType t) { return t == DType::kBF16 || t == DType::kF16; }

// What an argument of the slot's signature becomes for the f32 kernel: tensors are held by
// value (a handle; a half one replaced by an f32 copy), anything else is copied as is.
template <typename T>
using Held = std::conditional_t<std::is_same_v<std::decay_t<T>, Tensor>, Tensor, std::decay_t<T>>;

// Records the half outputs to round back into after the f32 kernel ran.
struct Writeback {
  std::vector<std::pair<Tensor, Tensor>> pairs;  // (half destination, f32 scratch)
  Device device;
  bool have_device = false;
};

template <typename T>
Held<T> Convert(T&& arg, Writeback& wb) {
  if constexpr (std::is_same_v<std::decay_t<T>, Tensor>) {
    const Tensor& t = arg;
    if (!t.defined()) return t;
    if (!wb.have_device) {
      wb.device = t.device();
      wb.have_device = true;
    }
    if (!IsHalf(t.dtype())) return t;
    Tensor f = Tensor::Empty(t.shape(), DType::kF32, t.device());
    // Outputs too: an accumulating kernel (sum_rows with beta, embedding/layernorm backward)
    // adds into the f32 value of its destination and the result is rounded once.
    if (t.has_data()) copy.Get(t.device())(t, f);
    if constexpr (!std::is_const_v<std::remove_reference_t<T>>) wb.pairs.emplace_back(t, f);
    return f;
  } else {
    return arg;
  }
}

template <typename Fn>
struct HalfViaF32;

template <typename... Args>
struct HalfViaF32<void(Args...)> {
  template <KernelSlot<void(Args...)>* Slot>
  static void Run(Args... args) {
    Writeback wb;
    // Braced initialisation evaluates left to right, so the device is the first tensor's.
    std::tuple<Held<Args>...> held{Convert<Args>(std::forward<Args>(args), wb)...};
    BRAID_CHECK(wb.have_device) << "half fallback for '" << Slot->name() << "' got no tensor";
    auto* f32 = Slot->Get(wb.device, DType::kF32);
    std::apply([&](auto&... a) { f32(a...); }, held);
    auto* cp = copy.Get(wb.device);
    for (auto& [dst, f] : wb.pairs) cp(f, dst);
  }
};

template <auto* Slot>
void RegisterFallback(DeviceType type) {
  using Fn = typename std::remove_pointer_t<decltype(Slot)>::FnType;
  for (DType t : {DType::kBF16, DType::kF16}) {
    if (Slot->Find(type, t) == nullptr) {
      Slot->Register(type, t, &HalfViaF32<Fn>::template Run<Slot>);
    }
  }
}

}  // namespace

void RegisterHalfFallbacks(DeviceType type) {
  RegisterFallback<&binary>(type);
  RegisterFallback<&unary>(type);
  RegisterFallback<&unary_backward>(type);
  RegisterFallback<&axpby>(type);
  RegisterFallback<&sum_all>(type);
  RegisterFallback<&sum_rows>(type);
  RegisterFallback<&matmul>(type);
  RegisterFallback<&layernorm_forward>(type);
  RegisterFallback<&layernorm_backward>(type);
  RegisterFallback<&softmax_forward>(type);
  RegisterFallback<&softmax_backward>(type);
  RegisterFallback<&cross_entropy_forward>(type);
  RegisterFallback<&cross_entropy_backward>(type);
  RegisterFallback<&embedding_forward>(type);
  RegisterFallback<&embedding_backward>(type);
  RegisterFallback<&attention_forward>(type);
  RegisterFallback<&attention_backward>(type);
  RegisterFallback<&rmsnorm_forward>(type);
  RegisterFallback<&rmsnorm_backward>(type);
  RegisterFallback<&swiglu_forward>(type);
  RegisterFallback<&swiglu_backward>(type);
  RegisterFallback<&rope>(type);
  RegisterFallback<&gqa_forward>(type);
  RegisterFallback<&gqa_backward>(type);
  RegisterFallback<&dropout>(type);
}

}  // namespace braid::kernels
