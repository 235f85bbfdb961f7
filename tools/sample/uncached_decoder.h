// The TokenDecoder (core/token_decoder.h) of a model that brings none: it keeps the ids it was
// given and runs the whole context through the model's Forward for every Step, so any model whose
// Forward maps ids [B, T] to logits [B, T, V] generates, at the cost of a pass over the prefix per
// token. Also the reference a model's cached decoder is tested against.
#ifndef BRAID_TOOLS_SAMPLE_UNCACHED_DECODER_H_
#define BRAID_TOOLS_SAMPLE_UNCACHED_DECODER_H_

#include <cstdint>
#include <memory>

#include "core/module.h"
#include "core/token_decoder.h"

namespace braid::tools {

// `capacity`: the model's context (ModelSpec::context). The logits' width is read from one
// Forward over token 0 here.
std::unique_ptr<TokenDecoder> UncachedDecoder(Module& model, int64_t capacity);

}  // namespace braid::tools

#endif  // BRAID_TOOLS_SAMPLE_UNCACHED_DECODER_H_
