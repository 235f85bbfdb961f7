// Small helpers for the readers of outside JSON files (checkpoint indexes, data manifests), so
// that each says the same about a value it refuses. Header-only, as json_syntax_error.h is:
// readers that must not link core (the checkpoint index, which its fuzzer links alone) include
// it through //core:headers.
#ifndef BRAID_CORE_JSON_VALUES_H_
#define BRAID_CORE_JSON_VALUES_H_

#include <cstdint>
#include <string>

#include "nlohmann/json.hpp"

namespace braid {

// The member `key` of `object`, or null when `object` is not an object or has no such member.
inline const nlohmann::json* JsonMember(const nlohmann::json& object, const std::string& key) {
  if (!object.is_object()) return nullptr;
  auto it = object.find(key);
  return it == object.end() ? nullptr : &*it;
}

// A value as a message shows it: a number or a short string as it is written (cut at 40
// characters, never inside a UTF-8 character), else its kind ("a list", "an object").
inline std::string DescribeJson(const nlohmann::json& v) {
  if (v.is_array()) return "a list";
  if (v.is_object()) return "an object";
  std::string text = v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (text.size() > 40) {
    size_t cut = 37;
    while (cut > 0 && (uint8_t(text[cut]) & 0xc0) == 0x80) --cut;
    text = text.substr(0, cut) + "...";
  }
  return text;
}

}  // namespace braid

#endif  // BRAID_CORE_JSON_VALUES_H_
