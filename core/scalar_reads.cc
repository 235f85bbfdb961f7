#include "core/scalar_reads.h"

#include "core/check.h"

namespace braid {

std::vector<float> ReadScalars(const std::vector<Tensor>& scalars) {
  std::vector<float> out(scalars.size(), 0.0f);
  const Tensor* first = nullptr;
  for (const Tensor& s : scalars) {
    if (!s.defined()) continue;
    BRAID_CHECK(s.numel() == 1 && IsFloating(s.dtype()))
        << "ReadScalars: " << s.DescribeForError() << " is not a one-element floating tensor";
    if (first == nullptr) first = &s;
    BRAID_CHECK(s.device() == first->device())
        << "ReadScalars: " << s.DescribeForError() << " and " << first->DescribeForError()
        << " are on different devices";
  }
  if (first == nullptr) return out;
  if (first->device().type == DeviceType::kCPU) {
    for (size_t i = 0; i < scalars.size(); ++i) {
      if (scalars[i].defined()) out[i] = scalars[i].ToFloatVector()[0];
    }
    return out;
  }
  Tensor packed = Tensor::Empty({int64_t(scalars.size())}, DType::kF32, first->device());
  for (size_t i = 0; i < scalars.size(); ++i) {
    Tensor slot = packed.FlatRange(int64_t(i), 1);
    if (scalars[i].defined()) {
      slot.CopyFrom(scalars[i]);
    } else {
      slot.Fill(0.0f);
    }
  }
  return packed.ToFloatVector();
}

}  // namespace braid
