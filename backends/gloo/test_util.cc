#include "backends/gloo/test_util.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "core/plugin.h"
#include "core/registry.h"
#include "gtest/gtest.h"
#include "third_party/runfiles.h"

namespace braid::gloo_test {

namespace {

std::string Errno(const std::string& what) {
  return absl::StrCat(what, ": ", std::strerror(errno));
}

// Every character outside [A-Za-z0-9_-] as %XX, so that any key is one plain file name.
std::string EncodeKey(const std::string& key) {
  std::string out = "k_";
  for (unsigned char c : key) {
    if (std::isalnum(c) || c == '_' || c == '-') {
      out += char(c);
    } else {
      absl::StrAppend(&out, "%", absl::Hex(c, absl::kZeroPad2));
    }
  }
  return out;
}

// Sleeps a little longer each time, up to 10 ms.
class Backoff {
 public:
  void Sleep() {
    absl::SleepFor(delay_);
    delay_ = std::min(delay_ * 2, absl::Milliseconds(10));
  }

 private:
  absl::Duration delay_ = absl::Microseconds(200);
};

// Holds an exclusive flock on <dir>/lock for its lifetime.
class DirLock {
 public:
  explicit DirLock(const std::string& dir) {
    fd_ = ::open((dir + "/lock").c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0644);
    if (fd_ >= 0) ::flock(fd_, LOCK_EX);
  }
  ~DirLock() {
    if (fd_ >= 0) ::close(fd_);  // releases the lock
  }
  bool ok() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

}  // namespace

FileStore::FileStore(std::string dir) : dir_(std::move(dir)) { ::mkdir(dir_.c_str(), 0755); }

std::string FileStore::PathOf(const std::string& key) const {
  return absl::StrCat(dir_, "/", EncodeKey(key));
}

absl::Status FileStore::WriteAtomically(const std::string& key, const std::string& value) {
  static std::atomic<uint64_t> counter{0};
  std::string tmp = absl::StrCat(dir_, "/t_", ::getpid(), "_", counter++);
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f.write(value.data(), std::streamsize(value.size()));
    if (!f) return absl::InternalError(Errno(absl::StrCat("file store: writing ", tmp)));
  }
  if (::rename(tmp.c_str(), PathOf(key).c_str()) != 0) {
    return absl::InternalError(Errno(absl::StrCat("file store: renaming ", tmp)));
  }
  return absl::OkStatus();
}

bool FileStore::Read(const std::string& key, std::string* value) const {
  std::ifstream f(PathOf(key), std::ios::binary);
  if (!f) return false;
  std::ostringstream s;
  s << f.rdbuf();
  *value = s.str();
  return true;
}

absl::Status FileStore::Set(const std::string& key, const std::string& value) {
  return WriteAtomically(key, value);
}

absl::StatusOr<std::string> FileStore::Get(const std::string& key, absl::Duration timeout) {
  BRAID_RETURN_IF_ERROR(Wait({key}, timeout));
  std::string v;
  if (!Read(key, &v)) {
    return absl::NotFoundError(absl::StrCat("file store: key '", key, "' vanished while read"));
  }
  return v;
}

absl::Status FileStore::Wait(const std::vector<std::string>& keys, absl::Duration timeout) {
  absl::Time deadline = absl::Now() + timeout;
  Backoff backoff;
  for (;;) {
    std::vector<std::string> missing;
    for (const auto& k : keys) {
      if (::access(PathOf(k).c_str(), F_OK) != 0) missing.push_back(k);
    }
    if (missing.empty()) return absl::OkStatus();
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat("file store ", dir_, ": waited ",
                                                      absl::FormatDuration(timeout), " for key(s) ",
                                                      absl::StrJoin(missing, ", ")));
    }
    backoff.Sleep();
  }
}

absl::StatusOr<int64_t> FileStore::Add(const std::string& key, int64_t delta) {
  DirLock lock(dir_);
  if (!lock.ok()) return absl::InternalError(Errno(absl::StrCat("file store: locking ", dir_)));
  std::string v;
  int64_t n = 0;
  if (Read(key, &v) && !absl::SimpleAtoi(v, &n)) {
    return absl::FailedPreconditionError(
        absl::StrCat("file store: Add on key '", key, "' whose value is not an integer"));
  }
  n += delta;
  BRAID_RETURN_IF_ERROR(WriteAtomically(key, std::to_string(n)));
  return n;
}

absl::StatusOr<std::string> FileStore::CompareSet(const std::string& key,
                                                  const std::string& expected,
                                                  const std::string& desired) {
  DirLock lock(dir_);
  if (!lock.ok()) return absl::InternalError(Errno(absl::StrCat("file store: locking ", dir_)));
  std::string current;
  bool present = Read(key, &current);
  if (!present) current.clear();
  if (current == expected) {
    BRAID_RETURN_IF_ERROR(WriteAtomically(key, desired));
    return desired;
  }
  return current;
}

absl::Status FileStore::Delete(const std::string& key) {
  if (::unlink(PathOf(key).c_str()) != 0 && errno != ENOENT) {
    return absl::InternalError(Errno(absl::StrCat("file store: deleting '", key, "'")));
  }
  return absl::OkStatus();
}

std::string FreshDir(const std::string& tag) {
  static std::atomic<int> counter{0};
  const char* tmp = ::getenv("TEST_TMPDIR");
  const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string name = info != nullptr ? absl::StrCat(info->test_suite_name(), ".", info->name())
                                     : std::string("store");
  for (char& c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_') c = '_';
  }
  std::string dir =
      absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/", name, tag, "_", ::getpid(), "_", counter++);
  ::mkdir(dir.c_str(), 0755);
  return dir;
}

std::string GlooPluginPath() {
  using ::bazel::tools::cpp::runfiles::Runfiles;
  std::string error;
  static Runfiles* runfiles = Runfiles::CreateForTest(&error);
  // Outside `bazel test` (a benchmark run by hand or with `bazel run`): next to the binary.
  if (runfiles == nullptr) runfiles = Runfiles::Create(program_invocation_name, &error);
  if (runfiles == nullptr) {
    ADD_FAILURE() << "runfiles: " << error;
    return "";
  }
  return runfiles->Rlocation("braid/backends/gloo/libbraid_gloo.so");
}

absl::StatusOr<std::unique_ptr<Communicator>> MakeGloo(
    int rank, int size, Store* store, absl::Duration timeout,
    const std::map<std::string, std::string>& options) {
  static const std::string* path = new std::string(GlooPluginPath());
  BRAID_RETURN_IF_ERROR(LoadPlugin(*path, {}));
  CommunicatorOptions o;
  o.rank = rank;
  o.size = size;
  o.store = store;
  o.timeout = timeout;
  o.options = options;
  return Registry::Get().MakeCommunicator("gloo", o);
}

std::string ChildExit::Describe() const {
  if (!reaped) return absl::StrCat("rank ", rank, " was still running at the deadline");
  if (exited) return absl::StrCat("rank ", rank, " exited with code ", code);
  return absl::StrCat("rank ", rank, " was killed by signal ", signal, " (", strsignal(signal),
                      ")");
}

std::vector<ChildExit> ForkRanks(int n, const std::function<void(int rank)>& body,
                                 absl::Duration deadline) {
  std::fflush(nullptr);  // or the children would print the parent's buffered output again
  std::vector<pid_t> pids(n, -1);
  std::vector<ChildExit> result(n);
  const unsigned alarm_s = unsigned(absl::ToInt64Seconds(deadline)) + 5;
  for (int r = 0; r < n; ++r) {
    result[r].rank = r;
    pid_t pid = ::fork();
    if (pid == 0) {
      ::alarm(alarm_s);
      int code = 0;
      {
        SCOPED_TRACE(absl::StrCat("in rank ", r, " (pid ", ::getpid(), ")"));
        try {
          body(r);
        } catch (const std::exception& e) {
          ADD_FAILURE() << "rank " << r << " threw: " << e.what();
        }
        code = ::testing::Test::HasFailure() ? 1 : 0;
      }
      std::fflush(nullptr);
      ::_exit(code);  // no static destructors, no gtest teardown: the parent owns those
    }
    if (pid < 0) {
      ADD_FAILURE() << Errno("fork");
      break;
    }
    pids[r] = pid;
  }
  absl::Time end = absl::Now() + deadline;
  int left = 0;
  for (pid_t p : pids) left += p > 0;
  Backoff backoff;
  while (left > 0 && absl::Now() < end) {
    bool any = false;
    for (int r = 0; r < n; ++r) {
      if (pids[r] <= 0 || result[r].reaped) continue;
      int status = 0;
      if (::waitpid(pids[r], &status, WNOHANG) == pids[r]) {
        result[r].reaped = true;
        result[r].exited = WIFEXITED(status);
        result[r].code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        result[r].signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
        --left;
        any = true;
      }
    }
    if (!any) backoff.Sleep();
  }
  for (int r = 0; r < n; ++r) {
    if (pids[r] <= 0 || result[r].reaped) continue;
    ::kill(pids[r], SIGKILL);
    int status = 0;
    ::waitpid(pids[r], &status, 0);  // reaped, but reported as still running at the deadline
  }
  return result;
}

void RunRanks(int n, const std::function<void(int rank)>& body, absl::Duration deadline) {
  for (const ChildExit& e : ForkRanks(n, body, deadline)) {
    EXPECT_TRUE(e.reaped && e.exited && e.code == 0)
        << e.Describe() << " (its failures are printed above)";
  }
}

std::vector<DType> AllDTypes() {
  return {DType::kF32, DType::kBF16, DType::kF16, DType::kI32, DType::kI64, DType::kU8, DType::kI8};
}

int64_t InputValue(DType t, int rank, int64_t i, int salt) {
  switch (t) {
    case DType::kI64:
      return (int64_t(rank + 1) << 40) * ((i + salt) % 3 - 1) + (i * 7 + rank * 13 + salt) % 1001 -
             500;
    case DType::kI32:
      return (int64_t(rank) * 7919 + i * 104729 + salt) % 2000001 - 1000000;
    case DType::kU8:
      return (rank * 37 + i * 11 + salt) % 61;
    case DType::kI8:
      return (rank * 5 + i * 3 + salt) % 61 - 30;
    default:
      return (rank * 7 + i * 13 + salt) % 41 - 20;
  }
}

Tensor Input(DType t, int rank, int64_t n, int salt) {
  std::vector<int64_t> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = InputValue(t, rank, i, salt);
  return IntTensor(t, v);
}

Tensor IntTensor(DType t, const std::vector<int64_t>& v) {
  const int64_t n = int64_t(v.size());
  Tensor x = Tensor::Empty({n}, t);
  for (int64_t i = 0; i < n; ++i) {
    switch (t) {
      case DType::kF32:
        x.data<float>()[i] = float(v[i]);
        break;
      case DType::kBF16:
        static_cast<uint16_t*>(x.raw_data())[i] = FloatToBF16(float(v[i]));
        break;
      case DType::kF16:
        static_cast<uint16_t*>(x.raw_data())[i] = FloatToF16(float(v[i]));
        break;
      case DType::kI32:
        x.data<int32_t>()[i] = int32_t(v[i]);
        break;
      case DType::kI64:
        x.data<int64_t>()[i] = v[i];
        break;
      case DType::kU8:
        x.data<uint8_t>()[i] = uint8_t(v[i]);
        break;
      case DType::kI8:
        x.data<int8_t>()[i] = int8_t(v[i]);
        break;
    }
  }
  return x;
}

Tensor FloatTensor(DType t, const std::vector<float>& v) {
  const int64_t n = int64_t(v.size());
  Tensor x = Tensor::Empty({n}, t);
  for (int64_t i = 0; i < n; ++i) {
    if (t == DType::kF32) {
      x.data<float>()[i] = v[i];
    } else if (t == DType::kBF16) {
      static_cast<uint16_t*>(x.raw_data())[i] = FloatToBF16(v[i]);
    } else {
      BRAID_CHECK(t == DType::kF16) << "FloatTensor of " << DTypeName(t);
      static_cast<uint16_t*>(x.raw_data())[i] = FloatToF16(v[i]);
    }
  }
  return x;
}

Tensor SerialReduce(DType t, ReduceOp op, const std::vector<int>& ranks, int64_t n, int salt) {
  std::vector<int64_t> acc(n);
  for (int64_t i = 0; i < n; ++i) {
    int64_t a = InputValue(t, ranks[0], i, salt);
    for (size_t k = 1; k < ranks.size(); ++k) {
      int64_t v = InputValue(t, ranks[k], i, salt);
      if (op == ReduceOp::kSum || op == ReduceOp::kAvg) a += v;
      if (op == ReduceOp::kMax) a = std::max(a, v);
      if (op == ReduceOp::kMin) a = std::min(a, v);
    }
    acc[i] = a;
  }
  if (op != ReduceOp::kAvg) return IntTensor(t, acc);
  std::vector<float> avg(n);
  for (int64_t i = 0; i < n; ++i) avg[i] = float(acc[i]) / float(ranks.size());
  return FloatTensor(t, avg);
}

Tensor Range(const Tensor& t, int64_t begin, int64_t count) {
  Tensor out = Tensor::Empty({count}, t.dtype());
  std::memcpy(out.raw_data(), static_cast<const char*>(t.raw_data()) + begin * SizeOf(t.dtype()),
              size_t(count) * SizeOf(t.dtype()));
  return out;
}

namespace {

std::string ValueString(const Tensor& t, int64_t i) {
  const void* p = t.raw_data();
  switch (t.dtype()) {
    case DType::kF32:
      return absl::StrCat(static_cast<const float*>(p)[i]);
    case DType::kBF16:
      return absl::StrCat(BF16ToFloat(static_cast<const uint16_t*>(p)[i]));
    case DType::kF16:
      return absl::StrCat(F16ToFloat(static_cast<const uint16_t*>(p)[i]));
    case DType::kI32:
      return absl::StrCat(static_cast<const int32_t*>(p)[i]);
    case DType::kI64:
      return absl::StrCat(static_cast<const int64_t*>(p)[i]);
    case DType::kU8:
      return absl::StrCat(static_cast<const uint8_t*>(p)[i]);
    case DType::kI8:
      return absl::StrCat(static_cast<const int8_t*>(p)[i]);
  }
  return "?";
}

}  // namespace

::testing::AssertionResult SameValues(const Tensor& got, const Tensor& want) {
  if (got.dtype() != want.dtype() || got.numel() != want.numel()) {
    return ::testing::AssertionFailure()
           << "got " << got.DescribeForError() << ", want " << want.DescribeForError();
  }
  const size_t elem = SizeOf(got.dtype());
  const char* a = static_cast<const char*>(got.raw_data());
  const char* b = static_cast<const char*>(want.raw_data());
  for (int64_t i = 0; i < got.numel(); ++i) {
    if (std::memcmp(a + i * elem, b + i * elem, elem) != 0) {
      return ::testing::AssertionFailure()
             << DTypeName(got.dtype()) << " element " << i << " of " << got.numel() << ": got "
             << ValueString(got, i) << ", want " << ValueString(want, i);
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace braid::gloo_test
