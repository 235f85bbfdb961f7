#include "core/async_copy.h"

#include <map>
#include <mutex>
#include <utility>

#include "core/check.h"

namespace braid {
namespace {

std::mutex& Mu() {
  static auto* mu = new std::mutex;
  return *mu;
}
std::map<DeviceType, AsyncCopyFn>& Table() {
  static auto* table = new std::map<DeviceType, AsyncCopyFn>;
  return *table;
}

// A copy made before CopyAsync returned (both sides in host memory, or no backend enqueues).
class DoneCopy final : public InFlightCopy {
 public:
  void OrderBeforeCurrentStream() override {}
  bool Done() override { return true; }
  void Wait() override {}
};

}  // namespace

void RegisterAsyncCopy(DeviceType type, AsyncCopyFn fn) {
  std::lock_guard<std::mutex> lock(Mu());
  Table()[type] = std::move(fn);
}

std::unique_ptr<InFlightCopy> CopyAsync(const Tensor& src, const Tensor& dst, CopyQueue queue) {
  BRAID_CHECK(src.numel() == dst.numel() && src.dtype() == dst.dtype())
      << "asynchronous copy from " << src.DescribeForError() << " into " << dst.DescribeForError()
      << ": the element counts and dtypes must be equal";
  const bool src_dev = src.device().type != DeviceType::kCPU;
  const bool dst_dev = dst.device().type != DeviceType::kCPU;
  BRAID_CHECK(!(src_dev && dst_dev))
      << "asynchronous copy from " << src.DescribeForError() << " into " << dst.DescribeForError()
      << ": one side must be host memory (device-to-device copies are ordered on the device "
         "already: CopyFrom)";
  if (src_dev || dst_dev) {
    const DeviceType type = (src_dev ? src.device() : dst.device()).type;
    AsyncCopyFn fn;
    {
      std::lock_guard<std::mutex> lock(Mu());
      auto it = Table().find(type);
      if (it != Table().end()) fn = it->second;
    }
    if (fn) return fn(src, dst, queue);
  }
  Tensor(dst).CopyFrom(src);
  return std::make_unique<DoneCopy>();
}

}  // namespace braid
