// What this machine offers to --nproc_per_node=auto|cpu|gpu: its CPUs and GPUs.
#ifndef BRAID_LAUNCHER_HOST_FACTS_H_
#define BRAID_LAUNCHER_HOST_FACTS_H_

#include <map>
#include <string>

namespace braid::launcher {

struct HostFacts {
  int cpus = 1;  // CPUs this process may run on
  int gpus = 0;  // GPUs it can see
};
// CPUs from the affinity mask; GPUs from CUDA_VISIBLE_DEVICES when set, else the /dev/nvidiaN
// device files.
HostFacts DetectHost(const std::map<std::string, std::string>& env);

}  // namespace braid::launcher

#endif  // BRAID_LAUNCHER_HOST_FACTS_H_
