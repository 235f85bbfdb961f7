// What every optimizer with per-parameter state (AdamW, Adam and SGD in core/optimizer.cc, the
// lamb and adam8bit plugins) does with that state the same way: make a slot on first use, walk the
// parameters for ParameterStates, and word the error of a state dict that does not fit.
// Header-only, so a plugin compiling against core's headers gets it without linking core.
#ifndef BRAID_CORE_OPTIMIZER_STATE_H_
#define BRAID_CORE_OPTIMIZER_STATE_H_

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "core/optimizer.h"
#include "core/tensor.h"

namespace braid {

// `slot`, made on first use as f32 zeros of `param`'s shape on its device (the moments start at
// zero, and stay f32 whatever the parameter's dtype).
inline Tensor& SlotOnFirstUse(Tensor& slot, const Tensor& param) {
  if (!slot.defined()) slot = Tensor::Zeros(param.shape(), DType::kF32, param.device());
  return slot;
}

// ParameterStates' result: one map per parameter of `groups`, in param_groups() order, each
// made by slots_of(group index, parameter index).
template <typename SlotsOf>
std::vector<std::map<std::string, Tensor>> PerParameterStates(const std::vector<ParamGroup>& groups,
                                                              SlotsOf&& slots_of) {
  std::vector<std::map<std::string, Tensor>> out;
  for (size_t g = 0; g < groups.size(); ++g) {
    for (size_t i = 0; i < groups[g].params.size(); ++i) out.push_back(slots_of(g, i));
  }
  return out;
}

// The error LoadStateDict returns when the given state does not fit, in one wording for every
// optimizer: "cannot load <optimizer> state: missing keys: ...; unexpected keys: ...;
// mismatched: ...;" followed by `keys_hint`, which says what the keys should be. OK when the
// three lists are empty.
inline absl::Status StateLoadError(absl::string_view optimizer,
                                   const std::vector<std::string>& missing,
                                   const std::vector<std::string>& unexpected,
                                   const std::vector<std::string>& mismatched,
                                   absl::string_view keys_hint) {
  if (missing.empty() && unexpected.empty() && mismatched.empty()) return absl::OkStatus();
  std::string msg = absl::StrCat("cannot load ", optimizer, " state:");
  const std::pair<const char*, const std::vector<std::string>*> lists[] = {
      {" missing keys: ", &missing}, {" unexpected keys: ", &unexpected},
      {" mismatched: ", &mismatched}};
  for (const auto& [label, list] : lists) {
    if (!list->empty()) absl::StrAppend(&msg, label, absl::StrJoin(*list, ", "), ";");
  }
  absl::StrAppend(&msg, keys_hint);
  return absl::InvalidArgumentError(msg);
}

}  // namespace braid

#endif  // BRAID_CORE_OPTIMIZER_STATE_H_
