#include "backends/in_process/run_ranks.h"

#include <memory>
#include <thread>
#include <vector>

#include "absl/time/time.h"
#include "backends/in_process/in_process_communicator.h"

namespace braid::testing {

void RunRanks(int n, const std::function<void(int rank, Communicator* comm)>& body) {
  std::vector<std::unique_ptr<Communicator>> group = MakeInProcessGroup(n);
  for (auto& c : group) c->set_timeout(absl::Seconds(60));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back([&, r] { body(r, group[size_t(r)].get()); });
  for (auto& t : threads) t.join();
}

}  // namespace braid::testing
