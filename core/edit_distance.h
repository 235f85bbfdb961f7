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
// that differ only in case count as equal.
inline size_t EditDistance(const std::string& a, const std::string& b, bool ignore_case = false) {
  auto same = [ignore_case](char x, char y) {
    return ignore_case ? absl::ascii_tolower(x) == absl::ascii_tolower(y) : x == y;
  };
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (same(a[i - 1], b[j - 1]) ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

}  // namespace braid

#endif  // BRAID_CORE_EDIT_DISTANCE_H_
