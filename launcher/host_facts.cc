#include "launcher/host_facts.h"

#include <dirent.h>
#include <sched.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <optional>
#include <vector>

#include "launcher/device_binding.h"

namespace braid::launcher {

HostFacts DetectHost(const std::map<std::string, std::string>& env) {
  HostFacts h;
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) h.cpus = std::max(1, CPU_COUNT(&set));
  if (std::optional<std::vector<std::string>> visible = VisibleCudaDevices(env)) {
    h.gpus = static_cast<int>(visible->size());
    return h;
  }
  // The NVIDIA driver makes /dev/nvidia0, /dev/nvidia1, ... (besides nvidiactl, nvidia-uvm).
  if (DIR* d = opendir("/dev")) {
    while (dirent* e = readdir(d)) {
      const char* n = e->d_name;
      if (std::strncmp(n, "nvidia", 6) != 0 || !n[6]) continue;
      bool digits = true;
      for (const char* p = n + 6; *p; ++p) digits = digits && std::isdigit(static_cast<unsigned char>(*p));
      if (digits) ++h.gpus;
    }
    closedir(d);
  }
  return h;
}

}  // namespace braid::launcher
