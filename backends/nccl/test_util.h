// Shared by the NCCL communicator's tests: loading the plugin as the training program does, a
// cudaMalloc allocator for cuda:N tensors (Braid's CUDA backend has none yet), host<->device
// copies, and running one thread per rank.
#ifndef BRAID_BACKENDS_NCCL_TEST_UTIL_H_
#define BRAID_BACKENDS_NCCL_TEST_UTIL_H_

#include <cuda_runtime_api.h>

#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/communicator.h"
#include "core/store.h"
#include "core/tensor.h"
#include "backends/cuda/gpu_test_env.h"
#include "gtest/gtest.h"

namespace braid::nccl::testing {

// Loads libbraid_nccl.so (from $BRAID_PLUGIN_PATH, then this test's runfiles), once. Also makes
// NCCL bootstrap over loopback unless NCCL_SOCKET_IFNAME is set: tests never use other networks.
absl::Status LoadNcclPlugin();

// The number of usable GPUs, or CUDA's reason why there are none.
absl::StatusOr<int> GpuCount();

// In a test body: unless `n` GPUs are usable, fails where the test's target promises them
// (BRAID_REQUIRE_GPU, backends/cuda/gpu_test_env.h) and skips otherwise, saying why; sets
// `count` to the number of usable GPUs.
#define BRAID_REQUIRE_GPUS(n, count)                                                       \
  do {                                                                                     \
    std::string _braid_why;                                                                \
    if (!::braid::nccl::testing::HaveGpus((n), &(count), &_braid_why)) {                   \
      if (::braid::gpu_test::MustFailWithGpus((n), (count))) FAIL() << _braid_why;         \
      GTEST_SKIP() << _braid_why;                                                          \
    }                                                                                      \
  } while (0)
// Whether `n` GPUs are usable; `count` is set to the number there are (0 when none), `why` to
// what is missing.
bool HaveGpus(int n, int* count, std::string* why);

// Makes cuda:N tensors allocatable in this process (cudaMalloc/cudaFree). Idempotent.
void UseCudaMallocAllocator();

// Makes communicator `rank` of `size` through the registry, as the training program does.
absl::StatusOr<std::unique_ptr<Communicator>> MakeNccl(
    int rank, int size, Store* store, int device, absl::Duration timeout = absl::Seconds(60),
    std::map<std::string, std::string> options = {});

// Runs fn(rank) on one thread per rank and joins them all.
void RunRanks(int n, const std::function<void(int rank)>& fn);

// Host <-> device copies of a tensor's bytes (blocking, legacy default stream).
void Upload(const Tensor& t, const void* host, size_t bytes);
void Download(const Tensor& t, void* host, size_t bytes);

template <typename T>
void UploadVector(const Tensor& t, const std::vector<T>& v) {
  ASSERT_EQ(v.size() * sizeof(T), t.nbytes()) << t.DescribeForError();
  Upload(t, v.data(), t.nbytes());
}

template <typename T>
std::vector<T> DownloadVector(const Tensor& t) {
  std::vector<T> v(t.nbytes() / sizeof(T));
  Download(t, v.data(), t.nbytes());
  return v;
}

// Fills a device tensor's bytes with `byte` (a sentinel that the operation must overwrite).
void FillBytes(const Tensor& t, int byte);

// Values as the dtype stores them, one uint64 per element (bit patterns for bf16/f16), from
// small integers so that sums are exact whatever order a collective adds in.
std::vector<uint64_t> Encode(DType t, const std::vector<double>& values);
std::vector<double> Decode(DType t, const std::vector<uint64_t>& raw);
void UploadValues(const Tensor& t, const std::vector<double>& values);
std::vector<double> DownloadValues(const Tensor& t);

}  // namespace braid::nccl::testing

#endif  // BRAID_BACKENDS_NCCL_TEST_UTIL_H_
