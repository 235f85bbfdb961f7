// Deferred initialisation: a model describes each parameter's initial values as a function that
// can produce any range of them, so a strategy that keeps only part of the model (ZeRO-3) never
// holds the rest, yet each rank's part has exactly the values a full initialisation with the same
// seed would give.
//
// Models create parameters through MakeParameter. Normally that fills them at once. While a
// DeferredInitScope is active on the thread (the training program opens one when the strategy's
// wants_deferred_init() is true), the parameters get no memory (their storage is released) and
// keep their initializer; the strategy then asks for the values it keeps (InitialValues) or
// gives a parameter its memory and values whole (Materialize).
#ifndef BRAID_CORE_DEFERRED_INIT_H_
#define BRAID_CORE_DEFERRED_INIT_H_

#include <cstdint>
#include <functional>

#include "core/device.h"
#include "core/tensor.h"

namespace braid {

// Writes elements [begin, end) of the initial values (flat, row-major) to out[0 .. end-begin).
using Initializer = std::function<void(float* out, int64_t begin, int64_t end)>;

class DeferredInitScope {
 public:
  DeferredInitScope();
  ~DeferredInitScope();
  DeferredInitScope(const DeferredInitScope&) = delete;
  DeferredInitScope& operator=(const DeferredInitScope&) = delete;

 private:
  bool previous_;
};
bool InDeferredInit();

// An f32 parameter with initial values `init`: filled now, or deferred inside a scope.
Tensor MakeParameter(const Shape& shape, Initializer init, Device device);
// The same with a constant (biases, LayerNorm), which needs no state to replay.
Tensor MakeConstantParameter(const Shape& shape, float value, Device device);

// True while `t` has an initializer and no memory.
bool IsDeferred(const Tensor& t);
// Elements [begin, end) of a deferred tensor's initial values, into out (host memory).
void InitialValues(const Tensor& t, int64_t begin, int64_t end, float* out);
// Gives a deferred tensor its memory and its initial values (a no-op for any other tensor).
void Materialize(const Tensor& t);

}  // namespace braid

#endif  // BRAID_CORE_DEFERRED_INIT_H_
