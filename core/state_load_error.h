// The error an optimizer's LoadStateDict returns when the given state does not fit it, in one
// wording for every optimizer (AdamW, Adam and SGD in core/optimizer.cc, the adam8bit plugin):
// "cannot load <optimizer> state: missing keys: ...; unexpected keys: ...; mismatched: ...;"
// followed by `keys_hint`, which says what the keys should be. Header-only, so a plugin
// compiling against core's headers gets it without linking core.
#ifndef BRAID_CORE_STATE_LOAD_ERROR_H_
#define BRAID_CORE_STATE_LOAD_ERROR_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"

namespace braid {

// OK when the three lists are empty; otherwise InvalidArgument naming every non-empty list.
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

#endif  // BRAID_CORE_STATE_LOAD_ERROR_H_
