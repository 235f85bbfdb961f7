#include "core/scalar_reads.h"

#include "core/check.h"

namespace braid {

std::vector<float> ReadScalars(const std::vector<Tensor>& scalars) {
  std::vector<float> out(scalars.size(), 0.0f);
  const Tensor* first = nullptr;  // the first one on a device other than the host's memory
  for (const Tensor& s : scalars) {
    if (!s.defined()) continue;
    BRAID_CHECK(s.numel() == 1 && IsFloating(s.dtype()))
        << "ReadScalars: " << s.DescribeForError() << " is not a one-element floating tensor";
    if (s.device().type == DeviceType::kCPU) continue;
    if (first == nullptr) first = &s;
    BRAID_CHECK(s.device() == first->device())
        << "ReadScalars: " << s.DescribeForError() << " and " << first->DescribeForError()
        << " are on different devices";
  }
  // In host memory (any CPU device, offloaded state's included): read in place.
  for (size_t i = 0; i < scalars.size(); ++i) {
    if (scalars[i].defined() && scalars[i].device().type == DeviceType::kCPU) {
      out[i] = scalars[i].ToFloatVector()[0];
    }
  }
  if (first == nullptr) return out;
  std::vector<size_t> on_device;
  for (size_t i = 0; i < scalars.size(); ++i) {
    if (scalars[i].defined() && scalars[i].device().type != DeviceType::kCPU) on_device.push_back(i);
  }
  Tensor packed = Tensor::Empty({int64_t(on_device.size())}, DType::kF32, first->device());
  for (size_t j = 0; j < on_device.size(); ++j) packed.FlatRange(int64_t(j), 1).CopyFrom(scalars[on_device[j]]);
  const std::vector<float> values = packed.ToFloatVector();
  for (size_t j = 0; j < on_device.size(); ++j) out[on_device[j]] = values[j];
  return out;
}

}  // namespace braid
