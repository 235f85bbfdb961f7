// A small allreduce-based job for the launcher's multi-process and multi-node tests: joins the
// world through the launcher's store and the Gloo plugin, then checks allreduce and allgather
// results exactly against what every rank can compute on its own.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "backends/store/tcp_store.h"
#include "core/communicator.h"
#include "core/plugin.h"
#include "core/registry.h"
#include "core/store.h"
#include "launcher/net.h"
#include "tools/cpp/runfiles/runfiles.h"

namespace {

int EnvInt(const char* name) {
  const char* v = std::getenv(name);
  int out = -1;
  return v && absl::SimpleAtoi(v, &out) ? out : -1;
}

absl::Status Run(const char* argv0) {
  using namespace braid;
  int rank = EnvInt("RANK"), world = EnvInt("WORLD_SIZE");
  if (rank < 0 || world < 1) return absl::InvalidArgumentError("RANK / WORLD_SIZE not set: run me under //launcher");
  BRAID_ASSIGN_OR_RETURN(auto store, ConnectStoreFromEnv(absl::Seconds(60)));
  const char* attempt = std::getenv("BRAID_RESTART_COUNT");
  PrefixStore job_store(absl::StrCat("allreduce_job/attempt", attempt ? attempt : "0"), store.get());

  std::string error;
  std::unique_ptr<bazel::tools::cpp::runfiles::Runfiles> rf(
      bazel::tools::cpp::runfiles::Runfiles::Create(argv0, &error));
  std::vector<std::string> path;
  if (rf) {
    std::string so = rf->Rlocation("braid/backends/gloo/libbraid_gloo.so");
    path.push_back(so.substr(0, so.rfind('/')));
  }
  BRAID_RETURN_IF_ERROR(EnsureCommunicator("gloo", PluginSearchPath(path)));
  CommunicatorOptions co;
  co.rank = rank;
  co.size = world;
  co.store = &job_store;
  co.timeout = absl::Seconds(60);
  const char* master = std::getenv("MASTER_ADDR");
  co.options["hostname"] = launcher::LocalAddressToward(master ? master : "127.0.0.1");
  BRAID_ASSIGN_OR_RETURN(auto comm, Registry::Get().MakeCommunicator("gloo", co));

  const int64_t n = 1 << 20;
  absl::Time start = absl::Now();
  for (int round = 1; round <= 5; ++round) {
    Tensor t = Tensor::Full({n}, float((rank + 1) * round));
    BRAID_RETURN_IF_ERROR(comm->AllReduce(t, ReduceOp::kSum)->Wait());
    float want = float(round * world * (world + 1) / 2);
    std::vector<float> v = t.ToFloatVector();
    for (int64_t i = 0; i < n; i += 4099) {
      if (v[size_t(i)] != want) {
        return absl::InternalError(absl::StrCat("allreduce round ", round, ": element ", i, " is ",
                                                v[size_t(i)], ", want ", want));
      }
    }
  }
  double secs = absl::ToDoubleSeconds(absl::Now() - start);
  Tensor mine = Tensor::Full({1}, float(rank));
  Tensor all = Tensor::Empty({world});
  BRAID_RETURN_IF_ERROR(comm->AllGather(mine, all)->Wait());
  std::vector<float> ranks = all.ToFloatVector();
  for (int r = 0; r < world; ++r) {
    if (ranks[size_t(r)] != float(r)) return absl::InternalError("allgather out of rank order");
  }
  BRAID_RETURN_IF_ERROR(comm->Barrier()->Wait());
  std::printf("allreduce job: rank %d of %d ok via %s (5 x %.0f MiB allreduced in %.2f s)\n", rank,
              world, co.options["hostname"].c_str(), double(n) * 4 / (1 << 20), secs);
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  absl::Status st = Run(argv[0]);
  if (!st.ok()) {
    std::fprintf(stderr, "allreduce job: %s\n", std::string(st.message()).c_str());
    return 1;
  }
  return 0;
}
