#include "backends/cuda/async_copy.h"

#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "backends/cuda/runtime.h"
#include "core/check.h"

namespace braid::cuda {
namespace {

// Events reused across copies: creating and destroying one per copy would cost a driver call
// each (and on the fake, a destroy runs the device). Bounded by the copies in flight at once.
class EventPool {
 public:
  static EventPool& Of(DeviceRuntime& rt) {
    static auto* mu = new std::mutex;
    static auto* pools = new std::map<DeviceRuntime*, std::unique_ptr<EventPool>>;
    std::lock_guard<std::mutex> lock(*mu);
    auto& p = (*pools)[&rt];
    if (p == nullptr) p.reset(new EventPool(rt));
    return *p;
  }
  // An event whose last record the device has passed (a new one when none has): reusing one
  // still pending would make a later wait mean a different record than its caller meant.
  Event Take() {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < busy_.size(); ++i) {
      absl::StatusOr<bool> done = rt_.api().QueryEvent(busy_[i]);
      BRAID_CHECK_OK(done.status());
      if (!*done) continue;
      Event e = busy_[i];
      busy_.erase(busy_.begin() + long(i));
      return e;
    }
    absl::StatusOr<Event> e = rt_.api().CreateEvent();
    BRAID_CHECK_OK(e.status());
    return *e;
  }
  void Give(Event e) {
    std::lock_guard<std::mutex> lock(mu_);
    busy_.push_back(e);
  }

 private:
  explicit EventPool(DeviceRuntime& rt) : rt_(rt) {}
  DeviceRuntime& rt_;
  std::mutex mu_;
  std::vector<Event> busy_;  // given back, maybe still recorded ahead of the device
};

class CudaInFlightCopy final : public InFlightCopy {
 public:
  CudaInFlightCopy(DeviceRuntime& rt, Stream on, Event done)
      : rt_(rt), on_(on), done_(done) {}
  ~CudaInFlightCopy() override { EventPool::Of(rt_).Give(done_); }
  void OrderBeforeCurrentStream() override {
    Stream current = rt_.current_stream();
    if (current == on_ || ordered_on_ == current) return;  // stream order already says so
    BRAID_CHECK_OK(rt_.api().StreamWaitEvent(current, done_));
    ordered_on_ = current;
  }
  bool Done() override {
    absl::StatusOr<bool> done = rt_.api().QueryEvent(done_);
    BRAID_CHECK_OK(done.status());
    return *done;
  }
  void Wait() override { BRAID_CHECK_OK(rt_.api().SynchronizeEvent(done_)); }

 private:
  DeviceRuntime& rt_;
  const Stream on_;
  const Event done_;
  Stream ordered_on_{reinterpret_cast<void*>(-1)};  // no stream yet
};

}  // namespace

std::unique_ptr<InFlightCopy> CopyAsyncCuda(const Tensor& src, const Tensor& dst, CopyQueue queue) {
  const bool to_device = dst.device().type == DeviceType::kCUDA;
  BRAID_CHECK(to_device != (src.device().type == DeviceType::kCUDA))
      << "asynchronous copy from " << src.DescribeForError() << " into " << dst.DescribeForError()
      << ": exactly one side must be on a CUDA device";
  DeviceRuntime& rt = RuntimeOf(to_device ? dst.device() : src.device());
  EventPool& pool = EventPool::Of(rt);
  Stream current = rt.current_stream();
  Stream on = queue == CopyQueue::kCopy ? rt.copy_stream() : current;
  if (on != current) {
    Event ready = pool.Take();
    BRAID_CHECK_OK(rt.api().RecordEvent(ready, current));
    BRAID_CHECK_OK(rt.api().StreamWaitEvent(on, ready));
    pool.Give(ready);  // the wait holds the record it waits for
  }
  if (dst.nbytes() > 0) {
    BRAID_CHECK_OK(rt.api().MemcpyAsync(dst.raw_data(), src.raw_data(), dst.nbytes(),
                                        to_device ? CopyKind::kHostToDevice : CopyKind::kDeviceToHost,
                                        on));
  }
  Event done = pool.Take();
  BRAID_CHECK_OK(rt.api().RecordEvent(done, on));
  return std::make_unique<CudaInFlightCopy>(rt, on, done);
}

}  // namespace braid::cuda
