// Test helpers for the Gloo communicator: ranks as forked processes over loopback, meeting
// through a file-based Store, each loading libbraid_gloo.so the way the training program does.
#ifndef BRAID_BACKENDS_GLOO_TEST_UTIL_H_
#define BRAID_BACKENDS_GLOO_TEST_UTIL_H_

#include <sys/types.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/communicator.h"
#include "core/store.h"
#include "gtest/gtest.h"

namespace braid::gloo_test {

// A Store shared by processes through a folder: one file per key, written to a temporary name
// and renamed (readers never see half a value); Add and CompareSet hold an flock on the folder's
// lock file; Get and Wait poll. Thread-safe. Keys may hold any characters; values any bytes.
class FileStore final : public Store {
 public:
  explicit FileStore(std::string dir);  // creates the folder if needed
  absl::Status Set(const std::string& key, const std::string& value) override;
  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override;
  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) override;
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) override;
  absl::StatusOr<std::string> CompareSet(const std::string& key, const std::string& expected,
                                         const std::string& desired) override;
  absl::Status Delete(const std::string& key) override;

  const std::string& dir() const { return dir_; }

 private:
  std::string PathOf(const std::string& key) const;
  absl::Status WriteAtomically(const std::string& key, const std::string& value);
  bool Read(const std::string& key, std::string* value) const;  // false when absent

  std::string dir_;
};

// A fresh, empty folder under $TEST_TMPDIR (or /tmp) named after the running test.
std::string FreshDir(const std::string& tag = "");

// Where the test's runfiles hold libbraid_gloo.so. Call in the parent, before forking.
std::string GlooPluginPath();

// Loads the plugin (once per process) and makes rank `rank` of a "gloo" communicator.
absl::StatusOr<std::unique_ptr<Communicator>> MakeGloo(
    int rank, int size, Store* store, absl::Duration timeout = absl::Seconds(30),
    const std::map<std::string, std::string>& options = {});

// How a child process ended: exited with `code`, or killed by `signal`.
struct ChildExit {
  int rank = 0;
  bool exited = false;
  int code = -1;
  int signal = 0;
  bool reaped = false;  // false: still running at the deadline (it was then SIGKILLed)
  std::string Describe() const;
};

// Forks n processes (call it before this process starts any thread: fork copies only the calling
// thread), runs body(rank) in child `rank` and exits it with 0, or 1 when a gtest assertion
// failed in it (the failures are printed by the child). Waits for every child; children still
// running after `deadline` are SIGKILLed, and every child is reaped before this returns. Each
// child also has an alarm() at the deadline, so none outlives a parent that died.
std::vector<ChildExit> ForkRanks(int n, const std::function<void(int rank)>& body,
                                 absl::Duration deadline = absl::Seconds(90));

// ForkRanks, then a gtest failure for every child that did not exit with 0.
void RunRanks(int n, const std::function<void(int rank)>& body,
              absl::Duration deadline = absl::Seconds(90));

// ---- Inputs and serial references ----------------------------------------------------------

// Every dtype a communicator moves, and those it reduces.
std::vector<DType> AllDTypes();

// Integer-valued inputs, so that every sum a reduction computes is exact in every dtype (bf16
// holds integers up to 256 exactly; four ranks of floats in [-20, 20] stay inside that), and
// i64 values beyond 2^53 (which a detour through float or double would corrupt).
int64_t InputValue(DType t, int rank, int64_t i, int salt);
Tensor Input(DType t, int rank, int64_t n, int salt);

// Tensors of dtype t holding the given values (converted; bf16/f16 round to nearest even).
Tensor IntTensor(DType t, const std::vector<int64_t>& v);
Tensor FloatTensor(DType t, const std::vector<float>& v);

// The element-wise reduction over `ranks` (in that order) of Input(t, rank, n, salt), computed
// serially in int64 and, for kAvg, divided in float the way the communicator does.
Tensor SerialReduce(DType t, ReduceOp op, const std::vector<int>& ranks, int64_t n, int salt);

// Elements [begin, begin + count) of a flat tensor, as a new tensor.
Tensor Range(const Tensor& t, int64_t begin, int64_t count);

// Bit-exact equality of two flat tensors of one dtype; the failure names the first difference.
::testing::AssertionResult SameValues(const Tensor& got, const Tensor& want);

}  // namespace braid::gloo_test

#endif  // BRAID_BACKENDS_GLOO_TEST_UTIL_H_
