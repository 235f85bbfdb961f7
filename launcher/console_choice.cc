#include "launcher/console_choice.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace braid::launcher {

ConsoleChoice ConsoleFor(const ConsoleSpec& c, const std::string& role, int rank, int local_rank) {
  ConsoleChoice out;
  if (c.Default()) {
    out.echo = rank == 0;
    out.tty_ok = out.echo;
    return out;
  }
  auto code = [local_rank](const std::map<int, int>& m) {
    auto it = m.find(local_rank);
    if (it == m.end()) it = m.find(-1);
    return it == m.end() ? 0 : it->second;
  };
  const auto& filter = c.local_ranks_filter;
  const bool in_filter = std::find(filter.begin(), filter.end(), local_rank) != filter.end();
  bool show;
  if (!c.tee.empty()) show = code(c.tee) != 0;
  else if (!filter.empty()) show = true;
  else show = rank == 0;
  if (!filter.empty()) show = show && in_filter;
  if (code(c.redirects) != 0 && code(c.tee) == 0) show = false;
  out.echo = show;
  if (show) out.prefix = absl::StrCat("[", role, rank, "]:");
  return out;
}

}  // namespace braid::launcher
