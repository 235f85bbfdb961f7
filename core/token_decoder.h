// TokenDecoder: a language model's inference one chunk of new tokens at a time, keeping what it
// needs of the tokens it has seen (a key/value cache), so that generating a token costs one pass
// over that token rather than over the whole prefix. A model supplies one through its
// ModelSpec::decoder (core/registry.h); a program that generates (tools/sample) needs no model by
// name. Inference only: no autograd through it.
#ifndef BRAID_CORE_TOKEN_DECODER_H_
#define BRAID_CORE_TOKEN_DECODER_H_

#include <cstdint>

#include "core/tensor.h"

namespace braid {

class TokenDecoder {
 public:
  virtual ~TokenDecoder() = default;
  // ids [B, t] i32: the t positions after the length() already seen (length() + t <=
  // capacity()). Returns their logits [B, t, vocab_rows()] and keeps them in the context. Equal
  // to the last t positions of the model's Forward over the whole context, up to f32 rounding.
  virtual Tensor Step(const Tensor& ids) = 0;
  virtual int64_t length() const = 0;    // positions seen since the last Clear
  virtual int64_t capacity() const = 0;  // the longest context (the model's block_size)
  virtual int64_t vocab_rows() const = 0;  // the logits' last dimension (padding rows included)
  virtual void Clear() = 0;              // forget every position: the next Step starts at 0
};

}  // namespace braid

#endif  // BRAID_CORE_TOKEN_DECODER_H_
