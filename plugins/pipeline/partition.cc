#include "plugins/pipeline/partition.h"

#include <algorithm>
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "core/check.h"

namespace braid::pipeline {
namespace {

absl::Status Invalid(const std::string& msg) {
  return absl::InvalidArgumentError(absl::StrCat("strategy 'pipeline': ", msg));
}

}  // namespace

bool IsPipelineOption(const std::string& key) {
  for (const char* k : {"stages", "schedule", "virtual_stages", "partition", "trace_file",
                        "split_backward", "receives_ahead"}) {
    if (key == k) return true;
  }
  return false;
}

absl::StatusOr<Options> ParseOptions(const std::map<std::string, std::string>& options,
                                     int mesh_stages) {
  Options o;
  for (const auto& [k, v] : options) {
    if (k == "stages") {
      if (!absl::SimpleAtoi(v, &o.stages) || o.stages < 1) {
        return Invalid(absl::StrCat("option stages='", v, "' is not a number of stages >= 1"));
      }
    } else if (k == "schedule") {
      o.schedule = v;
    } else if (k == "virtual_stages") {
      if (!absl::SimpleAtoi(v, &o.chunks) || o.chunks < 1) {
        return Invalid(absl::StrCat("option virtual_stages='", v, "' is not a number >= 1"));
      }
    } else if (k == "partition") {
      o.partition = v;
    } else if (k == "trace_file") {
      o.trace_file = v;
    } else if (k == "split_backward") {
      if (v != "true" && v != "false") {
        return Invalid(absl::StrCat("option split_backward='", v, "': use true or false"));
      }
      o.split_backward = v == "true";
    } else if (k == "receives_ahead") {
      if (!absl::SimpleAtoi(v, &o.receives_ahead) || o.receives_ahead < 0) {
        return Invalid(absl::StrCat("option receives_ahead='", v, "' is not a number >= 0"));
      }
    } else {
      return Invalid(absl::StrCat("unknown option '", k,
                                  "' (known: stages, schedule, virtual_stages, partition, trace_file, receives_ahead, "
                                  "split_backward)"));
    }
  }
  // The mesh is the one description of the layout: the option may only repeat it.
  BRAID_CHECK(mesh_stages >= 1) << "ParseOptions: the mesh's pipeline size, " << mesh_stages;
  if (o.stages != 0 && o.stages != mesh_stages) {
    return Invalid(absl::StrCat("option stages (", o.stages, ") disagrees with parallel.pipeline (",
                                mesh_stages, "); give the stage count once, in parallel.pipeline"));
  }
  o.stages = mesh_stages;
  if (o.schedule != "interleaved" && o.chunks != 1) {
    return Invalid(absl::StrCat("virtual_stages ", o.chunks, " needs schedule 'interleaved'"));
  }
  if (o.schedule != "gpipe" && o.schedule != "1f1b" && o.schedule != "interleaved") {
    return Invalid(absl::StrCat("unknown schedule '", o.schedule, "'; known: gpipe, 1f1b, interleaved"));
  }
  return o;
}

absl::StatusOr<std::vector<std::pair<int, int>>> Partition(const std::vector<int64_t>& cost,
                                                           int parts, const std::string& how) {
  const int n = int(cost.size());
  std::vector<int> counts;
  if (how == "uniform") {
    for (int i = 0; i < parts; ++i) counts.push_back(n / parts + (i < n % parts ? 1 : 0));
  } else if (how == "parameters") {
    // Minimise the largest piece's parameter count (dynamic programming over cut points).
    const int64_t kInf = std::numeric_limits<int64_t>::max();
    std::vector<int64_t> prefix(size_t(n) + 1, 0);
    for (int i = 0; i < n; ++i) prefix[size_t(i) + 1] = prefix[size_t(i)] + cost[size_t(i)];
    std::vector<std::vector<int64_t>> best(size_t(parts) + 1, std::vector<int64_t>(size_t(n) + 1, kInf));
    std::vector<std::vector<int>> cut(size_t(parts) + 1, std::vector<int>(size_t(n) + 1, 0));
    best[0][0] = 0;
    for (int k = 1; k <= parts; ++k) {
      for (int i = k; i <= n; ++i) {
        for (int j = k - 1; j < i; ++j) {
          if (best[size_t(k) - 1][size_t(j)] == kInf) continue;
          int64_t v = std::max(best[size_t(k) - 1][size_t(j)], prefix[size_t(i)] - prefix[size_t(j)]);
          if (v < best[size_t(k)][size_t(i)]) {
            best[size_t(k)][size_t(i)] = v;
            cut[size_t(k)][size_t(i)] = j;
          }
        }
      }
    }
    counts.assign(size_t(parts), 0);
    for (int k = parts, i = n; k > 0; --k) {
      int j = cut[size_t(k)][size_t(i)];
      counts[size_t(k) - 1] = i - j;
      i = j;
    }
  } else {
    for (absl::string_view part : absl::StrSplit(how, ',')) {
      int c;
      if (!absl::SimpleAtoi(part, &c) || c < 1) {
        return Invalid(absl::StrCat("partition '", how, "' is not 'parameters', 'time', 'uniform' or a list of ",
                                    "layer counts such as 2,3,1"));
      }
      counts.push_back(c);
    }
    int total = 0;
    for (int c : counts) total += c;
    if (int(counts.size()) != parts || total != n) {
      return Invalid(absl::StrCat("partition '", how, "' gives ", counts.size(), " stage(s) of ", total,
                                  " layer(s); the model has ", n, " layers for ", parts, " stage(s)"));
    }
  }
  std::vector<std::pair<int, int>> ranges;
  int at = 0;
  for (int c : counts) {
    ranges.push_back({at, at + c});
    at += c;
  }
  return ranges;
}

}  // namespace braid::pipeline
