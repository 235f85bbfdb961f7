#include "backends/cuda/runtime.h"

#include <map>
#include <mutex>
#include <unordered_map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/allocator.h"
#include "core/check.h"

namespace braid::cuda {
namespace {

// The calling thread's current stream per runtime; absent means the compute stream.
thread_local std::unordered_map<const DeviceRuntime*, Stream> current_streams;

struct Table {
  std::mutex mu;
  DeviceApiFactory factory;
  std::function<void(DeviceRuntime&)> created_hook;
  std::map<int, std::unique_ptr<DeviceRuntime>> runtimes;
  std::map<int, absl::Status> failures;
};

Table& GetTable() {
  static Table* t = new Table;  // never destroyed: tensors may outlive static teardown
  return *t;
}

}  // namespace

absl::StatusOr<std::unique_ptr<DeviceRuntime>> DeviceRuntime::Create(
    std::unique_ptr<DeviceApi> api) {
  BRAID_ASSIGN_OR_RETURN(Stream compute, api->CreateStream(StreamKind::kBlocking));
  BRAID_ASSIGN_OR_RETURN(Stream copy, api->CreateStream(StreamKind::kNonBlocking));
  return std::unique_ptr<DeviceRuntime>(new DeviceRuntime(std::move(api), compute, copy));
}

DeviceRuntime::DeviceRuntime(std::unique_ptr<DeviceApi> api, Stream compute, Stream copy)
    : api_(std::move(api)), compute_(compute), copy_(copy),
      pinned_(std::make_unique<PinnedHostPool>(api_.get())) {}

DeviceRuntime::~DeviceRuntime() {
  pinned_.reset();
  (void)api_->DestroyStream(copy_);
  (void)api_->DestroyStream(compute_);
}

Stream DeviceRuntime::current_stream() const {
  auto it = current_streams.find(this);
  return it == current_streams.end() ? compute_ : it->second;
}

CachingAllocator& DeviceRuntime::allocator() {
  // install.h registers the factory that makes every cuda:N allocator a CachingAllocator over
  // this runtime; anything else there is a wiring bug.
  auto* a = dynamic_cast<CachingAllocator*>(GetAllocator(device()));
  BRAID_CHECK(a != nullptr) << "the allocator of " << device()
                            << " is not the CUDA caching allocator: call InstallCudaBackend";
  return *a;
}

CurrentStreamGuard::CurrentStreamGuard(DeviceRuntime& runtime, Stream stream)
    : runtime_(&runtime) {
  auto it = current_streams.find(runtime_);
  had_previous_ = it != current_streams.end();
  if (had_previous_) previous_ = it->second;
  current_streams[runtime_] = stream;
}

CurrentStreamGuard::~CurrentStreamGuard() {
  if (had_previous_) {
    current_streams[runtime_] = previous_;
  } else {
    current_streams.erase(runtime_);
  }
}

void SetDeviceApiFactory(DeviceApiFactory factory) {
  Table& t = GetTable();
  std::lock_guard<std::mutex> lock(t.mu);
  t.factory = std::move(factory);
}

void SetRuntimeCreatedHook(std::function<void(DeviceRuntime&)> hook) {
  Table& t = GetTable();
  std::lock_guard<std::mutex> lock(t.mu);
  t.created_hook = std::move(hook);
}

absl::StatusOr<DeviceRuntime*> GetRuntime(int index) {
  Table& t = GetTable();
  std::lock_guard<std::mutex> lock(t.mu);
  auto it = t.runtimes.find(index);
  if (it != t.runtimes.end()) return it->second.get();
  auto failed = t.failures.find(index);
  if (failed != t.failures.end()) return failed->second;
  if (!t.factory) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cuda:", index, ": no CUDA backend is installed in this program (link //backends/cuda"
                        ":backend, built with --config=cuda)"));
  }
  absl::StatusOr<std::unique_ptr<DeviceApi>> api = t.factory(index);
  absl::StatusOr<std::unique_ptr<DeviceRuntime>> rt =
      api.ok() ? DeviceRuntime::Create(*std::move(api))
               : absl::StatusOr<std::unique_ptr<DeviceRuntime>>(api.status());
  if (!rt.ok()) {
    // Remembered: a device that failed once (no driver, bad index) fails the same way again.
    t.failures[index] = rt.status();
    return rt.status();
  }
  DeviceRuntime* raw = rt->get();
  if (t.created_hook) t.created_hook(*raw);
  t.runtimes[index] = *std::move(rt);
  return raw;
}

DeviceRuntime& RuntimeOf(Device device) {
  BRAID_CHECK(device.type == DeviceType::kCUDA) << "RuntimeOf(" << device << "): not a CUDA device";
  absl::StatusOr<DeviceRuntime*> rt = GetRuntime(device.index);
  BRAID_CHECK(rt.ok()) << rt.status().message();
  return **rt;
}

}  // namespace braid::cuda
