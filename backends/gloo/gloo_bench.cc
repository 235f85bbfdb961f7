// Bus bandwidth of the Gloo communicator's all-reduce, reduce-scatter and all-gather between
// local processes over loopback, with memcpy bandwidth of the same buffer for scale; and, with
// --ops=sendrecv, a point-to-point ping-pong between ranks 0 and 1 (what a pipeline's stages
// exchange): median_us is then one way (half the round trip), busbw the bytes over it:
//
//   bazel run //backends/gloo:gloo_bench -- --ranks=2 --min_bytes=4096 --max_bytes=67108864
//
// Bus bandwidth follows the usual convention (bytes of the full buffer per second, times
// 2(n-1)/n for all-reduce and (n-1)/n for reduce-scatter and all-gather), so that it compares
// across world sizes and with other libraries' figures.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "backends/gloo/test_util.h"

ABSL_FLAG(int, ranks, 2, "processes");
ABSL_FLAG(int64_t, min_bytes, 4096, "smallest buffer");
ABSL_FLAG(int64_t, max_bytes, 64 << 20, "largest buffer (sizes go up by 4x)");
ABSL_FLAG(std::string, ops, "allreduce,reduce_scatter,allgather",
          "operations to time: allreduce, reduce_scatter, allgather, sendrecv");
ABSL_FLAG(std::string, allreduce_algorithm, "auto", "auto, ring, bcube or direct");
ABSL_FLAG(int64_t, segment_bytes, 4 << 20, "pipelining segment of the ring algorithms");
ABSL_FLAG(std::string, dtype, "f32", "element type");
ABSL_FLAG(std::string, shm, "on",
          "sendrecv between ranks of this host over shared memory (on) or TCP (off)");

namespace braid::gloo_test {
namespace {

double MemcpyGBps(size_t bytes) {
  std::vector<char> a(bytes, 1), b(bytes, 2);
  int iters = int(std::clamp<int64_t>((256 << 20) / int64_t(bytes), 3, 1000));
  std::memcpy(b.data(), a.data(), bytes);
  absl::Time t0 = absl::Now();
  for (int i = 0; i < iters; ++i)
    std::memcpy(i % 2 ? a.data() : b.data(), i % 2 ? b.data() : a.data(), bytes);
  return double(bytes) * iters / absl::ToDoubleSeconds(absl::Now() - t0) / 1e9;
}

int Main() {
  const int n = absl::GetFlag(FLAGS_ranks);
  const DType dtype = ParseDType(absl::GetFlag(FLAGS_dtype)).value();
  const size_t elem = SizeOf(dtype);
  std::vector<std::string> ops = absl::StrSplit(absl::GetFlag(FLAGS_ops), ',');
  FileStore store(absl::StrCat("/tmp/gloo_bench_", ::getpid()));
  std::map<std::string, std::string> options = {
      {"allreduce_algorithm", absl::GetFlag(FLAGS_allreduce_algorithm)},
      {"segment_bytes", std::to_string(absl::GetFlag(FLAGS_segment_bytes))},
      {"shm", absl::GetFlag(FLAGS_shm)}};
  std::printf("%d ranks, %s, allreduce_algorithm=%s, segment_bytes=%ld, shm=%s\n", n,
              DTypeName(dtype), options["allreduce_algorithm"].c_str(),
              long(absl::GetFlag(FLAGS_segment_bytes)), options["shm"].c_str());
  std::printf("%-15s %12s %12s %12s %12s\n", "op", "bytes", "median_us", "busbw_GB/s",
              "memcpy_GB/s");
  std::fflush(stdout);
  std::vector<ChildExit> exits = ForkRanks(
      n,
      [&](int rank) {
        auto comm = MakeGloo(rank, n, &store, absl::Seconds(60), options);
        if (!comm.ok()) {
          std::fprintf(stderr, "rank %d: %s\n", rank, comm.status().ToString().c_str());
          ::_exit(1);
        }
        Communicator& c = **comm;
        for (const std::string& op : ops) {
          for (int64_t bytes = absl::GetFlag(FLAGS_min_bytes);
               bytes <= absl::GetFlag(FLAGS_max_bytes); bytes *= 4) {
            const int64_t count = std::max<int64_t>(n, bytes / int64_t(elem) / n * n);
            Tensor full = Tensor::Zeros({count}, dtype);
            Tensor block = Tensor::Zeros({count / n}, dtype);
            auto run = [&] {
              absl::Status st;
              if (op == "allreduce") st = c.AllReduce(full, ReduceOp::kSum)->Wait();
              if (op == "reduce_scatter") st = c.ReduceScatter(full, block, ReduceOp::kSum)->Wait();
              if (op == "allgather") st = c.AllGather(block, full)->Wait();
              // Ping-pong: rank 0 sends and waits for the message back; rank 1 echoes it.
              if (op == "sendrecv" && rank == 0) {
                st = c.Send(full, 1, 0)->Wait();
                if (st.ok()) st = c.Recv(full, 1, 0)->Wait();
              } else if (op == "sendrecv" && rank == 1) {
                st = c.Recv(full, 0, 0)->Wait();
                if (st.ok()) st = c.Send(full, 0, 0)->Wait();
              }
              if (!st.ok()) {
                std::fprintf(stderr, "rank %d: %s\n", rank, st.ToString().c_str());
                ::_exit(1);
              }
            };
            const int iters = int(std::clamp<int64_t>((512 << 20) / bytes, 5, 500));
            for (int i = 0; i < 3; ++i) run();
            if (!c.Barrier()->Wait().ok()) ::_exit(1);
            // The median of single runs: this machine is shared, and a mean follows its worst
            // moments.
            std::vector<double> times;
            for (int i = 0; i < iters; ++i) {
              absl::Time t0 = absl::Now();
              run();
              times.push_back(absl::ToDoubleSeconds(absl::Now() - t0));
            }
            std::sort(times.begin(), times.end());
            double seconds = times[times.size() / 2];
            double factor = op == "allreduce" ? 2.0 * (n - 1) / n : double(n - 1) / n;
            if (op == "sendrecv") {
              seconds /= 2;  // one way
              factor = 1;
            }
            double nbytes = double(count) * double(elem);
            if (rank == 0) {
              std::printf("%-15s %12.0f %12.1f %12.3f %12.2f\n", op.c_str(), nbytes, seconds * 1e6,
                          nbytes * factor / seconds / 1e9, MemcpyGBps(size_t(nbytes)));
              std::fflush(stdout);
            }
            if (!c.Barrier()->Wait().ok()) ::_exit(1);
          }
        }
      },
      absl::Minutes(30));
  int failed = 0;
  for (const ChildExit& e : exits) {
    if (!(e.exited && e.code == 0)) {
      std::fprintf(stderr, "%s\n", e.Describe().c_str());
      ++failed;
    }
  }
  return failed == 0 ? 0 : 1;
}

}  // namespace
}  // namespace braid::gloo_test

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return braid::gloo_test::Main();
}
