#include "core/kernels.h"

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
KernelSlot<LayerNormFwdFn> layernorm_forward("layernorm_forward");
KernelSlot<LayerNormBwdFn> layernorm_backward("layernorm_backward");
KernelSlot<SoftmaxFwdFn> softmax_forward("softmax_forward");
KernelSlot<SoftmaxBwdFn> softmax_backward("softmax_backward");
KernelSlot<CrossEntropyFwdFn> cross_entropy_forward("cross_entropy_forward");
KernelSlot<CrossEntropyBwdFn> cross_entropy_backward("cross_entropy_backward");
KernelSlot<EmbeddingFwdFn> embedding_forward("embedding_forward");
KernelSlot<EmbeddingBwdFn> embedding_backward("embedding_backward");
KernelSlot<AttentionFwdFn> attention_forward("attention_forward");
KernelSlot<AttentionBwdFn> attention_backward("attention_backward");
KernelSlot<AdamWFn> adamw("adamw");
KernelSlot<SgdFn> sgd("sgd");

}  // namespace braid::kernels
