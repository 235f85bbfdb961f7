#include "plugins/pipeline/stage_view.h"

#include <map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/check.h"

namespace braid::pipeline {

StageView::StageView(Module& model, const std::set<std::string>& names) : Module("StageView") {
  std::map<std::string, Tensor> params;
  for (auto& [n, p] : model.NamedParameters()) params[n] = p;
  std::set<std::string> covered;
  std::vector<std::string> taken;  // prefixes of borrowed modules ("h.0.")
  for (auto& [path, m] : model.NamedModules()) {
    if (path.empty()) continue;
    bool inside = false;
    for (const std::string& t : taken) inside = inside || path.compare(0, t.size(), t) == 0;
    if (inside) continue;
    // A module that owns a parameter through another name (a tied head) is not whole here.
    Module::NamedTensors own = m->NamedParameters();
    if (own.empty()) continue;
    bool whole = true;
    for (auto& [n, p] : own) {
      const std::string full = absl::StrCat(path, ".", n);
      auto it = params.find(full);
      whole = whole && names.count(full) > 0 && it != params.end() && it->second.impl() == p.impl();
    }
    if (!whole) continue;
    BorrowModule(path, m);
    taken.push_back(path + ".");
    for (auto& [n, p] : own) covered.insert(absl::StrCat(path, ".", n));
  }
  for (const std::string& n : names) {
    if (covered.count(n)) continue;
    auto it = params.find(n);
    BRAID_CHECK(it != params.end()) << "stage view: the model has no parameter '" << n << "'";
    ShareParameter(n, it->second);
  }
}

}  // namespace braid::pipeline
