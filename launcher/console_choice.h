// Which workers' output the launcher copies to its console, from torchrun's --redirects, --tee
// and --local_ranks_filter (parsed in launch_flags.cc). Every worker's output is always in its
// log; this only decides the console.
#ifndef BRAID_LAUNCHER_CONSOLE_CHOICE_H_
#define BRAID_LAUNCHER_CONSOLE_CHOICE_H_

#include <map>
#include <string>
#include <vector>

namespace braid::launcher {

// The choice as the command line gave it; see ConsoleFor.
struct ConsoleSpec {
  // Per local rank, torchrun's stream code (0 none, 3 stdout and stderr); key -1 = every rank.
  std::map<int, int> redirects, tee;
  std::vector<int> local_ranks_filter;  // empty = not given
  bool Default() const { return redirects.empty() && tee.empty() && local_ranks_filter.empty(); }
};

// How one worker's output reaches the console.
struct ConsoleChoice {
  bool echo = false;      // copy its output to the launcher's stdout
  std::string prefix;     // put before each console line ("" = none)
  bool tty_ok = false;    // may get a pseudo-terminal (only the lone default echo: rank 0)
};
// Default: global rank 0 only, unprefixed, as the program run alone. --tee=3 (or per local rank
// "0:3,1:0"): those ranks too; --local_ranks_filter: only these local ranks; --redirects=3: none
// of those ranks on the console (their logs only). Any choice but the default prefixes each line
// with "[<role><rank>]:", as torchrun does.
ConsoleChoice ConsoleFor(const ConsoleSpec& c, const std::string& role, int rank, int local_rank);

}  // namespace braid::launcher

#endif  // BRAID_LAUNCHER_CONSOLE_CHOICE_H_
