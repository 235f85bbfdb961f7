#include "plugins/ddp/ddp_buckets.h"

#include <algorithm>
#include <map>

#include "core/check.h"

namespace braid::ddp {

std::vector<std::vector<int>> AssignBuckets(const std::vector<BucketableParam>& params,
                                            const std::vector<int>& order, int64_t first_cap_bytes,
                                            int64_t cap_bytes) {
  BRAID_CHECK(order.size() == params.size())
      << "bucket order lists " << order.size() << " of " << params.size() << " parameters";
  struct Open {
    std::vector<int> members;
    int64_t bytes = 0;
    int first_pos = 0;     // position of the first member in `order`
    bool is_first = true;  // still the key's first bucket
  };
  std::map<int, Open> open;
  std::vector<std::pair<int, std::vector<int>>> closed;  // (first_pos, members)
  std::vector<bool> seen(params.size(), false);
  for (int pos = 0; pos < int(order.size()); ++pos) {
    const int i = order[size_t(pos)];
    BRAID_CHECK(i >= 0 && i < int(params.size()) && !seen[size_t(i)])
        << "bucket order is not a permutation (index " << i << " at position " << pos << ")";
    seen[size_t(i)] = true;
    Open& b = open[params[size_t(i)].key];
    const int64_t cap = b.is_first ? first_cap_bytes : cap_bytes;
    if (!b.members.empty() && b.bytes + params[size_t(i)].bytes > cap) {
      closed.emplace_back(b.first_pos, std::move(b.members));
      b.members.clear();
      b.bytes = 0;
      b.is_first = false;
    }
    if (b.members.empty()) b.first_pos = pos;
    b.members.push_back(i);
    b.bytes += params[size_t(i)].bytes;
  }
  for (auto& [key, b] : open) {
    if (!b.members.empty()) closed.emplace_back(b.first_pos, std::move(b.members));
  }
  std::sort(closed.begin(), closed.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<std::vector<int>> out;
  out.reserve(closed.size());
  for (auto& [pos, members] : closed) out.push_back(std::move(members));
  return out;
}

}  // namespace braid::ddp
