// The edit (Levenshtein) distance between two names: what every "did you mean" of Braid's
// messages measures (a config key, a launcher flag, a weight's name). Header-only so that the
// readers that include core's headers alone can use it.
#ifndef BRAID_CORE_EDIT_DISTANCE_H_
#define BRAID_CORE_EDIT_DISTANCE_H_

#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"

namespace braid {

// Insertions, deletions and substitutions that turn `a` into `b`; with `ignore_case`, letters
// that differ only in case count as equal. With `limit`, the distance is exact when it is at most
// `limit` and is some value above `limit` otherwise: a "did you mean" only wants names closer than
// the best so far, and without the bound one long unknown key (a config file can hold kilobytes of
// one) costs its length times every known name's.
inline size_t EditDistance(const std::string& a, const std::string& b, bool ignore_case = false,
                           size_t limit = static_cast<size_t>(-1)) {
  const size_t over = limit == static_cast<size_t>(-1) ? limit : limit + 1;
  // The distance is at least the difference in length.
  if ((a.size() > b.size() ? a.size() - b.size() : b.size() - a.size()) > limit) return over;
  auto same = [ignore_case](char x, char y) {
    return ignore_case ? absl::ascii_tolower(x) == absl::ascii_tolower(y) : x == y;
  };
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    size_t row_min = row[0];
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (same(a[i - 1], b[j - 1]) ? 0 : 1)});
      diagonal = up;
      row_min = std::min(row_min, row[j]);
    }
    // Each entry comes from one of the row above (or from its left neighbour, plus one), so a
    // row's smallest entry never falls below the previous row's: once it passes the limit, the
    // distance has too.
    if (row_min > limit) return over;
  }
  return std::min(row[b.size()], over);
}

}  // namespace braid

#endif  // BRAID_CORE_EDIT_DISTANCE_H_
