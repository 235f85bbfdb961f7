#include "backends/nccl/test_util.h"

#include <cstdlib>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "core/allocator.h"
#include "core/check.h"
#include "core/plugin.h"
#include "core/registry.h"
#include "third_party/runfiles.h"

namespace braid::nccl::testing {
namespace {

using ::bazel::tools::cpp::runfiles::Runfiles;

class CudaMallocAllocator final : public Allocator {
 public:
  explicit CudaMallocAllocator(Device d) : device_(d) {}
  void* Allocate(size_t bytes) override {
    int previous = 0;
    BRAID_CHECK(cudaGetDevice(&previous) == cudaSuccess);
    BRAID_CHECK(cudaSetDevice(device_.index) == cudaSuccess) << "cudaSetDevice(" << device_ << ")";
    void* p = nullptr;
    cudaError_t err = cudaMalloc(&p, bytes == 0 ? 1 : bytes);
    cudaSetDevice(previous);
    BRAID_CHECK(err == cudaSuccess)
        << "cudaMalloc of " << bytes << " bytes on " << device_ << ": " << cudaGetErrorString(err);
    RecordAlloc(bytes);
    return p;
  }
  void Deallocate(void* ptr, size_t bytes) override {
    cudaFree(ptr);
    RecordFree(bytes);
  }

 private:
  Device device_;
};

}  // namespace

absl::Status LoadNcclPlugin() {
  static std::once_flag once;
  static absl::Status* status = nullptr;
  std::call_once(once, [] {
    // NCCL reads this at its first use; loopback keeps the tests off every real network.
    setenv("NCCL_SOCKET_IFNAME", "lo", /*overwrite=*/0);
    std::vector<std::string> extra;
    std::string error;
    std::unique_ptr<Runfiles> runfiles(Runfiles::CreateForTest(&error));
    if (runfiles != nullptr) {
      std::string so = runfiles->Rlocation("braid/backends/nccl/libbraid_nccl.so");
      extra.push_back(so.substr(0, so.rfind('/')));
    }
    status = new absl::Status(LoadPlugin("nccl", PluginSearchPath(extra)));
  });
  return *status;
}

absl::StatusOr<int> GpuCount() {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    return absl::UnavailableError(absl::StrCat(
        "cudaGetDeviceCount failed: ", cudaGetErrorString(err), " (", cudaGetErrorName(err), ")"));
  }
  if (count == 0) return absl::UnavailableError("cudaGetDeviceCount found no CUDA device");
  return count;
}

bool HaveGpus(int n, int* count, std::string* why) {
  *count = 0;
  absl::StatusOr<int> c = GpuCount();
  if (!c.ok()) {
    *why = "No usable CUDA device: " + c.status().ToString();
    return false;
  }
  *count = *c;
  if (*c < n) {
    *why = absl::StrCat("Needs ", n, " GPUs (NCCL allows one rank per GPU); this machine has ", *c);
    return false;
  }
  return true;
}

void UseCudaMallocAllocator() {
  static std::once_flag once;
  std::call_once(once, [] {
    RegisterAllocatorFactory(DeviceType::kCUDA, [](Device d) -> std::unique_ptr<Allocator> {
      return std::make_unique<CudaMallocAllocator>(d);
    });
  });
}

absl::StatusOr<std::unique_ptr<Communicator>> MakeNccl(int rank, int size, Store* store, int device,
                                                       absl::Duration timeout,
                                                       std::map<std::string, std::string> options) {
  BRAID_RETURN_IF_ERROR(LoadNcclPlugin());
  CommunicatorOptions o;
  o.rank = rank;
  o.size = size;
  o.store = store;
  o.device = Device::CUDA(device);
  o.timeout = timeout;
  o.options = std::move(options);
  return Registry::Get().MakeCommunicator("nccl", o);
}

void RunRanks(int n, const std::function<void(int rank)>& fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back(fn, r);
  for (auto& t : threads) t.join();
}

void Upload(const Tensor& t, const void* host, size_t bytes) {
  cudaError_t err = cudaMemcpy(t.raw_data(), host, bytes, cudaMemcpyHostToDevice);
  BRAID_CHECK(err == cudaSuccess) << "upload to " << t.DescribeForError() << ": "
                                  << cudaGetErrorString(err);
}

void Download(const Tensor& t, void* host, size_t bytes) {
  cudaError_t err = cudaMemcpy(host, t.raw_data(), bytes, cudaMemcpyDeviceToHost);
  BRAID_CHECK(err == cudaSuccess) << "download from " << t.DescribeForError() << ": "
                                  << cudaGetErrorString(err);
}

void FillBytes(const Tensor& t, int byte) {
  cudaError_t err = cudaMemset(t.raw_data(), byte, t.nbytes());
  BRAID_CHECK(err == cudaSuccess) << "memset of " << t.DescribeForError() << ": "
                                  << cudaGetErrorString(err);
}

std::vector<uint64_t> Encode(DType t, const std::vector<double>& values) {
  std::vector<uint64_t> raw;
  for (double v : values) {
    switch (t) {
      case DType::kF32: {
        float f = float(v);
        uint32_t bits;
        std::memcpy(&bits, &f, 4);
        raw.push_back(bits);
        break;
      }
      case DType::kBF16:
        raw.push_back(FloatToBF16(float(v)));
        break;
      case DType::kF16:
        raw.push_back(FloatToF16(float(v)));
        break;
      case DType::kI32:
        raw.push_back(uint32_t(int32_t(v)));
        break;
      case DType::kI64:
        raw.push_back(uint64_t(int64_t(v)));
        break;
      case DType::kU8:
        raw.push_back(uint8_t(v));
        break;
      case DType::kI8:
        raw.push_back(uint8_t(int8_t(v)));
        break;
    }
  }
  return raw;
}

std::vector<double> Decode(DType t, const std::vector<uint64_t>& raw) {
  std::vector<double> values;
  for (uint64_t r : raw) {
    switch (t) {
      case DType::kF32: {
        uint32_t bits = uint32_t(r);
        float f;
        std::memcpy(&f, &bits, 4);
        values.push_back(f);
        break;
      }
      case DType::kBF16:
        values.push_back(BF16ToFloat(uint16_t(r)));
        break;
      case DType::kF16:
        values.push_back(F16ToFloat(uint16_t(r)));
        break;
      case DType::kI32:
        values.push_back(int32_t(uint32_t(r)));
        break;
      case DType::kI64:
        values.push_back(double(int64_t(r)));
        break;
      case DType::kU8:
        values.push_back(uint8_t(r));
        break;
      case DType::kI8:
        values.push_back(int8_t(uint8_t(r)));
        break;
    }
  }
  return values;
}

void UploadValues(const Tensor& t, const std::vector<double>& values) {
  BRAID_CHECK(int64_t(values.size()) == t.numel()) << t.DescribeForError();
  std::vector<uint64_t> raw = Encode(t.dtype(), values);
  const size_t elem = SizeOf(t.dtype());
  std::vector<char> bytes(t.nbytes());
  // Little-endian: an element's bytes are the low bytes of its uint64.
  for (size_t i = 0; i < raw.size(); ++i) std::memcpy(&bytes[i * elem], &raw[i], elem);
  if (!bytes.empty()) Upload(t, bytes.data(), bytes.size());
}

std::vector<double> DownloadValues(const Tensor& t) {
  const size_t elem = SizeOf(t.dtype());
  std::vector<char> bytes(t.nbytes());
  if (!bytes.empty()) Download(t, bytes.data(), bytes.size());
  std::vector<uint64_t> raw(size_t(t.numel()), 0);
  for (size_t i = 0; i < raw.size(); ++i) std::memcpy(&raw[i], &bytes[i * elem], elem);
  return Decode(t.dtype(), raw);
}

}  // namespace braid::nccl::testing
