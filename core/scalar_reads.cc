#include "core/scalar_reads.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/check.h"

namespace braid {
namespace {

// The elements of `tensors` (each floating; undefined ones have none, or one 0 when
// `undefined_is_zero`), concatenated, with at most one device-to-host transfer.
std::vector<float> Read(const std::vector<Tensor>& tensors, bool undefined_is_zero) {
  const Tensor* first = nullptr;  // the first one on a device other than the host's memory
  std::vector<int64_t> at(tensors.size(), 0);  // where each tensor's values start in the output
  int64_t total = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& s = tensors[i];
    at[i] = total;
    if (!s.defined()) {
      total += undefined_is_zero ? 1 : 0;
      continue;
    }
    BRAID_CHECK(IsFloating(s.dtype())) << "ReadValues: " << s.DescribeForError() << " is not floating";
    total += s.numel();
    if (s.device().type == DeviceType::kCPU) continue;
    if (first == nullptr) first = &s;
    BRAID_CHECK(s.device() == first->device())
        << "ReadValues: " << s.DescribeForError() << " and " << first->DescribeForError()
        << " are on different devices";
  }
  std::vector<float> out(size_t(total), 0.0f);
  // In host memory (any CPU device, offloaded state's included): read in place.
  int64_t on_device = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& s = tensors[i];
    if (!s.defined()) continue;
    if (s.device().type != DeviceType::kCPU) {
      on_device += s.numel();
      continue;
    }
    const std::vector<float> v = s.ToFloatVector();
    std::copy(v.begin(), v.end(), out.begin() + at[i]);
  }
  if (first == nullptr) return out;
  // The rest gathered on their device into one f32 buffer (device-to-device, converting copies,
  // which do not block), then read at once.
  Tensor packed = Tensor::Empty({on_device}, DType::kF32, first->device());
  int64_t next = 0;
  for (const Tensor& s : tensors) {
    if (!s.defined() || s.device().type == DeviceType::kCPU) continue;
    packed.FlatRange(next, s.numel()).CopyFrom(s.numel() == 1 ? s : s.FlatRange(0, s.numel()));
    next += s.numel();
  }
  const std::vector<float> values = packed.ToFloatVector();
  next = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& s = tensors[i];
    if (!s.defined() || s.device().type == DeviceType::kCPU) continue;
    std::copy(values.begin() + next, values.begin() + next + s.numel(), out.begin() + at[i]);
    next += s.numel();
  }
  return out;
}

}  // namespace

std::vector<float> ReadScalars(const std::vector<Tensor>& scalars) {
  for (const Tensor& s : scalars) {
    BRAID_CHECK(!s.defined() || (s.numel() == 1 && IsFloating(s.dtype())))
        << "ReadScalars: " << s.DescribeForError() << " is not a one-element floating tensor";
  }
  return Read(scalars, /*undefined_is_zero=*/true);
}

std::vector<float> ReadValues(const std::vector<Tensor>& tensors) {
  return Read(tensors, /*undefined_is_zero=*/false);
}

}  // namespace braid
