// LayoutHash (flat_layout.h): the fingerprint of the parameter layout that ranks compare.
#include "plugins/paramserver/flat_layout.h"

#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/module.h"
#include "core/tensor.h"

namespace braid::paramserver {

int64_t LayoutHash(const Module::NamedTensors& named) {
  uint64_t h = 14695981039346656037ull;
  auto add = [&h](const std::string& s) {
    for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
    h = (h ^ 0xff) * 1099511628211ull;
  };
  for (const auto& [name, t] : named) add(absl::StrCat(name, ShapeToString(t.shape())));
  return int64_t(h >> 1);
}

}  // namespace braid::paramserver
